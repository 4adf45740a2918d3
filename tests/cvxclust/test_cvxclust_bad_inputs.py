"""Bad inputs to the cluster read-outs and the solvers are named, not turned into numbers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hexad import cvxclust as cc

EDGES = np.array([[0, 1], [1, 2], [2, 3]])


def test_fused_clusters_rejects_non_finite_solutions():
    u = jnp.full((4, 2), jnp.nan)
    with pytest.raises(ValueError, match="u: expected finite"):
        cc.fused_clusters(u, EDGES, 1e-3)  # was one cluster per node
    with pytest.raises(ValueError, match="tol"):
        cc.fused_clusters(jnp.zeros((4, 2)), EDGES, -1.0)
    with pytest.raises(ValueError, match="u: expected a \\[n, d\\]"):
        cc.fused_clusters(jnp.zeros(4), EDGES, 1e-3)


def test_matrix_clusters_rejects_non_finite_or_non_square_matrices():
    with pytest.raises(ValueError, match="l: expected finite"):
        cc.matrix_clusters(jnp.full((3, 3), jnp.nan))  # was three clusters
    with pytest.raises(ValueError, match="l: expected a square"):
        cc.matrix_clusters(jnp.ones((2, 3)))
    with pytest.raises(ValueError, match="threshold"):
        cc.matrix_clusters(jnp.eye(3), float("nan"))


def test_cluster_read_outs_of_closed_over_arrays_run_under_jit():
    l = jnp.kron(jnp.eye(2), jnp.ones((2, 2)))
    ids, k = jax.jit(lambda t: cc.matrix_clusters(l, t))(0.5)
    assert ids.tolist() == [0, 0, 1, 1] and int(k) == 2
    u = jnp.array([[0.0], [0.0], [5.0], [5.0]])
    ids, k = jax.jit(lambda t: cc.fused_clusters(u, EDGES, t))(1e-3)
    assert ids.tolist() == [0, 0, 1, 1] and int(k) == 2


def test_label_propagation_rejects_labels_outside_the_classes():
    labeled = np.array([True, False, True, False])
    with pytest.raises(ValueError, match="labels: expected labelled values in \\[0, num_c"):
        cc.label_propagation(EDGES, np.array([0, 0, 5, 0]), labeled, 2)  # was [0 0 0 0]
    with pytest.raises(ValueError, match="labels"):
        cc.label_propagation(EDGES, np.array([-1, 0, 1, 0]), labeled, 2)
    # values on unlabelled nodes are ignored, as documented
    clean = cc.label_propagation(EDGES, np.array([0, 0, 1, 0]), labeled, 2)
    garbage = cc.label_propagation(EDGES, np.array([0, 9, 1, -4]), labeled, 2)
    assert garbage.tolist() == clean.tolist()


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: cc.FusionSolver(max_iters=-3), "max_iters"),
        (lambda: cc.FusionSolver(max_iters=0), "max_iters"),
        (lambda: cc.FusionSolver(step_ratio=float("nan")), "step_ratio"),
        (lambda: cc.FusionSolver(step_ratio=0.0), "step_ratio"),
        (lambda: cc.FusionSolver(tol=-1.0), "tol"),
        (lambda: cc.NuclearSolver(max_iters=-1), "max_iters"),
        (lambda: cc.NuclearSolver(tol=float("nan")), "tol"),
        (lambda: cc.NuclearSolver(rho=0.0), "rho"),
        (lambda: cc.NuclearSolver(adapt_every=-1), "adapt_every"),
        (lambda: cc.NuclearSolver(relaxation=2.0), "relaxation"),
        (lambda: cc.SharedAtomSolver(max_iters=0), "max_iters"),
        (lambda: cc.FactorSolver(rank=0), "rank"),
    ],
)
def test_solver_settings_are_checked_at_construction(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_validated_solvers_still_jit():
    p = cc.FusionProblem.create(np.array([[0.0], [1.0]]), np.array([[0, 1]]), np.ones(1), 1.0)
    out = jax.jit(cc.FusionSolver(max_iters=200))(p)
    assert bool(out.converged)


@pytest.mark.parametrize("n", [-1, 0, 1, 2.0, True, "4"])
def test_a_node_count_that_is_not_an_int_of_at_least_two_is_named(n):
    # n = -1 used to fail on the edge ids ("must lie in [0, -1)"), n = 2.0 inside NumPy
    with pytest.raises(ValueError, match="n: expected the number of nodes"):
        cc.adjacency_from_edges(EDGES, n)
    with pytest.raises(ValueError, match="n: expected the number of nodes"):
        cc.check_edges(EDGES, n)
    assert cc.adjacency_from_edges(EDGES, np.int64(4)).shape == (4, 4)
