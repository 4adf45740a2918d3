"""Shared code of the cvxclust studies: solve records and certificates, Wilson intervals, the
phase study's five programs (graph PSD-hard, node-only convex clustering, the shared-model
joint program, the same program without its graph, and the linear-reward surrogate) built,
tuned on their own draws and solved per grid cell with the paired tests of its verdict, and
the Planetoid study's four programs' predictions."""

from __future__ import annotations

import functools
import math
from typing import Any

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
