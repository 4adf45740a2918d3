"""DTB vs BadNets vs a naive two-backdoor model, against every implemented defense.

Security research: measures whether sanitisation activates a defense-triggered backdoor.
On scikit-learn's digits (upsampled to ``size``), three models (``model``: ``cnn``, the
SmallCNN, or ``preact``, a GroupNorm PreAct-ResNet with one block per entry of ``widths``)
are built from the same initialisation: (1) BadNets with the decoy patch (poison rate
``poison_rate``); (2) a naive two-backdoor model trained on clean + decoy-to-target +
hidden-to-true-label, i.e. DTB's objective without the bi-level term (``w_hidden_post = 0``);
(3) DTB (first-order or unrolled hypergradient, ``inner_steps`` unrolled steps of clean
fine-tuning + bounded decoy unlearning in the surrogate). Each model is then sanitised by every
model-repair defense in ``defenses`` (all 12 of ``hexad.backdoor.DEFENSES`` by default: FT,
FP, NAD, ANP, NC, I-BAU, CLP, FT-SAM, RNP, MCR, SAU, ABL) and by the two-round compositions
in ``compositions``, with the defender's clean split (5% of the training set; the attacker's
surrogate uses its own training images). ABL, a training-time defense, sanitises on the
training set the defender holds instead: the BadNets decoy-poisoned one. The two detectors
in ``detectors`` (AC, SS) flag samples of that decoy-poisoned set under each model. Decoy: a
checkerboard patch at the bottom-right; hidden: a blend trigger.

Command:  python -m experiments.backdoor_dtb [--quick] [--out DIR] [--seed N] [--set k=v ...]
          [--resume] [--ckpt DIR]
          The three trained models are checkpointed through hexad.cachex in ``--ckpt``
          (default ``checkpoints/backdoor_dtb/<run>/``); ``--resume`` restores them and
          re-runs only the defense evaluation.
Runtime:  --quick (8x8 digits, 4 defenses, the ft+ft composition, both detectors) measured
          73 s user + 2 s system CPU, 2 min 45 s wall, on a shared 2-core machine at load
          ~6 (the run-local compile cache below halves it). Full (16x16 digits, 12 defenses,
          3 compositions, 600 training steps), niced at load ~5-7: 442 s user + 7 s system
          CPU, 14.6 min wall in all (training ~3 min wall); the defense evaluation alone
          (``--resume``) 370 s user + 6 s system CPU, 12.5 min wall.
          Run as ``python -m`` (``__main__``), the study compiles each identical computation
          once through a persistent JAX compile cache in a temporary folder deleted at exit;
          ``STUDY.execute`` from Python (tests) does not.
The inner surrogate is FT's optimiser (SGD 0.01, momentum 0.9, 32-row blocks of the clean
split, ``inner_steps`` steps) plus bounded decoy unlearning (``hexad.backdoor.DTBConfig``).
On the plain BadNets model it predicts the real defenses' clean accuracy within 0.03 (mean
absolute gap) and their decoy ASR within 0.33 (the real defenses themselves spread from 0 to
0.98); the former surrogate (lr 0.05, no momentum, full batch, CE unlearning) took even the
plain BadNets model to accuracy 0.33.
Measured (full): DTB clean accuracy 0.964, decoy ASR 1.0, hidden ASR 0.006 before defense
(naive 0.975 / 1.0 / 0.006). The DTB decoy, trained on every outer batch, is not suppressed
by the 5-step surrogate after ~150 outer steps (gate < 1e-4 from there on), so the hidden term
is switched off and DTB ends close to the naive model: the hidden ASR after every defense and
composition is <= 0.009 (``hidden_asr_after_mean`` 0.003, naive 0.004); the decoy ASR after
has mean 0.74 (naive lower after FP, NAD, FT-SAM, RNP, SAU). Not reproduced at this scale.
Ablation (``--set unlearn=ce --set defenses=ft,fp,nad,nc,ibau,rnp --set compositions=ft+ft
--set detectors=ss``, 6.4 min wall): with unbounded CE unlearning the surrogate keeps
suppressing the decoy (gate ~0.5-0.75 to the end), DTB is 0.961 / 0.997 / 0.003 before and
its surrogate gives 0.646 / 0.045 / 1.0 (hidden fully active, accuracy lost; on BadNets
0.774 / 0.0); yet the real defenses that suppress the decoy (FP 0.20, NAD 0.29, I-BAU 0.25,
NC 0.0) leave the hidden ASR at 0.009, 0.003, 0.033, 0.045 (mean over the 7: 0.016, naive
0.005): the hidden trigger follows the surrogate's trajectory, not decoy removal as such.
AC separates the poisons exactly at full size (a 2-means cluster of exactly the
129 poisons) but does not flag them: all-to-one poisoning at rate 0.1 makes them 46% of the
target class, above AC's relative-size threshold 0.35. --quick: DTB 0.93 / 0.99 / 0.006
before, hidden after ft/fp/clp/ft+ft <= 0.006, nc 0.073 (naive <= 0.009).

summary.json keys (ASRs on the test split, non-target samples only):
  ``clean_acc``, ``decoy_asr_before``, ``hidden_asr_before``: the DTB model before defense;
  ``clean_acc_after_<d>``, ``decoy_asr_after_<d>``, ``hidden_asr_after_<d>``: DTB after
  defense ``<d>`` (a composition is named ``<a>+<b>``);
  ``hidden_asr_after_mean``, ``decoy_asr_after_mean``: DTB means over all defenses;
  ``naive_clean_acc``, ``naive_decoy_asr_before``, ``naive_hidden_asr_before``,
  ``naive_decoy_asr_after_<d>``, ``naive_hidden_asr_after_<d>``,
  ``naive_hidden_asr_after_mean``: the same for the naive two-backdoor model;
  ``badnets_clean_acc``, ``badnets_asr_before``, ``badnets_asr_after_<d>``,
  ``badnets_asr_after_mean``, ``badnets_der_mean``: BadNets (decoy trigger) and its mean DER;
  ``dtb_der_decoy_mean``: DTB's mean DER on the decoy;
  ``surrogate_clean_acc``, ``surrogate_decoy_asr``, ``surrogate_hidden_asr``: the DTB model
  after the inner surrogate it was trained against (``rounds`` x ``inner_steps`` SGD steps at
  ``inner_lr``, momentum ``inner_momentum``, ``inner_batch``-row blocks of the defender's
  clean split, of clean fine-tuning + ``unlearn`` decoy unlearning);
  ``surrogate_clean_acc_mae``, ``surrogate_decoy_asr_mae``,
  ``surrogate_hidden_asr_mae``: mean absolute gap between the surrogate's figure and each
  real defense's (surrogate fidelity; 0 = the surrogate predicts every defense);
  ``badnets_surrogate_asr``, ``badnets_surrogate_clean_acc``, ``naive_surrogate_hidden_asr``:
  the surrogate on the other two; ``badnets_surrogate_asr_mae``,
  ``badnets_surrogate_clean_acc_mae``: its mean absolute gaps to the real defenses on the
  plain BadNets model (which was not trained against it: the fidelity check);
  ``<det>_tpr``, ``<det>_fpr`` (DTB), ``naive_<det>_tpr``/``_fpr``,
  ``badnets_<det>_tpr``/``_fpr`` for ``<det>`` in ``detectors``: the fraction of decoy
  poisons / of clean samples the detector flags;
  ``defense_eval_s``: wall seconds of the DTB model's whole defense and detector
  evaluation; ``defenses``: the names evaluated; ``runtime_s``.
Plot ``asr.png``: hidden vs decoy ASR before (star) and after each defense, DTB and naive.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments import _runner
from hexad import backdoor as bd
from hexad import cachex
from hexad.data.images import load_digits, train_test_split


@dataclasses.dataclass(frozen=True)
class Config:
    size: int = 16
    model: str = "cnn"
    widths: tuple[int, ...] = (8, 16, 16)
    hidden: int = 32
    groups: int = 4
    poison_rate: float = 0.1
    decoy_target: int = 0
    hidden_target: int = 0
    blend_alpha: float = 0.15
    train_steps: int = 600
    batch_size: int = 64
    lr: float = 3e-3
    dtb_steps: int = 600
    inner_steps: int = 5
    inner_lr: float = 0.01
    inner_momentum: float = 0.9
    inner_batch: int = 32
    unlearn: str = "bounded"
    unlearn_weight: float = 1.0
    hypergrad: str = "unrolled"
    w_hidden_post: float = 3.0
    rounds: int = 1
    gate_tau: float = 0.3
    defenses: tuple[str, ...] = tuple(bd.DEFENSES)
    compositions: tuple[str, ...] = ("ft+ft", "nc+ft", "fp+nad")
    detectors: tuple[str, ...] = ("ac", "ss")
    defense_steps: int = 100

    def __post_init__(self):
        _runner.one_of(self, ("cnn", "preact"), "model")
        _runner.at_least(self, 8, "size")  # load_digits upsamples the 8x8 digits
        _runner.at_least(self, 1, "widths", "hidden", "groups", "train_steps", "batch_size")
        _runner.at_least(self, 1, "dtb_steps", "rounds", "defense_steps")
        _runner.at_least(self, 0, "inner_steps", "inner_batch", "inner_lr", "unlearn_weight")
        _runner.at_least(self, 0, "w_hidden_post")
        _runner.in_range(self, 0, 9, "decoy_target", "hidden_target")  # digit classes
        _runner.in_unit(self, "poison_rate", "blend_alpha", "gate_tau")
        _runner.in_unit(self, "inner_momentum", hi_open=True)
        _runner.positive(self, "lr")
        _runner.one_of(self, ("bounded", "ce"), "unlearn")
        _runner.one_of(self, ("unrolled", "first_order"), "hypergrad")


QUICK = {
    "size": 8,
    "widths": (8, 16),
    "train_steps": 200,
    "dtb_steps": 300,
    "inner_steps": 3,
    "defenses": ("ft", "fp", "nc", "clp"),
    "compositions": ("ft+ft",),
    "defense_steps": 30,
}


def _defense(name: str, steps: int):
    """Returns the defense ``name`` (``a+b`` composes) with its step counts set to ``steps``."""
    if "+" in name:
        if "abl" in name.split("+"):
            raise ValueError(f"compositions: {name!r}: ABL needs the poisoned training set")
        return bd.compose(*(_defense(n, steps) for n in name.split("+")))
    if name not in bd.DEFENSES:
        raise ValueError(f"defenses: unknown defense {name!r}; known: {sorted(bd.DEFENSES)}")
    f = bd.DEFENSES[name]
    kw = {
        "ft": {"n_steps": steps},
        "fp": {"n_steps": steps},
        "nad": {"n_steps": steps, "teacher_steps": steps},
        "anp": {"n_steps": 2 * steps},
        "ibau": {"n_steps": steps},
        "ftsam": {"n_steps": steps},
        "rnp": {"recover_steps": steps},
        "mcr": {"n_steps": steps, "ft_steps": steps},
        "sau": {"n_steps": steps},
        # ABL at BackdoorBench's lr 0.1 (SGD, momentum 0.9; set there for BN ResNets trained
        # from scratch) collapsed the trained 16x16 DTB CNN to a constant class-0 predictor in
        # its LGA + fine-tuning phases (accuracy 0.078, every test image class 0; isolation
        # precision 0.57); at 0.01 it keeps 0.961 and isolates poisons with precision 1.0
        "abl": {"lga_steps": steps, "finetune_steps": steps, "lr": 0.01},
        "nc": {},
        "clp": {},
    }[name]
    if name == "nc":
        return lambda k, m, p, x, y: (
            bd.neural_cleanse(k, m, p, x, y, n_steps=3 * steps, unlearn_steps=steps).params
        )
    if name == "abl":
        # ABL sanitises on the training set the defender holds: _run passes the decoy-poisoned
        # one for it (the clean split would give it no poisons to isolate)
        return lambda k, m, p, x, y: bd.abl(k, m, p, x, y, **kw).params
    return lambda k, m, p, x, y: f(k, m, p, x, y, **kw)


def _make_model(cfg: Config):
    if cfg.model == "cnn":
        return bd.SmallCNN(10, cfg.widths, cfg.hidden)
    if cfg.model == "preact":
        return bd.PreActResNet(10, cfg.widths, cfg.groups)
    raise ValueError(f"model: expected 'cnn' or 'preact', got {cfg.model!r}")


def _dtb_config(cfg: Config) -> bd.DTBConfig:
    return bd.DTBConfig(
        inner_steps=cfg.inner_steps,
        inner_lr=cfg.inner_lr,
        inner_momentum=cfg.inner_momentum,
        inner_batch=cfg.inner_batch,
        unlearn=cfg.unlearn,
        unlearn_weight=cfg.unlearn_weight,
        hypergrad=cfg.hypergrad,
        rounds=cfg.rounds,
        gate_tau=cfg.gate_tau,
        w_hidden_post=cfg.w_hidden_post,
    )


def _train_models(cfg, ctx, model, p0, problem, x, y, pois, keys) -> dict:
    """Returns ``{"badnets", "naive", "dtb"}`` parameters, trained from ``p0``."""
    opt = optax.adam(cfg.lr)
    # chunk=1: for a few hundred steps one compiled step dispatched per step costs less CPU
    # than compiling a 10-step unrolled chunk (measured 4.7 s vs 9.3 s for 200 quick steps)
    badnets, _ = bd.fit(
        keys[3], p0, pois.x, pois.y, model.apply, opt, cfg.train_steps, cfg.batch_size, chunk=1
    )
    base = _dtb_config(cfg)
    log = lambda tag: (
        lambda t, info: (
            ctx.log(
                model=tag,
                step=t,
                loss=float(info.loss),
                gate=float(info.gate),
                decoy_prob_after=float(info.decoy_prob_after),
                hidden_prob_after=float(info.hidden_prob_after),
            )
            if t % 20 == 0
            else None
        )
    )
    models = {"badnets": badnets}
    # The naive model's post-sanitisation term has weight 0, so its gradient is exactly zero
    # whatever the surrogate: inner_steps=0 drops the unrolled inner loop from its compile
    # and its steps (its logged *_after diagnostics are then taken at theta itself).
    naive = dataclasses.replace(base, w_hidden_post=0.0, inner_steps=0, rounds=1)
    for tag, c in (("naive", naive), ("dtb", base)):
        models[tag], _ = bd.implant(
            keys[4],
            model,
            p0,
            problem,
            x,
            y,
            x,
            y,
            c,
            opt,
            cfg.dtb_steps,
            cfg.batch_size,
            callback=log(tag),
        )
    return models


def run(cfg: Config, ctx: _runner.Context) -> dict:
    data = load_digits(cfg.size)
    tr, te = train_test_split(data, 0.2, seed=ctx.seed)
    x, y = jnp.asarray(tr.x), jnp.asarray(tr.y)
    xt, yt = jnp.asarray(te.x), jnp.asarray(te.y)
    n_clean = int(0.05 * x.shape[0])
    xc, yc = x[-n_clean:], y[-n_clean:]  # the defender's 5% clean split
    shape = (cfg.size, cfg.size, 1)
    keys = jax.random.split(ctx.key(), 8)
    decoy = bd.patch_trigger(shape, size=max(2, cfg.size // 5))
    hidden = bd.blend_trigger(keys[0], shape, cfg.blend_alpha)
    problem = bd.DTBProblem(decoy, hidden, cfg.decoy_target, cfg.hidden_target)
    model = _make_model(cfg)
    p0 = jax.jit(model.init)(keys[1], x[:1])

    @jax.jit  # one compile for every model and defense (eager would dispatch op by op)
    def _metrics(params):
        f = model.apply
        return (
            bd.accuracy(f, params, xt, yt),
            bd.attack_success_rate(f, params, xt, yt, decoy, cfg.decoy_target),
            bd.attack_success_rate(f, params, xt, yt, hidden, cfg.hidden_target),
        )

    def metrics(params):
        return dict(zip(("acc", "decoy", "hidden"), map(float, _metrics(params)), strict=True))

    pois = bd.poison(keys[2], x, y, decoy, cfg.poison_rate, cfg.decoy_target, 10)
    # The three trained models checkpoint through hexad.cachex; --resume skips the training.
    mngr = cachex.CacheXManager(ctx.checkpoint_dir)
    try:
        start, models = cachex.resume(mngr, {"badnets": p0, "naive": p0, "dtb": p0}, ctx.resume)
        if start == 0:
            models = _train_models(cfg, ctx, model, p0, problem, x, y, pois, keys)
            mngr.save(0, models)
            mngr.wait_until_finished()
    finally:
        mngr.close()
    models = dict(models)

    names = list(cfg.defenses) + list(cfg.compositions)
    before = {tag: metrics(p) for tag, p in models.items()}
    # Surrogate fidelity: the inner sanitisation DTB was trained against (R rounds of K SGD
    # steps of clean fine-tuning + decoy unlearning), run full-batch on the defender's clean
    # split, next to what the real defenses do to the same model.
    surrogate = jax.jit(
        lambda p: bd.sanitise_surrogate(model, _dtb_config(cfg), p, keys[6], problem, xc, yc)[-1]
    )
    sur = {tag: metrics(surrogate(p)) for tag, p in models.items()}
    after: dict[str, dict[str, dict]] = {tag: {} for tag in models}
    t_dtb = 0.0
    for name in ctx.progress(names, desc="defenses"):
        d = _defense(name, cfg.defense_steps)
        # ABL needs the training set the defender holds: the decoy-poisoned one
        dx, dy = (pois.x, pois.y) if name == "abl" else (xc, yc)
        for tag, p in models.items():
            t0 = time.perf_counter()
            after[tag][name] = metrics(d(keys[5], model, p, dx, dy))
            if tag == "dtb":
                t_dtb += time.perf_counter() - t0
            ctx.log(model=tag, defense=name, **after[tag][name])

    # Detectors (AC, SS) flag samples of the decoy-poisoned training set under each model.
    ip = np.asarray(pois.is_poison)
    detect = {}
    for det in cfg.detectors:
        if det not in ("ac", "ss"):
            raise ValueError(f"detectors: expected 'ac' or 'ss', got {det!r}")
        for tag, p in models.items():
            t0 = time.perf_counter()
            if det == "ss":
                fl = bd.spectral_signatures(model, p, pois.x, pois.y, eps=cfg.poison_rate)
            else:
                fl = bd.activation_clustering(model, p, pois.x, pois.y)
            if tag == "dtb":
                t_dtb += time.perf_counter() - t0
            pre = "" if tag == "dtb" else f"{tag}_"
            detect[f"{pre}{det}_tpr"] = float(fl[ip].mean())
            detect[f"{pre}{det}_fpr"] = float(fl[~ip].mean())

    out: dict = {"defenses": names, "defense_eval_s": round(t_dtb, 2), **detect}
    b = before["dtb"]
    out.update(clean_acc=b["acc"], decoy_asr_before=b["decoy"], hidden_asr_before=b["hidden"])
    for n in names:
        a = after["dtb"][n]
        out[f"clean_acc_after_{n}"] = a["acc"]
        out[f"decoy_asr_after_{n}"] = a["decoy"]
        out[f"hidden_asr_after_{n}"] = a["hidden"]
    mean = lambda tag, k: float(np.mean([after[tag][n][k] for n in names]))
    out["hidden_asr_after_mean"] = mean("dtb", "hidden")
    out.update(
        surrogate_clean_acc=sur["dtb"]["acc"],
        surrogate_decoy_asr=sur["dtb"]["decoy"],
        surrogate_hidden_asr=sur["dtb"]["hidden"],
        badnets_surrogate_asr=sur["badnets"]["decoy"],
        badnets_surrogate_clean_acc=sur["badnets"]["acc"],
        naive_surrogate_hidden_asr=sur["naive"]["hidden"],
    )
    # fidelity on the plain BadNets model, which was not trained against the surrogate
    for k, key in (("acc", "clean_acc"), ("decoy", "asr")):
        out[f"badnets_surrogate_{key}_mae"] = float(
            np.mean([abs(after["badnets"][n][k] - sur["badnets"][k]) for n in names])
        )
    for k, key in (("acc", "clean_acc"), ("decoy", "decoy_asr"), ("hidden", "hidden_asr")):
        out[f"surrogate_{key}_mae"] = float(
            np.mean([abs(after["dtb"][n][k] - sur["dtb"][k]) for n in names])
        )
    out["decoy_asr_after_mean"] = mean("dtb", "decoy")
    out["dtb_der_decoy_mean"] = float(
        np.mean(
            [
                bd.defense_effectiveness_rating(
                    b["acc"], after["dtb"][n]["acc"], b["decoy"], after["dtb"][n]["decoy"]
                )
                for n in names
            ]
        )
    )
    nb = before["naive"]
    out.update(
        naive_clean_acc=nb["acc"],
        naive_decoy_asr_before=nb["decoy"],
        naive_hidden_asr_before=nb["hidden"],
    )
    for n in names:
        out[f"naive_decoy_asr_after_{n}"] = after["naive"][n]["decoy"]
        out[f"naive_hidden_asr_after_{n}"] = after["naive"][n]["hidden"]
    out["naive_hidden_asr_after_mean"] = mean("naive", "hidden")
    bb = before["badnets"]
    out.update(badnets_clean_acc=bb["acc"], badnets_asr_before=bb["decoy"])
    for n in names:
        out[f"badnets_asr_after_{n}"] = after["badnets"][n]["decoy"]
    out["badnets_asr_after_mean"] = mean("badnets", "decoy")
    out["badnets_der_mean"] = float(
        np.mean(
            [
                bd.defense_effectiveness_rating(
                    bb["acc"], after["badnets"][n]["acc"], bb["decoy"], after["badnets"][n]["decoy"]
                )
                for n in names
            ]
        )
    )

    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5))
    for tag, color in (("dtb", "C3"), ("naive", "C0")):
        ax.scatter(
            [before[tag]["decoy"]],
            [before[tag]["hidden"]],
            marker="*",
            s=200,
            color=color,
            label=f"{tag} before",
        )
        xs = [after[tag][n]["decoy"] for n in names]
        ys = [after[tag][n]["hidden"] for n in names]
        ax.scatter(xs, ys, color=color, alpha=0.7, label=f"{tag} after")
        for n, u, v in zip(names, xs, ys, strict=True):
            ax.annotate(n, (u, v), fontsize=7, color=color)
    ax.set_xlabel("decoy ASR")
    ax.set_ylabel("hidden ASR")
    ax.set_xlim(-0.05, 1.05)
    ax.set_ylim(-0.05, 1.05)
    ax.legend(fontsize=8)
    ax.set_title("Hidden vs decoy ASR before and after each defense")
    ctx.save_plot(fig, "asr")
    return out


STUDY = _runner.Study("backdoor_dtb", Config, run, quick=QUICK, doc=__doc__)

if __name__ == "__main__":
    import tempfile

    # Each defense builds fresh closures for each of the three models, so jit would compile
    # the same computation three times; a run-local persistent cache (a temporary folder,
    # empty at start, deleted at exit) compiles each identical one once.
    with tempfile.TemporaryDirectory() as tmp:
        jax.config.update("jax_compilation_cache_dir", tmp)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        STUDY.main()
