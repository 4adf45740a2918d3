"""The standard figures of a backdoored model before and after defenses (BackdoorBench).

:func:`evaluate` measures one model on a test split: clean accuracy and the attack success
rates of a :class:`DTBProblem`'s two triggers (for a plain BadNets model, ``decoy`` is its
trigger). :func:`defense_table` turns the figures before defense, after each defense and after
a surrogate defense into one flat table with the means over the defenses, BackdoorBench's DER
(arXiv 2206.12654, sec. 4) and the surrogate's mean absolute gap to the real defenses.
:func:`detection_rates` scores a detector's flags against the known poisons, and
:func:`benchmark_defenses` runs the whole protocol on one model.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple

import jax
import numpy as np

from hexad._base import check_int
from hexad.backdoor._dtb import DTBProblem, weight_displacement
from hexad.backdoor._train import (
    accuracy,
    attack_success_rate,
    defense_effectiveness_rating,
    target_rate,
)
from hexad.backdoor._triggers import check_images
from hexad.backdoor.defenses import Composition, DefenseData, DefenseOutput

__all__ = [
    "BackdoorMetrics",
    "benchmark_defenses",
    "defense_table",
    "detection_rates",
    "evaluate",
    "finetune_trajectory",
]


class BackdoorMetrics(NamedTuple):
    """A model's figures on a test split (ASRs among the non-target samples only).

    Attributes:
      clean_acc: ``[]`` float32, accuracy on the clean images.
      decoy_asr: ``[]`` float32, attack success rate of the decoy trigger.
      hidden_asr: ``[]`` float32, attack success rate of the hidden trigger.
      clean_to_hidden: ``[]`` float32, among clean images not of the hidden target, the
        fraction classified as the hidden target without any trigger (a model collapsed
        towards that class scores a high hidden ASR for a reason that is not the backdoor).
        Optional in hand-built figures (default NaN: not measured).
    """

    clean_acc: jax.Array
    decoy_asr: jax.Array
    hidden_asr: jax.Array
    clean_to_hidden: jax.Array = np.float32(np.nan)


@functools.partial(jax.jit, static_argnums=0)
def _evaluate(model, params, x, y, problem: DTBProblem) -> BackdoorMetrics:
    # model and the targets are static: one compile per architecture and shapes, reused for
    # every parameter set (the models of a study and each defense's output)
    f = model.apply
    return BackdoorMetrics(
        accuracy(f, params, x, y),
        attack_success_rate(f, params, x, y, problem.decoy, problem.decoy_target),
        attack_success_rate(f, params, x, y, problem.hidden, problem.hidden_target),
        target_rate(f, params, x, y, problem.hidden_target),
    )


def evaluate(model, params, x: jax.Array, y: jax.Array, problem: DTBProblem) -> BackdoorMetrics:
    """Returns the :class:`BackdoorMetrics` of ``model.apply(params, .)`` on ``(x, y)``.

    Jitted inside (do not wrap it in ``jax.jit``); ``model`` is static.

    Args:
      model: a flax classifier with ``apply(params, x) -> logits``, e.g. :class:`SmallCNN`.
      params: its parameters.
      x: ``[n, H, W, C]`` clean test images (float, in [0, 1]).
      y: ``[n]`` int labels.
      problem: :class:`DTBProblem` (its triggers and targets).

    >>> import jax.numpy as jnp
    >>> from hexad.backdoor import SmallCNN, patch_trigger
    >>> m = SmallCNN(2, (2,), 4)
    >>> p = m.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    >>> pr = DTBProblem(patch_trigger((8, 8, 1), 2), patch_trigger((8, 8, 1), 2, (0, 0)), 0, 1)
    >>> r = evaluate(m, p, jnp.zeros((4, 8, 8, 1)), jnp.array([0, 1, 0, 1]), pr)
    >>> [round(float(v), 2) for v in r]  # an untrained model calls every image class 0 or 1
    [0.5, 1.0, 0.0, 0.0]
    """
    if not isinstance(problem, DTBProblem):
        raise TypeError(f"problem: expected a DTBProblem, got {type(problem).__name__}")
    check_images(x, "x", problem.decoy.image_shape)
    if x.ndim != 4:
        raise ValueError(f"x: expected shape [n, H, W, C], got {tuple(x.shape)}")
    if y.shape != x.shape[:1]:
        raise ValueError(f"y: expected shape [{x.shape[0]}], got {tuple(y.shape)}")
    _check_targets(model, params, x, problem)
    return _evaluate(model, params, x, y, problem)


def _num_classes(model, params, x) -> int:
    """The model's class count: ``model.num_classes``, else its logits' width on ``x[:1]``."""
    k = getattr(model, "num_classes", None)
    if isinstance(k, (int, np.integer)) and not isinstance(k, bool):
        return int(k)
    return int(jax.eval_shape(model.apply, params, x[:1]).shape[-1])


def _check_targets(model, params, x, problem: DTBProblem) -> None:
    """Raises ValueError naming the target when a target of ``problem`` is not one of the
    model's classes."""
    k = _num_classes(model, params, x)
    for name in ("decoy_target", "hidden_target"):
        t = getattr(problem, name)
        if not isinstance(t, (int, np.integer)) or isinstance(t, bool) or not 0 <= int(t) < k:
            raise ValueError(
                f"problem.{name}: expected a class of the model, in [0, {k}), got {t!r}"
            )


def _floats(m: BackdoorMetrics, name: str) -> dict[str, float]:
    if not isinstance(m, BackdoorMetrics):
        raise TypeError(f"{name}: expected BackdoorMetrics, got {type(m).__name__}")
    return {k: float(v) for k, v in m._asdict().items()}


def defense_table(
    before: BackdoorMetrics,
    after: Mapping[str, BackdoorMetrics],
    surrogate: BackdoorMetrics | None = None,
) -> dict[str, float]:
    """Returns one model's figures before and after each defense as a flat ``{key: float}``.

    For each metric ``m`` of :class:`BackdoorMetrics` (``clean_acc``, ``decoy_asr``,
    ``hidden_asr``): ``m_before``; ``m_after_<d>`` for each defense ``d`` of ``after``;
    ``m_after_mean``, the mean over the defenses; and, with ``surrogate`` (the figures after a
    surrogate of the defenses, e.g. :func:`sanitise_surrogate`), ``surrogate_m`` and
    ``surrogate_m_mae``, the mean over the defenses of ``|m_after_<d> - surrogate_m|`` (0: the
    surrogate predicts every defense). ``der_decoy_mean``: the mean over the defenses of
    :func:`defense_effectiveness_rating` against the decoy trigger. Means run over ``after``
    in its order, in float64.

    Args:
      before: the model's figures before defense.
      after: ``{defense name: figures after it}``, at least one entry.
      surrogate: optional figures after the surrogate defense.

    >>> m = lambda a, d, h: BackdoorMetrics(*map(np.float32, (a, d, h)))
    >>> t = defense_table(m(0.9, 1.0, 0.0), {"ft": m(0.9, 0.5, 0.25), "nc": m(0.8, 0.0, 0.5)})
    >>> t["decoy_asr_after_mean"], t["hidden_asr_after_nc"], round(t["der_decoy_mean"], 3)
    (0.25, 0.5, 0.85)
    """
    if not after:
        raise ValueError("after: expected the figures after at least one defense, got none")
    b = _floats(before, "before")
    a = {d: _floats(m, f"after[{d!r}]") for d, m in after.items()}
    s = None if surrogate is None else _floats(surrogate, "surrogate")

    def mean(fn) -> float:
        return float(np.mean([fn(d) for d in a]))

    out = {f"{k}_before": v for k, v in b.items()}
    for k in b:
        out.update({f"{k}_after_{d}": a[d][k] for d in a})
        out[f"{k}_after_mean"] = mean(lambda d, k=k: a[d][k])
        if s is not None:
            out[f"surrogate_{k}"] = s[k]
            out[f"surrogate_{k}_mae"] = mean(lambda d, k=k: abs(a[d][k] - s[k]))
    out["der_decoy_mean"] = mean(
        lambda d: defense_effectiveness_rating(
            b["clean_acc"], a[d]["clean_acc"], b["decoy_asr"], a[d]["decoy_asr"]
        )
    )
    return out


def detection_rates(flags, is_poison) -> tuple[float, float]:
    """Returns ``(tpr, fpr)``: the fractions of poisons and of clean samples flagged.

    Args:
      flags: ``[n]`` bool, a detector's output (e.g.
        :func:`hexad.backdoor.defenses.spectral_signatures`).
      is_poison: ``[n]`` bool, which samples are poisons (e.g. :attr:`Poisoned.is_poison`).

    >>> tpr, fpr = detection_rates(np.array([1, 1, 0, 1], bool), np.array([1, 0, 0, 0], bool))
    >>> round(tpr, 3), round(fpr, 3)
    (1.0, 0.667)
    """
    flags, is_poison = np.asarray(flags), np.asarray(is_poison)
    for name, v in (("flags", flags), ("is_poison", is_poison)):
        if v.dtype != bool or v.ndim != 1:
            raise ValueError(f"{name}: expected a [n] bool array, got {v.dtype} {v.shape}")
    if flags.shape != is_poison.shape:
        raise ValueError(f"flags: expected shape {is_poison.shape}, got {flags.shape}")
    return float(flags[is_poison].mean()), float(flags[~is_poison].mean())


def benchmark_defenses(
    key,
    model,
    params,
    problem: DTBProblem,
    test: tuple[jax.Array, jax.Array],
    defenses: Mapping[str, Callable],
    data: DefenseData,
    *,
    is_poison: jax.Array | None = None,
    surrogate: Callable | None = None,
    callback: Callable[[str, BackdoorMetrics, float], None] | None = None,
) -> dict[str, float]:
    """Returns one model's :func:`defense_table` on ``test``, with detector rates and weight
    displacements.

    BackdoorBench's protocol for a backdoored model: its figures before defense, after each
    defense (each sanitising ``params`` with the same ``key`` and ``data``) and after the
    ``surrogate``. A defense whose ``info`` has ``"flags"`` (AC, SS) also gives
    ``<name>_tpr`` / ``<name>_fpr`` against ``is_poison``; one whose step size was chosen by
    :func:`hexad.backdoor.defenses.select_lr` gives ``lr_<name>`` (``lr_<name>_<i>`` for
    round ``i`` of a composition). ``displacement_<name>``: the
    :func:`weight_displacement` of each defense (and ``surrogate``). A
    :class:`~hexad.backdoor.defenses.Composition` whose first round is also in ``defenses``
    (the same object, as :func:`make_defense` gives for equal requests) and ran before it
    continues from that run (the same key, so the same first round), so ``"ft+ft"`` costs one
    FT run beside ``"ft"``; its ``callback`` seconds are then those of its later rounds. Host
    loop.

    Args:
      key: PRNG key handed to every defense (and to ``surrogate``).
      model: the flax classifier (static).
      params: its parameters.
      problem: :class:`DTBProblem`, the triggers whose ASRs are measured.
      test: ``(x [n, H, W, C], y [n])``, the test split.
      defenses: ``{name: defense(key, model, params, data) -> DefenseOutput}``, e.g. from
        :func:`make_defense`; at least one.
      data: the :class:`DefenseData` every defense gets.
      is_poison: optional ``[n_train]`` bool, the known poisons of ``data.x_train``.
      surrogate: optional defense-shaped surrogate (:func:`surrogate_defense`).
      callback: optional ``callback(name, metrics, seconds)`` after each defense.

    >>> import jax.numpy as jnp
    >>> from hexad.backdoor import SmallCNN, patch_trigger
    >>> from hexad.backdoor.defenses import DefenseData, clp
    >>> m = SmallCNN(2, (2,), 4)
    >>> p = m.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    >>> pr = DTBProblem(patch_trigger((8, 8, 1), 2), patch_trigger((8, 8, 1), 2, (0, 0)), 0, 1)
    >>> xy = (jnp.full((4, 8, 8, 1), 0.5), jnp.array([0, 1, 0, 1]))
    >>> t = benchmark_defenses(jax.random.key(1), m, p, pr, xy, {"clp": clp}, DefenseData(*xy))
    >>> round(t["clean_acc_before"], 2), sorted(k for k in t if k.endswith("_clp"))[:3]
    (0.5, ['clean_acc_after_clp', 'clean_to_hidden_after_clp', 'decoy_asr_after_clp'])
    """
    if not defenses:
        raise ValueError("defenses: expected at least one defense, got none")
    if not isinstance(data, DefenseData):
        raise TypeError(f"data: expected a DefenseData, got {type(data).__name__}")
    if isinstance(problem, DTBProblem):  # before any defense runs (evaluate checks the rest)
        _check_targets(model, params, test[0], problem)

    def metrics(p) -> BackdoorMetrics:
        return jax.device_get(evaluate(model, p, *test, problem))

    after, extra, ran = {}, {}, {}
    for name, defense in defenses.items():
        t0 = time.perf_counter()
        first = id(defense.rounds[0]) if isinstance(defense, Composition) else None
        if first in ran:  # a composition whose round 0 ran alone: go on from that run
            out = defense.from_first(key, model, ran[first], data)
        else:
            out = defense(key, model, params, data)
        if not isinstance(out, DefenseOutput):
            raise TypeError(f"defenses[{name!r}]: expected a DefenseOutput, got {type(out)}")
        ran[id(defense)] = out  # the objects live in ``defenses`` meanwhile
        after[name] = metrics(out.params)
        extra[f"displacement_{name}"] = float(weight_displacement(params, out.params))
        if "flags" in out.info and is_poison is not None:
            tpr, fpr = detection_rates(np.asarray(out.info["flags"]), np.asarray(is_poison))
            extra[f"{name}_tpr"], extra[f"{name}_fpr"] = tpr, fpr
        rounds = out.info.get("rounds", (out.info,))
        for i, r in enumerate(rounds):  # the step sizes chosen by select_lr
            if "lr" in r:
                extra[f"lr_{name}" + (f"_{i}" if len(rounds) > 1 else "")] = float(r["lr"])
        if callback is not None:
            callback(name, after[name], time.perf_counter() - t0)
    sur = None
    if surrogate is not None:
        q = surrogate(key, model, params, data).params
        sur = metrics(q)
        extra["displacement_surrogate"] = float(weight_displacement(params, q))
    return {**defense_table(metrics(params), after, sur), **extra}


def finetune_trajectory(
    key,
    model,
    params,
    data: DefenseData,
    test,
    problem: DTBProblem,
    n_steps: int = 100,
    every: int = 10,
    lr: float = 0.01,
    batch_size: int = 64,
) -> dict[str, np.ndarray]:
    """Returns ``{"step", "clean_acc", "decoy_asr", "hidden_asr"}`` ``[ceil(n_steps / every) + 1]``
    along one real fine-tuning run (:func:`hexad.backdoor.defenses.finetune`'s optimiser and
    augmentation), measured on ``test`` every ``every`` steps (the same run, not restarts).

    >>> import jax.numpy as jnp
    >>> from hexad.backdoor import SmallCNN, patch_trigger
    >>> m = SmallCNN(2, (2,), 4)
    >>> p = m.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    >>> pr = DTBProblem(patch_trigger((8, 8, 1), 2), patch_trigger((8, 8, 1), 2, (0, 0)), 0, 1)
    >>> xy = (jnp.full((4, 8, 8, 1), 0.5), jnp.array([0, 1, 0, 1]))
    >>> finetune_trajectory(jax.random.key(1), m, p, DefenseData(*xy), xy, pr, 4, 2)["step"]
    array([0, 2, 4])
    """
    from hexad.backdoor._train import minimize
    from hexad.backdoor.defenses._common import CELoss, sgd

    n_steps = check_int("n_steps", n_steps)
    every = check_int("every", every)
    rows = [(0, evaluate(model, params, *test, problem))]
    done = [0]

    def record(p):  # after every step; measures every ``every`` steps and at the end
        done[0] += 1
        if done[0] % every == 0 or done[0] == n_steps:
            rows.append((done[0], evaluate(model, p, *test, problem)))
        return False

    opt = sgd(float(lr), 0.9, n_steps, 5e-4)
    loss = CELoss(model, 0.0, 2)
    xy = (data.x_clean, data.y_clean)
    minimize(
        key,
        params,
        loss,
        xy,
        opt,
        n_steps,
        min(batch_size, xy[0].shape[0]),
        until=record,  # one step per call: the defenses' compile, not an ``every``-step one
    )
    out = {"step": np.asarray([r[0] for r in rows])}
    for f in BackdoorMetrics._fields:
        out[f] = np.asarray([float(getattr(r[1], f)) for r in rows])
    return out
