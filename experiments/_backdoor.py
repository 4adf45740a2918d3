"""Shared code of the backdoor study (``backdoor_dtb``); not a study.

- :func:`efficacy_entries`: the calibration stage's figures per defense on a BadNets model.
- :func:`suppressed_entries`: hidden ASR after the defenses that suppressed the decoy and
  kept the clean accuracy.
- :func:`match_surrogate`: the surrogate's step size chosen so that what it does to a BadNets
  model (clean accuracy, decoy ASR) is closest to what the real defenses do.
- :func:`fp_operator`: the real fine-pruning run as an operator (its mask and its path), the
  oracle DTB's inner step and the mask control's mask.
- :func:`control_arms`, :func:`mask_control`, :func:`oracle_control`,
  :func:`surrogate_control`: the implant arms and the three positive controls.
- :func:`events`, :func:`verdict`, :func:`summarise`: the informative events, the pre-stated
  verdict and the study's summary.
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

from experiments import _verdicts
from hexad import backdoor as bd

ASR_OK, ACC_LOSS_OK = 0.2, 0.05  # a defense removes a backdoor: ASR below, accuracy kept
IMPLANT_OK = 0.5  # an implanted model below this clean accuracy (10 classes) has collapsed
ATTACKER_HELD = 0.1  # the share of the attacker's images held out to select the implant
COLLAPSE_OK = 0.05  # clean images sent to the hidden target after a defense: at most this
# The pre-stated gates and thresholds of the verdict (experiments/backdoor_dtb.py docstring)
SEED_SHARE = 2 / 3  # "on >= 2 of 3 seeds"
MIN_ADMITTED, MIN_EVENTS = 6, 10
USABLE_DECOY, USABLE_HIDDEN = 0.9, 0.05
MASK_HIDDEN, MASK_DORMANT, MASK_ACC = 0.8, 0.05, 0.03
ORACLE_HIDDEN, SURROGATE_ACC = 0.5, 0.05
REPRODUCED, PARTLY = 0.5, 0.2


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
    """Per defense ``<pre>{clean_acc,decoy_asr,hidden_asr,clean_to_hidden}_after_<d>`` and
    ``<pre>acted_<d>`` (1 when it moved the weights, 0 when it returned the model as given:
    "did not act"); ``<pre>implant_ok``;
    ``<pre>n_defenses_suppressed`` and ``<pre>hidden_asr_after_suppressed_mean`` (NaN when
    none suppressed); the unconditional means.

    A defense suppresses the decoy when its ASR after is below 0.2 *and* the model keeps its
    clean accuracy (< 5 points lost, the calibration's rule): a defense that wrecks the model
    also zeroes every ASR, which says nothing of the backdoors. An implant is ok when its clean
    accuracy before any defense is at least ``IMPLANT_OK``; a failed implant suppresses nothing.

    >>> t = {"clean_acc_before": 0.95, "decoy_asr_before": 1.0, "hidden_asr_before": 0.0,
    ...      "clean_to_hidden_before": 0.0, "hidden_asr_after_mean": 0.4,
    ...      "decoy_asr_after_mean": 0.05,
    ...      "clean_acc_after_ft": 0.93, "decoy_asr_after_ft": 0.1, "hidden_asr_after_ft": 0.8,
    ...      "clean_acc_after_fp": 0.10, "decoy_asr_after_fp": 0.0, "hidden_asr_after_fp": 0.0,
    ...      "clean_to_hidden_after_ft": 0.0, "clean_to_hidden_after_fp": 1.0,
    ...      "displacement_ft": 1.0, "displacement_fp": 2.0}
    >>> e = suppressed_entries("", t, ["ft", "fp"])
    >>> e["n_defenses_suppressed"], e["hidden_asr_after_suppressed_mean"]
    (1.0, 0.8)
    """
    ok = table["clean_acc_before"] >= IMPLANT_OK
    sup = [d for d in names if ok and _removes_decoy(table, d)]
    out = {
        f"{pre}{m}_after_{d}": table[f"{m}_after_{d}"]
        for d in names
        for m in ("clean_acc", "decoy_asr", "hidden_asr", "clean_to_hidden")
    }
    out |= {f"{pre}acted_{d}": float(table[f"displacement_{d}"] > 0) for d in names}
    out[f"{pre}implant_ok"] = float(ok)
    out[f"{pre}n_defenses_suppressed"] = float(len(sup))
    h = [table[f"hidden_asr_after_{d}"] for d in sup]
    out[f"{pre}hidden_asr_after_suppressed_mean"] = float(np.mean(h)) if h else float("nan")
    for k in (
        "clean_acc_before",
        "decoy_asr_before",
        "hidden_asr_before",
        "clean_to_hidden_before",
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


def match_surrogate(key, model, params, s: Setup, cfg: bd.DTBConfig, lrs, target):
    """Returns ``(config, rows)``: ``cfg`` with the ``inner_lr`` among ``lrs`` whose surrogate
    (each family member on ``params``, a BadNets model; the mean of their test figures) is
    closest to ``target = (clean accuracy, decoy ASR)`` after the real defenses, in
    ``|accuracy gap| + |decoy ASR gap|``: the surrogate calibrated on what defenses do, not
    on how far they move the weights. ``rows``: ``(lr, accuracy, decoy ASR)`` per candidate."""
    rows = []
    for lr in lrs:
        c = dataclasses.replace(cfg, inner_lr=float(lr))
        m = surrogate_figures(key, model, params, s, c)
        rows.append((float(lr), m["clean_acc"], m["decoy_asr"]))
    gap = [abs(a - target[0]) + abs(d - target[1]) for _, a, d in rows]
    return dataclasses.replace(cfg, inner_lr=rows[int(np.argmin(gap))][0]), rows


def surrogate_figures(key, model, params, s: Setup, cfg: bd.DTBConfig) -> dict[str, float]:
    """The test figures after the surrogate, the mean over the family's members (each run on
    the attacker's own images, which stand in for the defender's clean split)."""
    data = bd.DefenseData(*s.attacker_split)
    figs = []
    for member in cfg.family:
        q = bd.surrogate_defense(cfg, s.problem, member)(key, model, params, data).params
        figs.append(jax.device_get(bd.evaluate(model, q, *s.test, s.problem))._asdict())
    return {k: float(np.mean([f[k] for f in figs])) for k in figs[0]}


def fp_operator(key, model, data, n_steps: int):
    """Returns ``op(params) -> (masks, deltas)``: the real fine-pruning defense
    (:func:`hexad.backdoor.make_defense`, BackdoorBench's settings, ``n_steps``) run on
    ``params`` with ``data``, as the oracle's inner step: its mask (``info["mask"]``) and
    the displacements of its two-point path, the pruned model (0) and its end (the output
    less the pruned model), as :class:`hexad.backdoor.DTBBatch` carries them."""
    fp = bd.make_defense("fp", n_steps)

    def op(params):
        out = fp(key, model, params, data)
        m = out.info["mask"]
        start = bd.apply_channel_mask(params, m)
        end = jax.tree.map(jnp.subtract, out.params, start)
        deltas = jax.tree.map(lambda e: jnp.stack([jnp.zeros_like(e), e]), end)
        return m, deltas

    return op


def events(per_seed: list[dict], names: list[str], admitted: list[str]) -> dict[str, Any]:
    """The informative events: every (seed, admitted defense) where the defense acted on the
    DTB model (moved its weights), suppressed its decoy (ASR < ``ASR_OK``, < ``ACC_LOSS_OK``
    of clean accuracy lost) and did not collapse it (clean images sent to the hidden target
    at most ``COLLAPSE_OK``). Returns their lists ``events_defense``, ``events_seed``,
    ``events_hidden_asr`` (DTB) and ``events_naive_hidden_asr`` (the naive model after the
    same defense on the same seed), ``informative_events`` (count), and per defense the
    hidden ASR given suppression, ``hidden_asr_given_suppressed_<d>`` (mean over its events;
    NaN without one); ``collapse_rate_after_mean``: the mean over seeds and the model-repair
    defenses of ``names`` of the DTB model's clean-to-hidden rate after them."""
    ev: dict[str, list] = {"defense": [], "seed": [], "hidden": [], "naive": []}
    for i, s in enumerate(per_seed):
        before = s["clean_acc_before"]
        for d in admitted:
            ok = (
                s[f"acted_{d}"]
                and s[f"decoy_asr_after_{d}"] < ASR_OK
                and before - s[f"clean_acc_after_{d}"] < ACC_LOSS_OK
                and s[f"clean_to_hidden_after_{d}"] <= COLLAPSE_OK
            )
            if ok:
                ev["defense"].append(d)
                ev["seed"].append(i)
                ev["hidden"].append(float(s[f"hidden_asr_after_{d}"]))
                ev["naive"].append(float(s[f"naive_hidden_asr_after_{d}"]))
    out: dict[str, Any] = {
        "events_defense": ev["defense"],
        "events_seed": ev["seed"],
        "events_hidden_asr": ev["hidden"],
        "events_naive_hidden_asr": ev["naive"],
        "informative_events": len(ev["hidden"]),
    }
    for d in admitted:
        h = [v for v, e in zip(ev["hidden"], ev["defense"], strict=True) if e == d]
        out[f"hidden_asr_given_suppressed_{d}"] = float(np.mean(h)) if h else float("nan")
    repair = [d for d in names if d not in bd.defenses.RETRAINS]
    rates = [s[f"clean_to_hidden_after_{d}"] for s in per_seed for d in repair]
    out["collapse_rate_after_mean"] = float(np.mean(rates)) if rates else float("nan")
    return out


def admitted_defenses(per_seed: list[dict], names: list[str]) -> list[str]:
    """The calibration gate: the model-repair defenses (not retraining from data) that remove
    the BadNets backdoor (``efficacy_<d>``) on at least ``SEED_SHARE`` of the seeds."""
    need = SEED_SHARE * len(per_seed) - 1e-9
    return [
        d
        for d in names
        if d not in bd.defenses.RETRAINS and sum(s[f"efficacy_{d}"] for s in per_seed) >= need
    ]


def verdict(summary: dict[str, Any]) -> tuple[str, list[str], Any]:
    """The pre-stated verdict (experiments/backdoor_dtb.py docstring) from a summary's keys:
    ``(verdict, failed gates, the paired comparison with the naive model or None)``."""
    failed = []
    if summary["calibration_admitted"] < MIN_ADMITTED:
        failed.append(f"calibration admitted {summary['calibration_admitted']} < {MIN_ADMITTED}")
    for c in ("mask", "oracle_fp", "surrogate"):
        if not summary[f"control_{c}_pass"]:
            failed.append(f"control_{c} failed")
    if not summary["implant_usable"]:
        failed.append("implant not usable")
    if summary["informative_events"] < MIN_EVENTS:
        failed.append(f"informative events {summary['informative_events']} < {MIN_EVENTS}")
    h, n = summary["events_hidden_asr"], summary["events_naive_hidden_asr"]
    cmp = None
    if len(h) >= 2:
        interval = "bca" if len(h) >= 10 else "t"
        cmp = _verdicts.paired(h, n, margin=_verdicts.MARGINS["dtb"], direction="greater",
                               interval=interval)  # fmt: skip
    if failed:
        return "not tested", failed, cmp
    med = float(np.median(h))
    if med >= REPRODUCED and cmp is not None and cmp.outcome == "reproduced":
        return "reproduced", failed, cmp
    if med >= PARTLY:
        return "partly", failed, cmp
    return "not reproduced", failed, cmp


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
    attacker_split: tuple = ()


def implants(ctx: Any, stage: Stages, cfg: Any, s: Setup, arms: dict, opt, seed: int):
    """Returns ``(models, infos)``: the study's implants. A shared warm phase of
    ``cfg.warm_steps`` on ``arms["naive"]``'s objective from ``s.p0`` (none at 0), then each
    arm ``tag: (config, implant kwargs)`` ``cfg.dtb_steps`` from it, keeping the checkpoint
    best on the attacker's held-out images; each checkpointed for ``--resume`` (``infos``
    holds the arms trained in this run). An arm's kwargs may be a function of the warm model
    (``kw(warm) -> dict``: an operator fixed at, or first computed from, the warm model)."""
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
                kw = kw(warm) if callable(kw) else kw
                args = (s.keys[4], s.model, warm, s.problem, xa, ya, xa, ya, c, opt)
                p, infos[tag] = bd.implant(*args, cfg.dtb_steps, cfg.batch_size, held=h, **kw)
                save(0, p)
        models[tag] = p
    models["warm"] = warm
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
    split = (x[:n_c], y[:n_c])  # the attacker's stand-in for the clean split, its own images
    return Setup(model, p0, problem, pois, data, test, (x[:n_a], y[:n_a]), held, keys, split)


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


# --- the study's stages and controls (experiments/backdoor_dtb.py) -------------------------

ARM_STATS = ("gate", "clean_post", "decoy_post", "decoy_prob_after", "hidden_prob_after",
             "collapse_after")  # fmt: skip


def calibration_entries(t_bad: dict[str, float], calib: list[str]) -> dict[str, float]:
    """The calibration stage's figures (:func:`efficacy_entries`, the chosen step sizes,
    BadNets' own) and the surrogate's target: the mean clean accuracy and decoy ASR after the
    model-repair defenses that removed BadNets on this seed (all of them if none did)."""
    out = efficacy_entries(t_bad, calib) | lr_entries("calib_", t_bad)
    out |= {"badnets_clean_acc": t_bad["clean_acc_before"],
            "badnets_asr": t_bad["decoy_asr_before"]}  # fmt: skip
    repair = [d for d in calib if d not in bd.defenses.RETRAINS]
    eff = [d for d in repair if out[f"efficacy_{d}"]] or repair
    out["surrogate_target_acc"] = float(np.mean([t_bad[f"clean_acc_after_{d}"] for d in eff]))
    out["surrogate_target_asr"] = float(np.mean([t_bad[f"decoy_asr_after_{d}"] for d in eff]))
    return out


def naive_config(dcfg: bd.DTBConfig) -> bd.DTBConfig:
    """The naive two-backdoor objective: no surrogate, no post-sanitisation terms."""
    return dataclasses.replace(dcfg, w_hidden_post=0.0, w_clean_post=0.0, w_decoy_post=0.0,
                               inner_steps=0, family=("ft",))  # fmt: skip


def control_arms(dcfg: bd.DTBConfig, fp_op, dtb_steps: int, oracle_every: int):
    """Returns ``(arms, fixed)``: the study's four implant arms for :func:`implants`, ``naive``,
    ``dtb`` (``dcfg``), ``mask`` (the hidden backdoor at FP's mask, fixed at the warm model:
    ``gate="always"``, no decoy term) and ``oracle`` (the ``"delta"`` member on the real FP,
    ``fp_op``, rerun every ``oracle_every`` steps); ``fixed`` receives the mask control's mask
    once its arm starts."""
    fixed, cache = {}, {}  # one FP run gives the oracle's masks and displacements at once

    def mask_kw(warm):
        fixed["mask"] = fp_op(warm)[0]
        return {"mask_fn": lambda p: fixed["mask"], "mask_every": dtb_steps + 1}

    def oracle_mask(p):
        cache["op"] = fp_op(p)
        return cache["op"][0]

    mask_cfg = dataclasses.replace(dcfg, family=("mask_ft",), inner_steps=0, gate="always",
                                   w_decoy_post=0.0)  # fmt: skip
    oracle_cfg = dataclasses.replace(dcfg, family=("delta",), path_points=2)
    oracle_kw = {"mask_fn": oracle_mask, "delta_fn": lambda p, m: cache["op"][1],
                 "mask_every": oracle_every}  # fmt: skip
    arms = {"naive": (naive_config(dcfg), {}), "dtb": (dcfg, {}), "mask": (mask_cfg, mask_kw),
            "oracle": (oracle_cfg, oracle_kw)}  # fmt: skip
    return arms, fixed


def arm_entries(infos: dict, dtb_steps: int) -> dict[str, float]:
    """Each trained arm's kept step and its training figures over its last 20% of steps,
    ``<arm>_<stat>_mean`` for ``stat`` in :data:`ARM_STATS`."""
    tail = slice(int(0.8 * dtb_steps), None)
    out = {f"{t}_implant_best_step": float(i.best_step) for t, i in infos.items()}
    for t, i in infos.items():
        for k in ARM_STATS:
            out[f"{t}_{k}_mean"] = float(jnp.mean(getattr(i.steps, k)[tail]))
    return out


def metrics(s: Setup, params) -> dict[str, float]:
    """A model's test figures (:func:`hexad.backdoor.evaluate`) as floats."""
    m = jax.device_get(bd.evaluate(s.model, params, *s.test, s.problem))
    return {k: float(v) for k, v in m._asdict().items()}


def evaluable(clean_acc: float, decoy_asr: float | None = None) -> bool:
    """Whether a control can be evaluated on a model: it has not collapsed (clean accuracy
    >= ``IMPLANT_OK``) and, where a decoy is to be suppressed, carries it (ASR >= 0.5). A
    collapsed model "keeps" its chance accuracy and has no decoy to lose, so every control
    would pass on it; one that cannot be evaluated fails."""
    ok = clean_acc >= IMPLANT_OK
    return ok and (decoy_asr is None or decoy_asr >= 0.5)


def mask_control(s: Setup, models: dict, mask) -> dict[str, float]:
    """The mask control's figures and its per-seed result ``control_mask_seed`` (1/0): the
    mask arm's hidden ASR at ``mask`` >= ``MASK_HIDDEN`` and <= ``MASK_DORMANT`` without it,
    its clean accuracy within ``MASK_ACC`` of the naive implant's, without the mask and at it."""
    at = lambda p: bd.apply_channel_mask(p, mask)
    arms = (models["mask"], at(models["mask"]), models["naive"], at(models["naive"]))
    m, m_at, n_, n_at = (metrics(s, p) for p in arms)
    out = {
        "mask_hidden_asr_at_mask": m_at["hidden_asr"],
        "mask_hidden_asr": m["hidden_asr"],
        "mask_clean_acc": m["clean_acc"],
        "mask_clean_acc_at_mask": m_at["clean_acc"],
        "naive_clean_acc_at_mask": n_at["clean_acc"],
        "mask_pruned": float(sum(float(np.sum(1 - np.asarray(v))) for v in mask.values())),
    }
    out["control_mask_seed"] = float(
        evaluable(n_["clean_acc"])
        and m_at["hidden_asr"] >= MASK_HIDDEN
        and m["hidden_asr"] <= MASK_DORMANT
        and n_["clean_acc"] - m["clean_acc"] <= MASK_ACC
        and n_at["clean_acc"] - m_at["clean_acc"] <= MASK_ACC
    )
    return out


def oracle_control(t_or: dict[str, float]) -> dict[str, float]:
    """The FP control from the oracle's table after the real FP: its figures and
    ``control_oracle_fp_seed`` (1/0: the decoy suppressed with the accuracy kept, hidden ASR
    >= ``ORACLE_HIDDEN``, at most ``COLLAPSE_OK`` of clean images to the hidden target)."""
    out = {f"oracle_{m}_after_fp": t_or[f"{m}_after_fp"]
           for m in ("clean_acc", "decoy_asr", "hidden_asr", "clean_to_hidden")}  # fmt: skip
    out["oracle_decoy_asr_before"] = t_or["decoy_asr_before"]
    out["oracle_hidden_asr_before"] = t_or["hidden_asr_before"]
    lost = t_or["clean_acc_before"] - t_or["clean_acc_after_fp"]
    out["control_oracle_fp_seed"] = float(
        evaluable(t_or["clean_acc_before"], t_or["decoy_asr_before"])
        and t_or["decoy_asr_after_fp"] < ASR_OK
        and lost < ACC_LOSS_OK
        and t_or["hidden_asr_after_fp"] >= ORACLE_HIDDEN
        and t_or["clean_to_hidden_after_fp"] <= COLLAPSE_OK
    )
    return out


def surrogate_control(out: dict[str, float], sur: dict[str, float]) -> dict[str, float]:
    """The surrogate control: ``surrogate_<metric>`` (the DTB implant after its own surrogate,
    on test images) and ``control_surrogate_seed`` (1/0: accuracy within ``SURROGATE_ACC`` of
    the implant's, decoy ASR below ``ASR_OK``); ``out`` holds the implant's figures before."""
    res = {f"surrogate_{k}": v for k, v in sur.items()}
    res["control_surrogate_seed"] = float(
        evaluable(out["clean_acc_before"], out["decoy_asr_before"])
        and out["clean_acc_before"] - sur["clean_acc"] <= SURROGATE_ACC
        and sur["decoy_asr"] < ASR_OK
    )
    return res


def summarise(per_seed: list[dict], defenses: list[str], compositions: list[str]) -> dict:
    """The study's summary: the means over seeds (:func:`aggregate`), the controls over seeds,
    the calibration gate, the informative events and the pre-stated :func:`verdict`; with
    ``seed_rows``, each seed's own figures, so that a study run in seed parts (``--set
    n_seeds=1 --seed k``, one folder each) is summarised again from all of its seeds
    (:func:`join_parts`)."""
    names = [*defenses, *compositions]
    out = aggregate(per_seed)
    out["defenses"] = names
    out["defenses_calibrated"] = list(defenses)
    out["seed_rows"] = [dict(r) for r in per_seed]  # a run in seed parts is re-summarised
    out["n_seeds_run"] = float(len(per_seed))
    need = SEED_SHARE * len(per_seed) - 1e-9
    for c in ("mask", "oracle_fp", "surrogate"):
        out[f"control_{c}_pass"] = bool(sum(p[f"control_{c}_seed"] for p in per_seed) >= need)
    admitted = admitted_defenses(per_seed, defenses)
    out["calibration_admitted"] = len(admitted)
    out["calibration_admitted_list"] = admitted
    out["implant_usable"] = bool(
        out["decoy_asr_before"] >= USABLE_DECOY and out["hidden_asr_before"] <= USABLE_HIDDEN
    )
    out |= events(per_seed, names, admitted)
    h = out["events_hidden_asr"]
    out["events_median_hidden_asr"] = float(np.median(h)) if h else float("nan")
    out["verdict"], out["verdict_failed"], cmp = verdict(out)
    if cmp is not None:
        out |= {
            "events_vs_naive_mean": cmp.effect_mean,
            "events_vs_naive_ci_low": cmp.ci_low,
            "events_vs_naive_ci_high": cmp.ci_high,
            "events_vs_naive_outcome": cmp.outcome,
        }
    return out


def join_parts(parts: list[dict]) -> dict:
    """The summary of a study run in seed parts: :func:`summarise` over every part's
    ``seed_rows`` (the parts must have run the same defenses)."""
    rows = [r for p in parts for r in p["seed_rows"]]
    calibrated = parts[0]["defenses_calibrated"]
    names = parts[0]["defenses"]
    if any(p["defenses"] != names for p in parts):
        raise ValueError("parts: expected parts that ran the same defenses")
    return summarise(rows, list(calibrated), [n for n in names if n not in calibrated])
