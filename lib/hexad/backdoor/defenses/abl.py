"""Anti-Backdoor Learning, a training-time defense on the training set the defender holds.

ABL, like the detectors (:mod:`.detectors`), is ``defense(key, model, params, data,
n_steps=DEFAULT_STEPS, **settings) -> DefenseOutput`` and needs ``data.x_train,
data.y_train``. They train from a fresh initialisation by default (``from_scratch``, as
BackdoorBench, whose ABL, AC and SS build a new model), for ``retrain_factor * n_steps``
steps of SGD (momentum 0.9) at BackdoorBench's step sizes; ``from_scratch=False`` continues
from ``params`` instead. Trained from scratch, the model they return holds only what the
data holds (``info["retrains"]``, :data:`hexad.backdoor.defenses.RETRAINS`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hexad.backdoor._train import minimize
from hexad.backdoor.defenses._common import (
    DEFAULT_STEPS,
    CELoss,
    bb_epochs,
    budget,
    check_data,
    frac,
    output,
    per_sample_ce,
    sgd,
    train,
)


@functools.partial(jax.jit, static_argnums=0)
def _init(model, key, x):
    return model.init(key, x)


def start(key, model, params, x, from_scratch):
    """A fresh initialisation from ``key`` (``from_scratch``) or ``params``."""
    return _init(model, key, x[:1]) if from_scratch else params


def cycled(idx, n: int):
    """``idx`` repeated cyclically to length ``n``: uniform minibatches over ``idx`` from a
    fixed-size array, so training on a subset compiles once whatever its size."""
    return np.resize(np.asarray(idx), n)


def abl(
    key,
    model,
    params,
    data,
    n_steps=DEFAULT_STEPS,
    gamma=0.5,
    isolation_ratio=0.01,
    lr=0.01,
    momentum=0.9,
    weight_decay=1e-4,
    unlearn_lr=1e-4,
    unlearn_epochs=20,
    retrain_factor=5,
    from_scratch=True,
    batch_size=64,
):
    """Returns :class:`DefenseOutput`: Anti-Backdoor Learning (ABL; Li et al., NeurIPS 2021,
    arXiv 2110.11571), on ``data.x_train``, as BackdoorBench's ``abl``.

    1. LGA: training on ``sign(L - gamma) L`` of each batch's mean CE ``L`` (paper eq. 3;
       the gradient of BackdoorBench's ``Flooding`` loss ``|L - b| + b`` at ``b = gamma``).
    2. Isolation: the ``isolation_ratio`` of samples with the lowest loss.
    3. Training on the rest: ``lr`` for its first two thirds, ``lr / 10`` after
       (BackdoorBench: 0.01 for 40 of 60 epochs, then 0.001).
    4. Gradient ascent on the isolated samples' CE at ``unlearn_lr``.

    All by SGD (``momentum``, Nesterov's, ``weight_decay``), as BackdoorBench (whose
    unlearning schedule sets 1e-4 whatever ``lr_unlearning_init``). Budget (``n = n_steps``,
    ``R = retrain_factor``): ``R n / 4`` LGA steps, ``3 R n / 4`` training steps on the rest
    (BackdoorBench's 20 and 60 epochs on the whole training set), ``unlearn_epochs`` of
    BackdoorBench's epochs of unlearning (``n`` standing for 100). ``info``: ``isolated
    [n]`` bool, ``losses [n]`` the isolation scores, ``acted``, ``retrains``
    (``from_scratch``).
    """
    check_data(model, params, data, need_train=True)
    n = budget(n_steps)
    if not 0.0 < isolation_ratio < 1.0:
        raise ValueError(f"isolation_ratio: expected a number in (0, 1), got {isolation_ratio!r}")
    x, y = data.x_train, data.y_train
    k0, k1, k2, k3 = jax.random.split(key, 4)
    p = start(k0, model, params, x, from_scratch)
    total = int(retrain_factor) * n
    opt = lambda rate: sgd(float(rate), float(momentum), 0, float(weight_decay), True)
    lga = _LGA(model, float(gamma))
    p, _ = minimize(k1, p, lga, (x, y), opt(lr), frac(total, 0.25), batch_size)
    losses = per_sample_ce(model, p, x, y)
    n_iso = max(1, int(round(isolation_ratio * x.shape[0])))
    iso = np.argsort(np.asarray(losses))[:n_iso]
    isolated = np.zeros(x.shape[0], bool)
    isolated[iso] = True
    rest = cycled(np.flatnonzero(~isolated), x.shape[0])
    n_rest = frac(total, 0.75)
    n_hi = frac(n_rest, 2 / 3)
    k2a, k2b = jax.random.split(k2)
    p = train(k2a, model, p, x[rest], y[rest], n_hi, opt(lr), batch_size)
    if n_rest > n_hi:
        p = train(k2b, model, p, x[rest], y[rest], n_rest - n_hi, opt(0.1 * lr), batch_size)
    p, _ = minimize(
        k3,
        p,
        CELoss(model, sign=-1.0),
        (x[iso], y[iso]),
        opt(unlearn_lr),
        bb_epochs(n, unlearn_epochs),
        min(batch_size, n_iso),
    )
    info = {"isolated": isolated, "losses": losses}
    return output(params, p, info, retrains=bool(from_scratch))


@dataclasses.dataclass(frozen=True)
class _LGA:
    """ABL's local gradient ascent loss (value-hashable: one compile per setting)."""

    model: Any
    gamma: float

    def __call__(self, p, k, batch):
        loss = CELoss(self.model)(p, k, batch)
        return jnp.sign(jax.lax.stop_gradient(loss) - self.gamma) * loss
