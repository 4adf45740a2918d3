"""Exact block splitting of the nuclear-norm program (SplitNuclearSolver, nuclear_blocks)."""

import jax
import numpy as np
import pytest

from hexad import cvxclust as cc
from hexad.cvxclust import _split

SOLVER = cc.NuclearSolver(tol=1e-8, max_iters=10000)


def _components_problem(mu: float = 1.5):
    """Seven components (9, 6, 4, 3, 2, 1, 1 nodes); labelled nodes 0 and 15 (label 0) join the
    first and third, 9 and 19 (label 1) the second and fourth."""
    rng = np.random.default_rng(0)
    sizes = (9, 6, 4, 3, 2, 1, 1)
    y = np.repeat(np.arange(len(sizes)), sizes)
    n = len(y)
    a = np.triu(rng.random((n, n)) < np.where(y[:, None] == y[None, :], 0.7, 0.0), 1)
    a = (a | a.T).astype(float)
    labeled = np.zeros(n, bool)
    labeled[[0, 9, 15, 19]] = True
    return cc.joint_problem(
        mu,
        adjacency=a,
        labels=y % 2,
        labeled=labeled,
        num_classes=2,
        edge_weight=0.9,
        nonedge_weight=0.3,
    )


@pytest.fixture(scope="module")
def problem():
    return _components_problem()


@pytest.fixture(scope="module")
def unsplit(problem):
    return jax.jit(SOLVER)(problem)


def test_blocks_are_components_joined_by_equal_labels(problem):
    ids, k = cc.nuclear_blocks(problem)
    expect = np.repeat([0, 1, 0, 1, 2, 3, 4], (9, 6, 4, 3, 2, 1, 1))
    assert k == 5 and (ids == expect).all()
    # An edge between labelled nodes of different labels has S = -1 <= -C = -0.9: zero is
    # optimal there and the edge does not link.
    a = np.array([[0.0, 1.0], [1.0, 0.0]])
    p = cc.joint_problem(
        1.0,
        adjacency=a,
        labels=np.array([0, 1]),
        labeled=np.ones(2, bool),
        num_classes=2,
        edge_weight=0.9,
    )
    assert cc.nuclear_blocks(p)[1] == 2
    assert cc.nuclear_blocks(cc.graph_problem(a, 1.0))[1] == 1


def test_split_solve_matches_unsplit(problem, unsplit):
    # Two large blocks (13 and 9 nodes) through the rank-12 path (capped at 9 for the second
    # block), three small ones batched with the exact eigh step.
    split = cc.SplitNuclearSolver(SOLVER.replace(rank=12), small_max=5)(problem)
    assert bool(split.converged) and not bool(split.rank_saturated)
    # The claim is exact; both solves stop at tol 1e-8, so the objectives agree to ~1e-8.
    np.testing.assert_allclose(float(split.objective), float(unsplit.objective), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(split.l), np.asarray(unsplit.l), atol=1e-6)
    assert int(split.rank) == int(unsplit.rank)
    # The assembled multiplier certifies the whole problem.
    cert = cc.nuclear_certificate(problem, split.l, split.rho * split.dual)
    assert float(cert.rel_gap) <= 1e-6
    # Across blocks the solution is exactly zero.
    ids, _ = cc.nuclear_blocks(problem)
    assert float(np.abs(np.asarray(split.l)[ids[:, None] != ids[None, :]]).max()) == 0.0
    # A rank-4 step is too small for these blocks, and the output says so.
    low = cc.SplitNuclearSolver(SOLVER.replace(rank=4, max_iters=200), small_max=5)(problem)
    assert bool(low.rank_saturated) and not bool(low.converged)


def test_split_warm_start_and_one_compile_per_bucket(problem):
    solver = cc.SplitNuclearSolver(SOLVER, small_max=5)
    out = solver(problem)
    again = solver(problem, (out.l, out.dual, out.rho))
    assert int(again.n_iters) <= 5
    np.testing.assert_allclose(float(again.objective), float(out.objective), rtol=1e-8)
    loose = cc.SplitNuclearSolver(SOLVER.replace(tol=1e-6), small_max=5)
    for mu in (0.5, 1.0):
        assert bool(loose(_components_problem(mu)).converged)
    # Small blocks of 2, 1, 1 nodes, all padded to 2: one compile per padded size, whatever mu.
    assert _split._jit_batched(loose._small())._cache_size() == 1


def test_split_accepts_the_nuclear_solvers_warm_start(problem, unsplit):
    # NuclearSolver's output warm-starts from (z, dual, rho, subspace); the split solver takes
    # the same 4-tuple (the subspace is of the whole problem, not of a block: it is ignored).
    solver = cc.SplitNuclearSolver(SOLVER, small_max=5)
    init = (unsplit.l, unsplit.dual, unsplit.rho, unsplit.subspace)
    four, three = solver(problem, init), solver(problem, init[:3])
    assert int(four.n_iters) <= 5
    for a, b in zip(four, three, strict=True):
        if a is not None:
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match=r"init: expected \(z, dual, rho\) or"):
        solver(problem, init + (None,))


def test_split_bad_input():
    with pytest.raises(TypeError, match="problem"):
        cc.nuclear_blocks(np.eye(3))
    p = cc.graph_problem(np.zeros((3, 3)), 1.0)
    with pytest.raises(ValueError, match="small_max"):
        cc.SplitNuclearSolver(small_max=0)(p)
    with pytest.raises(ValueError, match="init"):
        cc.SplitNuclearSolver()(p, np.eye(2))
