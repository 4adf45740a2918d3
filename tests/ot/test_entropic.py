"""OT on manifolds: agreement with ott-jax, exactness on a known rotation, padding, batching."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ott.geometry import pointcloud
from ott.solvers import linear
from ott.tools import sinkhorn_divergence as ott_sd
from scipy.optimize import linear_sum_assignment

from hexad.geometry import Euclidean, Sphere, Torus
from hexad.ot import (
    EntropicMap,
    SqGeodesic,
    barycentric_tangent,
    entropic_map,
    greedy_matching,
    mccann_interpolation,
    sinkhorn_divergence,
    sinkhorn_w2,
)

S2 = Sphere(3)

# ott-jax's own code relies on implicit rank promotion, which conftest makes an error; direct
# calls into ott in these tests run under this context (the library does the same internally).
ALLOW = jax.numpy_rank_promotion("allow")


def _fibonacci(n):
    i = np.arange(n) + 0.5
    z = 1.0 - 2.0 * i / n
    r = np.sqrt(1.0 - z * z)
    phi = math.pi * (3.0 - math.sqrt(5.0)) * i
    return np.stack([r * np.cos(phi), r * np.sin(phi), z], axis=1).astype(np.float32)


def _rotation(axis, angle):
    k = np.asarray(axis, np.float64) / np.linalg.norm(axis)
    kx = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    return np.eye(3) + math.sin(angle) * kx + (1 - math.cos(angle)) * kx @ kx


@pytest.mark.slow  # ~40 s of CPU: four eager ott-jax solves and transports
def test_euclidean_map_equals_ott_dual_potentials_transport(key):
    kx, ky, kb = jax.random.split(key, 3)
    x = jax.random.normal(kx, (48, 2))
    y = jax.random.normal(ky, (40, 2)) * 0.5 + 1.0
    eps = 0.1
    ours = entropic_map(Euclidean(2), x, y, epsilon=eps, threshold=1e-5)
    with ALLOW:
        out = linear.solve(pointcloud.PointCloud(x, y, epsilon=eps), threshold=1e-5)
        ref = out.to_dual_potentials().transport(x)
    assert bool(ours.converged)
    np.testing.assert_allclose(ours.mapped, ref, atol=1e-4)
    # with non-uniform target weights: the barycentric projection of ott's own plan,
    # sum_j P_ij y_j / sum_j P_ij (the barycentric map)
    b = jax.random.uniform(kb, (40,), minval=0.2, maxval=1.0)
    b = b / b.sum()
    ours = entropic_map(Euclidean(2), x, y, None, b, epsilon=eps, threshold=1e-5)
    with ALLOW:
        out = linear.solve(pointcloud.PointCloud(x, y, epsilon=eps), b=b, threshold=1e-5)
    bary = out.matrix @ y / out.matrix.sum(1, keepdims=True)
    np.testing.assert_allclose(ours.mapped, bary, atol=1e-4)


@pytest.mark.slow  # ~15 s of CPU each: eager ott-jax solve + autodiff transport
@pytest.mark.parametrize("m", [S2, Torus(2)], ids=["sphere", "torus"])
def test_riemannian_map_equals_ott_transport_with_geodesic_twist(m, key):
    kx, ky = jax.random.split(key)
    x = m.random_uniform(kx, (32,))
    y = m.random_normal(ky, m.proj(jnp.ones(m.dim)), 0.4, (24,))
    eps = 0.05
    ours = EntropicMap(m, epsilon=eps, threshold=1e-5)(x, y)
    with ALLOW:
        out = linear.solve(
            pointcloud.PointCloud(x, y, cost_fn=SqGeodesic(m), epsilon=eps),
            threshold=1e-5,
            max_iterations=500,
        )
        ref = out.to_dual_potentials().transport(x)
    np.testing.assert_allclose(m.dist(ours.mapped, ref), 0.0, atol=2e-4)
    assert float(jnp.max(m.manifold_error(ours.mapped))) < 1e-6


def test_sphere_map_converges_to_a_known_rotation():
    x = jnp.asarray(_fibonacci(64))  # nearest-neighbour spacing ~0.4 rad
    rot = _rotation([0.3, -0.5, 0.8], 0.1)  # moves points by <= 0.1 < spacing / 2
    y = jnp.asarray((np.asarray(x, np.float64) @ rot.T).astype(np.float32))
    # the exact OT assignment (reference solver) is y_i = R x_i, so the map is R
    c = np.asarray(S2.pairwise_sqdist(x, y), np.float64)
    rows, cols = linear_sum_assignment(c)
    assert np.array_equal(cols[np.argsort(rows)], np.arange(64))
    errs = []
    for eps in (0.05, 0.01, 0.002):
        out = EntropicMap(S2, epsilon=eps, threshold=1e-6, max_iterations=5000)(x, y)
        errs.append(float(jnp.max(S2.dist(out.mapped, y))))
    assert errs[0] > errs[1] > errs[2], errs
    assert errs[2] < 1e-3, errs


def test_mccann_endpoints_and_velocity(key):
    kx, ky = jax.random.split(key)
    x = S2.random_uniform(kx, (16,))
    y = S2.random_normal(ky, jnp.array([0.0, 0.0, 1.0]), 0.3, (16,))
    out = EntropicMap(S2, epsilon=0.05)(x, y)
    x0, v0 = mccann_interpolation(S2, x, out.tangent, 0.0)
    x1, _ = mccann_interpolation(S2, x, out.tangent, 1.0)
    np.testing.assert_allclose(x0, x, atol=1e-6)
    np.testing.assert_allclose(x1, out.mapped, atol=1e-5)
    np.testing.assert_allclose(v0, out.tangent, atol=1e-6)
    # per-point times [n] broadcast; velocities are tangent at x_t with constant speed
    t = jnp.linspace(0.0, 1.0, 16)
    xt, vt = mccann_interpolation(S2, x, out.tangent, t[:, None])
    np.testing.assert_allclose(jnp.sum(xt * vt, -1), 0.0, atol=1e-5)
    np.testing.assert_allclose(
        jnp.linalg.norm(vt, axis=-1), jnp.linalg.norm(out.tangent, axis=-1), rtol=1e-4, atol=1e-6
    )
    tx = Torus(2)
    a, b = jnp.array([[3.0, 0.0]]), jnp.array([[-3.0, 0.0]])
    xt, vt = mccann_interpolation(tx, a, tx.log(a, b), 0.5)
    np.testing.assert_allclose(xt, [[-math.pi, 0.0]], atol=1e-5)  # crosses the seam
    np.testing.assert_allclose(vt, [[2 * math.pi - 6.0, 0.0]], atol=1e-5)


def test_mccann_times_broadcast_against_n_by_1():
    # Per-point times t [n, 1] with batched x [B, n, d] broadcast like NumPy to [B, n, 1]
    # (B == n hid the former right-padding to [n, 1, 1]; B != n was an error).
    e1 = Euclidean(1)
    t = jnp.array([[0.0], [0.5], [1.0]])
    for b in (3, 2):
        xt, vt = mccann_interpolation(e1, jnp.zeros((b, 3, 1)), jnp.ones((b, 3, 1)), t)
        np.testing.assert_array_equal(xt, jnp.broadcast_to(t, (b, 3, 1)))
        np.testing.assert_array_equal(vt, jnp.ones((b, 3, 1)))
    # A vector t indexes x's leading axis: [B] per cloud of x [B, n, d], [n] per point of x [n, d].
    xt, _ = mccann_interpolation(
        e1, jnp.zeros((2, 3, 1)), jnp.ones((2, 3, 1)), jnp.array([0.25, 1.0])
    )
    np.testing.assert_array_equal(xt[:, :, 0], [[0.25] * 3, [1.0] * 3])
    xt, _ = mccann_interpolation(e1, jnp.zeros((3, 1)), jnp.ones((3, 1)), t[:, 0])
    np.testing.assert_array_equal(xt, t)
    with pytest.raises(ValueError, match=r"t: expected .*\(2, 3, 1\).*got \(2, 3\)"):
        mccann_interpolation(e1, jnp.zeros((2, 3, 1)), jnp.ones((2, 3, 1)), jnp.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"t: expected .*got \(3,\)"):
        mccann_interpolation(e1, jnp.zeros((2, 3, 1)), jnp.ones((2, 3, 1)), jnp.zeros(3))


def test_mccann_checks_the_tangent_shape_under_jit(key):
    x = S2.random_uniform(key, (4,))
    v = S2.proj_tangent(x[:1], jnp.array([[0.0, 0.3, 0.2]]))
    with pytest.raises(
        ValueError, match=r"tangent: expected the shape of x \(4, 3\), got \(1, 3\)"
    ):
        jax.jit(lambda x, v: mccann_interpolation(S2, x, v, 0.5))(x, v)


@pytest.mark.slow  # ~45 s of CPU: dense, blocked and vmapped solvers each compile
def test_padding_batching_and_memory_bounded_path(key):
    kx, ky = jax.random.split(key)
    x = S2.random_uniform(kx, (20,))
    y = S2.random_uniform(ky, (16,))
    solver = EntropicMap(S2, epsilon=0.05, threshold=1e-5)
    ref = solver(x[:12], y[:10])
    a = jnp.arange(20) < 12
    b = jnp.arange(16) < 10
    padded = solver(x, y, a.astype(jnp.float32), b.astype(jnp.float32))
    np.testing.assert_allclose(padded.mapped[:12], ref.mapped, atol=2e-5)
    assert bool(jnp.all(jnp.isfinite(padded.mapped)))
    blocked = EntropicMap(S2, epsilon=0.05, threshold=1e-5, batch_size=4)(
        x, y, a.astype(jnp.float32), b.astype(jnp.float32)
    )
    np.testing.assert_allclose(blocked.mapped, padded.mapped, atol=2e-5)
    xs = jnp.stack([x, x[::-1]])
    ys = jnp.stack([y, y[::-1]])
    batched = jax.jit(jax.vmap(solver))(xs, ys)
    np.testing.assert_allclose(batched.mapped[0], solver(x, y).mapped, atol=2e-5)
    np.testing.assert_allclose(batched.mapped[1], solver(x[::-1], y[::-1]).mapped, atol=2e-5)


def test_one_trace_per_solve(key):
    solver = EntropicMap(Torus(2), epsilon=0.05)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def solve(x, y):
        return solver(x, y).mapped

    k1, k2 = jax.random.split(key)
    for k in (k1, k2):
        x = Torus(2).random_uniform(k, (8,))
        solve(x, x[::-1]).block_until_ready()


@pytest.mark.slow  # ~60 s of CPU: eager ott-jax divergences compile nine Sinkhorn loops
def test_sinkhorn_divergence(key):
    kx, ky = jax.random.split(key)
    x = jax.random.normal(kx, (24, 2))
    y = jax.random.normal(ky, (20, 2)) + 2.0
    ours = sinkhorn_divergence(Euclidean(2), x, y, epsilon=0.1)
    with ALLOW:
        ref, _ = ott_sd.sinkhorn_divergence(pointcloud.PointCloud, x, y, epsilon=0.1)
    np.testing.assert_allclose(ours, ref, rtol=1e-4)
    s = S2.random_uniform(kx, (24,))
    assert abs(float(sinkhorn_w2(S2, s, s))) < 1e-2
    # a rigid rotation by 0.3 rad of a concentrated cloud: W2 close to 0.3
    c = S2.random_vmf(ky, jnp.array([1.0, 0.0, 0.0]), 200.0, (32,))
    rot = jnp.asarray(_rotation([0.0, 0.0, 1.0], 0.3), jnp.float32)
    w2 = float(sinkhorn_w2(S2, c, c @ rot.T, epsilon=1e-3))
    assert abs(w2 - 0.3) < 0.02, w2


def test_bad_input_is_named():
    solver = EntropicMap(S2, epsilon=0.05)
    x = np.tile(np.array([[1.0, 0.0, 0.0]], np.float32), (4, 1))
    with pytest.raises(ValueError, match="x: expected points on"):
        solver(2.0 * x, x)
    with pytest.raises(ValueError, match=r"y: expected points of shape \[..., 3\]"):
        solver(x, x[:, :2])
    with pytest.raises(ValueError, match="b: expected a positive total weight"):
        solver(x, x, None, np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="a: expected finite"):
        solver(x, x, np.array([1.0, np.nan, 1.0, 1.0], np.float32))
    for bad in (np.nan, np.inf):
        with pytest.raises(ValueError, match="x: expected finite values"):
            solver(np.where(np.arange(3) == 0, bad, x).astype(np.float32), x)
    with pytest.raises(ValueError, match="epsilon"):
        EntropicMap(S2, epsilon=0.0)(x, x)
    with pytest.raises(ValueError, match="tangent"):
        mccann_interpolation(S2, x, x[:2], 0.5)


@jax.jit
def _costs(m, xb, pts):
    cost = SqGeodesic(m)
    return cost.all_pairs(xb, pts)[0], cost.all_pairs(pts, xb)[:, 0], cost(xb[0], pts[1])


def test_nonfinite_costs_and_weights_propagate():
    # Under a trace the boundary checks cannot see values: a NaN/inf point must give a NaN
    # cost, never a plausible one (clip(inf) = 1 - eps was a near-zero sphere cost).
    x = S2.random_uniform(jax.random.key(1), (3,))
    for m, pts in ((S2, x), (Torus(2), x[:, :2]), (Euclidean(3), x)):
        for bad in (jnp.nan, jnp.inf):
            for c in _costs(m, pts.at[0, 0].set(bad), pts):
                assert not bool(jnp.any(jnp.isfinite(c))), (m, bad, c)
    # barycentric weights: a zero target weight is padding, a NaN one is not
    bt = jax.jit(lambda b: barycentric_tangent(S2, x, x, b, jnp.zeros(3), 0.1))
    assert bool(jnp.all(jnp.isfinite(bt(jnp.array([1.0, 1.0, 0.0])))))
    assert bool(jnp.all(jnp.isnan(bt(jnp.array([1.0, jnp.nan, 1.0])))))


def test_sinkhorn_w2_of_nan_is_nan():
    # sqrt(max(S, 0)) through ``where(S > 0, ...)`` read a NaN divergence as W2 = 0
    x = S2.random_uniform(jax.random.key(2), (4,))
    w2 = jax.jit(lambda a, b: sinkhorn_w2(S2, a, b, max_iterations=20))
    assert bool(jnp.isnan(w2(x.at[1, 0].set(jnp.nan), x)))
    assert 0.0 <= float(w2(x, x)) < 1e-2


def test_relative_epsilon_is_epsilon_times_the_largest_real_cost(key):
    # scale_cost="max_cost" is the absolute map at epsilon * max C over real pairs, exactly
    # (same ott solve), dense and row-blocked; padded points do not set the scale.
    kx, ky = jax.random.split(key)
    x, y = S2.random_uniform(kx, (12,)), S2.random_uniform(ky, (10,))
    b = jnp.ones(10).at[9].set(0.0)
    cmax = float(jnp.max(S2.pairwise_sqdist(x, y[:9])))
    rel = EntropicMap(S2, epsilon=0.01, scale_cost="max_cost", max_iterations=2000)(x, y, None, b)
    ab = EntropicMap(S2, epsilon=0.01 * cmax, max_iterations=2000)(x, y, None, b)
    np.testing.assert_allclose(float(rel.epsilon), 0.01 * cmax, rtol=1e-6)
    np.testing.assert_allclose(rel.mapped, ab.mapped, atol=1e-5)
    blocked = EntropicMap(
        S2, epsilon=0.01, scale_cost="max_cost", max_iterations=2000, batch_size=4
    )(x, y, None, b)
    np.testing.assert_allclose(float(blocked.epsilon), float(rel.epsilon), rtol=1e-6)
    np.testing.assert_allclose(blocked.mapped, rel.mapped, atol=1e-5)
    with pytest.raises(ValueError, match="scale_cost: expected one of"):
        EntropicMap(S2, epsilon=0.01, scale_cost="mean")(x, y)
    with pytest.raises(ValueError, match="epsilon: expected a finite number > 0"):
        EntropicMap(S2, epsilon=-0.01, scale_cost="max_cost")(x, y)


def test_greedy_matching_is_a_permutation_and_exact_on_permutation_plans(key):
    perm = jax.random.permutation(key, 9)
    plan = jnp.eye(9)[perm] + 0.01 * jax.random.uniform(key, (9, 9))
    idx = greedy_matching(plan)  # row idx[j] is matched to column j
    np.testing.assert_array_equal(np.asarray(perm)[np.asarray(idx)], np.arange(9))
    rnd = greedy_matching(jax.random.uniform(jax.random.fold_in(key, 1), (7, 7)))
    assert sorted(np.asarray(rnd).tolist()) == list(range(7))
