"""Phase diagram of exact recovery: graph alone, node information alone, and two joint programs.

A contextual SBM with ``K`` balanced classes of ``n / K`` nodes (``cvxclust.contextual_sbm``):
the graph has ``p = (1 + dpq) / 2`` and ``q = (1 - dpq) / 2`` (so unit graph costs are
proportional to the log-likelihood ratio); features ``x_v = (sep / 2) m_{y_v} + N(0, I_d)``
with unit class means (simplex directions for ``K = 3``, ``d >= 2``); ``labels_per_class``
labelled nodes per class, each label flipped with probability ``label_noise``. Panels
``K in ks`` x ``d in dims``; in each, a ``dpq`` x ``sep`` grid with ``trials`` draws per cell.
The four programs of ``hexad.cvxclust`` on every draw:

- ``graph``: the paper's graph program, PSD-hard (``graph_problem``; ``L in B``, ``L >= 0``);
- ``node``: node information alone as convex clustering: ``FusionProblem`` with the features,
  the partial labels under the softmax cross-entropy, Gaussian weights on the complete graph,
  and the partition read from the clusterpath at its first ``gamma`` with ``<= K`` clusters;
- ``joint``: the shared-model joint program (``shared_atom_problem``, our formulation of the
  paper's shared atomic representation), ``mu0 = 1``, ``mu1 = node_weight * n``;
- ``linear``: the linear-reward surrogate ``joint_problem`` (PSD-hard), ``alpha =
  feature_scale / std(K_x)``, ``beta``.

Hyper-parameters: each program has one weight scaled by a factor from ``grid`` (graph: the
non-edge weight; node: the Gaussian bandwidth ``phi``; joint: ``mu1``; linear: ``alpha``
and ``beta``). The *fixed* regime is factor 1 (the rule above, declared in advance); the
*tuned* regime takes each program's best rate over the same grid, so single sources get the
tuning budget of the joint. A draw is recovered when the program's partition equals the
truth (matrix programs: the components of ``L > 1/2``; node: the fused clusters); the
stricter exact recovery ``max |L - 1[y_u = y_v]| <= recovery_tol`` is reported as well (the
shared-model program's ``L`` keeps small entries across clusters, so it is rarely exact).
A solve is certified when it converged (residuals ``<= tol``) and (graph, joint, linear) its
relative duality gap is ``<= cert_tol`` (node: every path solve converged); a matrix solve
whose gap is above ``cert_tol`` continues from its own iterate at ``tol / 10``, then ``tol /
100`` (up to ``max_iters`` more each), until the gap certifies it. The graph draw of a trial
does not depend on ``sep`` or ``d`` (same generator), so ``graph`` is solved once per ``(K,
dpq)``.
A synergy cell: the joint rate ``>= 0.5``, both single sources ``<= 0.3``, and the joint's
Wilson 95% interval above both of theirs.

Every cell's solves are checkpointed (``checkpoints/<study>/<run>/settings-<hash>/cell-...``
or ``--ckpt DIR``) as soon as they finish, so a long run can be stopped and continued with
``--resume``: the cells already solved with the same seed and settings are restored, not
solved again. The settings hash leaves out the panel lists, so the panels can be run as separate
processes on one ``--ckpt`` folder (``--set ks=2`` and ``--set ks=3``) and the full study
then assembled from their cells with ``--resume``.

Command:  python -m experiments.cvxclust_phase [--quick] [--out DIR] [--seed N] [--set k=v]
          [--resume] [--ckpt DIR]
Runtime:  --quick (n = 24, one panel, 2 x 2 grid, 3 trials) about 1-2 min on 2 CPU cores; the
          full study (n = 60, 4 panels, 5 x 5 grids, 20 trials, 3 factors) several hours: with
          every solve continued to a certified gap, one hard cell takes about 35 s per factor
          for the three matrix programs on one busy core, most of it the linear surrogate's
          continuation. Run the panels as separate processes (``--set ks=2``, ``--set ks=3``)
          and assemble the study with ``--resume``.

summary.json keys: ``dpq_grid``, ``sep_grid``, ``panels`` (``"K{k}_d{d}"``); for regime in
``fixed``, ``tuned`` and program in ``graph``, ``node``, ``joint``, ``linear``:
``{regime}_{program}_recovery``, ``..._lo``, ``..._hi`` ([panel][dpq][sep] rates and Wilson
95% bounds) and ``{regime}_{program}_exact`` (exact-recovery rates);
``synergy_cells_fixed``, ``synergy_cells_tuned`` (counts) and
``synergy_cell_list_fixed``, ``synergy_cell_list_tuned`` (``[panel, dpq, sep]``);
``max_min_eig_violation`` (most negative eigenvalue over all PSD-hard solves);
``uncertified_solves`` (count), ``uncertified_list`` (up to 20 ``[program, panel, dpq,
sep, factor]``) and ``uncertified_by_program`` (count per program); ``n``, ``trials``,
``grid``; ``graph_threshold`` and ``feature_threshold`` (the overlays: exact-recovery ``dpq``
per ``K``, and ``s`` with ``Phi(s/2)^n = 1/2``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from threadpoolctl import threadpool_limits

from experiments import _cvxclust, _runner

P = _cvxclust.PROGRAMS


@dataclasses.dataclass(frozen=True)
class Config:
    n: int = 60
    ks: tuple[int, ...] = (2, 3)
    dims: tuple[int, ...] = (1, 5)
    dpq: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5)
    sep: tuple[float, ...] = (0.0, 2.0, 3.0, 4.0, 5.0)
    trials: int = 20
    labels_per_class: int = 3
    label_noise: float = 0.1
    grid: tuple[float, ...] = (0.5, 1.0, 2.0)
    feature_scale: float = 0.5
    beta: float = 0.5
    node_weight: float = 0.1
    label_weight: float = 1.0
    gamma_range: tuple[float, ...] = (1e-3, 1.0)
    n_gammas: int = 12
    recovery_tol: float = 0.05
    tol: float = 1e-4
    cert_tol: float = 1e-3
    max_iters: int = 3000

    def __post_init__(self):
        _runner.at_least(self, 2, "ks", "labels_per_class")
        _runner.at_least(self, 1, "dims", "trials", "max_iters", "n_gammas")
        _runner.require(all(self.n % k == 0 for k in self.ks), "n", "n: a multiple of each K")
        _runner.require(1.0 in self.grid, "grid", "grid: must hold the fixed factor 1")
        _runner.in_range(self, 0, 1, "dpq")
        _runner.at_least(self, 0, "sep")
        _runner.in_unit(self, "label_noise")
        _runner.positive(self, "grid", "feature_scale", "beta", "node_weight", "label_weight")
        _runner.positive(self, "gamma_range", "recovery_tol", "tol", "cert_tol")


def run(cfg: Config, ctx: _runner.Context) -> dict:
    panels = [(k, d) for k in cfg.ks for d in cfg.dims]
    shape = (len(panels), len(cfg.dpq), len(cfg.sep), len(cfg.grid))
    hits = {p: np.zeros(shape) for p in P}
    exact = {p: np.zeros(shape) for p in P}
    worst, bad, graph_cache = 0.0, [], {}
    with threadpool_limits(1):  # one BLAS thread: LAPACK's eigh thrashes on busy cores
        for a, (k, d) in enumerate(ctx.progress(panels, desc="panels")):
            for i, dpq in enumerate(cfg.dpq):
                for j, sep in enumerate(cfg.sep):
                    todo = P if (k, i) not in graph_cache else P[1:]
                    cell = (ctx.seed, k, d, i, j, dpq, sep)
                    start, res = _cvxclust.cell_checkpointed(ctx, cfg, cell, todo, graph_cache)
                    res["graph"] = graph_cache.setdefault((k, i), res["graph"])
                    for p in P:
                        hits[p][a, i, j] = res[p]["recovered"].sum(1)
                        exact[p][a, i, j] = res[p]["exact"].sum(1)
                        if p not in todo:
                            continue  # a cached graph solve, counted once
                        if p != "node":
                            worst = min(worst, float(res[p]["min_eig"].min()))
                        for f in np.flatnonzero(~res[p]["certified"].all(1)):
                            bad.append([p, f"K{k}_d{d}", dpq, sep, cfg.grid[f]])
                    ctx.log(
                        K=k,
                        d=d,
                        dpq=dpq,
                        sep=sep,
                        restored=start > 0,
                        **{p: res[p]["recovered"].mean(1).tolist() for p in P},
                    )
    fixed = cfg.grid.index(1.0)
    out = {
        "dpq_grid": list(cfg.dpq),
        "sep_grid": list(cfg.sep),
        "panels": [f"K{k}_d{d}" for k, d in panels],
    }
    for regime in ("fixed", "tuned"):
        rate = {p: (h[..., fixed] if regime == "fixed" else h.max(-1)) for p, h in hits.items()}
        lo_hi = {p: _cvxclust.wilson(r, cfg.trials) for p, r in rate.items()}
        for p in P:
            ex = exact[p][..., fixed] if regime == "fixed" else exact[p].max(-1)
            out[f"{regime}_{p}_exact"] = (ex / cfg.trials).tolist()
            out[f"{regime}_{p}_recovery"] = (rate[p] / cfg.trials).tolist()
            out[f"{regime}_{p}_lo"], out[f"{regime}_{p}_hi"] = (v.tolist() for v in lo_hi[p])
        j, g, nd = (rate[p] / cfg.trials for p in ("joint", "graph", "node"))
        top = np.maximum(lo_hi["graph"][1], lo_hi["node"][1])
        syn = (j >= 0.5) & (g <= 0.3) & (nd <= 0.3) & (lo_hi["joint"][0] > top)
        out[f"synergy_cells_{regime}"] = int(syn.sum())
        out[f"synergy_cell_list_{regime}"] = [
            [out["panels"][a], cfg.dpq[i], cfg.sep[s]]
            for a, i, s in zip(*np.nonzero(syn), strict=True)
        ]
        _plot(ctx, cfg, panels, j - np.maximum(g, nd), syn, regime)
    out |= {
        "max_min_eig_violation": worst,
        "uncertified_solves": len(bad),
        "uncertified_list": bad[:20],
        "uncertified_by_program": {p: sum(b[0] == p for b in bad) for p in P},
        "n": cfg.n,
        "trials": cfg.trials,
        "grid": list(cfg.grid),
        "graph_threshold": {f"K{k}": _cvxclust.graph_threshold(cfg.n, k) for k in cfg.ks},
        "feature_threshold": _cvxclust.feature_threshold(cfg.n),
    }
    return out


def _plot(ctx, cfg: Config, panels, diff, syn, regime: str) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    sep, dpq = np.asarray(cfg.sep), np.asarray(cfg.dpq)
    for ax, (k, d), m, s in zip(axes[0], panels, diff, syn, strict=True):
        im = ax.imshow(m, origin="lower", vmin=-1, vmax=1, cmap="RdBu", aspect="auto")
        ax.set_xticks(range(len(sep)), [f"{v:g}" for v in sep])
        ax.set_yticks(range(len(dpq)), [f"{v:g}" for v in dpq])
        y = np.interp(_cvxclust.graph_threshold(cfg.n, k), dpq, np.arange(len(dpq)))
        ax.axhline(y, color="k", ls="--", lw=1, label="graph threshold")
        if d == 1 and k == 2:
            x = np.interp(_cvxclust.feature_threshold(cfg.n), sep, np.arange(len(sep)))
            ax.axvline(x, color="k", ls=":", lw=1, label="features: Phi(s/2)^n = 1/2")
        for i, j in zip(*np.nonzero(s), strict=True):
            ax.text(j, i, "S", ha="center", va="center", color="k", fontweight="bold")
        ax.set(title=f"K={k}, d={d}", xlabel="sep", ylabel="p - q")
    fig.suptitle(f"recovery rate, joint - max(graph, node), {regime} weights (S: synergy)", y=1.03)
    axes[0][0].legend(fontsize=6, loc="upper right")
    fig.colorbar(im, ax=axes, shrink=0.8)
    ctx.save_plot(fig, f"phase_{regime}")


STUDY = _runner.Study(
    "cvxclust_phase",
    Config,
    run,
    quick={
        "n": 24,
        "ks": (2,),
        "dims": (1,),
        "dpq": (0.2, 0.6),
        "sep": (0.0, 4.0),
        "trials": 3,
        "grid": (1.0,),
        "max_iters": 1500,
    },
    doc=__doc__,
    resume_shared=("ks", "dims"),
)

if __name__ == "__main__":
    STUDY.main()
