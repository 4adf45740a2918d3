"""Shared code of the cvxclust studies: solve records and certificates, Wilson intervals, the
phase study's five programs (graph PSD-hard, node-only convex clustering, the shared-model
joint program, the same program without its graph, and the linear-reward surrogate) built,
tuned on their own draws and solved per grid cell with the paired tests of its verdict, the
cells tallied into its summary (rates, synergy cells, verdicts, solve checks, plots), and the
Planetoid study's four programs' predictions."""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from scipy.stats import norm

from experiments._verdicts import mcnemar
from hexad import cvxclust as cc

#: The Planetoid study's programs (each with a ``<program>_grid`` in its config).
PROGRAMS = ("graph", "node", "joint", "linear")
_certificate = jax.jit(cc.nuclear_certificate)


def solve_report(out) -> dict[str, Any]:
    """Per-solve convergence record: iterations, last residuals, rank, min eigenvalue, and for
    the nuclear programs whether the rank-k step may have missed an eigenvalue
    (``rank_saturated``) and the subspace size it reached (``subspace_rank``)."""
    it = int(out.n_iters)
    rep = {
        "iters": it,
        "converged": bool(out.converged),
        "primal_res": float(out.primal_residuals[it - 1]),
        "dual_res": float(out.dual_residuals[it - 1]),
        "min_eig": float(out.min_eig),
    }
    if hasattr(out, "rank"):
        rep |= {"rank": int(out.rank), "rank_saturated": bool(out.rank_saturated)}
    if hasattr(out, "subspace_rank"):
        rep["subspace_rank"] = int(out.subspace_rank)
    return rep


def certify(problem: cc.NuclearProblem, out: cc.NuclearOutput, tol: float) -> dict[str, Any]:
    """``rel_gap``: the relative duality gap of ``out.l`` (made feasible), the matrix the
    prediction is read from, against the ADMM multiplier ``rho * dual``; ``certified``:
    ``rel_gap <= tol`` and the solve converged (a solve stopped at ``max_iters`` is never
    certified)."""
    gap = float(_certificate(problem, out.l, out.rho * out.dual).rel_gap)
    return {"rel_gap": gap, "certified": bool(gap <= tol and bool(out.converged))}


def wilson(k, n: int, z: float = 1.959964) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval (95% by default) for ``k`` successes of ``n``, elementwise."""
    k = np.asarray(k, np.float64)
    p = k / n
    den = 1.0 + z**2 / n
    mid = (p + z**2 / (2 * n)) / den
    half = z * np.sqrt(p * (1 - p) / n + z**2 / (4 * n**2)) / den
    return np.clip(mid - half, 0, 1), np.clip(mid + half, 0, 1)


def graph_threshold(n: int, k: int) -> float:
    """``p - q`` at the exact-recovery threshold of the dense two-sided graph,
    ``(2 n / K) (-log BC) = log n`` with ``BC = sqrt(p q) + sqrt((1 - p)(1 - q))`` (the
    Bhattacharyya coefficient of an edge and a non-edge; ``= sqrt(1 - delta^2)`` here), for
    ``p, q = (1 +- delta) / 2``.

    A node's evidence is its ``2 n / K`` links to its own and one other class, each an edge or
    a non-edge; with ``p + q = 1`` non-edges carry as much information as edges, which the
    sparse condition ``(n / K)(sqrt p - sqrt q)^2 = log n`` (Abbe & Sandon) leaves out. At
    ``n = 60`` the threshold is 0.357 for ``K = 2`` and 0.430 for ``K = 3`` (the sparse form
    gave 0.504 and 0.606; the study's graph program recovers 0.10 of the draws at 0.3 and 0.75
    at 0.4 for ``K = 2``).
    """
    # -log BC = -log(1 - delta^2) / 2, so the condition solves in closed form
    return math.sqrt(-math.expm1(-k * math.log(n) / n))


def feature_threshold(n: int) -> float:
    """``s`` with ``Phi(s / 2)^n = 1/2``: where the per-node sign rule (d = 1, K = 2) recovers
    half the draws."""
    return 2.0 * float(norm.ppf(0.5 ** (1.0 / n)))


# ------------------------------------------------------------------------------------------
# The phase study's five programs of one draw
# ------------------------------------------------------------------------------------------

#: The phase study's programs: the graph alone, two node-only arms (convex clustering, and
#: the shared-model joint program with its graph term removed), the joint program and the
#: linear-reward surrogate. ``graph`` comes first: a row's graph solves are shared.
PHASE_PROGRAMS = ("graph", "node", "joint", "joint_nograph", "linear")
#: The arms whose grid is the joint program's ``eps`` (in units of ``n / K``).
EPS_PROGRAMS = ("joint", "joint_nograph")
#: The joint program's own parts: a synergy cell beats both (McNemar, paired draws).
SYNERGY_PARTS = ("graph", "joint_nograph")
#: The arms the joint is tested against per cell, in the order of ``synergy_p_*``.
MCNEMAR_ARMS = ("graph", "joint_nograph", "node")
#: The last entry of a tuning draw's generator seed: its stream never meets a scored draw's.
TUNE_STREAM = 0x74756E65  # "tune"
_FLAGS = ("recovered", "exact", "certified")


def _complete_edges(n: int) -> np.ndarray:
    i, j = np.triu_indices(n, 1)
    return np.stack([i, j], 1).astype(np.int32)


def joint_weights(eps: float, n: int, k: int, force: float, label_weight: float):
    """``(mu0, mu1, w)`` of the shared-model program at ``eps = 2 mu0 / mu1``.

    The program's feature part minimised over ``U`` is ``mu0 tr(X^T (L + eps I)^-1 X)``; on
    a cluster indicator of ``K`` clusters of ``n_c = n / K`` nodes it is a k-means shrunk by
    ``n_c / (n_c + eps)``, so moving one node costs about ``mu1 n_c / (n_c + eps)`` times its
    feature margin. ``mu1 = force (n_c + eps) / n_c`` keeps that force at ``force`` for every
    ``eps``; ``mu0 = eps mu1 / 2``; the label weight ``w = label_weight force / mu1`` keeps
    the label term's weight ``mu1 w`` at ``label_weight force`` as well.

    >>> mu0, mu1, w = joint_weights(300.0, 60, 2, 6.0, 1.0)
    >>> round(2 * mu0 / mu1, 6), round(mu1, 6), round(mu1 * w, 6)
    (300.0, 66.0, 6.0)
    """
    nc = n / k
    mu1 = force * (nc + eps) / nc
    return eps * mu1 / 2.0, mu1, label_weight * force / mu1


def fixed_index(cfg, program: str) -> int:
    """The grid index of the fixed rule: ``eps_fixed`` for the joint arms, factor 1 else."""
    return cfg.eps_grid.index(cfg.eps_fixed) if program in EPS_PROGRAMS else cfg.grid.index(1.0)


def grid_value(cfg, program: str, index: int) -> float:
    """The grid value at ``index``: ``eps`` in units of ``n / K`` for the joint arms, else the
    factor."""
    return (cfg.eps_grid if program in EPS_PROGRAMS else cfg.grid)[index]


def build(cfg, g: cc.ContextualSBM, k: int, program: str, index: int):
    """The problem of ``program`` on draw ``g`` at grid index ``index``: graph, its non-edge
    weight times the factor; node, the Gaussian bandwidth times it; linear, ``alpha`` and
    ``beta`` times it; joint and joint_nograph, ``eps = eps_grid[index] n / K`` with the
    weights of :func:`joint_weights` (force ``node_weight n``), joint_nograph with no graph
    (``C = 0``: the same program with the graph term's weight zero)."""
    n = len(g.truth)
    node = dict(labels=g.labels, labeled=g.labeled, num_classes=k)
    value = grid_value(cfg, program, index)
    if program in EPS_PROGRAMS:
        mu0, mu1, w = joint_weights(value * n / k, n, k, cfg.node_weight * n, cfg.label_weight)
        adjacency = g.adjacency if program == "joint" else None
        return cc.shared_atom_problem(
            mu0, mu1, adjacency=adjacency, features=g.features, label_weight=w, **node
        )
    if program == "graph":
        return cc.graph_problem(g.adjacency, 1.0, nonedge_weight=value)
    if program == "node":
        edges = _complete_edges(n)
        d2 = np.sum((g.features[edges[:, 0]] - g.features[edges[:, 1]]) ** 2, 1)
        w = np.exp(-value * d2 / np.median(d2))
        xa, mask = cc.with_labels(g.features, g.labels, g.labeled, k, cfg.label_weight)
        return cc.FusionProblem.create(xa, edges, w, 0.0, mask=mask, label_classes=k)
    if program == "linear":
        kx = cc.feature_similarity(g.features) if g.features.std(0).min() > 0 else None
        alpha = cfg.feature_scale / np.std(kx[~np.eye(n, dtype=bool)]) if kx is not None else 0
        return cc.joint_problem(
            1.0,
            adjacency=g.adjacency,
            features=g.features,
            alpha=value * alpha,
            beta=value * cfg.beta,
            **node,
        )
    raise ValueError(f"program: expected one of {PHASE_PROGRAMS}, got {program!r}")


def _refined(solve: list, certificate, warm, cert_tol: float):
    """``run(p) -> (out, converged, gap)``: ``solve[0]``, continued until certified. A solve
    whose relative duality gap exceeds ``cert_tol`` continues from ``warm(out)`` (its iterate,
    dual and penalty) under each later, tighter solver of ``solve`` in turn, and stops at the
    first whose gap meets ``cert_tol``; a certified first solve costs nothing more.
    ``converged``: the last iterate's residuals meet the first solver's ``tol`` (a continued
    solve that stops at its own ``max_iters`` above its tighter ``tol`` has still converged at
    the study's; one that never met it has not)."""
    tol = solve[0].tol

    def at_tol(o):
        last = o.n_iters - 1
        return (o.primal_residuals[last] <= tol) & (o.dual_residuals[last] <= tol)

    def run(p):
        out = solve[0](p)
        conv, gap = out.converged, certificate(p, out)
        for tight in solve[1:]:

            def more(o, tight=tight):
                o = tight(p, init=warm(o))
                return o, at_tol(o), certificate(p, o)

            out, conv, gap = jax.lax.cond(
                gap <= cert_tol, lambda o, c=conv, g=gap: (o, c, g), more, out
            )
        return out, conv, gap

    return run


@functools.lru_cache(maxsize=8)
def _solvers(tol: float, max_iters: int, gammas: tuple[float, ...], cert_tol: float = 1e-3):
    tols = (tol, tol / 10, tol / 100)  # the continuation ladder of the matrix programs

    nuc = _refined(
        [cc.NuclearSolver(tol=t, max_iters=max_iters) for t in tols],
        lambda p, o: cc.nuclear_certificate(p, o.l, o.rho * o.dual).rel_gap,  # of the partition's l
        lambda o: (o.l, o.dual, o.rho),
        cert_tol,
    )
    shared = _refined(
        [cc.SharedAtomSolver(tol=t, max_iters=max_iters) for t in tols],
        lambda p, o: cc.shared_atom_certificate(p, o.l, o.u, o.rho * o.dual).rel_gap,
        lambda o: (o.m, o.dual, o.rho),
        cert_tol,
    )
    fusion = cc.FusionSolver(tol=tol, max_iters=max_iters)

    def partition(l, y):
        ids, _ = cc.matrix_clusters(l)
        same = (ids[:, None] == ids[None, :]) == (y[:, None] == y[None, :])
        return jnp.all(same), cc.recovery_error(l, y)

    def matrix(solve):
        def fn(p, y):
            out, conv, gap = solve(p)
            return *partition(out.l, y), conv, gap, out.min_eig

        return fn

    def node(p, y):
        path = cc.clusterpath(p, jnp.asarray(gammas), solver=fusion)
        return path.clusters, path.n_clusters, jnp.all(path.converged)

    nuclear = _over_trials(matrix(nuc))  # one compile serves both PSD-hard nuclear programs
    shared_fn = _over_trials(matrix(shared))  # and one both shared-model arms (same shapes)
    return {
        "graph": nuclear,
        "linear": nuclear,
        "joint": shared_fn,
        "joint_nograph": shared_fn,
        "node": _over_trials(node),
    }


def _over_trials(fn):
    """``fn(problem, y)`` jitted over a batch of problems (the trials of a cell). On CPU the
    trials are mapped one after another: a vmapped while loop runs every trial until the
    slowest has converged (1.6-2.2x the iterations on the phase study's draws); elsewhere
    they are vmapped."""
    if jax.default_backend() == "cpu":
        return jax.jit(lambda batch, y: jax.lax.map(lambda p: fn(p, y), batch))
    return jax.jit(jax.vmap(fn, in_axes=(0, None)))


def cell_trials(cfg, k: int, dpq: float) -> int:
    """The scored draws of a cell: ``cfg.trials_near`` when ``dpq`` lies in ``[t -
    near_below, t + near_above]`` around the dense graph threshold ``t`` of ``K = k``
    (:func:`graph_threshold`), ``cfg.trials`` elsewhere. Every cell of a row has the same."""
    t = graph_threshold(cfg.n, k)
    near = t - cfg.near_below <= dpq <= t + cfg.near_above
    return cfg.trials_near if near else cfg.trials


def draw_cell(
    cfg, seed: int, k: int, d: int, i: int, dpq: float, sep: float, trials: int, tune=False
) -> list:
    """``trials`` contextual-SBM draws of one phase cell. Scored trial ``t`` of row ``i``
    draws from the generator ``(seed, k, i, t)``, tuning trial ``t`` from ``(seed, k, i, t,
    TUNE_STREAM)``: two disjoint streams, and in each the graph (drawn first) is the same for
    every ``sep`` and ``d``."""
    args = (cfg.n, (1 + dpq) / 2, (1 - dpq) / 2, sep, d, k * cfg.labels_per_class)
    tag = (TUNE_STREAM,) if tune else ()
    return [
        cc.contextual_sbm(
            np.random.default_rng([seed, k, i, t, *tag]), *args, cfg.label_noise, num_classes=k
        )
        for t in range(trials)
    ]


def _same_partition(ids: np.ndarray, truth: np.ndarray) -> bool:
    return bool(((ids[:, None] == ids[None, :]) == (truth[:, None] == truth[None, :])).all())


def solve_draws(cfg, draws, k: int, plan: dict) -> dict[str, dict[str, np.ndarray]]:
    """Solves each program of ``plan`` (``{program: grid indices}``) on ``draws``.

    Returns ``{program: {"recovered": [len(indices), trials] bool, "exact": ...,
    "certified": ..., "min_eig": [len(indices), trials]}}``. A draw is recovered when the
    program's partition equals the truth: for the matrix programs the components of
    ``L > 1/2`` (``matrix_clusters``); ``exact`` is the stricter ``max |L - 1[y_u = y_v]| <=
    cfg.recovery_tol`` (for node-only convex clustering, the same as ``recovered``).
    Convex clustering reads its partition at the first ``gamma`` of the clusterpath with at
    most ``K`` fused clusters and is "certified" when every solve of the path converged (no
    duality gap is implemented for the softmax loss); the other programs are certified by a
    relative duality gap ``<= cfg.cert_tol`` with a converged solve (continued at ``cfg.tol /
    10`` and ``/ 100`` until the gap meets it, see :func:`_refined`), and report the minimum
    eigenvalue of their solution.
    """
    truth = draws[0].truth
    y = jnp.asarray(truth)
    gammas = tuple(float(v) for v in np.geomspace(*cfg.gamma_range, cfg.n_gammas))
    solve = _solvers(cfg.tol, cfg.max_iters, gammas, cfg.cert_tol)
    res = {}
    for name, indices in plan.items():
        rows = {f: [] for f in (*_FLAGS, "min_eig")}
        for index in indices:
            built = [build(cfg, g, k, name, index) for g in draws]
            out = solve[name](jax.tree.map(lambda *v: jnp.stack(v), *built), y)
            if name == "node":
                clusters, counts, conv = (np.asarray(v) for v in out)
                first = np.argmax(counts <= k, axis=1)
                ok = [
                    bool((counts[t] <= k).any()) and _same_partition(clusters[t, first[t]], truth)
                    for t in range(len(draws))
                ]
                rec = (ok, ok, conv, np.zeros(len(draws)))
            else:
                same, err, conv, gap, eig = (np.asarray(v) for v in out)
                rec = (same, err <= cfg.recovery_tol, conv & (gap <= cfg.cert_tol), eig)
            for f, v in zip(rows, rec, strict=True):
                rows[f].append(v)
        res[name] = {f: np.asarray(v) for f, v in rows.items()}
    return res


def choose(counts, fixed: int) -> int:
    """The tuned grid index from the recoveries ``counts`` per grid value on the tuning draws:
    the most; on a tie the fixed rule's index if it is among the best, else the lowest."""
    counts = np.asarray(counts)
    return fixed if counts[fixed] == counts.max() else int(np.argmax(counts))


def phase_cell(cfg, seed: int, k: int, d: int, i: int, dpq: float, sep: float, programs):
    """One phase cell, tuned and scored.

    Each program is first solved at every grid value on ``cfg.tune_trials`` tuning draws
    (their own stream, :func:`draw_cell`), and its tuned value chosen there (:func:`choose`);
    then on the :func:`cell_trials` scored draws at the fixed rule's value and at the tuned
    one (one solve when they agree). Returns ``{program: {flag: [2, trials]}}`` with rows
    (fixed, tuned) for ``flag`` in ``recovered``, ``exact``, ``certified``, ``min_eig``, the
    tuning draws' ``tune_<flag>`` ``[grid, tune_trials]`` and ``choice`` ``[1]`` (the tuned
    grid index)."""
    every = tuple(range(len(cfg.grid)))
    tune = draw_cell(cfg, seed, k, d, i, dpq, sep, cfg.tune_trials, tune=True)
    tuned = solve_draws(cfg, tune, k, {p: every for p in programs})
    pick = {p: choose(tuned[p]["recovered"].sum(1), fixed_index(cfg, p)) for p in programs}
    plan = {p: tuple(dict.fromkeys((fixed_index(cfg, p), pick[p]))) for p in programs}
    draws = draw_cell(cfg, seed, k, d, i, dpq, sep, cell_trials(cfg, k, dpq))
    scored = solve_draws(cfg, draws, k, plan)
    out = {}
    for p in programs:
        rows = {f: v[[0, -1]] for f, v in scored[p].items()}  # (fixed, tuned), maybe the same
        tune_rows = {f"tune_{f}": v for f, v in tuned[p].items()}
        out[p] = rows | tune_rows | {"choice": np.array([pick[p]], np.int32)}
    return out


def _empty_cell(cfg, trials: int) -> dict[str, dict[str, np.ndarray]]:
    grid = len(cfg.grid)
    rec = {}
    for p in PHASE_PROGRAMS:
        rec[p] = {f: np.zeros((2, trials), bool) for f in _FLAGS} | {
            "min_eig": np.zeros((2, trials))
        }
        rec[p] |= {f"tune_{f}": np.zeros((grid, cfg.tune_trials), bool) for f in _FLAGS}
        rec[p] |= {
            "tune_min_eig": np.zeros((grid, cfg.tune_trials)),
            "choice": np.zeros(1, np.int32),
        }
    return rec


def cell_checkpointed(ctx, cfg, cell: tuple, todo, graph_cache: dict):
    """Returns ``(start, record)``: the :func:`phase_cell` record of phase cell ``cell = (seed,
    k, d, i, j, dpq, sep)``, restored from ``ctx``'s checkpoint ``cell-K<k>-d<d>-<i>-<j>`` (kept
    under the run's settings stamp; ``start`` > 0) or solved (``programs=todo``; a skipped
    graph record taken from ``graph_cache[k, i]``) and checkpointed (``start`` = 0)."""
    seed, k, d, i, j, dpq, sep = cell
    empty = _empty_cell(cfg, cell_trials(cfg, k, dpq))
    with ctx.checkpointed(f"cell-K{k}-d{d}-{i}-{j}", empty) as (start, res, save):
        if start == 0:
            res = phase_cell(cfg, seed, k, d, i, dpq, sep, todo)
            res.setdefault("graph", graph_cache.get((k, i)))
            res = jax.tree.map(lambda e, v: np.asarray(v, e.dtype), empty, res)
            save(0, res)
    return start, res


def mcnemar_p(cell: dict, part: str, flag: str, row: int, alpha: float) -> float:
    """The one-sided exact McNemar p value of ``joint`` better than ``part`` on the scored
    draws of one cell record (``flag``: ``recovered`` or ``exact``; ``row``: 0 fixed, 1
    tuned)."""
    a, o = cell["joint"][flag][row], cell[part][flag][row]
    return mcnemar(int((a & ~o).sum()), int((~a & o).sum()), alpha).p_value


def holm(p, alpha: float) -> np.ndarray:
    """Holm's step-down rejections (bool, the shape of ``p``) at family-wise level ``alpha``:
    the ``h``-th smallest of ``m`` p values is rejected while every smaller one was and it is
    ``< alpha / (m - h + 1)`` (Holm 1979)."""
    p = np.asarray(p, np.float64)
    flat = p.ravel()
    order = np.argsort(flat, kind="stable")
    ok = flat[order] < alpha / (flat.size - np.arange(flat.size))
    keep = np.zeros(flat.size, bool)
    keep[order] = np.cumprod(ok).astype(bool)
    return keep.reshape(p.shape)


# ------------------------------------------------------------------------------------------
# The phase study's summary: cells tallied, synergy cells, verdicts, plots
# ------------------------------------------------------------------------------------------

#: The recovery criteria: the summary keys' suffix and the cell record's flag.
PHASE_CRITERIA = (("", "recovered"), ("_exact", "exact"))
#: The weight regimes, in the order of a cell record's rows.
PHASE_REGIMES = ("fixed", "tuned")


class SynergyCells(NamedTuple):
    """The synergy test of one regime and criterion, ``[panel][dpq][sep]`` arrays:
    ``candidate``, ``synergy`` and ``holm`` (bool, see :func:`synergy_cells`) and ``diff`` (the
    joint's rate less the larger of its parts')."""

    candidate: np.ndarray
    synergy: np.ndarray
    holm: np.ndarray
    diff: np.ndarray

    def reason(self, name: str, verdict: str) -> str:
        """The verdict ``name: verdict`` with its counts of synergy and candidate cells."""
        return (
            f"{name}: {verdict} ({int(self.holm.sum())} synergy cell(s) surviving Holm, "
            f"{int(self.synergy.sum())} before it, {int(self.candidate.sum())} candidate(s))"
        )


def synergy_cells(rates: dict, p_parts: list, certified, alpha: float):
    """``(candidate, synergy, surviving Holm)`` cells ([panel][dpq][sep] bool): the joint's
    rate ``>= 0.5`` and each part's ``<= 0.3``; and, for synergy, the McNemar p against each
    part ``< alpha`` (the cell's p is the larger: an intersection-union test) with every
    compared solve certified; and that p surviving Holm over all cells.

    >>> rates = {"joint": np.array([0.6, 0.6]), "graph": np.array([0.2, 0.4]),
    ...          "joint_nograph": np.array([0.1, 0.1])}
    >>> p_parts = [np.array([0.01, 0.01]), np.array([0.001, 0.001])]
    >>> [v.tolist() for v in synergy_cells(rates, p_parts, np.array([True, True]), 0.05)]
    [[True, False], [True, False], [True, False]]
    """
    cand = (rates["joint"] >= 0.5) & np.all([rates[p] <= 0.3 for p in SYNERGY_PARTS], 0)
    p_cell = np.max(p_parts, 0)
    syn = cand & certified & (p_cell < alpha)
    return cand, syn, syn & holm(p_cell, alpha)


def phase_verdict(control: bool, strong: bool, candidate: bool) -> str:
    """The phase study's verdict: "not tested" when the positive ``control`` fails, else
    "reproduced" with a synergy cell surviving Holm (``strong``), else "undecided" with a
    ``candidate`` cell, else "not reproduced".

    >>> phase_verdict(True, False, True), phase_verdict(False, True, True)
    ('undecided', 'not tested')
    """
    if not control:
        return "not tested"
    if strong:
        return "reproduced"
    return "undecided" if candidate else "not reproduced"


class PhaseTally:
    """The phase study's cell records gathered into ``[panel][dpq][sep]`` arrays.

    ``n_trials`` (scored draws), ``hits[regime, flag, program]`` (recovered scored draws),
    ``certified[regime, program]`` (every scored solve certified), ``p_values[regime, flag,
    arm]`` (the joint against ``arm`` of :data:`MCNEMAR_ARMS`, :func:`mcnemar_p`),
    ``choice[program]`` (the tuned grid value, :func:`grid_value`); over all solves, scored
    and tuning, ``worst`` (the most negative eigenvalue of the matrix programs, at most 0)
    and ``uncertified`` (``[program, panel, dpq, sep, value, "scored" or "tuning", count]``).
    """

    def __init__(self, cfg, panels):
        shape = (len(panels), len(cfg.dpq), len(cfg.sep))
        keys = [(r, f) for r in PHASE_REGIMES for _, f in PHASE_CRITERIA]
        self.cfg, self.panels = cfg, list(panels)
        self.names = [f"K{k}_d{d}" for k, d in panels]
        self.n_trials = np.zeros(shape, int)
        self.hits = {(*rf, p): np.zeros(shape) for rf in keys for p in PHASE_PROGRAMS}
        self.certified = {
            (r, p): np.ones(shape, bool) for r in PHASE_REGIMES for p in PHASE_PROGRAMS
        }
        self.p_values = {(*rf, a): np.ones(shape) for rf in keys for a in MCNEMAR_ARMS}
        self.choice = {p: np.zeros(shape) for p in PHASE_PROGRAMS}
        self.worst, self.uncertified = 0.0, []

    def add(self, at: tuple, cell: tuple, res: dict, solved) -> None:
        """Counts the :func:`phase_cell` record ``res`` of ``cell = (seed, k, d, i, j, dpq,
        sep)`` at ``at = (panel, i, j)``; its solves' eigenvalues and certificates only for the
        programs in ``solved`` (a graph record shared by a row's cells is counted once)."""
        self.n_trials[at] = res["joint"]["recovered"].shape[1]
        for p in PHASE_PROGRAMS:
            self.choice[p][at] = grid_value(self.cfg, p, int(res[p]["choice"][0]))
            for r, regime in enumerate(PHASE_REGIMES):
                self.certified[regime, p][at] = res[p]["certified"][r].all()
                for _, f in PHASE_CRITERIA:
                    self.hits[regime, f, p][at] = res[p][f][r].sum()
            if p in solved:
                self._check(p, res[p], cell)
        for r, regime in enumerate(PHASE_REGIMES):
            for (_, f), arm in ((c, x) for c in PHASE_CRITERIA for x in MCNEMAR_ARMS):
                self.p_values[regime, f, arm][at] = mcnemar_p(res, arm, f, r, self.cfg.alpha)

    def _check(self, p: str, rec: dict, cell: tuple) -> None:
        """Updates ``worst`` and ``uncertified`` with one program's record, scored and tuning
        (a scored row solved once when the fixed and tuned values agree is counted once)."""
        _, k, d, _, _, dpq, sep = cell
        if p != "node":
            eig = min(float(rec["min_eig"].min()), float(rec["tune_min_eig"].min()))
            self.worst = min(self.worst, eig)
        fixed, pick = fixed_index(self.cfg, p), int(rec["choice"][0])
        rows = [("scored", fixed, rec["certified"][0])]
        rows += [("scored", pick, rec["certified"][1])] if pick != fixed else []
        rows += [("tuning", g, c) for g, c in enumerate(rec["tune_certified"])]
        for kind, g, ok in rows:
            if (~ok).any():
                value = grid_value(self.cfg, p, g)
                self.uncertified.append([p, f"K{k}_d{d}", dpq, sep, value, kind, int((~ok).sum())])

    def positive_control(self) -> list[float]:
        """The graph program's fixed rounding rate at the largest ``dpq``, per panel (the same
        for every ``sep``: the row shares its graph solves)."""
        top = int(np.argmax(self.cfg.dpq))
        graph = self.hits["fixed", "recovered", "graph"][:, top, 0] / self.n_trials[:, top, 0]
        return [float(v) for v in graph]

    def recovery(self, regime: str) -> dict[str, list]:
        """``{regime}_{program}_recovery``, ``_lo``, ``_hi`` (rounding rates and their Wilson
        95% bounds) and ``_exact`` (exact rates) of every program, ``[panel][dpq][sep]``."""
        out, n = {}, self.n_trials
        for p in PHASE_PROGRAMS:
            hits = self.hits[regime, "recovered", p]
            out[f"{regime}_{p}_recovery"] = (hits / n).tolist()
            out[f"{regime}_{p}_lo"], out[f"{regime}_{p}_hi"] = (v.tolist() for v in wilson(hits, n))
            out[f"{regime}_{p}_exact"] = (self.hits[regime, "exact", p] / n).tolist()
        return out

    def synergy(self, regime: str, sfx: str, flag: str) -> tuple[dict, SynergyCells]:
        """``(keys, cells)``: the synergy test of the joint against its parts in ``regime``
        under criterion ``flag`` (:func:`synergy_cells`), and its summary keys with ``key =
        regime + sfx``: ``synergy_cells_{key}``, ``synergy_cell_list_{key}`` (``[panel, dpq,
        sep]``), ``synergy_cells_{key}_holm``, ``candidate_cells_{key}`` and ``synergy_p_{key}``
        (the p values against :data:`MCNEMAR_ARMS`, ``[panel][dpq][sep][arm]``)."""
        cfg, key, both = self.cfg, f"{regime}{sfx}", ("joint", *SYNERGY_PARTS)
        rates = {p: self.hits[regime, flag, p] / self.n_trials for p in both}
        certified = np.all([self.certified[regime, p] for p in both], 0)
        p_parts = [self.p_values[regime, flag, p] for p in SYNERGY_PARTS]
        cand, syn, strong = synergy_cells(rates, p_parts, certified, cfg.alpha)
        diff = rates["joint"] - np.maximum(*(rates[p] for p in SYNERGY_PARTS))
        found = zip(*np.nonzero(syn), strict=True)
        keys = {
            f"synergy_cells_{key}": int(syn.sum()),
            f"synergy_cell_list_{key}": [
                [self.names[a], cfg.dpq[i], cfg.sep[s]] for a, i, s in found
            ],
            f"synergy_cells_{key}_holm": int(strong.sum()),
            f"candidate_cells_{key}": int(cand.sum()),
            f"synergy_p_{key}": np.stack(
                [self.p_values[regime, flag, x] for x in MCNEMAR_ARMS], -1
            ).tolist(),
        }
        return keys, SynergyCells(cand, syn, strong, diff)

    def solve_checks(self) -> dict[str, Any]:
        """``max_min_eig_violation``, ``uncertified_solves`` (count), ``uncertified_list`` (the
        first 20 rows) and ``uncertified_by_program``."""
        bad = self.uncertified
        return {
            "max_min_eig_violation": self.worst,
            "uncertified_solves": sum(b[-1] for b in bad),
            "uncertified_list": bad[:20],
            "uncertified_by_program": {
                p: sum(b[-1] for b in bad if b[0] == p) for p in PHASE_PROGRAMS
            },
        }

    def design(self) -> dict[str, Any]:
        """The run's design: ``n``, ``trials``, ``trials_near``, ``tune_trials``,
        ``trials_per_cell`` ([panel][dpq][sep]), ``near_band``, ``grid``, ``eps_grid``,
        ``eps_fixed``, ``alpha``, ``graph_threshold`` (per panel) and ``feature_threshold``."""
        cfg = self.cfg
        return {
            "n": cfg.n,
            "trials": cfg.trials,
            "trials_near": cfg.trials_near,
            "tune_trials": cfg.tune_trials,
            "trials_per_cell": self.n_trials.tolist(),
            "near_band": [cfg.near_below, cfg.near_above],
            "grid": list(cfg.grid),
            "eps_grid": list(cfg.eps_grid),
            "eps_fixed": cfg.eps_fixed,
            "alpha": cfg.alpha,
            "graph_threshold": [graph_threshold(cfg.n, k) for k, _ in self.panels],
            "feature_threshold": feature_threshold(cfg.n),
        }


#: Keys of a phase summary that are the same in every panel part (the run's design).
_PANEL_SHARED = ("dpq_grid", "sep_grid", "programs", "mcnemar_arms", "n", "trials",
                 "trials_near", "tune_trials", "near_band", "grid", "eps_grid", "eps_fixed",
                 "alpha", "feature_threshold")  # fmt: skip


def _panel_keys(s: dict) -> list[str]:
    """The keys of a phase summary indexed by panel first."""
    keys = ["panels", "trials_per_cell", "positive_control", "graph_threshold"]
    for regime in PHASE_REGIMES:
        for p in PHASE_PROGRAMS:
            keys += [f"{regime}_{p}_{t}" for t in ("recovery", "lo", "hi", "exact")]
        for sfx, _ in PHASE_CRITERIA:
            keys.append(f"synergy_p_{regime}{sfx}")
    return keys + [f"tuned_{p}_choice" for p in PHASE_PROGRAMS if f"tuned_{p}_choice" in s]


def join_panels(parts: list[dict], control: float, verdicts: dict[str, str]) -> dict:
    """The phase study's summary over panel parts (each run with its own ``--set ks=..
    --set dims=..``, same seed and design): panel-indexed figures side by side, synergy
    counts summed, Holm's correction redone over the cells of all panels (the family of the
    assembled study), the verdicts decided again with ``control`` (the positive control's
    least rate) and ``verdicts`` (``{regime + criterion suffix: verdict key}``), and the solve
    checks combined. Raises ``ValueError`` for parts of different designs or a panel twice."""
    if not parts:
        raise ValueError("parts: expected at least one phase summary, got none")
    first = parts[0]
    for s in parts[1:]:
        diff = [k for k in _PANEL_SHARED if s.get(k) != first.get(k)]
        if diff:
            raise ValueError(f"parts: panel parts of different designs (they differ in {diff})")
    out = {k: first[k] for k in _PANEL_SHARED if k in first}
    for k in _panel_keys(first):
        out[k] = [row for s in parts for row in s[k]]
    if len(set(out["panels"])) != len(out["panels"]):
        raise ValueError(f"parts: a panel in more than one part: {out['panels']}")
    ok = min(out["positive_control"]) >= control
    arms = list(first["mcnemar_arms"])
    reasons = []
    for regime in PHASE_REGIMES:
        for sfx, _ in PHASE_CRITERIA:
            key = f"{regime}{sfx}"
            listed = [c for s in parts for c in s[f"synergy_cell_list_{key}"]]
            out[f"synergy_cell_list_{key}"] = listed
            out[f"synergy_cells_{key}"] = len(listed)
            out[f"candidate_cells_{key}"] = sum(int(s[f"candidate_cells_{key}"]) for s in parts)
            p = np.asarray(out[f"synergy_p_{key}"], np.float64)  # [panel][dpq][sep][arm]
            p_cell = np.max([p[..., arms.index(a)] for a in SYNERGY_PARTS], 0)
            syn = np.zeros(p_cell.shape, bool)
            for panel, dpq, sep in listed:
                at = (out["panels"].index(panel), out["dpq_grid"].index(dpq),
                      out["sep_grid"].index(sep))  # fmt: skip
                syn[at] = True
            strong = syn & holm(p_cell, float(out["alpha"]))
            out[f"synergy_cells_{key}_holm"] = int(strong.sum())
            if (name := verdicts.get(key)) is not None:
                cand = out[f"candidate_cells_{key}"]
                out[name] = phase_verdict(ok, bool(strong.any()), cand > 0)
                reasons.append(
                    f"{name}: {out[name]} ({int(strong.sum())} synergy cell(s) surviving "
                    f"Holm, {int(syn.sum())} before it, {cand} candidate(s))"
                )
    bad = [row for s in parts for row in s["uncertified_list"]]
    by = {p: sum(int(s["uncertified_by_program"][p]) for s in parts) for p in PHASE_PROGRAMS}
    out |= {
        "verdict_reason": "; ".join(reasons) + f"; positive control {'passes' if ok else 'fails'}",
        "max_min_eig_violation": min(float(s["max_min_eig_violation"]) for s in parts),
        "uncertified_solves": sum(int(s["uncertified_solves"]) for s in parts),
        "uncertified_list": bad[:20],
        "uncertified_by_program": by,
    }
    return out


def plot_phase(ctx, cfg, panels, cells: SynergyCells, regime: str) -> None:
    """Saves ``phase_<regime>.png``: per panel, the joint's rate less the larger of its parts'
    over the ``dpq`` x ``sep`` grid, the dense graph threshold (and for ``K = 2, d = 1`` the
    feature threshold), synergy cells marked ``S`` (``S*`` when surviving Holm)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    sep, dpq = np.asarray(cfg.sep), np.asarray(cfg.dpq)
    rows = zip(axes[0], panels, cells.diff, cells.synergy, cells.holm, strict=True)
    for ax, (k, d), m, s, h in rows:
        im = ax.imshow(m, origin="lower", vmin=-1, vmax=1, cmap="RdBu", aspect="auto")
        ax.set_xticks(range(len(sep)), [f"{v:g}" for v in sep])
        ax.set_yticks(range(len(dpq)), [f"{v:g}" for v in dpq])
        y = np.interp(graph_threshold(cfg.n, k), dpq, np.arange(len(dpq)))
        ax.axhline(y, color="k", ls="--", lw=1, label="graph threshold (dense)")
        if d == 1 and k == 2:
            x = np.interp(feature_threshold(cfg.n), sep, np.arange(len(sep)))
            ax.axvline(x, color="k", ls=":", lw=1, label="features: Phi(s/2)^n = 1/2")
        for i, j in zip(*np.nonzero(s), strict=True):
            label = "S*" if h[i, j] else "S"
            ax.text(j, i, label, ha="center", va="center", color="k", fontweight="bold")
        ax.set(title=f"K={k}, d={d}", xlabel="sep", ylabel="p - q")
    fig.suptitle(
        f"recovery rate, joint - max(graph, joint without graph), {regime} weights "
        "(S: synergy, S*: surviving Holm)",
        y=1.03,
    )
    axes[0][0].legend(fontsize=6, loc="upper right")
    fig.colorbar(im, ax=axes, shrink=0.8)
    ctx.save_plot(fig, f"phase_{regime}")


# ------------------------------------------------------------------------------------------
# Transductive classification (Planetoid): the four programs' predictions
# ------------------------------------------------------------------------------------------


def reduce_features(x, dim: int) -> np.ndarray:
    """Centred features (row-normalised first when non-negative, as bag-of-words counts are)
    projected on their top ``dim`` principal directions and scaled to unit variance per
    direction (a dense ``[n, dim]`` input for the node losses)."""
    x = np.asarray(x, np.float64)
    if (x >= 0).all():
        x = x / np.maximum(x.sum(1, keepdims=True), 1e-12)
    x = x - x.mean(0)
    u, s, _ = np.linalg.svd(x, full_matrices=False)
    z = u[:, :dim] * s[:dim]
    return z / np.maximum(z.std(0), 1e-12)


def _scores_pred(scores, margin: float = 1e-6) -> np.ndarray:
    """argmax of ``[n, K]`` scores; -1 (no label) where the scores do not separate a class."""
    scores = np.asarray(scores)
    srt = np.sort(scores, axis=1)
    return np.where(srt[:, -1] - srt[:, -2] > margin, scores.argmax(1), -1)


def predict(cfg, program: str, value: float, inputs: dict, solvers: dict):
    """Returns ``(pred [n] with -1 for no label, solve report)`` of one program at one grid
    value. ``inputs`` holds ``adjacency``, ``features`` (reduced), ``labels``, ``labeled``,
    ``num_classes``, ``edge_weight``, ``nonedge_weight``, ``knn`` (edges, weights)."""
    k = inputs["num_classes"]
    lab = {key: inputs[key] for key in ("labels", "labeled", "num_classes")}
    graph = {key: inputs[key] for key in ("adjacency", "edge_weight", "nonedge_weight")}
    y, on = jnp.asarray(inputs["labels"]), jnp.asarray(inputs["labeled"])
    if program in ("graph", "linear"):
        extra = {} if program == "graph" else {"features": inputs["features"], "alpha": value}
        beta = value if program == "graph" else cfg.beta
        p = cc.joint_problem(1.0, **graph, **lab, beta=beta, **extra)
        out = solvers[program](p)
        pred = np.asarray(cc.assign_labels(out.l, y, on, k)[0])
        return pred, solve_report(out) | certify(p, out, cfg.cert_tol)
    if program == "joint":
        p = cc.shared_atom_problem(
            1.0, value, features=inputs["features"], label_weight=cfg.label_weight, **graph, **lab
        )
        out = solvers["joint"](p)
        cert = cc.shared_atom_certificate(p, out.l, out.u, out.rho * out.dual)
        rel = float(cert.rel_gap)
        rep = solve_report(out) | {"rel_gap": rel, "certified": rel <= cfg.cert_tol}
        rep["certified"] = rep["certified"] and rep["converged"]
        return _scores_pred(out.u[:, -k:]), rep
    edges, w = inputs["knn"]
    xa, mask = cc.with_labels(inputs["features"], inputs["labels"], inputs["labeled"], k)
    p = cc.FusionProblem.create(xa, edges, w, value, mask=mask, label_classes=k)
    out = solvers["node"](p)
    rep = {"iters": int(out.n_iters), "converged": bool(out.converged)}
    return _scores_pred(out.u[:, -k:]), rep | {"certified": rep["converged"]}


def accuracy_record(name: str, program: str, pred, truth, test) -> dict[str, float]:
    """``{name}_{program}_acc`` (all test nodes, no label = wrong), ``_coverage`` (test nodes
    with a label) and ``_covered_acc`` (accuracy on those)."""
    p, t = np.asarray(pred)[test], np.asarray(truth)[test]
    cov = p >= 0
    key = f"{name}_{program}"
    return {
        f"{key}_acc": float((p == t).mean()),
        f"{key}_coverage": float(cov.mean()),
        f"{key}_covered_acc": float((p[cov] == t[cov]).mean()) if cov.any() else 0.0,
    }
