"""DTB against calibrated defenses: does sanitisation wake a defense-triggered backdoor?

Security research. On generated RGB shape classes of side ``size`` (16;
``hexad.data.images.load_shapes_rgb``, 12,000 images; 1/6 test, the defender's clean split the
last 5% of the rest, 500 images), per seed, from one initialisation of ``model``: ``"preact"``,
a GroupNorm PreAct-ResNet (one block per entry of ``widths``), or ``"cnn"``, the norm-free
SmallCNN (``widths`` conv channels, ``hidden`` dense units). The default is the ResNet because
BackdoorBench's fine-tuning settings (SGD 0.01, momentum 0.9, tuned for normalised ResNets)
diverge on the norm-free CNN and leave it at chance accuracy, so the fine-tuning defenses
would "fail" for a reason that is not the backdoor's; 16x16 keeps its step at about the
cost of the CNN's at 32x32. The BadNets model and the implants train with BackdoorBench's
augmentation: each batch randomly shifted by up to ``train_pad`` pixels (2, zero fill;
RandomCrop with padding, the trigger stamped before the shift so it moves with the image;
``hexad.backdoor.fit(pad=...)``, ``DTBConfig.pad``), the shift the fine-tuning defenses apply
too; ``--set train_pad=0`` trains without it (then fine-tuning meets a distribution shift).

1. Calibration (every seed: at these budgets a defense's outcome can change with the key,
   e.g. FP at 0.01 leaves accuracy 0.14 or 0.97): a BadNets model (decoy patch, 10% poison)
   is sanitised by every defense of ``hexad.backdoor.DEFENSES`` at the step budget
   ``defense_steps`` (ABL, AC, SS on the poisoned training set; ANP, RNP select
   their pruning level by BackdoorBench's rule). The fine-tuning defenses (FT, FP, NAD,
   FT-SAM, MCR) choose their step size among ``defense_lrs`` (0.01, 0.003, 0.001) as a
   defender can, by two-fold cross-fitting on the clean split: the largest whose held-out
   loss of clean accuracy is not over 5 points by more than one paired standard error, then
   run on the whole split, where that run must pass the same rule on the images it trained
   on (at 0.01 one whole-split run of a few diverges to chance where the half-split runs did
   not; such a step size is rejected) (``hexad.backdoor.defenses.select_lr``), here and in
   every later sanitisation. ``--set defense_lrs=`` (empty) keeps BackdoorBench's fixed
   0.01, at which FT-SAM and, for some keys, FP throw a BadNets model trained with the shift
   to chance.
2. Surrogate matching: the DTB surrogate's step size is rescaled so that its ``"ft"``
   member moves the BadNets model's weights as far as the real FT does.
3. Three implants from the same start and data (decoy at ``poison_rate`` of each batch,
   target ``decoy_target``; hidden blend trigger, target ``hidden_target``). The start is a
   shared warm phase of ``warm_steps`` on the naive objective (task, decoy, hidden trigger
   dormant; no post-sanitisation term), so that every arm begins from a model that carries
   the decoy: from the initialisation the post-sanitisation term holds the network near
   chance accuracy and the decoy is never learnt, and the naive objective needs about
   BadNets' budget to learn the decoy (``warm_steps + dtb_steps = train_steps``). Then each
   arm trains ``dtb_steps`` from it: a naive two-backdoor model (the naive objective goes
   on), DTB (surrogate drawn from ``family`` each outer step) and, on the first seed only, an
   oracle DTB trained against fine-pruning's own mask (``"mask_ft"``), the control for
   whether this model can carry the effect at all. Each arm trains on the attacker's images
   less a held-out tenth and keeps the checkpoint with the lowest DTB objective on that
   tenth (``hexad.backdoor.implant``, every 20 steps; the warm model is a candidate): a run
   whose clean accuracy collapses late returns its best earlier state.
4. Naive and DTB are sanitised by every defense and ``compositions`` (multi-round; a
   composition's first round is its first defense's own run in the same suite, so ``ft+ft``
   is the FT model fine-tuned once more); the oracle by FP.
5. First seed: decoy and hidden ASR along one real fine-tuning run of 4 ``defense_steps``.

Command:  python -m experiments.backdoor_dtb [--quick] [--out DIR] [--seed N] [--set k=v ...]
Runtime:  --quick (2,000 images, the CNN of widths 8-16, two seeds, budget 6) about 110 s
          on 2 idle CPU cores from an empty cache, mostly compilation (once per defense, data
          shape and surrogate member; every step size a defense tries shares one); full (3 seeds,
          budget 200) about 64 minutes on 2 idle CPU cores: the first seed about 26
          (calibration 5; BadNets 0.5; the warm phase 1; the naive, DTB and oracle arms 0.5, 4
          (half of it compiling the surrogate family) and 2; the DTB and naive sanitisation
          suites 6 and 5.5; the trajectory 1), later seeds 18-20 (calibration 4-5, suites 4.5-7
          minutes each).
          With ``--resume`` the implants are restored from their checkpoints and each
          finished defense suite (a seed's calibration, its DTB and naive suites, the
          oracle's FP) from its figures, so a run can be spread over several sittings.
summary.json (means over ``n_seeds`` seeds; every numeric key also as ``<key>_sd``):
  ``efficacy_<d>`` (1 if the defense brings BadNets' ASR below 0.2 losing < 5 points of
  clean accuracy), ``calib_asr_<d>``, ``calib_acc_<d>``, ``calib_lr_<d>`` (the chosen step
  size), ``n_defenses_effective``; ``badnets_clean_acc``, ``badnets_asr``;
  ``clean_acc_before``, ``decoy_asr_before``, ``hidden_asr_before``, ``implant_ok``
  (clean accuracy before >= 0.5: the implant did not collapse),
  ``{clean_acc,decoy_asr,hidden_asr}_after_<d>``, ``{decoy,hidden}_asr_after_mean``,
  ``n_defenses_suppressed`` (decoy ASR after < 0.2 with < 5 points of clean accuracy lost;
  none for a collapsed implant), ``hidden_asr_after_suppressed_mean`` (DTB; over the seeds
  where some defense suppressed; NaN if none did), ``lr_<d>`` (the chosen step sizes;
  ``lr_<c>_<i>`` for round ``i`` of a composition), the same with prefix ``naive_``;
  ``oracle_{clean_acc,decoy_asr,hidden_asr}_after_fp``, ``oracle_hidden_asr_before`` (first
  seed; ``_sd`` 0); ``surrogate_displacement_ratio`` (surrogate vs real FT weight displacement
  on BadNets, after matching), ``surrogate_displacement_ratio_unmatched``, ``displacement_ft``,
  ``inner_lr_matched``; ``dtb_weight_mean``, ``dtb_decoy_prob_after_mean``,
  ``dtb_hidden_prob_after_mean`` (the implant's last 20% of steps), ``<arm>_implant_best_step``
  for ``dtb``, ``naive``, ``oracle`` (the step of the checkpoint kept); both absent when the
  implants were restored by ``--resume``; ``defenses``; ``runtime_s``.
metrics.jsonl: per seed, each stage's seconds (``stage``, ``seconds``), each defense's within
  a stage (``stage``, ``defense``, ``seconds``), then the seed's figures; the trajectory rows.
Plots: ``asr.png`` (hidden vs decoy ASR per defense), ``trajectory.png``.
"""

from __future__ import annotations

import dataclasses
import time

import jax.numpy as jnp
import numpy as np
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
    lr: float = 1e-3
    warm_steps: int = 1000
    dtb_steps: int = 500
    inner_steps: int = 5
    inner_lr: float = 0.01
    unlearn: str = "log1m"
    family: tuple[str, ...] = ("ft", "prune_ft", "noise_ft", "ft2")
    hypergrad: str = "first_order"
    w_hidden_post: float = 1.0
    weight_floor: float = 0.2
    train_pad: int = 2
    defenses: tuple[str, ...] = tuple(bd.DEFENSES)
    compositions: tuple[str, ...] = ("ft+ft", "nc+ft", "fp+nad")
    defense_steps: int = 200
    defense_lrs: tuple[float, ...] = (0.01, 0.003, 0.001)

    def __post_init__(self):
        ones = ("n_seeds", "widths", "hidden", "train_steps", "batch_size", "dtb_steps")
        _runner.at_least(self, 1, *ones, "defense_steps", "n_per_class")
        _runner.at_least(self, 8, "size")
        _runner.at_least(self, 0, "train_pad", "warm_steps")
        _runner.one_of(self, ("cnn", "preact"), "model")
        _runner.in_range(self, 0, 9, "decoy_target", "hidden_target")
        _runner.in_unit(self, "blend_alpha")
        _runner.in_unit(self, "poison_rate", lo_open=True, hi_open=True)
        _runner.positive(self, "lr", "defense_lrs")
        _runner.one_of(self, tuple(bd.DEFENSES), "defenses")
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


# quick is a smoke run, compile-bound: the norm-free CNN compiles about twice as fast
QUICK = {"n_seeds": 2, "size": 16, "n_per_class": 200, "model": "cnn", "widths": (8, 16),
         "hidden": 32, "train_steps": 200, "warm_steps": 100, "dtb_steps": 100, "inner_steps": 3,
         "defense_steps": 6, "compositions": ("ft+ft",)}  # fmt: skip


_lr_entries = _backdoor.lr_entries  # the step sizes the defenses chose, ``lr_<d>``


def _seed(cfg: Config, ctx, images, opt, seed: int, first: bool) -> dict:
    s = _backdoor.setup(cfg, images, seed)
    model, problem, data, keys = s.model, s.problem, s.data, s.keys
    stage = _backdoor.Stages(ctx, seed)
    names = [*cfg.defenses, *cfg.compositions]
    lrs = cfg.defense_lrs or None  # (): BackdoorBench's fixed step sizes
    defs = {n: bd.make_defense(n, cfg.defense_steps, lrs) for n in names}

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
    out = _backdoor.efficacy_entries(t_bad, calib) | _lr_entries("calib_", t_bad)
    out |= {
        "badnets_clean_acc": t_bad["clean_acc_before"],
        "badnets_asr": t_bad["decoy_asr_before"],
    }
    with stage("matching"):  # the surrogate moves the weights as far as the real FT does
        real = float(t_bad["displacement_ft"])
        dcfg, r0 = _backdoor.match_inner_lr(
            keys[6], model, badnets, data, cfg.dtb(), problem, real, 0
        )
        dcfg, ratio = _backdoor.match_inner_lr(keys[6], model, badnets, data, dcfg, problem, real)
    out |= {"surrogate_displacement_ratio": ratio, "surrogate_displacement_ratio_unmatched": r0,
            "displacement_ft": real, "inner_lr_matched": dcfg.inner_lr}  # fmt: skip
    naive = dataclasses.replace(dcfg, w_hidden_post=0.0, inner_steps=0, family=("ft",))
    arms = {"naive": (naive, {}), "dtb": (dcfg, {})}
    if first:  # the capacity control, on the first seed only (an implant's cost)
        arms["oracle"] = (dataclasses.replace(dcfg, family=("mask_ft",)),
                          {"mask_fn": _backdoor.fp_mask_fn(model, data)})  # fmt: skip
    models, infos = _backdoor.implants(ctx, stage, cfg, s, arms, opt, seed)
    tail = slice(int(0.8 * cfg.dtb_steps), None)
    out |= {f"{t}_implant_best_step": float(i.best_step) for t, i in infos.items()}
    for k in ("weight", "decoy_prob_after", "hidden_prob_after") if "dtb" in infos else ():
        out[f"dtb_{k}_mean"] = float(jnp.mean(getattr(infos["dtb"].steps, k)[tail]))
    tables = {}
    for tag in ("dtb", "naive"):
        with stage(f"defenses_{tag}"):
            tables[tag] = bench(models[tag], defs, f"defenses_{tag}")
    out |= _backdoor.suppressed_entries("", tables["dtb"], names)
    out |= _backdoor.suppressed_entries("naive_", tables["naive"], names)
    out |= _lr_entries("", tables["dtb"]) | _lr_entries("naive_", tables["naive"])
    if first:
        with stage("oracle_fp"):
            fp = {"fp": bd.make_defense("fp", cfg.defense_steps, lrs)}
            t_or = bench(models["oracle"], fp, "oracle_fp")
        for m in ("clean_acc", "decoy_asr", "hidden_asr"):
            out[f"oracle_{m}_after_fp"] = t_or[f"{m}_after_fp"]
        out["oracle_hidden_asr_before"] = t_or["hidden_asr_before"]
        _backdoor.plot_asr(ctx, tables, names)
        with stage("trajectory"):
            _backdoor.trajectories(ctx, s, {k: models[k] for k in ("dtb", "naive")},
                                   4 * cfg.defense_steps)  # fmt: skip
    return out | stage.seconds


def run(cfg: Config, ctx: _runner.Context) -> dict:
    data = load_shapes_rgb(0, cfg.n_per_class, cfg.size)
    per_seed, opt = [], optax.adam(cfg.lr)  # one optimiser: the seeds share compiles
    for s in ctx.progress(range(cfg.n_seeds), desc="seeds", total=cfg.n_seeds):
        t0 = time.perf_counter()
        per_seed.append(_seed(cfg, ctx, data, opt, 1000 * ctx.seed + s, s == 0))
        ctx.log(seed=s, seconds=round(time.perf_counter() - t0, 1), **per_seed[-1])
    out = _backdoor.aggregate(per_seed)
    out["defenses"] = [*cfg.defenses, *cfg.compositions]
    out["n_seeds_run"] = float(np.asarray(len(per_seed)))
    return out


STUDY = _runner.Study("backdoor_dtb", Config, run, quick=QUICK, doc=__doc__)

if __name__ == "__main__":
    STUDY.main()
