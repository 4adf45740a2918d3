"""Shared code of the backdoor study (``backdoor_dtb``); not a study.

- :func:`efficacy_entries`: the calibration stage's figures per defense on a BadNets model.
- :func:`suppressed_entries`: hidden ASR after the defenses that suppressed the decoy and
  kept the clean accuracy.
- :func:`match_inner_lr`: scale the surrogate's step size so that its weight displacement
  matches a real defense's.
- :func:`fp_mask_fn`: fine-pruning's own pruning mask at ``theta`` (the oracle DTB's inner
  operation).
- :func:`aggregate`: mean and ``*_sd`` over seeds; :func:`plot_asr`, :func:`plot_trajectory`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hexad import backdoor as bd

ASR_OK, ACC_LOSS_OK = 0.2, 0.05  # a defense removes a backdoor: ASR below, accuracy kept
IMPLANT_OK = 0.5  # an implanted model below this clean accuracy (10 classes) has collapsed
ATTACKER_HELD = 0.1  # the share of the attacker's images held out to select the implant


class Stages:
    """Times the stages of one seed: ``with stages("name"):`` logs ``stage`` and ``seconds``
    (wall) to the study's ``metrics.jsonl`` and keeps ``seconds_<name>``."""

    def __init__(self, ctx: Any, seed: int):
        self.ctx, self.seed, self.seconds = ctx, seed, {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        yield
        dt = round(time.perf_counter() - t0, 2)
        self.seconds[f"seconds_{name}"] = dt
        self.ctx.log(seed=self.seed, stage=name, seconds=dt)


def efficacy_entries(table: dict[str, float], names: list[str]) -> dict[str, float]:
    """``efficacy_<d>`` (1.0 when ASR after < 0.2 with < 5 points of clean accuracy lost),
    ``calib_asr_<d>``, ``calib_acc_<d>``, ``n_defenses_effective`` from a BadNets table.

    >>> t = {"clean_acc_before": 0.9, "clean_acc_after_ft": 0.88, "decoy_asr_after_ft": 0.1}
    >>> efficacy_entries(t, ["ft"])["efficacy_ft"]
    1.0
    """
    out = {}
    for d in names:
        asr, acc = table[f"decoy_asr_after_{d}"], table[f"clean_acc_after_{d}"]
        ok = _removes_decoy(table, d)
        out |= {f"efficacy_{d}": float(ok), f"calib_asr_{d}": asr, f"calib_acc_{d}": acc}
    out["n_defenses_effective"] = float(sum(out[f"efficacy_{d}"] for d in names))
    return out


def _removes_decoy(table: dict[str, float], d: str) -> bool:
    """Whether defense ``d`` brings the decoy ASR below ``ASR_OK`` losing less than
    ``ACC_LOSS_OK`` of clean accuracy."""
    lost = table["clean_acc_before"] - table[f"clean_acc_after_{d}"]
    return table[f"decoy_asr_after_{d}"] < ASR_OK and lost < ACC_LOSS_OK


def suppressed_entries(pre: str, table: dict[str, float], names: list[str]) -> dict[str, float]:
    """Per defense ``<pre>{clean_acc,decoy_asr,hidden_asr}_after_<d>``; ``<pre>implant_ok``;
    ``<pre>n_defenses_suppressed`` and ``<pre>hidden_asr_after_suppressed_mean`` (NaN when
    none suppressed); the unconditional means.

    A defense suppresses the decoy when its ASR after is below 0.2 *and* the model keeps its
    clean accuracy (< 5 points lost, the calibration's rule): a defense that wrecks the model
    also zeroes every ASR, which says nothing of the backdoors. An implant is ok when its clean
    accuracy before any defense is at least ``IMPLANT_OK``; a failed implant suppresses nothing.

    >>> t = {"clean_acc_before": 0.95, "decoy_asr_before": 1.0, "hidden_asr_before": 0.0,
    ...      "hidden_asr_after_mean": 0.4, "decoy_asr_after_mean": 0.05,
    ...      "clean_acc_after_ft": 0.93, "decoy_asr_after_ft": 0.1, "hidden_asr_after_ft": 0.8,
    ...      "clean_acc_after_fp": 0.10, "decoy_asr_after_fp": 0.0, "hidden_asr_after_fp": 0.0}
    >>> e = suppressed_entries("", t, ["ft", "fp"])
    >>> e["n_defenses_suppressed"], e["hidden_asr_after_suppressed_mean"]
    (1.0, 0.8)
    """
    ok = table["clean_acc_before"] >= IMPLANT_OK
    sup = [d for d in names if ok and _removes_decoy(table, d)]
    out = {
        f"{pre}{m}_after_{d}": table[f"{m}_after_{d}"]
        for d in names
        for m in ("clean_acc", "decoy_asr", "hidden_asr")
    }
    out[f"{pre}implant_ok"] = float(ok)
    out[f"{pre}n_defenses_suppressed"] = float(len(sup))
    h = [table[f"hidden_asr_after_{d}"] for d in sup]
    out[f"{pre}hidden_asr_after_suppressed_mean"] = float(np.mean(h)) if h else float("nan")
    for k in (
        "clean_acc_before",
        "decoy_asr_before",
        "hidden_asr_before",
        "hidden_asr_after_mean",
        "decoy_asr_after_mean",
    ):
        out[pre + k] = table[k]
    return out


def lr_entries(pre: str, table: dict) -> dict:
    """The step sizes the defenses of a table chose (``lr_<d>``), with the prefix ``pre``."""
    return {pre + k: v for k, v in table.items() if k.startswith("lr_")}


def badnets(cfg: Any, s: Setup, opt) -> Any:
    """The BadNets model: ``cfg.train_steps`` of ``opt`` on the poisoned training set, each
    batch randomly shifted by up to ``cfg.train_pad`` pixels (trigger stamped first)."""
    x, y = s.pois.x, s.pois.y
    return bd.fit(s.keys[3], s.p0, x, y, s.model.apply, opt, cfg.train_steps, cfg.batch_size,
                  pad=cfg.train_pad)[0]  # fmt: skip


def match_inner_lr(key, model, params, data, cfg: bd.DTBConfig, problem, real: float, iters=2):
    """Returns ``(config, ratio)``: ``cfg`` with ``inner_lr`` rescaled ``iters`` times by
    ``real / displacement`` of the ``"ft"`` surrogate member, and the final ratio of the
    surrogate's displacement to ``real`` (a real defense's, measured on the same model)."""
    ratio = 1.0
    for _ in range(iters + 1):
        q = bd.surrogate_defense(cfg, problem, "ft")(key, model, params, data).params
        ratio = float(bd.weight_displacement(params, q)) / max(real, 1e-12)
        if _ == iters:
            break
        cfg = dataclasses.replace(cfg, inner_lr=cfg.inner_lr / max(ratio, 1e-6))
    return cfg, ratio


def fp_mask_fn(model, data, acc_drop=0.1, max_ratio=0.8):
    """Returns ``mask_fn(params) -> masks``: fine-pruning's rule (last conv layer, by mean
    clean activation, until a relative clean-split accuracy drop ``acc_drop``)."""

    feats = jax.jit(lambda p: model.apply(p, data.x_clean, features=True)[1])
    acc = jax.jit(
        lambda p, m: bd.accuracy(
            lambda q, x: model.apply(q, x, m, m), p, data.x_clean, data.y_clean
        )
    )

    def mask_fn(params):
        layer = bd.conv_layers(params)[-1]
        order = np.argsort(np.asarray(jnp.mean(feats(params)[layer], axis=(0, 1, 2))))
        ones = np.ones(order.shape[0], np.float32)
        base, mask = float(acc(params, {layer: jnp.asarray(ones)})), ones
        for k in range(1, int(max_ratio * order.shape[0]) + 1):
            trial = mask.copy()
            trial[order[:k]] = 0.0
            if float(acc(params, {layer: jnp.asarray(trial)})) < (1 - acc_drop) * base:
                break
            mask = trial
        return {layer: jnp.asarray(mask)}

    return mask_fn


def aggregate(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean over seeds of every numeric key, and ``<key>_sd`` (sample sd; 0 for one seed;
    NaNs ignored, NaN when all are)."""
    out: dict[str, Any] = {}
    keys = list(dict.fromkeys(k for s in per_seed for k in s))  # a key missing in a seed: NaN
    for k in keys:
        v = [s.get(k, float("nan")) for s in per_seed]
        if not all(isinstance(a, (int, float)) for a in v):
            out[k] = v[0]
            continue
        a = np.asarray(v, np.float64)
        ok = a[~np.isnan(a)]
        out[k] = float(ok.mean()) if ok.size else float("nan")
        out[f"{k}_sd"] = (
            float(ok.std(ddof=1)) if ok.size > 1 else (0.0 if ok.size else float("nan"))
        )
    return out


def plot_asr(ctx: Any, tables: dict[str, dict[str, float]], names: list[str]) -> None:
    """Saves ``asr.png``: each model's hidden vs decoy ASR before (star) and after each
    defense in ``names``."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5))
    for (tag, t), color in zip(tables.items(), ("C3", "C0", "C2"), strict=False):
        xs = [t[f"decoy_asr_after_{n}"] for n in names if f"decoy_asr_after_{n}" in t]
        ys = [t[f"hidden_asr_after_{n}"] for n in names if f"hidden_asr_after_{n}" in t]
        ax.scatter(xs, ys, color=color, alpha=0.7, label=f"{tag} after")
        ax.scatter(
            [t["decoy_asr_before"]],
            [t["hidden_asr_before"]],
            marker="*",
            s=200,
            color=color,
            label=f"{tag} before",
        )
    ax.axvline(ASR_OK, color="grey", lw=0.8, ls=":")
    ax.set(xlabel="decoy ASR", ylabel="hidden ASR", xlim=(-0.05, 1.05), ylim=(-0.05, 1.05))
    ax.set_title("Hidden vs decoy ASR before and after each defense (seed 0)")
    ax.legend(fontsize=8)
    ctx.save_plot(fig, "asr")


def plot_trajectory(ctx: Any, trajs: dict[str, dict[str, np.ndarray]]) -> None:
    """Saves ``trajectory.png``: decoy and hidden ASR along one real fine-tuning run."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for (tag, t), color in zip(trajs.items(), ("C3", "C0", "C2"), strict=False):
        ax.plot(t["step"], t["decoy_asr"], color=color, ls="--", label=f"{tag} decoy")
        ax.plot(t["step"], t["hidden_asr"], color=color, label=f"{tag} hidden")
    ax.set(xlabel="fine-tuning step", ylabel="ASR", ylim=(-0.05, 1.05))
    ax.set_title("ASR along a real fine-tuning run (seed 0)")
    ax.legend(fontsize=8)
    ctx.save_plot(fig, "trajectory")


@dataclasses.dataclass
class Setup:
    """One seed's data, model, triggers and defender's data (see :func:`setup`)."""

    model: Any
    p0: Any
    problem: Any
    pois: Any
    data: Any
    test: tuple
    attacker: tuple
    held: tuple
    keys: Any


def implants(ctx: Any, stage: Stages, cfg: Any, s: Setup, arms: dict, opt, seed: int):
    """Returns ``(models, infos)``: the study's implants. A shared warm phase of
    ``cfg.warm_steps`` on ``arms["naive"]``'s objective from ``s.p0`` (none at 0), then each
    arm ``tag: (config, implant kwargs)`` ``cfg.dtb_steps`` from it, keeping the checkpoint
    best on the attacker's held-out images; each checkpointed for ``--resume`` (``infos``
    holds the arms trained in this run)."""
    models, infos = {}, {}
    (xa, ya), h = s.attacker, s.held  # the attacker's images stand in for the clean split too
    with stage("implant_warm"), ctx.checkpointed(f"seed{seed}_warm", s.p0) as (st, warm, save):
        if st == 0 and cfg.warm_steps:
            warm = bd.implant(s.keys[8], s.model, s.p0, s.problem, xa, ya, xa, ya,
                              arms["naive"][0], opt, cfg.warm_steps, cfg.batch_size)[0]  # fmt: skip
            save(0, warm)
    for tag, (c, kw) in arms.items():
        with stage(f"implant_{tag}"), ctx.checkpointed(f"seed{seed}_{tag}", warm) as (st, p, save):
            if st == 0:
                args = (s.keys[4], s.model, warm, s.problem, xa, ya, xa, ya, c, opt)
                p, infos[tag] = bd.implant(*args, cfg.dtb_steps, cfg.batch_size, held=h, **kw)
                save(0, p)
        models[tag] = p
    return models, infos


def make_model(cfg: Any, num_classes: int = 10):
    """The study's classifier: ``cfg.model`` ``"cnn"`` (:class:`hexad.backdoor.SmallCNN`) or
    ``"preact"`` (:class:`hexad.backdoor.PreActResNet`)."""
    if cfg.model == "cnn":
        return bd.SmallCNN(num_classes, cfg.widths, cfg.hidden)
    if cfg.model == "preact":
        return bd.PreActResNet(num_classes, cfg.widths, cfg.groups)
    raise ValueError(f"model: expected 'cnn' or 'preact', got {cfg.model!r}")


def setup(cfg: Any, images: Any, seed: int) -> Setup:
    """Splits ``images`` (1/6 test; the defender's clean split the last 5% of the rest; of the
    others, the attacker's, ``ATTACKER_HELD`` held out to select the implant's checkpoint,
    the rest its training images; the four are disjoint), builds the triggers (decoy: a
    checkerboard patch of side ``size / 8`` at the bottom-right; hidden: a uniform-noise
    blend), the CNN and its initialisation, the BadNets-poisoned training set and the
    defender's :class:`hexad.backdoor.DefenseData` (with decoy-triggered non-target clean
    rows as BackdoorBench's backdoor validation data)."""
    from hexad.data.images import train_test_split

    tr, te = train_test_split(images, 1 / 6, seed=seed)
    x, y = jnp.asarray(tr.x), jnp.asarray(tr.y)
    n_c = int(0.05 * x.shape[0])
    keys = jax.random.split(jax.random.key(seed), 10)
    shape = x.shape[1:]
    decoy = bd.patch_trigger(shape, size=max(2, cfg.size // 8))
    hidden = bd.blend_trigger(keys[0], shape, cfg.blend_alpha)
    problem = bd.DTBProblem(decoy, hidden, cfg.decoy_target, cfg.hidden_target)
    model = make_model(cfg, images.num_classes)
    p0 = jax.jit(model.init)(keys[1], x[:1])
    pois = bd.poison(keys[2], x, y, decoy, cfg.poison_rate, cfg.decoy_target, images.num_classes)
    xc, yc = x[-n_c:], y[-n_c:]
    n_a = x.shape[0] - n_c - int(ATTACKER_HELD * (x.shape[0] - n_c))  # attacker's training rows
    nt = yc != cfg.decoy_target
    x_bd = bd.apply_trigger(decoy, xc[nt])
    data = bd.DefenseData(xc, yc, pois.x, pois.y, x_bd, jnp.full(x_bd.shape[0], cfg.decoy_target))
    test = (jnp.asarray(te.x), jnp.asarray(te.y))
    held = (x[n_a:-n_c], y[n_a:-n_c])
    return Setup(model, p0, problem, pois, data, test, (x[:n_a], y[:n_a]), held, keys)


def trajectories(ctx: Any, s: Setup, models: dict, n_steps: int) -> None:
    """Logs and plots (``trajectory.png``) clean accuracy and both ASRs along one real
    fine-tuning run of ``n_steps`` for each model of ``models``."""
    trajs = {}
    for tag, p in models.items():
        t = bd.finetune_trajectory(
            s.keys[7], s.model, p, s.data, s.test, s.problem, n_steps, max(1, n_steps // 20)
        )
        trajs[tag] = t
        for i, step in enumerate(t["step"]):
            row = {k: float(t[k][i]) for k in ("clean_acc", "decoy_asr", "hidden_asr")}
            ctx.log(trajectory=tag, step=int(step), **row)
    plot_trajectory(ctx, trajs)
