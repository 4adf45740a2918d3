"""What the three RWEFM studies share: the training config, the --quick sizes and ``compare``.

:func:`compare` trains RWEFM on a manifold and the Euclidean baseline on the same clouds, and
scores both against held-out clouds; ``rwefm_synthetic``, ``rwefm_protein`` and
``rwefm_singlecell`` differ only in their data (and plots). Training is
:func:`hexad.rwefm.make_train` in jitted chunks through
:meth:`experiments._runner.Context.train_chunks` (progress, per-chunk keys, checkpoints in
``checkpoint_dir / <tag>``, ``--resume``).
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import optax

from experiments import _runner
from hexad import rwefm
from hexad.geometry import Euclidean, Manifold

__all__ = ["QUICK", "TrainConfig", "compare", "train"]


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


#: The --quick sizes of every RWEFM study.
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


@functools.cache
def _chunk_fn(manifold, width, depth, heads, lr, steps, epsilon, ot_pairing, batch, chunk):
    """The trainer factory and one jitted chunk of ``chunk`` minibatch steps per setting.

    The clouds and the noise model are arguments of the chunk, so runs in one process with the
    same settings and shapes (an interrupted and a resumed run in the tests) share one
    compilation.
    """
    model = rwefm.VectorField(manifold, width=width, depth=depth, heads=heads)
    opt = optax.adam(optax.cosine_decay_schedule(lr, steps, alpha=0.1))

    def trainer(noise):
        return rwefm.make_trainer(
            manifold, model, opt, noise, epsilon=epsilon, ot_pairing=ot_pairing
        )

    def run(state, key, clouds, noise):
        weights = jnp.ones(clouds.shape[:2], clouds.dtype)
        return rwefm.make_train(trainer(noise), chunk, batch)(key, state, clouds, weights)

    return trainer, jax.jit(run)


def train(key, manifold: Manifold, noise, clouds, cfg: TrainConfig, ctx, tag: str):
    """Trains one model on ``clouds [N, n, d]``; returns ``(params, mean loss of the last chunk)``.

    ``split(key)`` gives the init key and the run key; chunk ``c`` runs on
    ``fold_in(run key, c)``, checkpointed every ``cfg.ckpt_every`` chunks under ``tag``.
    """
    trainer, chunk = _chunk_fn(
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
    weights = jnp.ones(clouds.shape[:2], clouds.dtype)
    k0, key = jax.random.split(key)
    first = rwefm.CloudBatch(clouds[: cfg.batch], weights[: cfg.batch])
    state = trainer(noise).init(k0, first)

    def log(c, infos):
        return {
            "step": (c + 1) * cfg.chunk,
            "loss": float(jnp.mean(infos.loss)),
            "map_converged": float(jnp.mean(infos.map_converged)),
        }

    state, infos = ctx.train_chunks(
        lambda st, k: chunk(st, k, clouds, noise),
        state,
        max(cfg.steps // cfg.chunk, 1),
        key,
        tag=tag,
        ckpt_every=cfg.ckpt_every,
        log=log,
    )
    return state.params, float(jnp.mean(infos.loss))


@functools.cache
def _distance_fn(manifold, epsilon):
    """One jitted cloud-distance matrix per (manifold, epsilon), shared by every evaluation
    of a run and by later runs in the same process: compiled once per shape."""

    def dist(xs, ys):
        a = jnp.ones(xs.shape[:2], xs.dtype)
        b = jnp.ones(ys.shape[:2], ys.dtype)
        return rwefm.cloud_distances(manifold, xs, a, ys, b, epsilon=epsilon)

    return jax.jit(dist)


@functools.cache
def _sampler_fn(manifold, width, depth, heads, n_steps, method):
    """One jitted sampler per network and sampler settings (compiled once per shape)."""
    model = rwefm.VectorField(manifold, width=width, depth=depth, heads=heads)
    return jax.jit(rwefm.make_sampler(manifold, model, n_steps=n_steps, method=method).sample)


def _evaluate(manifold, gen, test, cfg):
    dist = _distance_fn(manifold, cfg.eval_epsilon)
    d_gt, d_gg, d_tt = dist(gen, test), dist(gen, gen), dist(test, test)
    return {
        "w2": float(rwefm.set_w2(d_gt)),
        "1nna": float(rwefm.one_nn_accuracy(d_gg, d_tt, d_gt)),
        "mmd": float(rwefm.mmd(d_gg, d_tt, d_gt)),
    }


def compare(keys, manifold, train_clouds, test, test2, cfg, ctx, tag=None):
    """Trains RWEFM on ``manifold`` and the Euclidean baseline on the same clouds, and scores both.

    RWEFM starts from uniform noise on the manifold. The baseline is the same network and budget
    in the ambient space ``R^manifold.dim`` from Gaussian noise fitted to the data
    (:func:`hexad.rwefm.fit_noise`), its samples projected onto the manifold at the end. Both
    are scored against ``test``; ``test2`` (a second draw from the test distribution) gives the
    data's own floor.

    Args:
      keys: four PRNG keys: RWEFM training, baseline training, RWEFM noise, baseline noise.
      manifold: the manifold the clouds live on.
      train_clouds, test, test2: ``[n, m, d]`` clouds.
      cfg: the study config (a :class:`TrainConfig`: training, sampler and metric settings).
      ctx: the run context (progress, metrics, checkpoints).
      tag: prefix of the training stages' names (``<tag>-rwefm``, ``<tag>-euclid``), or None.

    Returns:
      ``(figures, gen_r, gen_e, train_seconds)``: the summary figures, and the generated clouds.
    """
    kr, ke, k1, k2 = keys
    ambient = Euclidean(manifold.dim)
    label = "" if tag is None else f"{tag}-"
    t0 = time.perf_counter()
    params_r, loss_r = train(
        kr, manifold, rwefm.NoiseModel(manifold), train_clouds, cfg, ctx, f"{label}rwefm"
    )
    ones = jnp.ones(train_clouds.shape[:2], train_clouds.dtype)
    noise_e = rwefm.fit_noise(ambient, rwefm.CloudBatch(train_clouds, ones))
    params_e, loss_e = train(ke, ambient, noise_e, train_clouds, cfg, ctx, f"{label}euclid")
    seconds = time.perf_counter() - t0

    shape = (cfg.n_test, cfg.n_points)
    mask = jnp.ones(shape, bool)
    net = (cfg.width, cfg.depth, cfg.heads, cfg.sampler_steps, cfg.method)
    samp_r, samp_e = _sampler_fn(manifold, *net), _sampler_fn(ambient, *net)
    gen_r = samp_r(params_r, rwefm.NoiseModel(manifold).sample(k1, shape), mask)
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
