"""Phase diagram of exact recovery: graph-only, node-information-only and joint programs.

Two balanced communities of ``n`` nodes; the graph is an SBM with ``p = 1/2 + dpq/2`` and
``q = 1/2 - dpq/2`` (graph strength ``dpq = p - q``); node features are
``x_v = +-(sep/2) e_1 + N(0, I_d)`` (feature separation ``sep``); ``n_labeled`` nodes (half per
community) carry labels, each flipped with probability ``label_noise``. One feature dimension
(``d = 1``) by default: the entrywise signal-to-noise of ``K_x`` falls like ``1/sqrt(d)``.
For every grid cell and each of ``trials`` draws, three programs of ``hexad.cvxclust``
(arXiv:2508.20231) are solved with the same ``mu = mu_scale * sqrt(n)``:

- graph-only: ``min_{L in B} ||L - A||_1 + mu ||L||_*``;
- node-information-only: ``min_{L in B} -<alpha K_x + beta S_y, L> + mu ||L||_*``;
- joint: both terms together (``cvxclust.joint_problem``).

``alpha = feature_scale / std(K_x off-diagonal)`` puts the feature term's entrywise noise on
the scale of a graph entry (our choice, fixed before looking at the grid). A program
*recovers* a draw when ``max_uv |L_uv - 1[y_u = y_v]| <= recovery_tol`` (exact recovery up to
the solver tolerance). The trials of a cell are solved together with ``jax.vmap``, the batch
sharded over a ``hexad.sharding.data_mesh`` of ``gcd(trials, devices)`` devices (one device
on a plain CPU host, where this is a no-op). The grid's cells are not batched together: a
vmapped ``while_loop`` runs every member until the slowest has converged, and cells near the
phase boundary need several times the iterations of easy ones.

Command:  python -m experiments.cvxclust_phase [--quick] [--out DIR] [--seed N] [--set k=v]
          [--resume [--ckpt DIR]] (per grid row, through ``hexad.cachex.ItemCheckpoint``)
Runtime:  --quick (n=40, 4x4 grid, 3 trials) 61 s measured on 2 busy CPU cores; full (n=80,
          7x7 grid, 10 trials) 19 min (1131 s) measured on 2 cores shared with other jobs
          (session 2); re-run in session 4 at load ~3: 141 s of CPU, 2.5 min wall.

Measured (full, seed 0, session 4; session 2 gave the same two figures): ``synergy_cells`` = 2,
at (dpq, sep) = (0.3, 4.0) and (0.4, 4.0), where the joint program recovers 0.5 and 0.6 of the
draws and neither source alone more than 0.2; ``joint_ge_both_frac`` 0.653; no solve failed to
converge. The graph alone recovers at least half the draws only at dpq >= 0.5 (0.7-1.0);
features alone only at sep >= 5 (0.5-1.0). The joint program is not uniformly better: at dpq <=
0.2 with sep 5-6 it recovers 0-0.7 where features alone recover 0.7-1.0, and at dpq = 0.5, sep =
0 it recovers none where the graph alone recovers 0.7 (presumably the feature term, pure noise
at sep = 0, outweighs the graph there at this ``alpha``; not investigated).

summary.json keys:
  ``dpq_grid``, ``sep_grid``: the grid axes (rows: dpq, columns: sep).
  ``graph_recovery``, ``features_recovery``, ``joint_recovery``: [len(dpq), len(sep)] exact
    recovery rates (fractions of trials).
  ``synergy_cells``: number of cells where the joint rate is >= 0.5 while both single-source
    rates are < 0.5; ``synergy_cell_list``: those cells as ``[dpq, sep]`` pairs.
  ``joint_ge_both_frac``: fraction of cells where the joint rate is >= both others.
  ``not_converged``: number of solves that hit ``max_iters``.
  ``n``, ``trials``, ``mu``: the settings used; ``devices``: the data-mesh size.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from threadpoolctl import threadpool_limits

from experiments import _runner
from hexad import cachex, sharding
from hexad import cvxclust as cc


@dataclasses.dataclass(frozen=True)
class Config:
    n: int = 80
    d: int = 1
    dpq: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
    sep: tuple[float, ...] = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0)
    trials: int = 10
    n_labeled: int = 6
    label_noise: float = 0.1
    mu_scale: float = 1.0
    feature_scale: float = 0.5
    beta: float = 0.5
    recovery_tol: float = 0.05
    tol: float = 1e-4
    max_iters: int = 1500

    def __post_init__(self):
        _runner.at_least(self, 4, "n")
        _runner.require(self.n % 2 == 0, "n", f"n must be even (two communities), got {self.n}")
        _runner.at_least(self, 1, "d", "trials", "max_iters")
        _runner.in_range(self, 2, self.n, "n_labeled")  # both classes keep a label
        _runner.in_range(self, -1, 1, "dpq")  # p - q with p, q in [0, 1]
        _runner.at_least(self, 0, "sep", "feature_scale", "beta")
        _runner.in_unit(self, "label_noise")
        _runner.positive(self, "mu_scale", "recovery_tol", "tol")


def _problems(cfg: Config, mu: float, a, x, noisy, labeled):
    k = cc.feature_similarity(x)
    alpha = cfg.feature_scale / np.std(k[~np.eye(cfg.n, dtype=bool)])
    node = dict(
        features=x, labels=noisy, labeled=labeled, num_classes=2, alpha=alpha, beta=cfg.beta
    )
    return (
        cc.graph_problem(a, mu),
        cc.joint_problem(mu, **node),
        cc.joint_problem(mu, adjacency=a, **node),
    )


def run(cfg: Config, ctx: _runner.Context) -> dict:
    mu = cfg.mu_scale * float(np.sqrt(cfg.n))
    solver = cc.NuclearSolver(tol=cfg.tol, max_iters=cfg.max_iters)
    y = jnp.asarray(np.repeat([0, 1], cfg.n // 2))
    mesh = sharding.data_mesh(jax.devices()[: math.gcd(cfg.trials, jax.device_count())])
    spec = sharding.batch_sharding(mesh)

    @jax.jit
    def solve_batch(problems):
        out = jax.vmap(solver)(problems)
        err = jax.vmap(cc.recovery_error, in_axes=(0, None))(out.l, y)
        return err, out.converged

    shape = (len(cfg.dpq), len(cfg.sep))
    rates = {k: np.zeros(shape) for k in ("graph", "features", "joint")}
    not_conv = 0
    rows = [f"dpq={v:g}" for v in cfg.dpq]
    # Each finished grid row is checkpointed through hexad.cachex (its rates and non-converged
    # count); --resume skips finished rows. Row i draws from its own generator (seed, i), so a
    # resumed run sees exactly the draws of an uninterrupted one.
    with cachex.CacheXManager(ctx.checkpoint_dir) as mngr:
        done = cachex.ItemCheckpoint(
            mngr, rows, config={"seed": ctx.seed, **dataclasses.asdict(cfg)}, enabled=ctx.resume
        )
        with threadpool_limits(1):  # one BLAS thread: LAPACK's eigh thrashes on busy cores
            for i in ctx.progress(range(shape[0]), desc="grid rows"):
                if done.done(rows[i]):
                    rec = done.record(rows[i])
                    for k in rates:
                        rates[k][i] = rec[k]
                    not_conv += rec["not_converged"]
                    ctx.log(dpq=cfg.dpq[i], resumed=True)
                    continue
                rng = np.random.default_rng([ctx.seed, i])
                row_nc = 0
                for j in range(shape[1]):
                    p, q, sep = 0.5 + cfg.dpq[i] / 2, 0.5 - cfg.dpq[i] / 2, cfg.sep[j]
                    args = (cfg.n, p, q, sep, cfg.d, cfg.n_labeled, cfg.label_noise)
                    draws = [
                        _problems(cfg, mu, *cc.contextual_sbm(rng, *args)[:4])
                        for _ in range(cfg.trials)
                    ]
                    for name, col in zip(
                        ("graph", "features", "joint"), zip(*draws, strict=True), strict=True
                    ):
                        stacked = jax.tree.map(lambda *v: jnp.stack(v), *col)
                        err, conv = solve_batch(jax.device_put(stacked, spec))
                        rates[name][i, j] = float(jnp.mean(err <= cfg.recovery_tol))
                        row_nc += int(jnp.sum(~conv))
                    ctx.log(
                        dpq=cfg.dpq[i], sep=cfg.sep[j], **{k: v[i, j] for k, v in rates.items()}
                    )
                not_conv += row_nc
                done.complete(
                    rows[i],
                    {**{k: v[i].tolist() for k, v in rates.items()}, "not_converged": row_nc},
                )
    g, f, jt = rates["graph"], rates["features"], rates["joint"]
    syn = (jt >= 0.5) & (g < 0.5) & (f < 0.5)
    syn_list = [[cfg.dpq[i], cfg.sep[j]] for i, j in zip(*np.nonzero(syn), strict=True)]
    _plot(ctx, cfg, rates, syn)
    return {
        "dpq_grid": list(cfg.dpq),
        "sep_grid": list(cfg.sep),
        "graph_recovery": g.tolist(),
        "features_recovery": f.tolist(),
        "joint_recovery": jt.tolist(),
        "synergy_cells": int(syn.sum()),
        "synergy_cell_list": syn_list,
        "joint_ge_both_frac": float(np.mean((jt >= g) & (jt >= f))),
        "not_converged": not_conv,
        "n": cfg.n,
        "trials": cfg.trials,
        "mu": mu,
        "devices": int(mesh.size),
    }


def _plot(ctx, cfg: Config, rates, syn) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8), sharey=True)
    for ax, name in zip(axes, ("graph", "features", "joint"), strict=True):
        im = ax.imshow(rates[name], origin="lower", vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(cfg.sep)), [f"{s:g}" for s in cfg.sep])
        ax.set_yticks(range(len(cfg.dpq)), [f"{s:g}" for s in cfg.dpq])
        ax.set_xlabel("feature separation")
        ax.set_title(f"{name}: exact recovery rate")
        if name == "joint":
            for i, j in zip(*np.nonzero(syn), strict=True):
                ax.text(j, i, "S", ha="center", va="center", color="red", fontweight="bold")
    axes[0].set_ylabel("graph strength p - q")
    fig.colorbar(im, ax=axes, shrink=0.8)
    ctx.save_plot(fig, "phase")


STUDY = _runner.Study(
    "cvxclust_phase",
    Config,
    run,
    quick={"n": 40, "dpq": (0.0, 0.2, 0.4, 0.6), "sep": (0.0, 1.5, 3.0, 4.5), "trials": 3},
    doc=__doc__,
)

if __name__ == "__main__":
    STUDY.main()
