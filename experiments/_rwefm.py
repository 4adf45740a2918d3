"""What the three RWEFM studies share: the config, the --quick sizes and ``compare``.

:func:`compare` trains RWEFM on a manifold and the Euclidean baseline on the same clouds, over
``n_seeds`` seeds each, and scores both against held-out clouds as the RWEFM reference does;
``rwefm_synthetic``, ``rwefm_protein`` and ``rwefm_singlecell`` differ only in their data.

The two arms share everything but the geometry:

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

Scores, for the ground distances ``chamfer`` (``d_M^2``) and ``emd`` (entropic OT for ``d_M``,
``eval_epsilon`` relative, Sinkhorn to convergence): ``1nna`` (1-NN two-sample accuracy, 0.5
ideal), ``mm`` (minimum-matching distance) and ``kmmd`` (kernel MMD, one bandwidth: the
median of the held-out clouds' own distances). ``n_floor`` further held-out draws give each
metric's floor. Summary keys, for each such ``<metric>`` (e.g. ``emd_1nna``):
``rwefm_<metric>_mean``/``_sd``/``_seeds``, ``euclid_<metric>_mean``/``_sd``/``_seeds``,
``<metric>_diff_mean``/``_diff_sd`` (paired RWEFM - baseline over seeds),
``floor_<metric>_mean``/``_sd``; and ``noise``, ``pairing``, ``n_seeds``,
``map_iterations_<arm>``, ``map_calibration_frac_<arm>``, ``map_converged_frac_<arm>`` (over
all training maps), ``eval_converged_frac`` (over all EMD solves), ``<arm>_final_loss_mean``,
``on_manifold_max_err``, ``euclid_off_manifold_before_proj`` and ``train_seconds``, with
``<arm>`` in ``rwefm``, ``euclid``.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments import _runner
from hexad import rwefm
from hexad.geometry import Euclidean, Manifold

__all__ = ["METRICS", "QUICK", "TrainConfig", "compare"]

METRICS = tuple(f"{g}_{s}" for g in ("chamfer", "emd") for s in ("1nna", "mm", "kmmd"))
ARMS = ("rwefm", "euclid")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The settings all three RWEFM studies share (each study's ``Config`` adds its data)."""

    n_train: int = 512
    n_test: int = 96
    n_points: int = 32
    n_seeds: int = 3
    n_floor: int = 3
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
}


def _optimizer(cfg):
    sched = optax.exponential_decay(cfg.lr, cfg.lr_decay_steps, cfg.lr_decay)
    return optax.adam(sched)


@functools.cache
def _chunk_fn(geom, cfg, iterations):
    """The trainer factory and one jitted chunk of ``cfg.chunk`` steps for every seed at once
    (vmapped), the clouds and the noise model as arguments: compiled once per setting."""
    model = rwefm.VectorField(geom, width=cfg.width, depth=cfg.depth, heads=cfg.heads)

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


def _train(key, geom: Manifold, noise, clouds, cfg, iterations, ctx, tag):
    """Trains ``cfg.n_seeds`` models; returns ``(params [S], last-chunk loss, converged frac)``.

    The converged fraction is the mean over every chunk of the chunk's mean ``map_converged``.
    Each chunk's figure is kept in the checkpointed state (beside the chunk count), so a run
    resumed with ``--resume``, finished or not, reports the uninterrupted run's value."""
    trainer, chunk = _chunk_fn(geom, cfg, iterations)
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
def _sampler_fn(geom, cfg):
    model = rwefm.VectorField(geom, width=cfg.width, depth=cfg.depth, heads=cfg.heads)
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
        out[f"{g}_mm"] = float(rwefm.min_matching_distance(d_gt[g]))
        out[f"{g}_kmmd"] = float(rwefm.mmd(d_gg[g], d_tt[g], d_gt[g], bandwidth[g]))
    return out


def _stats(summary, prefix, rows):
    for m in METRICS:
        v = np.array([r[m] for r in rows])
        summary[f"{prefix}_{m}_mean"] = float(v.mean())
        summary[f"{prefix}_{m}_sd"] = float(v.std(ddof=1)) if v.size > 1 else 0.0
        if prefix in ARMS:
            summary[f"{prefix}_{m}_seeds"] = [round(float(x), 5) for x in v]


def compare(key, manifold, train_clouds, test, floors, cfg, ctx, tag=None):
    """Trains both arms over ``cfg.n_seeds`` seeds and scores them (module docstring).

    Args:
      key: the study's PRNG key for this manifold.
      manifold: the manifold the clouds live on.
      train_clouds, test: ``[N, n, d]`` clouds; ``floors``: further held-out draws like ``test``.
      cfg: a :class:`TrainConfig`; ctx: the run context; tag: a stage-name prefix or None.

    Returns:
      ``(summary, gen_rwefm [n_test, n, d], gen_euclid)`` (the generated clouds of seed 0).
    """
    kc, kt, ks = jax.random.split(key, 3)
    ones = jnp.ones(train_clouds.shape[:2], train_clouds.dtype)
    noise = rwefm.fit_noise(manifold, rwefm.CloudBatch(train_clouds, ones), cfg.noise)
    geoms = {"rwefm": manifold, "euclid": Euclidean(manifold.dim)}
    label = "" if tag is None else f"{tag}-"
    summary = {"noise": cfg.noise, "pairing": cfg.pairing, "n_seeds": cfg.n_seeds}
    shape = (cfg.n_seeds, cfg.n_test, cfg.n_points)
    x0 = noise.sample(ks, shape)  # the same noise clouds for both arms
    mask = jnp.ones(shape[1:], bool)
    gens, t0 = {}, time.perf_counter()
    for arm, geom in geoms.items():
        iters, frac = rwefm.calibrate_map_iterations(
            kc, geom, noise, train_clouds, ones, epsilon=cfg.epsilon, target=cfg.map_target,
            n_pairs=cfg.map_pairs, max_iterations=cfg.map_max_iterations, pairing=cfg.pairing,
            batch_size=cfg.batch,
        )  # fmt: skip
        params, loss, conv = _train(kt, geom, noise, train_clouds, cfg, iters, ctx, label + arm)
        summary[f"map_iterations_{arm}"], summary[f"map_calibration_frac_{arm}"] = iters, frac
        summary[f"map_converged_frac_{arm}"], summary[f"{arm}_final_loss_mean"] = conv, loss
        gens[arm] = _sampler_fn(geom, cfg)(params, x0, mask)
    summary["train_seconds"] = time.perf_counter() - t0
    raw_e, gens["euclid"] = gens["euclid"], manifold.proj(gens["euclid"])
    summary["on_manifold_max_err"] = float(jnp.max(manifold.manifold_error(gens["rwefm"])))
    summary["euclid_off_manifold_before_proj"] = float(jnp.max(manifold.manifold_error(raw_e)))

    dist = _distances(manifold, cfg.eval_epsilon, cfg.eval_max_iterations)
    d_tt, ok_tt = dist(test, test)
    oks = [ok_tt]
    bandwidth = {g: rwefm.median_bandwidth(d) for g, d in d_tt.items()}
    rows = {arm: [_scores(dist, g, test, d_tt, bandwidth, oks) for g in gens[arm]] for arm in ARMS}
    floor_rows = [_scores(dist, f, test, d_tt, bandwidth, oks) for f in floors]
    for arm in ARMS:
        _stats(summary, arm, rows[arm])
    _stats(summary, "floor", floor_rows)
    diffs = [{m: r[m] - e[m] for m in METRICS} for r, e in zip(*rows.values(), strict=True)]
    for m in METRICS:
        v = np.array([d[m] for d in diffs])
        summary[f"{m}_diff_mean"] = float(v.mean())
        summary[f"{m}_diff_sd"] = float(v.std(ddof=1)) if v.size > 1 else 0.0
    summary["eval_converged_frac"] = float(np.mean(np.concatenate([np.ravel(o) for o in oks])))
    return summary, gens["rwefm"][0], gens["euclid"][0]
