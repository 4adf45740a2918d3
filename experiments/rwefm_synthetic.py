"""RWEFM versus Euclidean flow matching on synthetic meta-distributions on S^2 and T^2.

Each sample is a whole cloud: on ``S^2`` a mixture of ``n_modes`` von Mises-Fisher components
with uniform random modes, log-uniform concentrations in ``kappa_range`` and Dirichlet(1)
weights; on ``T^2`` a mixture of wrapped normals with uniform centres and scales in
``scale_range`` (:func:`hexad.rwefm.vmf_mixture_clouds`,
:func:`hexad.rwefm.wrapped_normal_mixture_clouds`). For each manifold the study trains

- RWEFM: the :class:`hexad.rwefm.VectorField` on ``M`` with uniform noise clouds, Riemannian
  entropic maps and McCann velocities, sampled with Riemannian midpoint steps; and
- the Euclidean baseline: the same network, budget and sampler on the ambient coordinates
  (``R^3`` for the sphere, angles in ``R^2`` for the torus) with Gaussian noise fitted to the
  data, squared Euclidean OT, and its samples projected onto ``M`` at the end
  (normalised / wrapped),

then generates ``n_test`` clouds with each and compares them with ``n_test`` held-out clouds.

Training checkpoints through ``hexad.cachex`` every ``ckpt_every`` chunks (default
``checkpoints/<study>/<run>/<model>/``, or ``--ckpt DIR``); ``--resume`` restores each model's
newest durable chunk and continues with the same per-chunk keys, so a resumed run reproduces
the uninterrupted one.

Command:  python -m experiments.rwefm_synthetic [--quick] [--out DIR] [--seed N] [--set k=v ...]
          [--resume] [--ckpt DIR]
Runtime:  --quick measured at 115 s of CPU (113 s user + 3 s sys; 81 s of wall time on an
          idle 2-core machine), most of it XLA compilation of the four training
          chunks and sampling; the full study (4 models x 1000 steps) measured at 2311 s of
          CPU (2262 user + 49 sys; 54 min of wall time at load 6-10).

Full run (seed 0; lower is better except 1-NNA, ideal 0.5):
  S^2: W2 RWEFM 0.561 vs Euclidean 0.545 (floor 0.574); 1-NNA 0.438 vs 0.352 (0.06 vs 0.15
       from the ideal 0.5); MMD 0.0057 vs 0.0138; on-manifold error 1.2e-7 (the baseline was
       0.70 off the sphere before projection).
  T^2: W2 1.004 vs 0.984 (floor 0.953); 1-NNA 0.594 vs 0.531; MMD 0.0155 vs 0.0142; error 0.
  The baseline matches or beats RWEFM on W2 on both manifolds; on S^2 RWEFM is better on 1-NNA
  and its MMD is 2.4x lower; on T^2 the baseline is as good or better on every metric.

summary.json keys, for ``m`` in ``s2``, ``t2``:
  ``{m}_rwefm_w2``, ``{m}_euclid_w2``: symmetric nearest-cloud Sinkhorn W2 on M between
    generated and held-out clouds (:func:`hexad.rwefm.set_w2`; lower is better);
  ``{m}_rwefm_1nna``, ``{m}_euclid_1nna``: leave-one-out 1-NN two-sample accuracy between
    generated and held-out clouds (0.5 ideal);
  ``{m}_rwefm_mmd``, ``{m}_euclid_mmd``: squared MMD on cloud W2 distances (median bandwidth);
  ``{m}_on_manifold_max_err``: largest distance of an RWEFM sample coordinate from M;
  ``{m}_euclid_off_manifold_before_proj``: the baseline's largest distance from M before its
    final projection;
  ``{m}_rwefm_final_loss``, ``{m}_euclid_final_loss``: mean training loss of the last chunk;
  ``{m}_data_w2``: the same W2 between two held-out sets of real clouds (the noise floor);
  ``train_seconds``: wall seconds spent training (all models).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments import _runner
from hexad import cachex
from hexad.geometry import Euclidean, Sphere, Torus
from hexad.rwefm import (
    CloudBatch,
    NoiseModel,
    VectorField,
    cloud_distances,
    fit_noise,
    make_sampler,
    make_trainer,
    mmd,
    one_nn_accuracy,
    set_w2,
    vmf_mixture_clouds,
    wrapped_normal_mixture_clouds,
)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The cloud sizes, network, training and evaluation settings all three RWEFM studies share
    (each study's ``Config`` adds its data settings); :func:`compare` reads these."""

    n_train: int = 512
    n_test: int = 64
    n_points: int = 64
    steps: int = 1000
    chunk: int = 50
    batch: int = 32
    lr: float = 1e-3
    width: int = 64
    depth: int = 3
    heads: int = 4
    epsilon: float = 0.1
    ot_pairing: bool = True
    sampler_steps: int = 100
    method: str = "midpoint"
    eval_epsilon: float = 0.01
    ckpt_every: int = 10

    def __post_init__(self):
        _runner.at_least(self, 1, "n_train", "n_test", "n_points", "steps", "chunk", "batch")
        _runner.at_least(self, 1, "width", "depth", "heads", "sampler_steps", "ckpt_every")
        _runner.positive(self, "lr", "epsilon", "eval_epsilon")
        _runner.one_of(self, ("euler", "midpoint"), "method")


@dataclasses.dataclass(frozen=True)
class Config(TrainConfig):
    manifolds: tuple[str, ...] = ("s2", "t2")
    n_modes: int = 3
    kappa_range: tuple[float, float] = (10.0, 40.0)
    scale_range: tuple[float, float] = (0.15, 0.5)

    def __post_init__(self):
        super().__post_init__()
        _runner.one_of(self, ("s2", "t2"), "manifolds")
        _runner.at_least(self, 1, "n_modes")
        _runner.positive(self, "kappa_range", "scale_range")
        for name in ("kappa_range", "scale_range"):
            lo, hi = getattr(self, name)
            _runner.require(lo <= hi, name, f"{name} must be (low, high) with low <= high")


def _data(key, name, n, cfg):
    if name == "s2":
        return vmf_mixture_clouds(
            key, n, cfg.n_points, n_modes=cfg.n_modes, kappa_range=cfg.kappa_range
        )
    return wrapped_normal_mixture_clouds(
        key, n, cfg.n_points, n_modes=cfg.n_modes, scale_range=cfg.scale_range
    )


@functools.cache
def _chunk_fn(manifold, width, depth, heads, lr, steps, epsilon, ot_pairing, batch, chunk):
    """The model, optimizer, and one jitted training chunk per setting (compiled once per shape).

    ``run(state, key, train, noise)`` takes ``chunk`` steps on minibatches of ``batch`` clouds
    drawn from ``train`` without replacement. The data and the noise model are arguments, so
    runs in one process with the same settings and shapes (e.g. an interrupted and a resumed
    run in the tests) share one compilation.
    """
    model = VectorField(manifold, width=width, depth=depth, heads=heads)
    opt = optax.adam(optax.cosine_decay_schedule(lr, steps, alpha=0.1))

    def run(state, key, train, noise):
        tr = make_trainer(manifold, model, opt, noise, epsilon=epsilon, ot_pairing=ot_pairing)
        weights = jnp.ones(train.shape[:2], train.dtype)

        def body(st, k):
            ki, ks = jax.random.split(k)
            idx = jax.random.choice(ki, train.shape[0], (batch,), replace=False)
            st, info = tr.step(ks, st, CloudBatch(train[idx], weights[idx]))
            return st, info.loss

        return jax.lax.scan(body, state, jax.random.split(key, chunk))

    return model, opt, jax.jit(run)


def _train(key, manifold, noise, train, cfg, ctx, tag):
    """Trains one model in jitted chunks; checkpoints every ``ckpt_every`` chunks (--resume).

    The state and the last chunk's mean loss go through :class:`hexad.cachex.CacheXManager`
    into ``ctx.checkpoint_dir / tag``; chunk ``c`` draws its keys from ``fold_in(key, c)``, so
    a resumed run takes exactly the steps of an uninterrupted one.
    """
    model, opt, chunk = _chunk_fn(
        manifold,
        cfg.width,
        cfg.depth,
        cfg.heads,
        cfg.lr,
        cfg.steps,
        cfg.epsilon,
        cfg.ot_pairing,
        cfg.batch,
        cfg.chunk,
    )
    tr = make_trainer(manifold, model, opt, noise, epsilon=cfg.epsilon, ot_pairing=cfg.ot_pairing)
    weights = jnp.ones(train.shape[:2], train.dtype)
    k0, key = jax.random.split(key)
    state = tr.init(k0, CloudBatch(train[: cfg.batch], weights[: cfg.batch]))

    n_chunks = max(cfg.steps // cfg.chunk, 1)
    if cfg.ckpt_every < 1:
        raise ValueError(f"ckpt_every: expected an int >= 1, got {cfg.ckpt_every}")
    saved = {"state": state, "loss": jnp.zeros((), jnp.float32)}
    mngr = None if ctx.checkpoint_dir is None else cachex.CacheXManager(ctx.checkpoint_dir / tag)
    try:
        start = 0
        if mngr is not None:
            start, saved = cachex.resume(mngr, saved, ctx.resume)
        state, loss = saved["state"], saved["loss"]
        for c in ctx.progress(range(start, n_chunks), desc=f"train {tag}"):
            state, losses = chunk(state, jax.random.fold_in(key, c), train, noise)
            loss = jnp.mean(losses)
            if mngr is not None and ((c + 1) % cfg.ckpt_every == 0 or c + 1 == n_chunks):
                mngr.save(c, {"state": state, "loss": loss})
            ctx.log(model=tag, step=(c + 1) * cfg.chunk, loss=float(loss))
        if mngr is not None:
            mngr.wait_until_finished()
    finally:
        if mngr is not None:
            mngr.close()
    return model, state.params, float(loss)


@functools.cache
def _distance_fn(manifold, epsilon):
    """One jitted cloud-distance matrix per (manifold, epsilon), shared by every evaluation
    of a run and by later runs in the same process: compiled once per shape."""

    def dist(xs, ys):
        a = jnp.ones(xs.shape[:2], xs.dtype)
        b = jnp.ones(ys.shape[:2], ys.dtype)
        return cloud_distances(manifold, xs, a, ys, b, epsilon=epsilon)

    return jax.jit(dist)


@functools.cache
def _sampler_fn(manifold, width, depth, heads, n_steps, method):
    """One jitted sampler per network and sampler settings (compiled once per shape)."""
    model = VectorField(manifold, width=width, depth=depth, heads=heads)
    return jax.jit(make_sampler(manifold, model, n_steps=n_steps, method=method).sample)


def _evaluate(manifold, gen, test, cfg):
    dist = _distance_fn(manifold, cfg.eval_epsilon)
    d_gt, d_gg, d_tt = dist(gen, test), dist(gen, gen), dist(test, test)
    return {
        "w2": float(set_w2(d_gt)),
        "1nna": float(one_nn_accuracy(d_gg, d_tt, d_gt)),
        "mmd": float(mmd(d_gg, d_tt, d_gt)),
    }


def _plot(ctx, name, test, gen_r, gen_e):
    import matplotlib.pyplot as plt

    def coords(c):
        c = np.asarray(c)
        if name == "s2":
            return np.arctan2(c[:, 1], c[:, 0]), np.arcsin(np.clip(c[:, 2], -1, 1))
        return c[:, 0], c[:, 1]

    k = 4
    fig, axes = plt.subplots(3, k, figsize=(3 * k, 8), sharex=True, sharey=True)
    for row, (title, clouds) in enumerate(
        (("held-out", test), ("RWEFM", gen_r), ("Euclidean", gen_e))
    ):
        for j in range(k):
            ax = axes[row, j]
            u, v = coords(clouds[j])
            ax.scatter(u, v, s=6)
            ax.set_xlim(-math.pi, math.pi)
            ax.set_ylim(
                -math.pi / 2 if name == "s2" else -math.pi, math.pi / 2 if name == "s2" else math.pi
            )
            if j == 0:
                ax.set_ylabel(title)
    fig.suptitle(
        f"{name}: real vs generated clouds ({'longitude/latitude' if name == 's2' else 'angles'})"
    )
    ctx.save_plot(fig, f"clouds_{name}")


def compare(keys, manifold, train, test, test2, cfg, ctx, tag=None):
    """Trains RWEFM on ``manifold`` and the Euclidean baseline on the same clouds, and scores both.

    The baseline is the same network and budget in the ambient space ``R^manifold.dim``, its
    samples projected onto the manifold at the end. Both are scored against ``test``; ``test2``
    (a second draw from the test distribution) gives the data's own floor.

    Args:
      keys: four PRNG keys: RWEFM training, baseline training, RWEFM noise, baseline noise.
      manifold: the manifold the clouds live on.
      train, test, test2: ``[n, m, d]`` clouds.
      cfg: the study config (training, sampler and metric settings).
      ctx: the run context (progress, metrics).
      tag: prefix of the progress labels, or None.

    Returns:
      ``(figures, gen_r, gen_e, train_seconds)``: the summary figures, and the generated clouds.
    """
    kr, ke, k1, k2 = keys
    ambient = Euclidean(manifold.dim)
    label = "" if tag is None else f"{tag}-"
    t0 = time.perf_counter()
    _, params_r, loss_r = _train(
        kr, manifold, NoiseModel(manifold), train, cfg, ctx, f"{label}rwefm"
    )
    noise_e = fit_noise(ambient, CloudBatch(train, jnp.ones(train.shape[:2], train.dtype)))
    _, params_e, loss_e = _train(ke, ambient, noise_e, train, cfg, ctx, f"{label}euclid")
    seconds = time.perf_counter() - t0

    shape = (cfg.n_test, cfg.n_points)
    mask = jnp.ones(shape, bool)
    net = (cfg.width, cfg.depth, cfg.heads, cfg.sampler_steps, cfg.method)
    samp_r, samp_e = _sampler_fn(manifold, *net), _sampler_fn(ambient, *net)
    gen_r = samp_r(params_r, NoiseModel(manifold).sample(k1, shape), mask)
    raw_e = samp_e(params_e, noise_e.sample(k2, shape), mask)
    gen_e = manifold.proj(raw_e)

    er = _evaluate(manifold, gen_r, test, cfg)
    ee = _evaluate(manifold, gen_e, test, cfg)
    floor = _evaluate(manifold, test2, test, cfg)
    figures = {
        "rwefm_w2": er["w2"],
        "euclid_w2": ee["w2"],
        "rwefm_1nna": er["1nna"],
        "euclid_1nna": ee["1nna"],
        "rwefm_mmd": er["mmd"],
        "euclid_mmd": ee["mmd"],
        "on_manifold_max_err": float(jnp.max(manifold.manifold_error(gen_r))),
        "euclid_off_manifold_before_proj": float(jnp.max(manifold.manifold_error(raw_e))),
        "rwefm_final_loss": loss_r,
        "euclid_final_loss": loss_e,
        "data_w2": floor["w2"],
    }
    return figures, gen_r, gen_e, seconds


def run(cfg: Config, ctx: _runner.Context) -> dict:
    summary: dict = {}
    t_train = 0.0
    key = ctx.key()
    for name in cfg.manifolds:
        if name not in ("s2", "t2"):
            raise ValueError(f"manifolds: expected names in ('s2', 't2'), got {name!r}")
        key, kd, kt, kt2, kr, ke, ks = jax.random.split(key, 7)
        manifold = Sphere(3) if name == "s2" else Torus(2)
        train = _data(kd, name, cfg.n_train, cfg)
        test = _data(kt, name, cfg.n_test, cfg)
        test2 = _data(kt2, name, cfg.n_test, cfg)
        figures, gen_r, gen_e, seconds = compare(
            (kr, ke) + tuple(jax.random.split(ks)), manifold, train, test, test2, cfg, ctx, name
        )
        t_train += seconds
        summary.update({f"{name}_{k}": v for k, v in figures.items()})
        _plot(ctx, name, test, gen_r, gen_e)
    summary["train_seconds"] = t_train
    return summary


#: The --quick sizes, shared with the single-cell study.
QUICK = {
    "n_train": 64,
    "n_test": 16,
    "n_points": 24,
    "steps": 150,
    "chunk": 50,
    "batch": 8,
    "lr": 3e-3,
    "width": 32,
    "depth": 1,
    "heads": 2,
    "sampler_steps": 20,
}

STUDY = _runner.Study(
    "rwefm_synthetic",
    Config,
    run,
    quick=QUICK,
    doc=__doc__,
)

if __name__ == "__main__":
    STUDY.main()
