"""Anti-Backdoor Learning, a training-time defense on the training set the defender holds.

ABL, like the detectors (:mod:`.detectors`), is ``defense(key, model, params, data,
n_steps=100, **settings) -> DefenseOutput`` and needs ``data.x_train, data.y_train``. They
train from a fresh initialisation by default (``from_scratch``, as BackdoorBench), for
``retrain_factor * n_steps`` steps of Adam at ``lr`` (BackdoorBench's SGD at 0.1 is set for
batch-normalised ResNets; our norm-free CNN diverges there); ``from_scratch=False``
continues from ``params`` instead.
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
    CELoss,
    DefenseOutput,
    adam,
    budget,
    check_data,
    frac,
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
    n_steps=100,
    gamma=0.5,
    isolation_ratio=0.01,
    unlearn_lr=5e-4,
    lr=1e-3,
    retrain_factor=5,
    from_scratch=True,
    batch_size=64,
):
    """Returns :class:`DefenseOutput`: Anti-Backdoor Learning (ABL; Li et al., NeurIPS 2021,
    arXiv 2110.11571), on ``data.x_train``.

    1. LGA: training on ``sign(L - gamma) L`` of each batch's mean CE ``L`` (paper eq. 3).
    2. Isolation: the ``isolation_ratio`` of samples with the lowest loss (BB: 1%).
    3. Training on the rest, then 4. gradient ascent on the isolated samples' CE (SGD,
       momentum 0.9, ``unlearn_lr`` 5e-4 as BackdoorBench).

    Budget (``n = n_steps``, ``R = retrain_factor``): ``R n / 4`` LGA steps, ``3 R n / 4``
    training steps on the rest (BB's 20 and 60 epochs), ``n / 5`` unlearning steps.
    ``info``: ``isolated [n]`` bool, ``losses [n]`` the isolation scores.
    """
    check_data(model, params, data, need_train=True)
    n = budget(n_steps)
    if not 0.0 < isolation_ratio < 1.0:
        raise ValueError(f"isolation_ratio: expected a number in (0, 1), got {isolation_ratio!r}")
    x, y = data.x_train, data.y_train
    k0, k1, k2, k3 = jax.random.split(key, 4)
    p = start(k0, model, params, x, from_scratch)
    total = int(retrain_factor) * n
    lga = _LGA(model, float(gamma))
    p, _ = minimize(k1, p, lga, (x, y), adam(float(lr)), frac(total, 0.25), batch_size)
    losses = per_sample_ce(model, p, x, y)
    n_iso = max(1, int(round(isolation_ratio * x.shape[0])))
    iso = np.argsort(np.asarray(losses))[:n_iso]
    isolated = np.zeros(x.shape[0], bool)
    isolated[iso] = True
    rest = cycled(np.flatnonzero(~isolated), x.shape[0])
    p = train(k2, model, p, x[rest], y[rest], frac(total, 0.75), adam(float(lr)), batch_size)
    p, _ = minimize(
        k3,
        p,
        CELoss(model, sign=-1.0),
        (x[iso], y[iso]),
        sgd(float(unlearn_lr), 0.9),
        frac(n, 0.2),
        min(batch_size, n_iso),
    )
    return DefenseOutput(p, {"isolated": isolated, "losses": losses})


@dataclasses.dataclass(frozen=True)
class _LGA:
    """ABL's local gradient ascent loss (value-hashable: one compile per setting)."""

    model: Any
    gamma: float

    def __call__(self, p, k, batch):
        loss = CELoss(self.model)(p, k, batch)
        return jnp.sign(jax.lax.stop_gradient(loss) - self.gamma) * loss
