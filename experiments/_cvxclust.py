"""Shared code of the cvxclust studies: solve records and certificates, Wilson intervals, and
the four programs of the phase study (graph PSD-hard, node-only convex clustering, the
shared-model joint program and the linear-reward surrogate) built and solved per grid cell."""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from scipy.stats import norm

from hexad import cvxclust as cc

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
# The four programs of one draw
# ------------------------------------------------------------------------------------------


def _complete_edges(n: int) -> np.ndarray:
    i, j = np.triu_indices(n, 1)
    return np.stack([i, j], 1).astype(np.int32)


def build(cfg, g: cc.ContextualSBM, k: int, factor: float) -> dict[str, Any]:
    """The problems of one draw at one grid factor (1 = the fixed rule), keyed by program."""
    n = len(g.truth)
    node = dict(labels=g.labels, labeled=g.labeled, num_classes=k)
    kx = cc.feature_similarity(g.features) if g.features.std(0).min() > 0 else None
    alpha = cfg.feature_scale / np.std(kx[~np.eye(n, dtype=bool)]) if kx is not None else 0.0
    edges = _complete_edges(n)
    d2 = np.sum((g.features[edges[:, 0]] - g.features[edges[:, 1]]) ** 2, 1)
    w = np.exp(-factor * d2 / np.median(d2))
    xa, mask = cc.with_labels(g.features, g.labels, g.labeled, k, cfg.label_weight)
    return {
        "graph": cc.graph_problem(g.adjacency, 1.0, nonedge_weight=factor),
        "node": cc.FusionProblem.create(xa, edges, w, 0.0, mask=mask, label_classes=k),
        "joint": cc.shared_atom_problem(
            1.0,
            factor * cfg.node_weight * n,
            adjacency=g.adjacency,
            features=g.features,
            label_weight=cfg.label_weight,
            **node,
        ),
        "linear": cc.joint_problem(
            1.0,
            adjacency=g.adjacency,
            features=g.features,
            alpha=factor * alpha,
            beta=factor * cfg.beta,
            **node,
        ),
    }


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
    return {
        "graph": nuclear,
        "linear": nuclear,
        "joint": _over_trials(matrix(shared)),
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


def draw_cell(cfg, seed: int, k: int, d: int, i: int, dpq: float, sep: float) -> list:
    """The ``cfg.trials`` contextual-SBM draws of one phase cell. Trial ``t`` of row ``i``
    draws from the generator ``(seed, k, i, t)``, so its graph (drawn first) is the same for
    every ``sep`` and ``d``."""
    args = (cfg.n, (1 + dpq) / 2, (1 - dpq) / 2, sep, d, k * cfg.labels_per_class)
    return [
        cc.contextual_sbm(
            np.random.default_rng([seed, k, i, t]), *args, cfg.label_noise, num_classes=k
        )
        for t in range(cfg.trials)
    ]


def _same_partition(ids: np.ndarray, truth: np.ndarray) -> bool:
    return bool(((ids[:, None] == ids[None, :]) == (truth[:, None] == truth[None, :])).all())


def solve_cell(cfg, draws, k: int, programs=PROGRAMS) -> dict[str, dict[str, np.ndarray]]:
    """Solves every program at every grid factor on the draws of one cell.

    Returns ``{program: {"recovered": [factors, trials] bool, "exact": ..., "certified": ...,
    "min_eig": [factors, trials]}}``. A draw is recovered when the program's partition equals
    the truth: for the matrix programs the components of ``L > 1/2`` (``matrix_clusters``);
    ``exact`` is the stricter ``max |L - 1[y_u = y_v]| <= cfg.recovery_tol`` (for node-only,
    the same as ``recovered``). Node-only convex clustering reads its partition at the first
    ``gamma`` of the clusterpath with at most ``K`` fused clusters and is "certified" when
    every solve of the path converged (no duality gap is implemented for the softmax loss);
    the other programs are certified by a relative duality gap ``<= cfg.cert_tol`` with a
    converged solve (continued at ``cfg.tol / 10`` and ``/ 100`` until the gap meets it, see
    :func:`_refined`), and report the minimum eigenvalue of their PSD-hard solution.
    """
    truth = draws[0].truth
    y = jnp.asarray(truth)
    gammas = tuple(float(v) for v in np.geomspace(*cfg.gamma_range, cfg.n_gammas))
    solve = _solvers(cfg.tol, cfg.max_iters, gammas, cfg.cert_tol)
    res = {p: {"recovered": [], "exact": [], "certified": [], "min_eig": []} for p in programs}
    for factor in cfg.grid:
        built = [build(cfg, g, k, factor) for g in draws]
        for name in programs:
            batch = jax.tree.map(lambda *v: jnp.stack(v), *[b[name] for b in built])
            out = solve[name](batch, y)
            if name == "node":
                clusters, counts, conv = (np.asarray(v) for v in out)
                first = np.argmax(counts <= k, axis=1)
                ok = [
                    bool((counts[t] <= k).any()) and _same_partition(clusters[t, first[t]], truth)
                    for t in range(len(draws))
                ]
                res[name]["recovered"].append(ok)
                res[name]["exact"].append(ok)
                res[name]["certified"].append(conv)
                res[name]["min_eig"].append(np.zeros(len(draws)))
            else:
                same, err, conv, gap, eig = (np.asarray(v) for v in out)
                res[name]["recovered"].append(same)
                res[name]["exact"].append(err <= cfg.recovery_tol)
                res[name]["certified"].append(conv & (gap <= cfg.cert_tol))
                res[name]["min_eig"].append(eig)
    return {p: {key: np.asarray(v) for key, v in r.items()} for p, r in res.items()}


def _empty_cell(cfg) -> dict[str, dict[str, np.ndarray]]:
    shape = (len(cfg.grid), cfg.trials)
    flags = ("recovered", "exact", "certified")
    return {
        p: {f: np.zeros(shape, bool) for f in flags} | {"min_eig": np.zeros(shape)}
        for p in PROGRAMS
    }


def cell_checkpointed(ctx, cfg, cell: tuple, todo, graph_cache: dict):
    """Returns ``(start, record)``: the :func:`solve_cell` record of phase cell ``cell = (seed,
    k, d, i, j, dpq, sep)``, restored from ``ctx``'s checkpoint ``cell-K<k>-d<d>-<i>-<j>`` (kept
    under the run's settings stamp; ``start`` > 0) or solved (``programs=todo``; a skipped
    graph solve taken from ``graph_cache[k, i]``) and checkpointed (``start`` = 0)."""
    seed, k, d, i, j, dpq, sep = cell
    empty = _empty_cell(cfg)
    with ctx.checkpointed(f"cell-K{k}-d{d}-{i}-{j}", empty) as (start, res, save):
        if start == 0:
            res = solve_cell(cfg, draw_cell(cfg, seed, k, d, i, dpq, sep), k, todo)
            res.setdefault("graph", graph_cache.get((k, i)))
            res = jax.tree.map(lambda e, v: np.asarray(v, e.dtype), empty, res)
            save(0, res)
    return start, res


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
