"""The shared-model joint program (4b): CVXPY + SCS, the certificate, three clusters."""

import cvxpy as cp
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hexad import cvxclust as cc


@pytest.fixture(scope="module")
def solve():
    return jax.jit(cc.SharedAtomSolver(tol=1e-8, max_iters=20000))


def _scs_value(p):
    n, d, k = p.n, p.x.shape[1], p.y.shape[1]
    c, a, x, y, w = (np.asarray(v) for v in (p.cost, p.target, p.x, p.y, p.label_weight))
    m = cp.Variable((n + d + k, n + d + k), symmetric=True)
    ll, uu = m[:n, :n], m[:n, n:]
    loss = 0.5 * cp.sum_squares(x - uu[:, :d])
    if k:
        s = uu[:, d:]
        loss = loss + cp.sum(
            cp.multiply(w, cp.log_sum_exp(s, axis=1) - cp.sum(cp.multiply(y, s), axis=1))
        )
    obj = cp.sum(cp.multiply(c, cp.abs(ll - a))) + float(p.mu0) * cp.trace(m)
    obj = obj + float(p.mu1) * loss
    prob = cp.Problem(cp.Minimize(obj), [m >> 0, ll >= 0, ll <= 1, cp.diag(ll) == 1])
    prob.solve(solver="SCS", eps=1e-9, max_iters=200000)
    return prob.value


def _small(seed=0):
    rng = np.random.default_rng(seed)
    y = np.repeat([0, 1, 2], 4)
    prob = np.where(y[:, None] == y[None, :], 0.7, 0.3)
    a = np.triu(rng.random(prob.shape) < prob, 1).astype(float)
    x = np.eye(3)[y][:, :2] * 1.5 + rng.normal(size=(12, 2))
    labeled = np.zeros(12, bool)
    labeled[[0, 4, 8, 9]] = True
    return a + a.T, x, y, labeled


@pytest.mark.parametrize("mu0, mu1", [(1.0, 1.0), pytest.param(0.5, 3.0, marks=pytest.mark.slow)])
def test_shared_atom_program_matches_scs_and_its_gap_closes(solve, mu0, mu1):
    a, x, y, labeled = _small()
    p = cc.shared_atom_problem(
        mu0,
        mu1,
        adjacency=a,
        features=x,
        labels=y,
        labeled=labeled,
        num_classes=3,
        label_weight=2.0,
    )
    out = solve(p)
    ref = _scs_value(p)
    assert bool(out.converged)
    # The bar: 1e-4 relative agreement with the reference solver.
    assert abs(float(out.objective) - ref) <= 1e-4 * abs(ref)
    assert float(out.min_eig) >= -1e-10 and float(cc.box_violation(out.l)) <= 1e-12
    cert = cc.shared_atom_certificate(p, out.l, out.u, out.rho * out.dual)
    assert float(cert.rel_gap) <= 1e-6
    # Weak duality on an early iterate and on a junk multiplier.
    early = cc.SharedAtomSolver(tol=1e-12, max_iters=5)(p)
    c = cc.shared_atom_certificate(p, early.l, early.u, early.rho * early.dual)
    assert float(c.dual) <= ref + 1e-6 <= float(c.primal) + 2e-6 and float(c.rel_gap) > 1e-3
    junk = np.random.default_rng(3).normal(size=early.dual.shape) * 10
    assert float(cc.shared_atom_certificate(p, early.l, early.u, junk).dual) <= ref + 1e-6
    assert not bool(early.converged) and int(early.n_iters) == 5


def test_anderson_accelerated_solve_matches_scs():
    a, x, y, labeled = _small()
    p = cc.shared_atom_problem(
        1.0, 1.0, adjacency=a, features=x, labels=y, labeled=labeled, num_classes=3
    )
    out = jax.jit(cc.SharedAtomSolver(anderson=5, balance=2.0))(p)
    ref = _scs_value(p)
    assert bool(out.converged)
    # The bar: 1e-4 relative agreement with the reference solver.
    assert abs(float(out.objective) - ref) <= 1e-4 * abs(ref)
    assert float(out.min_eig) >= -1e-10 and float(cc.box_violation(out.l)) <= 1e-12


def test_without_node_loss_it_is_the_psd_hard_graph_program(solve):
    a, x, _, _ = _small(1)
    shared = solve(cc.shared_atom_problem(1.0, 0.0, adjacency=a, features=x))
    graph = jax.jit(cc.NuclearSolver(tol=1e-8, max_iters=20000))(cc.graph_problem(a, 1.0))
    np.testing.assert_allclose(np.asarray(shared.l), np.asarray(graph.l), atol=1e-4)


def _three_clusters():
    """Three tight clusters of 8 nodes in 6-D: ``(y, x, x standardised)``."""
    y = np.repeat([0, 1, 2], 8)
    means = np.zeros((3, 6))
    means[:, :5] = np.array([1.0, 1.0, -2.0])[:, None]
    means[:, 5] = (2.0, -2.0, 0.0)
    x = means[y] + 0.25 * np.random.default_rng(0).normal(size=(24, 6))
    return y, x, (x - x.mean(0)) / x.std(0)


def test_keeps_three_separated_clusters_apart_where_the_linear_surrogate_merges_them(solve):
    # After standardisation the means of clusters 0 and 1 have a positive inner product, so
    # the linear reward (an unnormalised k-means) merges them. The shared-model program keeps
    # all three. Node information only (no graph).
    y, x, xs = _three_clusters()
    m = np.array([xs[y == c].mean(0) for c in range(3)])
    assert m[0] @ m[1] > 0.5  # the merging condition of the linear surrogate
    out = jax.jit(cc.SharedAtomSolver(tol=1e-6, max_iters=5000))(
        cc.shared_atom_problem(1.0, 4.0, features=xs)
    )
    ids, k = cc.matrix_clusters(out.l)
    assert bool(out.converged) and int(k) == 3 and (np.asarray(ids) == y).all()
    assert float(jnp.max(out.l[:8, 8:16])) < 0.5
    lin = jax.jit(cc.NuclearSolver(tol=1e-6, max_iters=5000))(
        cc.joint_problem(1.0, features=x, alpha=1.0)
    )
    assert bool(lin.converged) and float(jnp.min(lin.l[:8, 8:16])) > 0.99  # merged
    assert float(jnp.max(lin.l[:16, 16:])) < 0.01  # cluster 2 stays apart


@pytest.mark.parametrize(
    "kw",
    [dict(rank=8), dict(rank=2, max_rank=16), dict(rank=2, max_rank=16, rank_margin=2)],
    ids=["fixed", "grown", "tracked"],
)
def test_rank_k_step_matches_full_eigh(kw):
    # The three clusters with a graph that agrees with them and two labels per cluster: the
    # PSD iterate M (24 + 6 + 3 = 33 square) has rank 3 at the optimum; rank 2 must grow.
    y, _, xs = _three_clusters()
    a = (y[:, None] == y[None, :]).astype(float) - np.eye(24)
    lab = np.isin(np.arange(24), [0, 1, 8, 9, 16, 17])
    p = cc.shared_atom_problem(
        1.0, 1.0, adjacency=a, features=xs, labels=y, labeled=lab, num_classes=3
    )
    full_solver = cc.SharedAtomSolver(tol=1e-5, max_iters=20000)
    full = jax.jit(full_solver)(p)
    low = jax.jit(full_solver.replace(**kw))(p)
    assert bool(full.converged) and bool(low.converged) and not bool(low.rank_saturated)
    assert not bool(full.rank_saturated) and int(full.subspace_rank) == 33
    assert int(low.rank) == int(full.rank)
    # All three stop within 50 iterations at relative residuals <= 1e-5 (float32). Measured
    # differences to the full eigh: L 0, U 1.2e-5, objective 0 relative, duality gap 5.8e-6
    # relative; the bounds allow 8x (U), 1e-4 (L) and 3x (gap) of that.
    np.testing.assert_allclose(np.asarray(low.l), np.asarray(full.l), atol=1e-4)
    np.testing.assert_allclose(np.asarray(low.u), np.asarray(full.u), atol=1e-4)
    np.testing.assert_allclose(float(low.objective), float(full.objective), rtol=1e-6)
    cert = cc.shared_atom_certificate(p, low.l, low.u, low.rho * low.dual)
    assert float(cert.rel_gap) <= 2e-5
    if "rank_margin" in kw:  # tracks the kept rank 3 plus the margin 2
        assert int(low.subspace_rank) == 5
    elif "max_rank" in kw:
        assert 4 <= int(low.subspace_rank) <= 16
    else:
        assert int(low.subspace_rank) == 8


def test_bad_input_raises():
    a = np.ones((3, 3)) - np.eye(3)
    with pytest.raises(ValueError, match="mu0"):
        cc.shared_atom_problem(-1.0, 1.0, adjacency=a)
    with pytest.raises(ValueError, match="mu1"):
        cc.shared_atom_problem(1.0, -1.0, adjacency=a)
    with pytest.raises(ValueError, match="symmetric"):
        cc.shared_atom_problem(1.0, 1.0, adjacency=np.triu(a))
    with pytest.raises(ValueError, match="binary"):
        cc.shared_atom_problem(1.0, 1.0, adjacency=a * 2)
    with pytest.raises(ValueError, match="features"):
        cc.shared_atom_problem(1.0, 1.0, features=np.array([[np.nan], [0.0], [1.0]]))
    with pytest.raises(ValueError, match="labels"):
        cc.shared_atom_problem(
            1.0,
            1.0,
            adjacency=a,
            labels=np.array([0, 2, 1]),
            labeled=np.ones(3, bool),
            num_classes=2,
        )
    with pytest.raises(ValueError, match="labels, labeled"):
        cc.shared_atom_problem(
            1.0,
            1.0,
            adjacency=a,
            labels=np.array([0, 1, 1]),
            labeled=np.ones(5, bool),
            num_classes=2,
        )
    with pytest.raises(ValueError, match="same n"):
        cc.shared_atom_problem(1.0, 1.0, adjacency=a, features=np.zeros((4, 1)))


def test_solution_short_of_convergence_is_the_better_feasible_point():
    # Karate club (graph, standardised degree and clustering, the two leaders' labels), the
    # Planetoid smoke case at mu1 = 0.1. At tol 1e-4 the box iterate made PSD was 1.39e-3 from
    # optimal (relative gap), the PSD iterate made feasible (psd_rescale) 3.5e-4: certified at
    # the studies' 1e-3 with a 3x margin. Either way the output is the lower of the two.
    import networkx as nx

    g = nx.karate_club_graph()
    a = nx.to_numpy_array(g) > 0
    y = np.array([g.nodes[v]["club"] != "Mr. Hi" for v in range(34)], int)
    clus = nx.clustering(g)
    x = np.array([[g.degree(v), clus[v]] for v in range(34)], np.float64)
    x = (x - x.mean(0)) / x.std(0)
    lab = np.zeros(34, bool)
    lab[[0, 33]] = True
    c_a, c_ac = cc.balanced_weights(a.astype(float))
    graph = dict(adjacency=a.astype(float), edge_weight=c_a, nonedge_weight=c_ac)
    p = cc.shared_atom_problem(
        1.0, 0.1, features=x, labels=y, labeled=lab, num_classes=2, label_weight=1.0, **graph
    )
    out = jax.jit(cc.SharedAtomSolver(tol=1e-4, max_iters=3000))(p)
    assert bool(out.converged) and float(out.min_eig) >= -1e-10
    assert float(cc.box_violation(out.l)) <= 1e-12
    mult = out.rho * out.dual
    cert = cc.shared_atom_certificate(p, out.l, out.u, mult)
    box = cc.shared_atom_certificate(p, cc.psd_repair(out.m[:34, :34])[0], out.m[:34, 34:], mult)
    assert float(cert.rel_gap) <= 1e-3 and float(cert.primal) <= float(box.primal)
