"""Convex clustering: agreement with CVXPY (Clarabel), KKT residuals, warm starts, traces."""

import chex
import cvxpy as cp
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hexad import cvxclust as cc

SOLVER = cc.FusionSolver(tol=1e-7, max_iters=20000)


@pytest.fixture(scope="module")
def solve():
    return jax.jit(SOLVER)


@pytest.fixture(scope="module")
def blobs():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(size=(8, 2)), rng.normal(size=(8, 2)) + 4.0])
    edges, w = cc.knn_gaussian_weights(x, k=4)
    return x, edges, w.astype(np.float64)


def _cvxpy_value(x, edges, w, gamma, loss, mask=None, delta=1.0):
    n = x.shape[0]
    mask = np.ones_like(x) if mask is None else mask
    d = np.zeros((len(edges), n))
    d[np.arange(len(edges)), edges[:, 0]] = 1.0
    d[np.arange(len(edges)), edges[:, 1]] = -1.0
    u = cp.Variable(x.shape)
    if loss == "squared":
        fit = 0.5 * cp.sum(cp.multiply(mask, cp.square(x - u)))
    elif loss == "huber":
        fit = 0.5 * cp.sum(cp.multiply(mask, cp.huber(x - u, delta)))  # cvxpy's is 2x ours
    else:
        fit = cp.sum(cp.multiply(mask, cp.logistic(u) - cp.multiply(x, u)))
    pen = gamma * cp.sum(cp.multiply(w, cp.norm(d @ u, 2, axis=1)))
    prob = cp.Problem(cp.Minimize(fit + pen))
    prob.solve(solver="CLARABEL")
    return prob.value


@pytest.mark.parametrize("loss", ["squared", "huber", "logistic"])
def test_objective_matches_clarabel(solve, blobs, loss):
    x, edges, w = blobs
    if loss == "logistic":
        x = 1.0 / (1.0 + np.exp(-x))  # interior data: the infimum is attained
    p = cc.FusionProblem.create(x, edges, w, 0.7, loss=loss, huber_delta=0.5)
    out = solve(p)
    ref = _cvxpy_value(x, edges, w, 0.7, loss, delta=0.5)
    assert bool(out.converged)
    # The bar: 1e-4 relative agreement with the reference solver.
    assert abs(float(out.objective) - ref) <= 1e-4 * abs(ref)
    np.testing.assert_allclose(float(cc.fusion_objective(p, out.u)), float(out.objective))


def test_partial_labels_match_clarabel(solve, blobs):
    x, edges, w = blobs
    labels = np.repeat([0, 1], 8)
    labeled = np.zeros(16, bool)
    labeled[[0, 3, 9, 12]] = True
    xa, mask = cc.with_labels(x, labels, labeled, 2, label_weight=2.0)
    p = cc.FusionProblem.create(xa, edges, w, 0.7, mask=mask)
    out = solve(p)
    ref = _cvxpy_value(xa, edges, w, 0.7, "squared", mask=mask)
    assert abs(float(out.objective) - ref) <= 1e-4 * abs(ref)
    # Transductive labels: the fused label block carries the labels to the unlabelled nodes.
    pred = np.argmax(np.asarray(out.u[:, 2:]), axis=1)
    assert (pred == labels).all()


def test_softmax_label_loss_matches_clarabel(solve, blobs):
    x, edges, w = blobs
    labels = np.repeat([0, 1], 8)
    labeled = np.zeros(16, bool)
    labeled[[0, 3, 9, 12]] = True
    xa, mask = cc.with_labels(x, labels, labeled, 2, label_weight=2.0)
    p = cc.FusionProblem.create(xa, edges, w, 0.7, mask=mask, label_classes=2, label_ridge=0.1)
    out = solve(p)
    e = len(edges)
    d = np.zeros((e, 16))
    d[np.arange(e), edges[:, 0]] = 1.0
    d[np.arange(e), edges[:, 1]] = -1.0
    u = cp.Variable((16, 4))
    s, y, m = u[:, 2:], xa[:, 2:], mask[:, 2]
    fit = 0.5 * cp.sum_squares(x - u[:, :2]) + 0.05 * cp.sum_squares(s)
    fit = fit + cp.sum(cp.multiply(m, cp.log_sum_exp(s, axis=1) - cp.sum(cp.multiply(y, s), 1)))
    prob = cp.Problem(cp.Minimize(fit + 0.7 * cp.sum(cp.multiply(w, cp.norm(d @ u, 2, axis=1)))))
    prob.solve(solver="CLARABEL")
    assert bool(out.converged)
    assert abs(float(out.objective) - prob.value) <= 1e-4 * abs(prob.value)
    assert (np.argmax(np.asarray(out.u[:, 2:]), axis=1) == labels).all()
    with pytest.raises(ValueError, match="label_classes"):
        cc.FusionProblem.create(x, edges, w, 0.7, label_classes=1)
    with pytest.raises(ValueError, match="one-hot"):
        cc.FusionProblem.create(np.c_[x, x[:, :1]], edges, w, 0.7, label_classes=2)


def test_kkt_and_duality_gap_vanish(solve, blobs):
    x, edges, w = blobs
    p = cc.FusionProblem.create(x, edges, w, 0.7)
    out = solve(p)
    u, lam = np.asarray(out.u), np.asarray(out.dual)
    # Stationarity u - x + D^T Lambda = 0, recomputed here with numpy.
    dt_lam = np.zeros_like(u)
    np.add.at(dt_lam, edges[:, 0], lam)
    np.add.at(dt_lam, edges[:, 1], -lam)
    assert np.abs(u - x + dt_lam).max() < 1e-5
    # Dual feasibility and complementarity: ||lam_l|| <= gamma w_l, equal where u_i != u_j.
    nl = np.linalg.norm(lam, axis=1)
    assert (nl <= 0.7 * w + 1e-9).all()
    du = np.linalg.norm(u[edges[:, 0]] - u[edges[:, 1]], axis=1)
    apart = du > 1e-4
    np.testing.assert_allclose(nl[apart], 0.7 * w[apart], rtol=1e-4)
    gap = float(out.objective - cc.fusion_dual_objective(p, out.dual))
    assert -1e-9 <= gap <= 1e-6 * float(out.objective)
    hist = np.asarray(out.primal_residuals)
    assert hist[int(out.n_iters) - 1] <= SOLVER.tol and (hist[int(out.n_iters) :] == -1).all()


def test_dual_objective_takes_its_limit_at_unobserved_entries():
    # Partial labels under the squared loss: node 2's label columns are unobserved (M = 0).
    x, e = np.array([[0.0], [1.0], [3.0]]), np.array([[0, 1], [1, 2]])
    xa, m = cc.with_labels(x, np.array([0, 1, 0]), np.array([1, 1, 0], bool), 2)
    p = cc.FusionProblem.create(xa, e, np.ones(2), 1.0, mask=m)
    # inf_u M (x - u)^2 / 2 - g u at M = 0 is 0 where g = D^T Lambda = 0, -inf elsewhere.
    assert float(cc.fusion_dual_objective(p, jnp.zeros((2, 3)))) == 0.0
    lam = jnp.zeros((2, 3)).at[0, 0].set(0.5)  # g = (0.5, -0.5, 0) on the feature column only
    # <g, x> - |g|^2 / 2 = -0.5 - 0.25, by hand
    assert float(cc.fusion_dual_objective(p, lam)) == pytest.approx(-0.75)
    lam = lam.at[1, 2].set(0.5)  # edge (1, 2) moves node 2's unobserved label entry
    assert float(cc.fusion_dual_objective(p, lam)) == -np.inf


def test_dual_objective_names_what_it_does_not_cover():
    # the dual covers neither the softmax label block nor the other losses, and says which
    x, e = np.array([[0.0], [1.0], [3.0]]), np.array([[0, 1], [1, 2]])
    xa, m = cc.with_labels(x, np.array([0, 1, 0]), np.array([1, 1, 0], bool), 2)
    q = cc.FusionProblem.create(xa, e, np.ones(2), 1.0, mask=m, label_classes=2)
    with pytest.raises(ValueError, match="problem.label_classes: .* got 2"):
        cc.fusion_dual_objective(q, jnp.zeros((2, 3)))
    q = cc.FusionProblem.create(x, e, np.ones(2), 1.0, loss="huber")
    with pytest.raises(ValueError, match="problem.loss: .* got 'huber'"):
        cc.fusion_dual_objective(q, jnp.zeros((2, 1)))


def test_any_warm_start_converges_to_the_same_optimum(solve, blobs):
    x, edges, w = blobs
    p = cc.FusionProblem.create(x, edges, w, 0.7)
    ref = solve(p)
    rng = np.random.default_rng(1)
    for scale in (0.1, 10.0):
        init = (rng.normal(size=x.shape) * scale, rng.normal(size=(len(edges), 2)) * scale)
        out = solve(p, init)
        assert bool(out.converged)
        np.testing.assert_allclose(float(out.objective), float(ref.objective), rtol=1e-7)
        np.testing.assert_allclose(np.asarray(out.u), np.asarray(ref.u), atol=1e-4)


def test_one_trace_per_jitted_solve(blobs):
    x, edges, w = blobs

    @jax.jit
    @chex.assert_max_traces(n=1)
    def f(p):
        return cc.FusionSolver(tol=1e-4, max_iters=200)(p)

    for gamma in (0.1, 0.5, 2.0):  # gamma is a leaf: no retrace
        f(cc.FusionProblem.create(x, edges, w, gamma))


def test_non_convergence_is_reported(blobs):
    x, edges, w = blobs
    out = cc.FusionSolver(tol=1e-12, max_iters=3)(cc.FusionProblem.create(x, edges, w, 0.7))
    assert not bool(out.converged) and int(out.n_iters) == 3


def test_clusterpath_merges_monotonically_and_finds_the_blobs():
    # Uniform weights on the complete graph: the exact path only merges (Hocking et al. 2011).
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.normal(size=(5, 2)) * 0.2, rng.normal(size=(5, 2)) * 0.2 + 3.0])
    edges = np.array([(i, j) for i in range(10) for j in range(i + 1, 10)])
    p = cc.FusionProblem.create(x, edges, np.ones(len(edges)), 0.0)
    gammas = np.geomspace(1e-3, 1.0, 12)
    path = jax.jit(cc.clusterpath, static_argnames=("solver", "rtol"))(
        p, gammas, solver=cc.FusionSolver(tol=1e-8, max_iters=20000)
    )
    raw = np.asarray(path.raw_n_clusters)
    assert bool(np.all(path.converged))
    assert raw[0] == 10 and raw[-1] == 1
    assert (np.diff(raw) <= 0).all() and (np.diff(np.asarray(path.n_clusters)) <= 0).all()
    # Somewhere on the path the two blobs are exactly the two clusters.
    truth = np.repeat([0, 1], 5)
    assert any((np.asarray(c) == truth).all() for c in path.clusters)


def test_clusterpath_nan_gamma_is_rejected_or_poisons_the_rest_of_the_path():
    x = np.array([[0.0], [1.0], [3.0]])
    p = cc.FusionProblem.create(x, np.array([[0, 1], [1, 2]]), np.ones(2), 0.0)
    with pytest.raises(ValueError, match="gammas: expected a non-empty ascending finite"):
        cc.clusterpath(p, np.array([0.1, np.nan, 1.0]))
    # Under jit the gammas are not checked: a NaN entry must not restart the path from a zero
    # dual (which gave finite, wrong solutions after it); its solve and all later ones are NaN.
    path = jax.jit(cc.clusterpath)(p, jnp.array([0.1, jnp.nan, 1.0, 2.0]))
    clean = jax.jit(cc.clusterpath)(p, jnp.array([0.1, 1.0]))
    np.testing.assert_allclose(path.u[0], clean.u[0], atol=1e-12)
    assert bool(clean.converged.all()) and np.isfinite(np.asarray(clean.objective)).all()
    assert np.isnan(np.asarray(path.u[1:])).all() and np.isnan(np.asarray(path.objective[1:])).all()
    assert path.converged.tolist() == [True, False, False, False]


def test_fused_clusters_components():
    u = jnp.array([[0.0], [0.0], [0.0], [7.0], [7.0]])
    ids, k = cc.fused_clusters(u, jnp.array([[0, 1], [1, 2], [3, 4], [2, 3]]), 1e-6)
    assert ids.tolist() == [0, 0, 0, 1, 1] and int(k) == 2


def test_isolated_node_keeps_its_data(solve):
    x = np.array([[0.0], [1.0], [5.0]])
    out = solve(cc.FusionProblem.create(x, np.array([[0, 1]]), np.ones(1), 10.0))
    np.testing.assert_allclose(np.asarray(out.u)[:, 0], [0.5, 0.5, 5.0], atol=1e-6)


def test_knn_weights_are_symmetric_and_valid():
    x = np.random.default_rng(3).normal(size=(30, 2))
    edges, w = cc.knn_gaussian_weights(x, k=3)
    assert (edges[:, 0] < edges[:, 1]).all() and len(np.unique(edges, axis=0)) == len(edges)
    assert ((w > 0) & (w <= 1)).all() and len(edges) >= 30 * 3 // 2


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"edges": np.array([[0, 3]])}, "edges"),
        ({"edges": np.array([[1, 1]])}, "self loops"),
        ({"weights": -np.ones(1)}, "weights"),
        ({"gamma": -1.0}, "gamma"),
        ({"loss": "hinge"}, "loss"),
        ({"mask": np.ones((2, 2))}, "mask"),
        ({"x": np.array([[np.nan], [0.0], [1.0]])}, "x"),
        ({"x": np.array([[2.0], [0.0], [1.0]]), "loss": "logistic"}, "logistic"),
    ],
)
def test_bad_input_raises(kwargs, match):
    args = {"x": np.zeros((3, 1)), "edges": np.array([[0, 1]]), "weights": np.ones(1)}
    args.update({k: v for k, v in kwargs.items() if k in args})
    rest = {k: v for k, v in kwargs.items() if k not in args}
    gamma = rest.pop("gamma", 1.0)
    with pytest.raises(ValueError, match=match):
        cc.FusionProblem.create(args["x"], args["edges"], args["weights"], gamma, **rest)


def test_bad_labels_raise():
    x = np.zeros((4, 1))
    with pytest.raises(ValueError, match="labels"):
        cc.with_labels(x, np.array([0, 5, 1, 0]), np.ones(4, bool), 2)
    with pytest.raises(ValueError, match=r"classes \[2\]"):
        cc.with_labels(x, np.array([0, 1, 2, 0]), np.array([1, 1, 0, 1], bool), 3)
    with pytest.raises(TypeError, match="labels"):
        cc.with_labels(x, np.array([0.0, 1, 1, 0]), np.ones(4, bool), 2)
