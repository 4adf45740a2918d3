"""Transductive node classification on Cora and Citeseer with the four convex programs.

On the standard Planetoid split (20 labels per class for training, 500 validation and 1000
test nodes), the programs of ``hexad.cvxclust`` (arXiv:2508.20231), each with one weight
chosen on the validation split from a grid:

- ``graph``: graph + training labels, PSD-hard (``joint_problem`` without features, solved
  block by block by ``SplitNuclearSolver``; blocks of ``partial_from`` nodes or more, on Cora
  and Citeseer the main component, with the adaptive rank-``k`` eigen step of
  ``NuclearSolver``, ``k`` tracking the kept rank plus ``rank_margin`` from ``rank`` up to
  ``max_rank``); grid: the label weight ``beta``;
- ``node``: node information alone as convex clustering (``FusionProblem``: reduced features,
  training labels under the softmax cross-entropy, ``knn``-NN Gaussian weights); grid:
  ``gamma``;
- ``joint``: the shared-model joint program (``shared_atom_problem``, reduced features and
  training labels, ``mu0 = 1``); labels from each node's model scores; from ``partial_from``
  nodes the same rank-``k`` eigen step on its ``n + feature_dim + K`` PSD block, ``k``
  up to ``joint_max_rank`` (on Cora it keeps more eigenvalues than ``max_rank``);
  grid: ``mu1``;
- ``linear``: the linear-reward surrogate (``joint_problem`` with ``K_x`` of the reduced
  features, PSD-hard; one block, the same rank-``k`` step from ``partial_from`` nodes); grid:
  ``alpha``;

and, as baselines, a multinomial logistic regression (``C`` from ``lr_cs`` on validation) and
label propagation (Zhou et al. 2004). Features are row-normalised and reduced to ``feature_dim``
principal directions (the joint program's PSD block is ``n + feature_dim + K``). Graph weights:
``c_A = 1 - t``, ``c_Ac = t`` (``t`` the edge density). A test node with no label (no labelled
node reaches its cluster, or its scores tie) counts as an error in ``_acc`` and is left out of
``_covered_acc``. Zachary's karate club (the two factions, members 0 and 33 labelled; features:
standardised degree and clustering coefficient) is the smoke case with the same code.

Command:  python -m experiments.cvxclust_planetoid [--quick] [--out DIR] [--seed N] [--set k=v]
          [--resume] [--ckpt DIR]; each grid value's figures are kept as it finishes, and
          ``--resume`` restores them rather than solve again, so a long run can be stopped.
Runtime:  --quick runs the karate club only (under a minute). In the full run the graph and
          linear programs take the rank-``k`` eigen step: on Cora's main graph-program block
          (n = 2550, ``beta = 1``) about 0.11 s per ADMM iteration on an idle core (``k``
          settles at 194 with about 175 eigenvalues kept; the doubling step it replaced sat
          at 256 with two sweeps, 0.19 s; a dense ``eigh`` alone over a second); the ADMM
          itself is slow there: the relative duality gap is 1.3e-2 after 3000 iterations
          (342 s), so such a solve runs into ``max_iters`` uncertified at ``cert_tol``. The
          joint program's step on Cora's 2731-square block keeps more eigenvalues (``k`` up
          to 512), about 30 minutes a solve before this step, so the full run takes hours.

summary.json keys: for ``d`` in ``karate`` (and ``cora``, ``citeseer`` in the full run) and
``p`` in ``graph``, ``node``, ``joint``, ``linear``: ``{d}_{p}_acc``, ``{d}_{p}_coverage``,
``{d}_{p}_covered_acc`` (test nodes; karate: validation and test are the even and odd
halves of the 32 unlabelled members), ``{d}_{p}_val_acc``,
``{d}_{p}_choice`` (the chosen grid value), and of the chosen solve ``{d}_{p}_iters``,
``{d}_{p}_converged``, ``{d}_{p}_certified`` (duality gap ``<= cert_tol`` and converged; and
``_rel_gap``, ``_min_eig`` where defined; for ``graph``, ``joint`` and ``linear`` also ``_rank``,
``_rank_saturated``, whether the rank-``k`` step may have missed an eigenvalue above the
threshold, and ``_subspace_rank``, the subspace size reached);
``{d}_linear_lr_acc`` and ``{d}_lp_acc`` (baselines).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
from threadpoolctl import threadpool_limits

from experiments import _cvxclust, _runner
from hexad import cvxclust as cc
from hexad.data import load_planetoid


@dataclasses.dataclass(frozen=True)
class Config:
    datasets: tuple[str, ...] = ("cora", "citeseer")
    feature_dim: int = 16
    knn: int = 10
    beta: float = 1.0
    label_weight: float = 1.0
    graph_grid: tuple[float, ...] = (0.5, 1.0, 2.0)
    node_grid: tuple[float, ...] = (0.01, 0.1, 1.0)
    joint_grid: tuple[float, ...] = (0.1, 1.0, 10.0)
    linear_grid: tuple[float, ...] = (0.5, 1.0, 2.0)
    tol: float = 1e-4
    cert_tol: float = 1e-3
    max_iters: int = 1500
    rank: int = 16
    max_rank: int = 256
    joint_max_rank: int = 512
    rank_margin: int = 16
    power_iters: int = 1
    partial_from: int = 500
    partial_rho: float = 0.25
    relaxation: float = 1.6
    lp_alpha: float = 0.99
    lr_cs: tuple[float, ...] = (0.1, 1.0, 10.0)

    def __post_init__(self):
        _runner.one_of(self, ("cora", "citeseer"), "datasets")
        _runner.at_least(self, 1, "feature_dim", "knn", "max_iters", "rank", "partial_from")
        _runner.at_least(self, 0, "rank_margin")
        _runner.at_least(self, 1, "power_iters")
        _runner.at_least(self, self.rank, "max_rank", "joint_max_rank")
        grids = ("graph_grid", "node_grid", "joint_grid", "linear_grid", "lr_cs")
        _runner.positive(self, "beta", "label_weight", "tol", "cert_tol", "partial_rho", *grids)
        _runner.in_range(self, 0, 2, "relaxation", lo_open=True, hi_open=True)
        _runner.in_unit(self, "lp_alpha", hi_open=True)


def _solvers(cfg: Config) -> dict:
    nuc = cc.NuclearSolver(tol=cfg.tol, max_iters=cfg.max_iters, compute_objective=False)
    # Blocks and programs of at least ``partial_from`` nodes take the adaptive rank-k step
    # (``k`` tracking the kept rank plus ``rank_margin`` between ``rank`` and ``max_rank``,
    # ``power_iters`` block Krylov sweeps a step, with the exact-prox check at the end),
    # over-relaxed and started at ``partial_rho`` (on Cora's main block the dual residual
    # leads the primal one several-fold at rho = 1); smaller ones the dense eigh. On Cora's
    # main graph block one sweep reached the same gap as two after 3000 iterations (1.3e-2)
    # in 342 s against 641 s for two sweeps of the doubling step (2 idle cores).
    step = dict(rank_margin=cfg.rank_margin, power_iters=cfg.power_iters, rho=cfg.partial_rho,
                relaxation=cfg.relaxation)  # fmt: skip
    partial = nuc.replace(rank=cfg.rank, max_rank=cfg.max_rank, **step)
    jitted = functools.cache(jax.jit)

    def linear(p):
        if p.n < cfg.partial_from:
            return jitted(nuc)(p)
        return jitted(partial.replace(rank=min(cfg.rank, p.n), max_rank=min(cfg.max_rank, p.n)))(p)

    shared = cc.SharedAtomSolver(tol=cfg.tol, max_iters=cfg.max_iters)

    def joint(p):  # the PSD block is n + p: the rank-k step from partial_from nodes
        if p.n < cfg.partial_from:
            return jitted(shared)(p)
        k, big = min(cfg.rank, p.n + p.p), min(cfg.joint_max_rank, p.n + p.p)
        return jitted(shared.replace(rank=k, max_rank=big, **step))(p)

    return {
        "graph": cc.SplitNuclearSolver(partial, small_solver=nuc, small_max=cfg.partial_from - 1),
        "linear": linear,
        "joint": joint,
        "node": jax.jit(cc.FusionSolver(tol=cfg.tol, max_iters=10 * cfg.max_iters)),
    }


def _evaluate(cfg, name, ctx, edges, x, y, train, val, test, k) -> dict:
    from sklearn.linear_model import LogisticRegression

    n = len(y)
    a = cc.adjacency_from_edges(edges, n)
    c_a, c_ac = cc.balanced_weights(a)
    labeled = np.zeros(n, bool)
    labeled[train] = True
    z = _cvxclust.reduce_features(x, min(cfg.feature_dim, x.shape[1]))
    alpha0 = 0.5 / np.std(cc.feature_similarity(z))
    inputs = dict(
        adjacency=a,
        features=z,
        labels=y,
        labeled=labeled,
        num_classes=k,
        edge_weight=c_a,
        nonedge_weight=c_ac,
        knn=cc.knn_gaussian_weights(z, cfg.knn),
    )
    solvers, res = _solvers(cfg), {}

    def solve(prog, v):  # one grid value's figures, kept for --resume (ctx.memo)
        pred, rep = _cvxclust.predict(cfg, prog, v * alpha0 if prog == "linear" else v, inputs,
                                      solvers)  # fmt: skip
        rec = _cvxclust.accuracy_record(name, prog, pred, y, test)
        return rec | rep | {"val_acc": float((pred[val] == y[val]).mean()), "choice": v}

    for prog in _cvxclust.PROGRAMS:
        best = None
        for v in getattr(cfg, f"{prog}_grid"):
            r = ctx.memo(f"{name}-{prog}-{v:g}", functools.partial(solve, prog, v))
            ctx.log(dataset=name, program=prog, value=v, **r)
            if best is None or r["val_acc"] > best["val_acc"]:  # the first best value
                best = r
        head = f"{name}_{prog}_"
        res |= {k if k.startswith(head) else head + k: val for k, val in best.items()}
    xn = x / np.maximum(np.abs(x).sum(1, keepdims=True), 1e-12)
    fits = [LogisticRegression(C=c, max_iter=1000).fit(xn[train], y[train]) for c in cfg.lr_cs]
    m = max(fits, key=lambda f: f.score(xn[val], y[val]))
    res[f"{name}_linear_lr_acc"] = float(m.score(xn[test], y[test]))
    lp = np.asarray(cc.label_propagation(edges, y, labeled, k, alpha=cfg.lp_alpha))
    res[f"{name}_lp_acc"] = float((lp[test] == y[test]).mean())
    return res


def _karate(cfg: Config, ctx) -> dict:
    import networkx as nx

    g = nx.karate_club_graph()
    n = g.number_of_nodes()
    y = np.array([0 if g.nodes[v]["club"] == "Mr. Hi" else 1 for v in range(n)])
    clus = nx.clustering(g)
    x = np.array([[g.degree(v), clus[v]] for v in range(n)], np.float64)
    x = (x - x.mean(0)) / x.std(0)
    rest = np.setdiff1d(np.arange(n), [0, 33])
    edges = np.array(g.edges())
    args = (np.array([0, 33]), rest[::2], rest[1::2], 2)
    return _evaluate(cfg, "karate", ctx, edges, x, y, *args)


def run(cfg: Config, ctx: _runner.Context) -> dict:
    with threadpool_limits(1):  # one BLAS thread: LAPACK thrashes on busy cores
        summary = _karate(cfg, ctx)
        for name in ctx.progress(cfg.datasets, desc="datasets"):
            g = load_planetoid(name)
            edges = g.edges[g.edges[:, 0] != g.edges[:, 1]]
            args = (g.features, g.labels, g.train_idx, g.val_idx, g.test_idx, g.num_classes)
            summary.update(_evaluate(cfg, name, ctx, edges, *args))
    return summary


STUDY = _runner.Study(
    "cvxclust_planetoid",
    Config,
    run,
    quick={"datasets": ()},
    doc=__doc__,
    resume_shared=("datasets",),  # each data set's solves are kept on their own
)

if __name__ == "__main__":
    STUDY.main()
