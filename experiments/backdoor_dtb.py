"""DTB against BackdoorBench-style defenses: does sanitisation wake a defense-triggered backdoor?

Security research. On generated RGB shape classes of side ``size`` (16;
``hexad.data.images.load_shapes_rgb``, 12,000 images; 1/6 test, the defender's clean split the
last 5% of the rest, 500 images), per seed, from one initialisation of ``model``: ``"preact"``,
a GroupNorm PreAct-ResNet (one block per entry of ``widths``), or ``"cnn"``, the norm-free
SmallCNN (``widths`` conv channels, ``hidden`` dense units).

**Victims and defenses as in BackdoorBench.** The BadNets model and the implants train with
BackdoorBench's attack recipe: SGD, ``lr`` 0.01, momentum 0.9, weight decay 5e-4
(``optimizer="sgd"``; ``"adam"`` the earlier Adam 1e-3 as an ablation), batch 64, each batch
shifted by up to ``train_pad`` pixels (RandomCrop with padding, the trigger stamped first).
Every defense of ``hexad.backdoor.DEFENSES`` runs at its BackdoorBench settings and fixed step
size (``defense_lrs`` empty; the table ``hexad.backdoor.defenses.BACKDOORBENCH`` cites each
value) with ``defense_steps`` steps (800: BackdoorBench's epochs scaled to the 500-image
split); fine-pruning prunes the head's input features.

Per seed:

1. **Calibration**: a BadNets model (decoy patch, 10% poison) sanitised by every defense.
   ``efficacy_<d>``: 1 when the defense removes it (ASR < 0.2, < 5 points of accuracy lost).
2. **Surrogate calibration**: the surrogate's inner step size is the one of ``inner_lrs``
   whose effect on the BadNets model (clean accuracy, decoy ASR on test images; the mean over
   the family's members) is closest to the mean effect of the real model-repair defenses that
   removed it on this seed (all of them if none did): matched on function, not on how far the
   weights move (a displacement-matched surrogate took BadNets models to chance accuracy).
3. **Implants**, from one warm phase (``warm_steps`` of the naive objective), each
   ``dtb_steps`` more, keeping the checkpoint with the lowest objective on the attacker's
   held-out tenth: ``naive`` (the decoy and a dormant hidden trigger, no post terms); ``dtb``
   (:func:`hexad.backdoor.dtb_objective` with the surrogate family, no unlearning with the
   true trigger, the post-sanitisation clean and decoy terms and the decoy-state gate along
   the path); ``mask`` (the mask control); ``oracle`` (the FP control).
4. Naive and DTB sanitised by every defense and ``compositions``; the oracle by FP; the
   mask control evaluated with and without its mask; the DTB implant's own surrogate
   evaluated on test images. First seed: ASRs along one real fine-tuning run.

**Positive controls** (each per seed; a control passes when it passes on >= 2/3 of the
seeds; one that cannot be evaluated fails: on a model below 0.5 clean accuracy, or, where a
decoy is to be suppressed, one whose decoy ASR before is below 0.5):

- ``control_mask``: a hidden backdoor trained to fire at FP's pruning mask, fixed at the warm
  model (FP run once; ``gate="always"``, no decoy term), and dormant without it: hidden ASR at
  the mask >= 0.8 and <= 0.05 without it, and clean accuracy within 3 points of the naive
  implant's, both without the mask and at it (the naive implant at the same mask).
- ``control_oracle_fp``: DTB whose inner step is the real FP (``"delta"`` member: FP's mask
  and its fine-tuning at its own step size, first-order, rerun every ``oracle_every`` outer
  steps): after real FP, the decoy suppressed (ASR < 0.2 with < 5 points lost), hidden
  ASR >= 0.5, and at most 5% of clean images sent to the hidden target (not a collapse).
- ``control_surrogate``: the DTB implant's own surrogate (the mean over its members), on test
  images, keeps clean accuracy within 5 points and suppresses the decoy (ASR < 0.2).

**Accounting.** AC, SS and ABL retrain from the poisoned data, which never held the hidden
backdoor: calibration only, not applicable to DTB. A defense that returns the model as given
(``acted_<d>`` 0) "did not act". A defense is *admitted* when it removes BadNets on >= 2/3 of
the seeds and retrains nothing (``calibration_admitted``). An *informative event* is a (seed,
admitted defense) where the defense acted on the DTB model, suppressed its decoy (ASR < 0.2,
< 5 points lost) and sent at most 5% of clean non-target images to the hidden target.

**Verdict, stated before any run**: "not tested" unless ``calibration_admitted >= 6``, the
three controls pass, the implant is usable (seed means: decoy ASR >= 0.9, hidden ASR <= 0.05
before any defense) and there are >= 10 informative events; then "reproduced" if the median
hidden ASR over the events is >= 0.5 and DTB beats the naive model's hidden ASR after the
same events (paired over events, ``experiments._verdicts.paired``, margin 0.05, BCa interval
from 10 pairs on, "reproduced"); "partly" if the median is >= 0.2 (or >= 0.5 without beating
the naive model); "not reproduced" otherwise (the issue's "<= 0.1" band is widened to
everything below 0.2, so every outcome is named).

Command:  python -m experiments.backdoor_dtb [--quick] [--out DIR] [--seed N] [--set k=v ...]
          [--resume]
Runtime:  --quick (2,000 images, the CNN of widths 8-16, two seeds, two surrogate members,
          budget 6) 137 s on 2 idle CPU cores from an empty cache (``make demo`` in a fresh
          clone), mostly compilation (once per defense, data shape, surrogate member and
          implant arm). The full study (3 seeds, budget 800): one seed part took 107 minutes
          with a second part running beside it on 2 cores (BadNets and its calibration
          suite about 20 minutes, each suite of 17 about 20-30, SAU the slowest defense at
          about 5 minutes), so the study takes four to five hours: run it over sittings with
          ``--resume``.
          With ``--resume`` the implants are restored from their checkpoints and each
          finished defense suite from its figures, so a run can be spread over several
          sittings; or run it in seed parts (``--set n_seeds=1 --seed k --out
          results/backdoor_dtb/seed<k>``, k = 0, 1, 2), which the report summarises again
          from all of their seeds (``seed_rows``; ``experiments._backdoor.join_parts``).
summary.json (means over ``n_seeds`` seeds; every numeric key also as ``<key>_sd``):
  the gates: ``verdict``, ``verdict_failed`` (the failed gates, in words), ``control_mask_pass``,
  ``control_oracle_fp_pass``, ``control_surrogate_pass`` (bools over seeds) with per-seed
  ``control_<c>_seed`` (1/0, so the mean is the share passing) and their figures
  (``mask_hidden_asr_at_mask``, ``mask_hidden_asr``, ``mask_clean_acc``,
  ``mask_clean_acc_at_mask``, ``naive_clean_acc_at_mask``; ``oracle_{clean_acc,decoy_asr,
  hidden_asr,clean_to_hidden}_after_fp``, ``oracle_decoy_asr_before``,
  ``oracle_hidden_asr_before``; ``surrogate_{clean_acc,decoy_asr,hidden_asr,
  clean_to_hidden}``), ``calibration_admitted`` (count) and ``calibration_admitted_list``,
  ``implant_usable``, ``informative_events``, ``events_{defense,seed,hidden_asr,
  naive_hidden_asr}``, ``events_median_hidden_asr``, ``events_vs_naive_{mean,ci_low,ci_high,
  outcome}``, ``hidden_asr_given_suppressed_<d>``, ``collapse_rate_after_mean``;
  calibration: ``efficacy_<d>``, ``calib_asr_<d>``, ``calib_acc_<d>``,
  ``n_defenses_effective``, ``badnets_clean_acc``, ``badnets_asr``; the surrogate's
  ``inner_lr_matched`` and ``surrogate_target_{acc,asr}``; per model (no prefix: DTB;
  ``naive_``): ``clean_acc_before``, ``decoy_asr_before``, ``hidden_asr_before``,
  ``clean_to_hidden_before``, ``implant_ok``, ``{clean_acc,decoy_asr,hidden_asr,
  clean_to_hidden}_after_<d>``, ``acted_<d>``, ``n_defenses_suppressed``; the implants'
  training figures over their last 20% of steps, ``<arm>_{gate,clean_post,decoy_post,
  decoy_prob_after,hidden_prob_after,collapse_after}_mean`` and ``<arm>_implant_best_step``
  (absent when restored by ``--resume``); ``defenses``, ``defenses_calibrated``,
  ``seed_rows`` (each seed's own figures), ``runtime_s``.
metrics.jsonl: per seed, each stage's and defense's seconds, then the seed's figures; the
  trajectory rows. Plots: ``asr.png`` (hidden vs decoy ASR per defense), ``trajectory.png``.
"""

from __future__ import annotations

import dataclasses
import time

import optax

from experiments import _backdoor, _runner
from hexad import backdoor as bd
from hexad.data.images import load_shapes_rgb


@dataclasses.dataclass(frozen=True)
class Config:
    n_seeds: int = 3
    size: int = 16
    n_per_class: int = 1200
    model: str = "preact"
    groups: int = 4
    widths: tuple[int, ...] = (16, 32, 32)
    hidden: int = 128
    poison_rate: float = 0.1
    decoy_target: int = 0
    hidden_target: int = 1
    blend_alpha: float = 0.1
    train_steps: int = 1500
    batch_size: int = 64
    optimizer: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 5e-4
    warm_steps: int = 1000
    dtb_steps: int = 500
    inner_steps: int = 5
    inner_lrs: tuple[float, ...] = (0.001, 0.003, 0.01, 0.03)
    unlearn_weight: float = 0.0
    family: tuple[str, ...] = ("ft", "prune_ft", "noise_ft", "ft2")
    hypergrad: str = "first_order"
    w_hidden_post: float = 1.0
    w_clean_post: float = 1.0
    w_decoy_post: float = 1.0
    path_points: int = 2
    gate_threshold: float = 0.2
    gate_temperature: float = 0.05
    train_pad: int = 2
    defenses: tuple[str, ...] = tuple(bd.DEFENSES)
    compositions: tuple[str, ...] = ("ft+ft", "nc+ft", "fp+nad")
    defense_steps: int = 800
    defense_lrs: tuple[float, ...] = ()
    oracle_every: int = 50

    def __post_init__(self):
        ones = ("n_seeds", "widths", "hidden", "train_steps", "batch_size", "dtb_steps")
        _runner.at_least(self, 1, *ones, "defense_steps", "n_per_class", "oracle_every")
        _runner.at_least(self, 8, "size")
        _runner.at_least(self, 0, "train_pad", "warm_steps")
        _runner.one_of(self, ("cnn", "preact"), "model")
        _runner.one_of(self, ("sgd", "adam"), "optimizer")
        _runner.in_range(self, 0, 9, "decoy_target", "hidden_target")
        _runner.in_unit(self, "blend_alpha")
        _runner.in_unit(self, "poison_rate", lo_open=True, hi_open=True)
        _runner.positive(self, "lr", "inner_lrs")
        _runner.in_unit(self, "momentum", hi_open=True)
        _runner.at_least(self, 0, "weight_decay")
        _runner.one_of(self, tuple(bd.DEFENSES), "defenses")
        if self.defense_lrs:
            _runner.positive(self, "defense_lrs")
        try:
            self.dtb()
            bd.check_problem(bd.DTBProblem(None, None, self.decoy_target, self.hidden_target))
            for name in self.compositions:
                bd.make_defense(name)
        except ValueError as e:  # the library's checks name the field
            key = str(e).partition(":")[0].replace("name", "compositions")
            raise _runner.ConfigError(key, str(e)) from None

    def dtb(self) -> bd.DTBConfig:
        names = {f.name for f in dataclasses.fields(bd.DTBConfig)}
        kw = {k: v for k, v in dataclasses.asdict(self).items() if k in names}
        return bd.DTBConfig(decoy_rate=self.poison_rate, pad=self.train_pad, **kw)

    def opt(self) -> optax.GradientTransformation:
        """The victims' optimiser: BackdoorBench's SGD recipe, or Adam as an ablation."""
        if self.optimizer == "adam":
            return optax.adam(self.lr)
        return optax.chain(optax.add_decayed_weights(self.weight_decay),
                           optax.sgd(self.lr, momentum=self.momentum))  # fmt: skip


# quick is a smoke run, compile-bound: the norm-free CNN compiles about twice as fast, and two
# surrogate members (each compiles its own implant step) stand for the four
QUICK = {"n_seeds": 2, "size": 16, "n_per_class": 200, "model": "cnn", "widths": (8, 16),
         "hidden": 32, "train_steps": 200, "warm_steps": 100, "dtb_steps": 60, "inner_steps": 3,
         "defense_steps": 6, "compositions": ("ft+ft",), "inner_lrs": (0.003, 0.01),
         "oracle_every": 30, "family": ("ft", "prune_ft")}  # fmt: skip


def _seed(cfg: Config, ctx, images, opt, seed: int, first: bool) -> dict:
    s = _backdoor.setup(cfg, images, seed)
    model, problem, data, keys = s.model, s.problem, s.data, s.keys
    stage = _backdoor.Stages(ctx, seed)
    names = [*cfg.defenses, *cfg.compositions]
    lrs = cfg.defense_lrs or None  # (): BackdoorBench's fixed step sizes
    defs = {n: bd.make_defense(n, cfg.defense_steps, lrs) for n in names}
    fp = defs.get("fp") or bd.make_defense("fp", cfg.defense_steps, lrs)  # the FP control's

    def bench(p, ds, tag):
        def log(name, _, seconds):
            ctx.log(seed=seed, stage=tag, defense=name, seconds=round(seconds, 2))

        return ctx.memo(f"seed{seed}_{tag}", lambda: bd.benchmark_defenses(
            keys[5], model, p, problem, s.test, ds, data, is_poison=s.pois.is_poison, callback=log
        ))  # fmt: skip

    with stage("badnets"):
        badnets = _backdoor.badnets(cfg, s, opt)
    calib = list(cfg.defenses)  # on every seed: a defense's outcome can change with the key
    with stage("calibration"):
        t_bad = bench(badnets, {d: defs[d] for d in calib}, "calibration")
    out = _backdoor.calibration_entries(t_bad, calib)
    target = (out["surrogate_target_acc"], out["surrogate_target_asr"])
    with stage("surrogate_calibration"):
        dcfg, rows = _backdoor.match_surrogate(keys[6], model, badnets, s, cfg.dtb(),
                                               cfg.inner_lrs, target)  # fmt: skip
    out["inner_lr_matched"] = dcfg.inner_lr
    for lr, acc, asr in rows:
        ctx.log(seed=seed, stage="surrogate_calibration", inner_lr=lr, clean_acc=acc, decoy_asr=asr)
    fp_op = _backdoor.fp_operator(keys[9], model, bd.DefenseData(*s.attacker_split),
                                  cfg.defense_steps)  # fmt: skip
    arms, fixed = _backdoor.control_arms(dcfg, fp_op, cfg.dtb_steps, cfg.oracle_every)
    models, infos = _backdoor.implants(ctx, stage, cfg, s, arms, opt, seed)
    out |= _backdoor.arm_entries(infos, cfg.dtb_steps)
    tables = {}
    for tag in ("dtb", "naive"):
        with stage(f"defenses_{tag}"):
            tables[tag] = bench(models[tag], defs, f"defenses_{tag}")
    out |= _backdoor.suppressed_entries("", tables["dtb"], names)
    out |= _backdoor.suppressed_entries("naive_", tables["naive"], names)
    out |= _backdoor.lr_entries("", tables["dtb"]) | _backdoor.lr_entries("naive_", tables["naive"])
    # the mask control (restored by --resume: the same FP run on the same warm model)
    mask = fixed["mask"] if "mask" in fixed else fp_op(models["warm"])[0]
    out |= _backdoor.mask_control(s, models, mask)
    with stage("oracle_fp"):
        out |= _backdoor.oracle_control(bench(models["oracle"], {"fp": fp}, "oracle_fp"))
    with stage("surrogate_control"):  # the DTB implant's own surrogate on test images
        sur = _backdoor.surrogate_figures(keys[6], model, models["dtb"], s, dcfg)
    out |= _backdoor.surrogate_control(out, sur)
    if first:
        _backdoor.plot_asr(ctx, tables, names)
        with stage("trajectory"):
            _backdoor.trajectories(ctx, s, {k: models[k] for k in ("dtb", "naive")},
                                   cfg.defense_steps)  # fmt: skip
    return out | stage.seconds


def run(cfg: Config, ctx: _runner.Context) -> dict:
    data = load_shapes_rgb(0, cfg.n_per_class, cfg.size)
    per_seed, opt = [], cfg.opt()  # one optimiser: the seeds share compiles
    for s in ctx.progress(range(cfg.n_seeds), desc="seeds", total=cfg.n_seeds):
        t0 = time.perf_counter()
        per_seed.append(_seed(cfg, ctx, data, opt, 1000 * ctx.seed + s, s == 0))
        ctx.log(seed=s, seconds=round(time.perf_counter() - t0, 1), **per_seed[-1])
    return _backdoor.summarise(per_seed, list(cfg.defenses), list(cfg.compositions))


STUDY = _runner.Study("backdoor_dtb", Config, run, quick=QUICK, doc=__doc__)

if __name__ == "__main__":
    STUDY.main()
