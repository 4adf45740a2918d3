"""Benchmarks of ``hexad.cvxclust``: convex clustering and the nuclear-norm program vs CVXPY.

Run: ``python -m kernels cvxclust [--quick]``.

- Convex clustering (squared loss, 2-D blobs with 5 centres, 10-NN Gaussian weights,
  ``gamma = 0.5``, float32, ``tol = 1e-4``) at n = 200, 1000, 10000 (and 100000 without
  ``--quick``), against CVXPY with Clarabel and with SCS on the same objective. The harness
  peers run at n <= 10000 (one Clarabel solve took 3.7 s there, SCS 15 s); at n = 100000, where
  the harness's >= 6 calls per row would take many minutes, Clarabel and SCS are each timed
  once (one ``prob.solve`` with canonicalisation, under a 300 s solver time limit) and the row
  name carries the wall and solver seconds and the status. The row name carries the relative
  objective gap ``(ours - peer) / peer`` measured once before timing (negative: ours is lower).
- Soft-PSD nuclear-norm graph clustering (``graph_problem(..., psd=False)``; SBM, 4 equal
  blocks, p = 0.8, q = 0.1, ``mu = sqrt(n)``, ``tol = 1e-5``, over-relaxation 1.3) at
  n = 100, 500, 2000: the rank-16 subspace eigen step at n <= 500 and rank 12 at 2000 (a full
  ``eigh`` is most of an iteration at n = 100; the rank-16 step is certified exact at the end,
  see ``sat``); CVXPY + SCS (default accuracy) as the harness peer at
  n = 100, timed once at n = 500 (300 s solver limit; the row name gives its wall seconds and
  status), skipped at n = 2000 (an SDP with a 4000 x 4000 PSD cone).
  The row name gives the relative objective gap vs SCS (negative: ours is lower), the gap of
  ours to the planted partition's objective (``gap_truth``, which is the optimum when the
  recovery error is 0), our recovery error, whether the rank-k step was certified exact
  (``sat=False``) and the compile seconds (these rows are timed as pre-compiled calls under a
  one-thread BLAS limit, see ``fn``).

- The non-negative factor point (``FactorSolver``, rank 64, 100 steps; PSD-hard program of the
  same SBM) at n = 500 (``--quick``) or 2000, without a peer; the row name gives its gap to the
  planted partition's objective (``gap_truth``; 0 where the partition is the optimum) after
  those steps.

- Planetoid scale (not with ``--quick``): the graph program's main block on Cora (n = 2550,
  ``cvxclust_planetoid``'s ``graph`` program at ``beta = 1``), 20 ADMM iterations of the
  rank-``k`` step tracking the kept rank (``rank_margin=16``, one block Krylov sweep a step,
  as the study runs it) against the doubling step with two sweeps (the peer; the study's step
  before), each from its own state after 200 iterations; the row name gives both subspace sizes,
  the dense ``eigh``'s seconds and the tracking solve's seconds to a certified duality gap of
  1e-2 from the cold start (100-iteration chunks, certified after each).

Bounds: the fusion rows, the roofline of the bytes every iteration must move (the edge duals
``[E, 2]`` and the points ``[n, 2]``, read and written once, float32) times the iterations run;
the nuclear rows, the roofline of one rank-k subspace product per iteration (``2 n^2 k`` FLOPs)
and of the bytes of the ``n x n`` iterate, its dual and the target read once and the iterate
written once (float32), times the iterations run; the factor row, the roofline of one
``[n, n] x [n, rank]`` product (``2 n^2 rank`` FLOPs) and of reading ``K`` once per step.

Goals: at least as fast as Clarabel at n = 1000; n = 100000 in minutes; the nuclear-norm
program at least 50x faster than SCS at n = 100 at equal accuracy.
"""

from __future__ import annotations

import time

import cvxpy as cp
import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp
from threadpoolctl import ThreadpoolController

from hexad import cvxclust as cc
from kernels._harness import Case

GAMMA = 0.5
PEERS = ("CLARABEL", "SCS")
ONCE_LIMIT_S = 300.0


def _blobs(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(5, 2)) * 4.0
    return (centres[rng.integers(0, 5, n)] + rng.normal(size=(n, 2))).astype(np.float32)


def _once(prob, solver: str, limit_s: float) -> str:
    """One timed CVXPY solve (canonicalisation included) under a solver time limit, for sizes
    where the harness's >= 6 peer calls per row would take too long. Returns a row-name tag."""
    opts = {"time_limit": limit_s} if solver == "CLARABEL" else {"time_limit_secs": limit_s}
    t0 = time.perf_counter()
    try:
        prob.solve(solver=solver, **opts)
    except cp.error.SolverError as err:  # e.g. a time-out without a usable point
        wall = time.perf_counter() - t0
        return f"{solver.lower()}_1call=failed({type(err).__name__},{wall:.0f}s)"
    wall = time.perf_counter() - t0
    solve_s = prob.solver_stats.solve_time or float("nan")
    return f"{solver.lower()}_1call={wall:.1f}s(solver {solve_s:.1f}s,{prob.status})"


def _cvx_fusion_problem(x, edges, w) -> cp.Problem:
    n = x.shape[0]
    e = len(edges)
    d = sp.csr_matrix(
        (np.r_[np.ones(e), -np.ones(e)], (np.r_[np.arange(e), np.arange(e)], edges.T.reshape(-1))),
        shape=(e, n),
    )
    u = cp.Variable(x.shape)
    obj = 0.5 * cp.sum_squares(x - u) + GAMMA * cp.sum(cp.multiply(w, cp.norm(d @ u, 2, axis=1)))
    return cp.Problem(cp.Minimize(obj))


def _cvx_fusion(x, edges, w, solver: str):
    prob = _cvx_fusion_problem(x, edges, w)

    def solve():
        prob.solve(solver=solver)
        return prob.value

    return solve


def _fusion_cases(n: int, peers: bool, once: bool = False) -> list[Case]:
    x = _blobs(n)
    edges, w = cc.knn_gaussian_weights(x, k=10)
    problem = cc.FusionProblem.create(x, edges, w, GAMMA)
    solver = cc.FusionSolver(tol=1e-4, max_iters=20000)
    # A separate jit of a wrapper, so the harness's own compile of `solver` is not a cache hit.
    out = jax.jit(lambda p: solver(p))(problem)
    ours = float(out.objective)
    it = int(out.n_iters)
    base = f"cvxclust/fusion n={n} E={len(edges)} iters={it} conv={bool(out.converged)}"
    # Bound: every iteration reads and writes the edge duals [E, 2] and the points [n, 2] at
    # least once (float32), so the roofline of those bytes times the iterations run.
    nbytes = it * 4.0 * 2 * (2 * len(edges) + 2 * n)
    common = dict(
        fn=solver,
        args=(problem,),
        shapes=f"x[{n},2] edges[{len(edges)},2]",
        items=float(n),
        unit="points",
        repeats=5,
        warmup=1,
        bytes=nbytes,
        bound_note="roofline of the edge duals' and points' bytes per iteration",
    )
    if not peers:
        tag = "(peer skipped)"
        if once:
            tags = [_once(_cvx_fusion_problem(x, edges, w), s, ONCE_LIMIT_S) for s in PEERS]
            tag = f"(peers timed once: {' '.join(tags)})"
        return [
            Case(
                name=f"{base} {tag}",
                **common,
                goal="n=100000 in minutes",
            )
        ]
    cases = []
    for name in PEERS:
        peer = _cvx_fusion(x, edges, w, name)
        ref = peer()
        gap = (ours - ref) / abs(ref)
        cases.append(
            Case(
                name=f"{base} gap_vs_{name.lower()}={gap:+.1e}",
                peer=lambda *_, peer=peer: peer(),
                peer_name=f"cvxpy {name.lower()}",
                peer_jit=False,
                goal="ratio <= 1 vs clarabel at n=1000",
                **common,
            )
        )
    return cases


def _sbm(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(4), n // 4)
    prob = np.where(y[:, None] == y[None, :], 0.8, 0.1)
    a = np.triu(rng.random((n, n)) < prob, 1).astype(np.float32)
    return a + a.T, y


# The nuclear and factor rows time a pre-compiled call (compiled outside the harness).
_PRECOMPILED = dict(repeats=5, warmup=1, jit=False)


def _partition_objective(problem, y) -> float:
    """The objective at the planted partition's matrix."""
    part = jnp.asarray(y[:, None] == y[None, :], problem.target.dtype)
    return float(cc.nuclear_objective(problem, part))


def _nuclear_cvx(problem) -> cp.Problem:
    n = problem.n
    lvar = cp.Variable((n, n), symmetric=True)
    c, t = np.asarray(problem.cost), np.asarray(problem.target)
    obj = cp.sum(cp.multiply(c, cp.abs(lvar - t))) + float(problem.mu) * cp.normNuc(lvar)
    return cp.Problem(cp.Minimize(obj), [lvar >= 0, lvar <= 1, cp.diag(lvar) == 1])


def _subspace_bound(n: int, k: int, iters: int) -> dict:
    """The nuclear rows' bound: every iteration multiplies the ``n x n`` iterate by the
    ``n x k`` subspace at least once and reads the iterate, its dual and the target and writes
    the iterate (float32)."""
    return dict(
        flops=iters * 2.0 * n * n * k,
        bytes=iters * 4.0 * 4 * n * n,
        bound_note="roofline of a rank-k subspace product and the n x n iterate's bytes",
        shapes=f"A[{n},{n}]",
    )


def _nuclear_cases(n: int, peer: bool, once: bool = False) -> list[Case]:
    a, y = _sbm(n)
    problem = cc.graph_problem(a, float(np.sqrt(n)), psd=False)  # the soft nuclear program
    rank = 16 if n <= 500 else 12
    solver = cc.NuclearSolver(
        tol=1e-5, max_iters=2000, rank=rank, compute_objective=False, relaxation=1.3
    )
    t0 = time.perf_counter()
    compiled = jax.jit(solver).lower(problem).compile()
    compile_s = time.perf_counter() - t0

    # One BLAS thread: with several busy processes on few cores, OpenBLAS's thread pool makes
    # LAPACK's eigh many times slower; the peer runs under the same limit. One controller for
    # all calls: threadpool_limits(1) rescans the loaded libraries on every entry (a
    # noticeable part of a small solve).
    limit = ThreadpoolController().limit

    def fn(p):
        with limit(limits=1):
            return jax.block_until_ready(compiled(p))

    with limit(limits=1):
        out = compiled(problem)
    err = float(cc.recovery_error(out.l, jnp.asarray(y)))
    ours = float(cc.nuclear_objective(problem, out.l))
    truth = _partition_objective(problem, y)
    base = (
        f"cvxclust/nuclear n={n} {'eigh' if rank is None else f'rank{rank}'} "
        f"iters={int(out.n_iters)} conv={bool(out.converged)} rec_err={err:.1e} "
        f"gap_truth={(ours - truth) / abs(truth):+.1e} "
        f"sat={bool(out.rank_saturated)} compile={compile_s:.1f}s"
    )
    iters = int(out.n_iters)
    common = dict(
        fn=fn,
        args=(problem,),
        **_subspace_bound(n, rank, iters),
        items=float(n),
        unit="nodes",
        **_PRECOMPILED,
    )
    if not peer:
        tag = "(SCS skipped: minutes)"
        if once:
            with limit(limits=1):
                tag = f"(SCS timed once: {_once(_nuclear_cvx(problem), 'SCS', ONCE_LIMIT_S)})"
        return [Case(name=f"{base} {tag}", **common)]
    prob = _nuclear_cvx(problem)

    def scs():
        with limit(limits=1):
            prob.solve(solver="SCS")
        return prob.value

    ref = scs()
    return [
        Case(
            name=f"{base} gap_vs_scs={(ours - ref) / abs(ref):+.1e}",
            peer=lambda *_: scs(),
            peer_name="cvxpy scs",
            peer_jit=False,
            goal="ratio <= 0.02 (50x) vs scs at n=100",
            **common,
        )
    ]


def _factor_case(n: int, rank: int = 64, steps: int = 100) -> Case:
    a, y = _sbm(n)
    problem = cc.graph_problem(a, float(np.sqrt(n)))  # PSD-hard: the factor point's program
    solver = cc.FactorSolver(rank=rank, steps=steps)
    key = jax.random.key(0)
    t0 = time.perf_counter()
    compiled = jax.jit(solver).lower(problem, key).compile()
    compile_s = time.perf_counter() - t0
    out = compiled(problem, key)
    truth = _partition_objective(problem, y)
    gap = (float(out.objective) - truth) / abs(truth)
    return Case(
        name=f"cvxclust/factor n={n} rank={rank} steps={steps} gap_truth={gap:+.1e} "
        f"compile={compile_s:.1f}s",
        fn=lambda p, k: jax.block_until_ready(compiled(p, k)),
        args=(problem, key),
        # Every step multiplies K by the factor once and reads K (the power iterations
        # for the step size are not counted).
        flops=2.0 * n * n * rank * steps,
        bytes=4.0 * n * n * steps,
        bound_note="roofline of one [n, n] x [n, rank] product and K's bytes per step",
        shapes=f"K[{n},{n}] V[{n},{rank}]",
        items=float(steps),
        unit="steps",
        **_PRECOMPILED,
    )


def _cora_block() -> cc.NuclearProblem:
    """The graph program's main block on Cora (``cvxclust_planetoid``'s ``graph`` program at
    ``beta = 1``: the Planetoid training labels, balanced edge weights)."""
    from hexad.data import load_planetoid

    g = load_planetoid("cora")
    n = len(g.labels)
    a = cc.adjacency_from_edges(g.edges[g.edges[:, 0] != g.edges[:, 1]], n)
    c_a, c_ac = cc.balanced_weights(a)
    labeled = np.zeros(n, bool)
    labeled[g.train_idx] = True
    p = cc.joint_problem(
        1.0, adjacency=a, edge_weight=c_a, nonedge_weight=c_ac, labels=g.labels,
        labeled=labeled, num_classes=g.num_classes, beta=1.0,
    )  # fmt: skip
    ids, _ = cc.nuclear_blocks(p)
    ix = np.ix_(*(np.flatnonzero(ids == np.bincount(ids).argmax()),) * 2)
    return p.replace(target=p.target[ix], cost=p.cost[ix], linear=p.linear[ix])


PLANETOID_GAP = 1e-2  # the certified gap the Planetoid row times (cvxclust_planetoid's goal)


def _to_gap(solver, problem, chunk: int, cap: int) -> str:
    """Seconds and iterations until the duality gap of the solve's point is at most
    ``PLANETOID_GAP``: ``chunk`` iterations at a time, each chunk warm-started from the last
    (its iterate, dual, rho and subspace) and certified after it; at most ``cap``."""
    step = jax.jit(solver.replace(max_iters=chunk, tol=0.0))
    init, total, iters, gap = None, 0.0, 0, float("inf")
    while iters < cap and gap > PLANETOID_GAP:
        t0 = time.perf_counter()
        out = jax.block_until_ready(step(problem, init))
        total += time.perf_counter() - t0
        iters += chunk
        init = (out.l, out.dual, out.rho, out.subspace)
        gap = float(cc.nuclear_certificate(problem, out.l, out.rho * out.dual).rel_gap)
    hit = "" if gap <= PLANETOID_GAP else ">"
    return f"{hit}{total:.0f}s({iters}it,gap {gap:.1e})"


def _planetoid_case(iters: int = 20, warm: int = 200) -> Case:
    """The rank-tracking eigen step against the doubling one on Cora's main block: each path
    first runs ``warm`` iterations from the cold start (so its subspace has settled where it
    settles), then ``iters`` iterations from there are timed. The row name gives each path's
    subspace and kept rank there, the dense ``eigh``'s seconds per iteration, and the tracking
    solve's time to the certified gap ``PLANETOID_GAP`` from the cold start."""
    problem = _cora_block()
    n = problem.n
    base = cc.NuclearSolver(tol=0.0, max_iters=iters, compute_objective=False, rho=0.25,
                            relaxation=1.6, rank=16, max_rank=256)  # fmt: skip
    paths = {"track": base.replace(rank_margin=16, power_iters=1), "double": base}
    limit = ThreadpoolController().limit
    fns, tags, ks = {}, [], {}
    with limit(limits=1):
        for name, solver in paths.items():
            start = jax.jit(solver.replace(max_iters=warm))(problem)
            init = (start.l, start.dual, start.rho, start.subspace)
            compiled = jax.jit(solver).lower(problem, init).compile()
            fns[name], ks[name] = (compiled, init), int(start.subspace_rank)
            tags.append(f"{name} k={ks[name]} kept={int(start.rank)}")
        eigh = jax.jit(jnp.linalg.eigh)
        jax.block_until_ready(eigh(problem.target))
        t0 = time.perf_counter()
        jax.block_until_ready(eigh(problem.target))
        tags.append(f"eigh {time.perf_counter() - t0:.2f}s/it")
        tags.append(f"to_gap{PLANETOID_GAP:.0e}={_to_gap(paths['track'], problem, 100, 3000)}")

    def run(name):
        def call(p):
            with limit(limits=1):
                return jax.block_until_ready(fns[name][0](p, fns[name][1]))

        return call

    return Case(
        name=f"cvxclust/planetoid cora main block n={n} {iters} iters: " + "; ".join(tags),
        fn=run("track"),
        args=(problem,),
        peer=run("double"),
        peer_name="the doubling rank-k step",
        peer_jit=False,
        goal="ratio <= 0.5 vs the doubling step",
        **_subspace_bound(n, ks["track"], iters),
        items=float(iters),
        unit="iters",
        **_PRECOMPILED,
    )


def cases(quick: bool) -> list[Case]:
    out = []
    for n in (200, 1000) if quick else (200, 1000, 10000, 100000):
        out += _fusion_cases(n, peers=n <= 10000, once=n == 100000)
    for n in (100,) if quick else (100, 500, 2000):
        out += _nuclear_cases(n, peer=n <= 100, once=n == 500)
    out.append(_factor_case(500 if quick else 2000))
    if not quick:
        out.append(_planetoid_case())
    return out
