"""A defender's own choice of step size: fine-tuning defenses tuned on held-out clean data.

BackdoorBench fixes each defense's learning rate (SGD 0.01 for the fine-tuning family), set for
its ResNets and data. A model that sits in a sharper region than a plain backdoored one can be
thrown to chance accuracy by that step size, and the defense then "removes" the backdoor by
destroying the model, which no defender would ship. :func:`select_lr` gives a defense the
choice a defender can make with what it holds: it splits off part of the clean split and keeps
the largest step size that does not cost more than ``acc_drop`` of held-out clean accuracy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np

from hexad.backdoor.defenses._common import DefenseOutput, check_data, masked_accuracy


def _check(lrs, acc_drop, held_frac) -> tuple[float, ...]:
    lrs = tuple(float(v) for v in np.atleast_1d(np.asarray(lrs, dtype=float)))
    if not lrs or not all(np.isfinite(v) and v > 0 for v in lrs):
        raise ValueError(f"lrs: expected one or more finite step sizes > 0, got {lrs!r}")
    if not 0.0 <= float(acc_drop) <= 1.0:
        raise ValueError(f"acc_drop: expected a number in [0, 1], got {acc_drop!r}")
    if not 0.0 < float(held_frac) < 1.0:
        raise ValueError(f"held_frac: expected a number in (0, 1), got {held_frac!r}")
    return tuple(sorted(set(lrs), reverse=True))


def select_lr(
    defense: Callable,
    lrs: Sequence[float] = (0.01, 0.003, 0.001),
    acc_drop: float = 0.05,
    held_frac: float = 0.2,
) -> Callable:
    """Returns ``defense`` with its ``lr`` chosen on held-out clean data.

    The result has the signature of every defense, ``(key, model, params, data, n_steps=100,
    **settings) -> DefenseOutput``. It splits the clean split ``data.x_clean`` by a
    permutation drawn from ``key`` into a fit part and a held part (``held_frac`` of it, at
    least one image each), measures the model's clean accuracy ``a0`` on the held part, and
    runs ``defense`` on the fit part at each step size of ``lrs`` from the largest; it keeps
    the first result whose held-out accuracy is at least ``a0 - acc_drop``, or, if none is,
    the one with the highest held-out accuracy. ``info`` has the kept run's ``info`` and
    ``lr`` (the kept step size), ``held_acc_before`` and ``held_acc`` (``{lr: accuracy}``
    of each run tried). Cost: one to ``len(lrs)`` runs of ``defense``.

    Args:
      defense: a defense that takes an ``lr`` keyword (FT, FP, NAD, FT-SAM, MCR).
      lrs: candidate step sizes (> 0).
      acc_drop: the held-out clean accuracy the defender gives up at most (in [0, 1]).
      held_frac: the fraction of the clean split held out (in (0, 1)).

    >>> import jax.numpy as jnp
    >>> from hexad.backdoor import SmallCNN
    >>> from hexad.backdoor.defenses import DefenseData, finetune
    >>> m = SmallCNN(2, (2,), 4)
    >>> p = m.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    >>> d = DefenseData(jnp.zeros((10, 8, 8, 1)), jnp.zeros(10, int))
    >>> out = select_lr(finetune, lrs=(0.01, 0.001))(jax.random.key(1), m, p, d, 2)
    >>> out.info["lr"] in (0.01, 0.001), len(out.info["held_acc"]) >= 1
    (True, True)
    """
    if not callable(defense):
        raise TypeError(f"defense: expected a callable defense, got {defense!r}")
    grid = _check(lrs, acc_drop, held_frac)
    drop = float(acc_drop)

    def run(key, model, params, data, n_steps=100, **settings):
        if "lr" in settings:
            raise ValueError("settings: lr is chosen by select_lr; pass lrs instead")
        check_data(model, params, data)
        m = data.x_clean.shape[0]
        if m < 2:
            raise ValueError(f"data.x_clean: select_lr needs at least 2 images, got {m}")
        n_held = min(m - 1, max(1, int(round(held_frac * m))))
        k_split, k_run = jax.random.split(key)
        perm = np.asarray(jax.random.permutation(k_split, m))
        held, fit = perm[:n_held], perm[n_held:]
        xh, yh = data.x_clean[held], data.y_clean[held]
        fit_data = data._replace(x_clean=data.x_clean[fit], y_clean=data.y_clean[fit])
        a0 = float(masked_accuracy(model, params, None, xh, yh))
        tried, best = {}, None
        for lr in grid:
            out = defense(k_run, model, params, fit_data, n_steps, lr=lr, **settings)
            acc = float(masked_accuracy(model, out.params, None, xh, yh))
            tried[lr] = acc
            if best is None or acc >= a0 - drop or acc > best[1]:
                best = (lr, acc, out)
            if acc >= a0 - drop:
                break
        lr, _, out = best
        info = dict(out.info) | {"lr": lr, "held_acc_before": a0, "held_acc": tried}
        return DefenseOutput(out.params, info)

    return run
