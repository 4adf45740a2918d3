"""What the three RWEFM studies share: the config, the --quick sizes and ``compare``.

:func:`compare` trains RWEFM on a manifold and the Euclidean baseline on the same clouds, over
``n_seeds`` seeds each, and scores both against held-out clouds as the RWEFM reference does;
``rwefm_synthetic``, ``rwefm_protein`` and ``rwefm_singlecell`` differ only in their data.

The arms share everything but the geometry (and, for the third, the input features):

- the noise (``noise``: the reference's per-cloud-fitted ``ambient_gaussian`` projected onto
  M, ``uniform`` or ``wrapped_normal``; :func:`hexad.rwefm.fit_noise`), and, per seed, the same
  init key, noise clouds, minibatches and times (seed ``s`` of one arm is paired with seed
  ``s`` of the other);
- the entropic maps' ``epsilon`` relative to each pair's largest cost, with a Sinkhorn bound
  calibrated per arm until ``map_target`` of sampled maps converge
  (:func:`hexad.rwefm.calibrate_map_iterations` on ``map_pairs`` sampled pairs);
- the cloud pairing (``pairing``), network, optimiser (Adam with ``lr`` decayed by ``lr_decay``
  every ``lr_decay_steps``), budget and Euler sampler. The baseline works in the ambient
  coordinates (``R^d``; angles for the torus) and its samples are projected onto M.

Arms: ``rwefm`` (the flow on M, its network fed ``M.features``: ``(cos, sin)`` on a torus),
``euclid`` (the flow in the chart, fed the chart's coordinates), and, where ``M.features`` are
not the coordinates (a torus), ``euclid_periodic``: the flow in the chart fed ``M.features``,
so that RWEFM vs ``euclid_periodic`` measures the transport alone and ``euclid_periodic`` vs
``euclid`` the features alone.

Scores, for the ground distances ``chamfer`` (``d_M^2``) and ``emd`` (entropic OT for ``d_M``,
``eval_epsilon`` relative, Sinkhorn to convergence): ``1nna`` (1-NN two-sample accuracy, 0.5
ideal), ``1nna_half`` (the reference's scoring: ``(|acc_gen - 0.5| + |acc_test - 0.5|) / 2``,
0 ideal, see :func:`hexad.rwefm.one_nn_accuracies`), ``mm`` (minimum-matching distance) and
``kmmd`` (kernel MMD, one bandwidth: the median of the held-out clouds' own distances). Each
seed's score is the mean over ``n_generations`` sets of generated clouds from fresh noise (the
reference draws 5). ``n_floor`` further held-out draws give each metric's floor. Summary keys,
for each such ``<metric>`` (e.g. ``emd_1nna``) and ``<arm>``:
``<arm>_<metric>_mean``/``_sd``/``_seeds``, ``<metric>_diff_mean``/``_diff_sd`` (paired RWEFM
- ``euclid`` over seeds), ``<metric>_diff_periodic_mean``/``_sd`` (paired RWEFM -
``euclid_periodic``, where that arm runs), ``floor_<metric>_mean``/``_sd``; and ``arms``,
``n_generations``, ``noise``, ``pairing``, ``n_seeds``,
``map_iterations_<arm>``, ``map_calibration_frac_<arm>``, ``map_converged_frac_<arm>`` (over
all training maps), ``eval_converged_frac`` (over all EMD solves), ``<arm>_final_loss_mean``,
``on_manifold_max_err``, ``euclid_off_manifold_before_proj`` and ``train_seconds``.

The verdict (with ``n_seeds >= 2``; :mod:`experiments._verdicts`, margin
``MARGINS["rwefm"]``): RWEFM's EMD 1-NNA distance from 0.5 minus the reference arm's
(``verdict_reference``: ``euclid_periodic`` where it runs, else ``euclid``), paired over seeds,
in ``verdict``, ``effect_mean``, ``effect_ci_low``, ``effect_ci_high``, ``n_seeds``,
``seeds_needed`` (undecided only) and ``equivalence_margin``. The report joins the seeds of a
setting run in several parts and decides on all of them.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments import _runner, _verdicts
from hexad import rwefm
from hexad.geometry import Euclidean, Manifold

__all__ = ["QUICK", "TrainConfig", "compare"]

ARMS = ("rwefm", "euclid", "euclid_periodic")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The settings all three RWEFM studies share (each study's ``Config`` adds its data)."""

    n_train: int = 512
    n_test: int = 96
    n_points: int = 32
    n_seeds: int = 3
    n_floor: int = 3
    n_generations: int = 5
    steps: int = 5000
    chunk: int = 100
    batch: int = 16
    lr: float = 3e-4
    lr_decay: float = 0.99
    lr_decay_steps: int = 1000
    width: int = 128
    depth: int = 4
    heads: int = 4
    noise: str = "ambient_gaussian"
    epsilon: float = 0.002
    map_target: float = 0.95
    map_pairs: int = 256
    map_max_iterations: int = 5000
    pairing: str = "matching"
    sampler_steps: int = 100
    method: str = "euler"
    eval_epsilon: float = 0.05
    eval_max_iterations: int = 5000
    ckpt_every: int = 10

    def __post_init__(self):
        _runner.at_least(self, 1, "n_train", "n_test", "n_points", "steps", "chunk", "batch")
        _runner.at_least(self, 1, "width", "depth", "heads", "sampler_steps", "ckpt_every")
        _runner.at_least(self, 1, "n_seeds", "n_floor", "lr_decay_steps", "map_max_iterations")
        _runner.at_least(self, 1, "n_generations")
        _runner.at_least(self, 1, "eval_max_iterations", "map_pairs")
        _runner.positive(self, "lr", "epsilon", "eval_epsilon")
        _runner.in_unit(self, "lr_decay", "map_target", lo_open=True)
        _runner.one_of(self, rwefm.NOISE_KINDS, "noise")
        _runner.one_of(self, rwefm.PAIRINGS, "pairing")
        _runner.one_of(self, ("euler", "midpoint"), "method")


#: The --quick sizes of every RWEFM study.
QUICK = {
    "n_train": 32,
    "n_test": 12,
    "n_points": 12,
    "steps": 40,
    "chunk": 20,
    "batch": 8,
    "lr": 3e-3,
    "width": 32,
    "depth": 1,
    "heads": 2,
    "map_max_iterations": 1000,
    "sampler_steps": 10,
    "n_generations": 1,
}


def _optimizer(cfg):
    sched = optax.exponential_decay(cfg.lr, cfg.lr_decay_steps, cfg.lr_decay)
    return optax.adam(sched)


def _model(geom, feats, cfg):
    return rwefm.VectorField(
        geom, width=cfg.width, depth=cfg.depth, heads=cfg.heads, features_of=feats
    )


@functools.cache
def _chunk_fn(geom, feats, cfg, iterations):
    """The trainer factory and one jitted chunk of ``cfg.chunk`` steps for every seed at once
    (vmapped), the clouds and the noise model as arguments: compiled once per setting."""
    model = _model(geom, feats, cfg)

    def trainer(noise):
        return rwefm.make_trainer(
            geom,
            model,
            _optimizer(cfg),
            noise,
            epsilon=cfg.epsilon,
            sinkhorn_iterations=iterations,
            pairing=cfg.pairing,
        )

    def run(states, key, clouds, noise):
        w = jnp.ones(clouds.shape[:2], clouds.dtype)
        train = rwefm.make_train(trainer(noise), cfg.chunk, cfg.batch)
        keys = jax.random.split(key, cfg.n_seeds)
        return jax.vmap(train, in_axes=(0, 0, None, None))(keys, states, clouds, w)

    return trainer, jax.jit(run)


def _train(key, geom: Manifold, feats, noise, clouds, cfg, iterations, ctx, tag):
    """Trains ``cfg.n_seeds`` models; returns ``(params [S], last-chunk loss, converged frac)``.

    The converged fraction is the mean over every chunk of the chunk's mean ``map_converged``.
    Each chunk's figure is kept in the checkpointed state (beside the chunk count), so a run
    resumed with ``--resume``, finished or not, reports the uninterrupted run's value."""
    trainer, chunk = _chunk_fn(geom, feats, cfg, iterations)
    w = jnp.ones(clouds.shape[:2], clouds.dtype)
    k0, key = jax.random.split(key)
    first = rwefm.CloudBatch(clouds[: cfg.batch], w[: cfg.batch])
    states = [trainer(noise).init(k, first) for k in jax.random.split(k0, cfg.n_seeds)]
    state = jax.tree.map(lambda *a: jnp.stack(a), *states)
    n_chunks = max(cfg.steps // cfg.chunk, 1)

    def step(st, k):
        # (train state, each chunk's converged fraction, chunks done); run eagerly around the
        # jitted chunk, so each fraction is the float32 mean the log line reports
        train_state, fracs, c = st
        train_state, infos = chunk(train_state, k, clouds, noise)
        fracs = fracs.at[c].set(jnp.mean(infos.map_converged))
        return (train_state, fracs, c + 1), infos

    def log(c, infos):
        return {"step": (c + 1) * cfg.chunk, "loss": float(jnp.mean(infos.loss)),
                "map_converged": float(jnp.mean(infos.map_converged))}  # fmt: skip

    start = (state, jnp.zeros(n_chunks, jnp.float32), jnp.zeros((), jnp.int32))
    (state, fracs, _), infos = ctx.train_chunks(
        step, start, n_chunks, key, tag=tag, ckpt_every=cfg.ckpt_every, log=log
    )
    conv = float(np.mean(np.asarray(fracs, np.float64)))
    return state.params, float(jnp.mean(infos.loss)), conv


@functools.cache
def _sampler_fn(geom, feats, cfg):
    model = _model(geom, feats, cfg)
    sampler = rwefm.make_sampler(geom, model, n_steps=cfg.sampler_steps, method=cfg.method)
    return jax.jit(jax.vmap(sampler.sample, in_axes=(0, 0, None)))


@functools.cache
def _distances(manifold, eps, iters):
    """Jitted ``(xs, ys) -> {ground: [N, M]}`` and the EMD solves' convergence."""

    def dist(xs, ys):
        a, b = jnp.ones(xs.shape[:2], xs.dtype), jnp.ones(ys.shape[:2], ys.dtype)
        emd, ok = rwefm.emd_distances(manifold, xs, a, ys, b, epsilon=eps, max_iterations=iters)
        return {"chamfer": rwefm.chamfer_distances(manifold, xs, a, ys, b), "emd": emd}, ok

    return jax.jit(dist)


def _scores(dist, gen, test, d_tt, bandwidth, oks):
    d_gg, ok_gg = dist(gen, gen)
    d_gt, ok_gt = dist(gen, test)
    oks += [ok_gg, ok_gt]
    out = {}
    for g in ("chamfer", "emd"):
        out[f"{g}_1nna"] = float(rwefm.one_nn_accuracy(d_gg[g], d_tt[g], d_gt[g]))
        halves = np.asarray(rwefm.one_nn_accuracies(d_gg[g], d_tt[g], d_gt[g]), np.float64)
        out[f"{g}_1nna_half"] = float(np.mean(np.abs(halves - 0.5)))
        out[f"{g}_mm"] = float(rwefm.min_matching_distance(d_gt[g]))
        out[f"{g}_kmmd"] = float(rwefm.mmd(d_gg[g], d_tt[g], d_gt[g], bandwidth[g]))
    return out


def _stats(summary, prefix, rows):
    for m in rows[0]:
        v = np.array([r[m] for r in rows])
        summary[f"{prefix}_{m}_mean"] = float(v.mean())
        summary[f"{prefix}_{m}_sd"] = float(v.std(ddof=1)) if v.size > 1 else 0.0
        if prefix in ARMS:
            summary[f"{prefix}_{m}_seeds"] = [round(float(x), 5) for x in v]


def _mean_rows(rows):
    """One row of each metric's mean over a seed's generations."""
    return {m: float(np.mean([r[m] for r in rows])) for m in rows[0]}


def _paired(summary, name, rows_a, rows_b):
    for m in rows_a[0]:
        v = np.array([a[m] - b[m] for a, b in zip(rows_a, rows_b, strict=True)])
        summary[f"{m}_{name}_mean"] = float(v.mean())
        summary[f"{m}_{name}_sd"] = float(v.std(ddof=1)) if v.size > 1 else 0.0


def compare(key, manifold, train_clouds, test, floors, cfg, ctx, tag=None, extra_scores=None):
    """Trains every arm over ``cfg.n_seeds`` seeds and scores them (module docstring).

    Args:
      key: the study's PRNG key for this manifold.
      manifold: the manifold the clouds live on.
      train_clouds, test: ``[N, n, d]`` clouds; ``floors``: further held-out draws like ``test``.
      cfg: a :class:`TrainConfig`; ctx: the run context; tag: a stage-name prefix or None.
      extra_scores: ``(generated [n_test, n, d], test) -> {metric: float}``, a study's own
        metrics, scored, summarised and paired like the shared ones; or None.

    Returns:
      ``(summary, gen_rwefm [n_test, n, d], gen_euclid)`` (the generated clouds of seed 0).
    """
    kc, kt, ks = jax.random.split(key, 3)
    ones = jnp.ones(train_clouds.shape[:2], train_clouds.dtype)
    noise = rwefm.fit_noise(manifold, rwefm.CloudBatch(train_clouds, ones), cfg.noise)
    chart = Euclidean(manifold.dim)
    # arm -> (the flow's geometry, the manifold whose features the network sees)
    arms = {"rwefm": (manifold, None), "euclid": (chart, None)}
    probe = jax.ShapeDtypeStruct((1, manifold.dim), jnp.float32)
    if jax.eval_shape(manifold.features, probe).shape != probe.shape:
        arms["euclid_periodic"] = (chart, manifold)
    label = "" if tag is None else f"{tag}-"
    summary = {"noise": cfg.noise, "pairing": cfg.pairing, "n_seeds": cfg.n_seeds}
    summary.update(arms=list(arms), n_generations=cfg.n_generations)
    shape = (cfg.n_generations, cfg.n_seeds, cfg.n_test, cfg.n_points)
    x0 = noise.sample(ks, shape)  # the same noise clouds for every arm
    mask = jnp.ones(shape[2:], bool)
    gens, calibrated, t0 = {}, {}, time.perf_counter()
    for arm, (geom, feats) in arms.items():
        if geom not in calibrated:  # the chart arms share one geometry, hence one calibration
            calibrated[geom] = rwefm.calibrate_map_iterations(
                kc, geom, noise, train_clouds, ones, epsilon=cfg.epsilon, target=cfg.map_target,
                n_pairs=cfg.map_pairs, max_iterations=cfg.map_max_iterations,
                pairing=cfg.pairing, batch_size=cfg.batch,
            )  # fmt: skip
        iters, frac = calibrated[geom]
        params, loss, conv = _train(
            kt, geom, feats, noise, train_clouds, cfg, iters, ctx, label + arm
        )
        summary[f"map_iterations_{arm}"], summary[f"map_calibration_frac_{arm}"] = iters, frac
        summary[f"map_converged_frac_{arm}"], summary[f"{arm}_final_loss_mean"] = conv, loss
        sample = _sampler_fn(geom, feats, cfg)
        gens[arm] = jnp.stack([sample(params, x, mask) for x in x0])  # [G, S, n_test, n, d]
    summary["train_seconds"] = time.perf_counter() - t0
    raw_e = gens["euclid"]
    for arm in arms:
        if arm != "rwefm":
            gens[arm] = manifold.proj(gens[arm])
    summary["on_manifold_max_err"] = float(jnp.max(manifold.manifold_error(gens["rwefm"])))
    summary["euclid_off_manifold_before_proj"] = float(jnp.max(manifold.manifold_error(raw_e)))

    dist = _distances(manifold, cfg.eval_epsilon, cfg.eval_max_iterations)
    d_tt, ok_tt = dist(test, test)
    oks = [ok_tt]
    bandwidth = {g: rwefm.median_bandwidth(d) for g, d in d_tt.items()}

    def score(g):
        out = _scores(dist, g, test, d_tt, bandwidth, oks)
        return out if extra_scores is None else {**out, **extra_scores(g, test)}

    rows = {
        arm: [_mean_rows([score(g[i, s]) for i in range(cfg.n_generations)])
              for s in range(cfg.n_seeds)]
        for arm, g in gens.items()
    }  # fmt: skip
    floor_rows = [score(f) for f in floors]
    for arm in arms:
        _stats(summary, arm, rows[arm])
    _stats(summary, "floor", floor_rows)
    _paired(summary, "diff", rows["rwefm"], rows["euclid"])
    if "euclid_periodic" in arms:
        _paired(summary, "diff_periodic", rows["rwefm"], rows["euclid_periodic"])
    summary["eval_converged_frac"] = float(np.mean(np.concatenate([np.ravel(o) for o in oks])))
    if cfg.n_seeds >= 2:
        ref = "euclid_periodic" if "euclid_periodic" in arms else "euclid"
        gap = {a: [abs(r["emd_1nna"] - 0.5) for r in rows[a]] for a in ("rwefm", ref)}
        v = _verdicts.paired(
            gap["rwefm"], gap[ref], margin=_verdicts.MARGINS["rwefm"], direction="less"
        )
        summary.update(v.summary_keys(), verdict_reference=ref)
    return summary, gens["rwefm"][0, 0], gens["euclid"][0, 0]
