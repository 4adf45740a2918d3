"""A defender's own choice of step size: fine-tuning defenses tuned on held-out clean data.

BackdoorBench fixes each defense's learning rate (SGD 0.01 for the fine-tuning family), set for
its ResNets and data. A model that sits in a sharper region than a plain backdoored one can be
thrown to chance accuracy by that step size, and the defense then "removes" the backdoor by
destroying the model, which no defender would ship. :func:`select_lr` gives a defense the
choice a defender can make with what it holds: the largest step size whose clean-accuracy
loss, measured on clean images the defense did not train on, is within ``acc_drop``.

Why cross-fitting and a standard error. A held-out fifth of a 500-image split is 100 images:
one image is one point of accuracy, and the measured loss has a standard error of 2-3 points
against a 5-point budget. With the former rule (that fifth, loss compared with ``acc_drop``
bare) a step size that costs 3 points is rejected about one time in six, and one that costs
8 accepted one time in five (simulated over 20,000 splits for a defense that also flips 3%
of the verdicts each way; the first is checked in ``tests/backdoor/test_defenses.py``).
Two-fold cross-fitting judges every image of the split once, by the run that did not train
on it: five times the held-out images, a standard error about 2.2 times smaller. The paired
standard error (only images whose verdict changed add to it) then sets the tolerance, so
that the rule rejects a step size only when the loss exceeds the budget by more than the
measurement resolves.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import jax
import numpy as np

from hexad._base import check_int
from hexad.backdoor.defenses._common import (
    DEFAULT_STEPS,
    DefenseOutput,
    check_data,
    masked_correct,
)


def paired_drop(before, after) -> tuple[float, float]:
    r"""Returns ``(drop, se)``: the accuracy lost from ``before`` to ``after`` on the same images
    and its paired standard error.

    ``before``, ``after``: ``[n]`` bools (image :math:`i` classified correctly). With
    :math:`d_i = \text{before}_i - \text{after}_i \in \{-1, 0, 1\}`,
    :math:`\text{drop} = \bar d` and :math:`\text{se} = \sqrt{(\overline{d^2} - \text{drop}^2) /
    n}`, the standard error of a difference of two paired proportions (the one of
    McNemar's test, unpooled): only images whose verdict changed add to it, so two models
    that agree on most images are compared far more tightly than two independent accuracies.

    >>> paired_drop([1, 1, 1, 1], [1, 1, 1, 0])
    (0.25, 0.2165...)
    """
    b, a = np.asarray(before, np.float64), np.asarray(after, np.float64)
    if b.ndim != 1 or b.size == 0 or b.shape != a.shape:
        raise ValueError(
            f"before, after: expected two [n] vectors, n >= 1, got shapes {np.shape(before)}, "
            f"{np.shape(after)}"
        )
    d = b - a
    drop = float(d.mean())
    return drop, math.sqrt(max(float(np.mean(d**2)) - drop**2, 0.0) / d.size)


def _check(lrs, acc_drop, held_frac, z, folds) -> tuple[float, ...]:
    lrs = tuple(float(v) for v in np.atleast_1d(np.asarray(lrs, dtype=float)))
    if not lrs or not all(np.isfinite(v) and v > 0 for v in lrs):
        raise ValueError(f"lrs: expected one or more finite step sizes > 0, got {lrs!r}")
    if not 0.0 <= float(acc_drop) <= 1.0:
        raise ValueError(f"acc_drop: expected a number in [0, 1], got {acc_drop!r}")
    if not 0.0 < float(held_frac) < 1.0:
        raise ValueError(f"held_frac: expected a number in (0, 1), got {held_frac!r}")
    if not (math.isfinite(float(z)) and float(z) >= 0.0):
        raise ValueError(f"z: expected a finite number >= 0, got {z!r}")
    check_int("folds", folds, lo=1)
    return tuple(sorted(set(lrs), reverse=True))


def select_lr(
    defense: Callable,
    lrs: Sequence[float] = (0.01, 0.003, 0.001),
    acc_drop: float = 0.05,
    held_frac: float = 0.2,
    z: float = 1.0,
    folds: int = 2,
) -> Callable:
    """Returns ``defense`` with its ``lr`` chosen on held-out clean data.

    The result has the signature of every defense, ``(key, model, params, data,
    n_steps=DEFAULT_STEPS, **settings) -> DefenseOutput``. A permutation drawn from ``key``
    splits the clean split ``data.x_clean`` into ``folds`` parts (``folds = 1``: one held part
    of ``held_frac``, at least one image, the rest the fit part). For each step size of ``lrs``,
    from the largest, ``defense`` runs once per part on the other parts and is judged on that
    part, so every judged image is one the run did not train on. Over the judged images it
    measures, image by image, what the model got right before and after, the loss ``drop`` and
    its paired standard error ``se`` (:func:`paired_drop`), and keeps the first step size with

        drop <= acc_drop + z se,

    i.e. it rejects a step size only when its loss exceeds ``acc_drop`` by more than ``z``
    standard errors (``z = 1``: the one-standard-error rule, Hastie, Tibshirani and Friedman,
    ESL 2nd ed., sec. 7.10; ``z = 0``: the bare comparison). With ``folds >= 2`` the model
    returned is ``defense`` run at that step size on the whole clean split, and that run must
    pass the same rule on the clean split it trained on (before vs after, image by image):
    the runs on the parts do not vouch for it, because at a step size near the edge of
    stability one run of a few can diverge, and a defender sees a model that lost its own
    training images. A step size whose whole-split run fails is rejected and the search goes
    on. With ``folds = 1`` the model returned is the fit part's run (the former rule at
    ``z = 0``). If no step size passes, it keeps the one with the highest held-out accuracy
    (capped by its whole-split run's accuracy on its own images, where one was made). ``info``
    has the returned run's ``info`` and ``lr`` (the kept step size), ``folds``,
    ``held_acc_before``, ``held_acc`` and ``held_drop_se`` (``{lr: value}`` of each step size
    tried), ``fit_acc_before`` and ``fit_acc`` (the clean split's accuracy before, and after
    each whole-split run made). Cost: ``folds`` runs of ``defense`` for each step size tried
    (one to ``len(lrs)``), and with ``folds >= 2`` one whole-split run for each that passes
    on the parts (one more if none does).

    Args:
      defense: a defense that takes an ``lr`` keyword (FT, FP, NAD, FT-SAM, MCR).
      lrs: candidate step sizes (> 0).
      acc_drop: the held-out clean accuracy the defender gives up at most (in [0, 1]).
      held_frac: the fraction of the clean split held out when ``folds = 1`` (in (0, 1)).
      z: the tolerance in paired standard errors (>= 0).
      folds: cross-fitting parts (>= 1; at most the clean split's size).

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
    grid = _check(lrs, acc_drop, held_frac, z, folds)
    drop, z, folds = float(acc_drop), float(z), int(folds)

    def run(key, model, params, data, n_steps=DEFAULT_STEPS, **settings):
        if "lr" in settings:
            raise ValueError("settings: lr is chosen by select_lr; pass lrs instead")
        check_data(model, params, data)
        m = data.x_clean.shape[0]
        if m < max(2, folds):
            raise ValueError(
                f"data.x_clean: select_lr needs at least max(2, folds={folds}) images, got {m}"
            )
        k_split, k_run = jax.random.split(key)
        perm = np.asarray(jax.random.permutation(k_split, m))
        if folds == 1:
            n_held = min(m - 1, max(1, int(round(held_frac * m))))
            splits = [(perm[:n_held], perm[n_held:])]
        else:
            parts = np.array_split(perm, folds)
            splits = [(h, np.concatenate(parts[:f] + parts[f + 1 :])) for f, h in enumerate(parts)]
        sub = lambda rows: data._replace(x_clean=data.x_clean[rows], y_clean=data.y_clean[rows])
        judged = np.concatenate([h for h, _ in splits])
        c_all = np.asarray(masked_correct(model, params, None, data.x_clean, data.y_clean))
        c0 = c_all[judged]  # the model before, on the judged images (one pass over the split)
        tried, ses, fit_acc, score, whole = {}, {}, {}, {}, {}
        lr = None
        for cand in grid:
            c1, outs = [], []
            for f, (h, fit) in enumerate(splits):
                k = k_run if folds == 1 else jax.random.fold_in(k_run, f)
                outs.append(defense(k, model, params, sub(fit), n_steps, lr=cand, **settings))
                c1.append(np.asarray(masked_correct(model, outs[-1].params, None, *sub(h)[:2])))
            c1 = np.concatenate(c1)
            loss, se = paired_drop(c0, c1)
            tried[cand], ses[cand] = float(c1.mean()), se
            score[cand] = tried[cand]
            ok = loss <= drop + z * se + 1e-12  # 1e-12: a loss of exactly acc_drop passes
            if folds == 1:
                whole[cand] = outs[0]
            elif ok:  # the model shipped: this step size on the whole clean split, checked
                whole[cand] = defense(k_run, model, params, data, n_steps, lr=cand, **settings)
                c2 = np.asarray(
                    masked_correct(model, whole[cand].params, None, data.x_clean, data.y_clean)
                )
                fit_acc[cand] = float(c2.mean())
                loss2, se2 = paired_drop(c_all, c2)
                ok = loss2 <= drop + z * se2 + 1e-12
                score[cand] = min(score[cand], fit_acc[cand])
            if ok:
                lr = cand
                break
        if lr is None:  # none passed: the best held-out accuracy (of a run that kept its own)
            lr = max(score, key=lambda v: (score[v], -grid.index(v)))
        out = whole.get(lr) or defense(k_run, model, params, data, n_steps, lr=lr, **settings)
        info = dict(out.info) | {
            "lr": lr,
            "folds": folds,
            "held_acc_before": float(c0.mean()),
            "held_acc": tried,
            "held_drop_se": ses,
            "fit_acc_before": float(c_all.mean()),
            "fit_acc": fit_acc,
        }
        return DefenseOutput(out.params, info)

    return run
