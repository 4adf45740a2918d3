"""RWEFM versus Euclidean flow matching on synthetic meta-distributions on S^2 and T^2.

Each sample is a whole cloud. On ``S^2``: a mixture of ``n_modes`` von Mises-Fisher components
with uniform modes, log-uniform concentrations in ``kappa_range`` (broad by default) and
Dirichlet(1) weights (:func:`hexad.rwefm.vmf_mixture_clouds`). On ``T^2``: a mixture of wrapped
normals with scales in ``scale_range`` whose centres lie within ``seam_width`` of the seam
``+-pi`` (:func:`hexad.rwefm.wrapped_normal_mixture_clouds`), so the clouds straddle it: the
flat torus and the baseline's angle chart differ only there.

For each manifold the shared :func:`experiments._rwefm.compare` trains RWEFM on M and the
Euclidean baseline on the ambient coordinates (``R^3``; angles in ``R^2``) from the same noise,
``n_seeds`` seeds each, and scores both against ``n_test`` held-out clouds, with floors from
``n_floor`` further held-out draws (see that module for the settings they share). Training
checkpoints through ``hexad.cachex`` (``<manifold>-<arm>/`` in
``checkpoints/<study>/<run>/settings-<hash>/`` or ``--ckpt DIR``, the hash of every setting
but ``manifolds``); ``--resume`` continues from each arm's newest durable chunk trained with
the same settings.

Command:  python -m experiments.rwefm_synthetic [--quick] [--out DIR] [--seed N] [--set k=v ...]
          [--resume] [--ckpt DIR]
Runtime:  --quick about 3-4 minutes on 2 idle cores (mostly compilation); the full study
          (2 manifolds x 2 arms x 3 seeds x 5000 steps) about an hour per manifold on 2 idle
          cores (S^2: 95 min beside two other jobs, 35-90 s per chunk). T^2 is run in one-seed
          parts (``--set manifolds=t2 --set n_seeds=1 --seed k --out .../t2-seed<k>``, three
          arms): 32-44 min each on 2 cores (12-13 s per 100-step chunk per arm), 29-60 min
          beside a second part, depending on the host (set ``manifolds=t2`` or
          ``manifolds=s2`` to run one: it draws the same data as in the full study, and a
          later full run with the same ``--out`` name and ``--resume`` reuses its training).

summary.json keys: ``noise``, ``pairing``, ``n_seeds``; the worst case over the manifolds of
``map_converged_frac_<arm>`` (every arm that ran) and ``eval_converged_frac``;
``train_seconds``; and, for ``m`` in ``s2``, ``t2``, every key of
:func:`experiments._rwefm.compare` prefixed ``{m}_`` (metric means, sds, seeds, paired
differences, floors, map and evaluation convergence, manifold errors, final losses).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np

from experiments import _runner
from experiments._rwefm import QUICK, TrainConfig, compare
from hexad.geometry import Sphere, Torus
from hexad.rwefm import vmf_mixture_clouds, wrapped_normal_mixture_clouds

MANIFOLDS = ("s2", "t2")


@dataclasses.dataclass(frozen=True)
class Config(TrainConfig):
    manifolds: tuple[str, ...] = MANIFOLDS
    n_modes: int = 3
    kappa_range: tuple[float, float] = (2.0, 10.0)
    scale_range: tuple[float, float] = (0.5, 1.0)
    seam_width: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        _runner.one_of(self, MANIFOLDS, "manifolds")
        _runner.at_least(self, 1, "n_modes")
        _runner.positive(self, "kappa_range", "scale_range", "seam_width")
        for name in ("kappa_range", "scale_range"):
            lo, hi = getattr(self, name)
            _runner.require(lo <= hi, name, f"{name} must be (low, high) with low <= high")


def _data(key, name, n, cfg):
    if name == "s2":
        return vmf_mixture_clouds(
            key, n, cfg.n_points, n_modes=cfg.n_modes, kappa_range=cfg.kappa_range
        )
    return wrapped_normal_mixture_clouds(
        key,
        n,
        cfg.n_points,
        n_modes=cfg.n_modes,
        scale_range=cfg.scale_range,
        seam_width=cfg.seam_width,
    )


def _plot(ctx, name, test, gen_r, gen_e):
    import matplotlib.pyplot as plt

    def coords(c):
        c = np.asarray(c)
        if name == "s2":
            return np.arctan2(c[:, 1], c[:, 0]), np.arcsin(np.clip(c[:, 2], -1, 1))
        return c[:, 0], c[:, 1]

    k = 4
    fig, axes = plt.subplots(3, k, figsize=(3 * k, 8), sharex=True, sharey=True, squeeze=False)
    half = math.pi / 2 if name == "s2" else math.pi
    for row, (title, clouds) in enumerate(
        (("held-out", test), ("RWEFM", gen_r), ("Euclidean", gen_e))
    ):
        for j in range(min(k, clouds.shape[0])):
            ax = axes[row, j]
            ax.scatter(*coords(clouds[j]), s=6)
            ax.set_xlim(-math.pi, math.pi)
            ax.set_ylim(-half, half)
            if j == 0:
                ax.set_ylabel(title)
    fig.suptitle(f"{name}: real vs generated clouds (seed 0)")
    ctx.save_plot(fig, f"clouds_{name}")


def run(cfg: Config, ctx: _runner.Context) -> dict:
    summary: dict = {"noise": cfg.noise, "pairing": cfg.pairing, "n_seeds": cfg.n_seeds}
    worst: dict = {}
    t_train = 0.0
    for name in cfg.manifolds:
        # Each manifold's key depends on its name only, so a run of one manifold draws the
        # same data (and resumes the same checkpoints) as the full study.
        key = jax.random.fold_in(ctx.key(), MANIFOLDS.index(name))
        kd, kt, kf, kc = jax.random.split(key, 4)
        manifold = Sphere(3) if name == "s2" else Torus(2)
        train = _data(kd, name, cfg.n_train, cfg)
        test = _data(kt, name, cfg.n_test, cfg)
        floors = [_data(k, name, cfg.n_test, cfg) for k in jax.random.split(kf, cfg.n_floor)]
        figures, gen_r, gen_e = compare(kc, manifold, train, test, floors, cfg, ctx, name)
        t_train += figures["train_seconds"]
        for k, v in figures.items():
            if k.startswith("map_converged_frac_") or k == "eval_converged_frac":
                worst[k] = min(worst.get(k, 1.0), v)
        summary.update({f"{name}_{k}": v for k, v in figures.items()})
        _plot(ctx, name, test, gen_r, gen_e)
    return {**summary, **worst, "train_seconds": t_train}


STUDY = _runner.Study(
    "rwefm_synthetic", Config, run, quick=QUICK, doc=__doc__, resume_shared=("manifolds",)
)

if __name__ == "__main__":
    STUDY.main()
