"""RWEFM noise models, cloud matching, map-iteration calibration and the evaluation metrics:
closed forms, exact small problems, invariants and named errors."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from hexad.geometry import Euclidean, Sphere, Torus
from hexad.rwefm import (
    NOISE_KINDS,
    CloudBatch,
    NoiseModel,
    VectorField,
    calibrate_map_iterations,
    chamfer_distances,
    emd_distances,
    fit_noise,
    make_loss,
    match_clouds,
    median_bandwidth,
    min_matching_distance,
    vmf_mixture_clouds,
    wrapped_normal_mixture_clouds,
)

S2, T2 = Sphere(3), Torus(2)


def test_ambient_gaussian_fit_is_the_per_cloud_closed_form():
    # Two clouds of 4 points in R^2: the fitted loc is the mean of the cloud means, the
    # Cholesky mean/std are those of the two clouds' covariance factors (computed here by hand).
    x = jnp.array(
        [
            [[0.0, 0.0], [2.0, 0.0], [0.0, 2.0], [2.0, 2.0]],
            [[1.0, 1.0], [1.0, 3.0], [5.0, 1.0], [5.0, 3.0]],
        ]
    )
    noise = fit_noise(Euclidean(2), CloudBatch(x, jnp.ones((2, 4))))
    assert noise.kind == "ambient_gaussian"
    np.testing.assert_allclose(noise.loc, [2.0, 1.5], rtol=1e-6)
    l1 = np.linalg.cholesky(np.diag([1.0, 1.0]) + 1e-5 * np.eye(2))
    l2 = np.linalg.cholesky(np.diag([4.0, 1.0]) + 1e-5 * np.eye(2))
    np.testing.assert_allclose(noise.chol_mean, (l1 + l2) / 2, rtol=1e-5)
    np.testing.assert_allclose(noise.chol_std, np.abs(l1 - l2) / 2, rtol=1e-5, atol=1e-7)


def test_noise_samples_lie_on_the_manifold_and_match_their_covariance(key):
    w = jnp.ones((8, 16))
    torus = CloudBatch(wrapped_normal_mixture_clouds(key, 8, 16), w)
    sphere = CloudBatch(vmf_mixture_clouds(key, 8, 16), w)
    for m, data in ((T2, torus), (S2, sphere)):
        for kind in NOISE_KINDS:
            x = fit_noise(m, data, kind).sample(jax.random.key(1), (3, 5))
            assert x.shape == (3, 5, m.dim)
            assert float(jnp.max(m.manifold_error(x))) <= 1e-6, (m, kind)
    # With chol_std = 0 every cloud is N(loc, L L^T) in R^2: the sample covariance of 20000
    # points is within 0.05 of it (the entries' Monte-Carlo sd is about sqrt(2/20000) * 4 =
    # 0.04 for the largest variance 4: a 0.15 tolerance is over 3 sd).
    chol = jnp.array([[2.0, 0.0], [1.0, 0.5]])
    loc = jnp.array([1.0, -1.0])
    noise = NoiseModel(Euclidean(2), "ambient_gaussian", loc, 1.0, chol, 0 * chol)
    z = noise.sample(jax.random.key(2), (4, 5000)).reshape(-1, 2)
    np.testing.assert_allclose(np.cov(np.asarray(z).T), chol @ chol.T, atol=0.15)
    np.testing.assert_allclose(np.mean(np.asarray(z), axis=0), [1.0, -1.0], atol=0.05)


def test_unknown_noise_and_bad_clouds_are_named(key):
    x = S2.random_uniform(key, (2, 4))
    with pytest.raises(ValueError, match="noise: expected one of"):
        fit_noise(S2, CloudBatch(x, jnp.ones((2, 4))), "gaussian")
    with pytest.raises(ValueError, match="noise: expected one of"):
        NoiseModel(S2, "normal").sample(key, (2, 3))
    with pytest.raises(ValueError, match="batch.points: expected points on"):
        fit_noise(S2, CloudBatch(1.5 * x, jnp.ones((2, 4))))
    noise = NoiseModel(S2)
    with pytest.raises(ValueError, match="clouds.points: expected points on"):
        calibrate_map_iterations(key, S2, noise, 1.5 * x, jnp.ones((2, 4)))
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="target: expected a value in"):
            calibrate_map_iterations(key, S2, noise, x, jnp.ones((2, 4)), target=bad)
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="epsilon: expected a finite number > 0"):
            calibrate_map_iterations(key, S2, noise, x, jnp.ones((2, 4)), epsilon=bad)


def test_calibrated_bound_meets_its_target(key):
    # By construction: rerunning the maps with the returned bound, at least `target` converge;
    # one inner-iteration block fewer, fewer than `target` do (or the bound is the first block).
    clouds = wrapped_normal_mixture_clouds(key, 16, 12)
    w = jnp.ones((16, 12))
    noise = NoiseModel(T2)

    def calib(target, bound):
        return calibrate_map_iterations(
            jax.random.key(3), T2, noise, clouds, w, epsilon=0.01, target=target, n_pairs=20,
            max_iterations=bound,
        )  # fmt: skip

    its, frac = calib(0.9, 3000)
    assert frac >= 0.9 and its % 10 == 0
    assert its <= calib(1.0, 3000)[0]
    assert calib(0.9, its)[1] >= 0.9  # the same maps, bounded at the returned count
    if its > 10:
        assert calib(0.9, its - 10)[1] < 0.9


@pytest.mark.parametrize("target", [0.55, 0.07, 0.5])
def test_calibrated_bound_counts_the_target_in_integers(monkeypatch, target):
    # In floating point 0.55 * 100 = 55.00000000000001 (0.07 * 100 likewise; 0.5 * 100 is
    # exact): with exactly 55 of 100 maps converged the target is met, and the bound must be
    # what the 55th fastest converged map took, not the "iterations" of a map that failed.
    # Stand-ins make the count exact: noise cloud i is the constant i (pairing "none" keeps
    # the order, so pair i holds it), and the map of pair i converges iff i < converged,
    # after 10 (i + 1) iterations.
    n_pairs, need = 100, round(target * 100)

    class Counting:
        manifold = Euclidean(1)

        def sample(self, key, shape):
            i = jnp.arange(shape[0] * shape[1], dtype=jnp.float32).reshape(shape[:2])
            return jnp.broadcast_to(i[:, :, None, None], (*shape, 1))

    class Out(NamedTuple):
        converged: jax.Array
        n_iters: jax.Array

    def calib(converged):
        class Map:
            def __init__(self, *args, **kwargs):
                pass

            def __call__(self, x, y, a, b):
                i = x[0, 0]
                return Out(i < converged, (10 * (i + 1)).astype(jnp.int32))

        monkeypatch.setattr("hexad.rwefm._train.EntropicMap", Map)
        clouds = jnp.zeros((3, 2, 1))
        return calibrate_map_iterations(
            jax.random.key(0), Euclidean(1), Counting(), clouds, jnp.ones((3, 2)),
            target=target, n_pairs=n_pairs, max_iterations=5000,
        )  # fmt: skip

    assert calib(need) == (10 * need, need / n_pairs)
    assert calib(need + 3) == (10 * need, (need + 3) / n_pairs)
    assert calib(need - 1) == (5000, (need - 1) / n_pairs)  # short of the target


def test_match_clouds_costs_noise_under_the_data_mask():
    # On the line: data cloud 0 is two points at 0, cloud 1 two points at 10, with masses
    # (0.99, 0.01); noise cloud 0 is {1, 100}, noise cloud 1 is {9, 9}. Under the documented
    # cost (each noise point counts equally where the data cloud has a real point, the data
    # points by their masses) the Chamfer costs are, by hand,
    #   noise 0: 5001.5 to data 0, 4171.5 to data 1;  noise 1: 162 to data 0, 2 to data 1,
    # so the swap (4333.5) beats the identity (5003.5). Weighing noise point i by data mass
    # b_i instead (101.99, 242.19; 162, 2) would choose the identity (103.99 vs 404.19).
    data = jnp.array([[[0.0], [0.0]], [[10.0], [10.0]]])
    noise = jnp.array([[[1.0], [100.0]], [[9.0], [9.0]]])
    w = jnp.array([[0.99, 0.01], [0.99, 0.01]])
    assert match_clouds(Euclidean(1), noise, data, w).tolist() == [1, 0]
    # Uniform masses are their own mask: the same costs either way, padding ignored (a third,
    # zero-mass data point at 50, and third noise points at 1000 that it masks out).
    for m in (jnp.ones((2, 2)), 0.5 * jnp.ones((2, 2))):
        assert match_clouds(Euclidean(1), noise, data, m).tolist() == [1, 0]
    pad = jnp.array([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0]])
    data3 = jnp.concatenate([data, jnp.full((2, 1, 1), 50.0)], axis=1)
    noise3 = jnp.concatenate([noise, jnp.full((2, 1, 1), 1000.0)], axis=1)
    assert match_clouds(Euclidean(1), noise3, data3, pad).tolist() == [1, 0]


def test_fit_noise_ignores_padded_points():
    # Padding may hold any finite value: a huge one (1e20, whose square overflows float32)
    # must not reach the fit through a 0 * inf, and a NaN one is rejected by name.
    x = S2.random_uniform(jax.random.key(0), (2, 5))
    w = jnp.ones((2, 5)).at[:, -1].set(0.0)
    e = jax.random.normal(jax.random.key(1), (2, 5, 3))
    for m, pts in ((S2, x), (Euclidean(3), e)):
        for kind in NOISE_KINDS:
            clean = fit_noise(m, CloudBatch(pts, w), kind)
            huge = fit_noise(m, CloudBatch(pts.at[:, -1].set(1e20), w), kind)
            for a, b in zip(jax.tree.leaves(clean), jax.tree.leaves(huge), strict=True):
                np.testing.assert_array_equal(a, b, err_msg=f"{m} {kind}")
    with pytest.raises(ValueError, match="batch.points: expected finite values"):
        fit_noise(S2, CloudBatch(x.at[:, -1].set(jnp.nan), w))


def test_match_clouds_is_a_permutation_that_recovers_a_shuffle(key):
    # Six tight clouds around +-e_k; the noise clouds are the same clouds shuffled. The
    # Chamfer cost is ~0 on the true pairs and >= (pi/2)^2 elsewhere, so the matching must be
    # the inverse shuffle exactly.
    kp, kd = jax.random.split(key)
    centres = jnp.concatenate([jnp.eye(3), -jnp.eye(3)])[:, None, :]
    clouds = S2.proj(centres + 0.05 * jax.random.normal(kd, (6, 8, 3)))
    perm = jax.random.permutation(kp, 6)
    idx = jax.jit(lambda x, y: match_clouds(S2, x, y, jnp.ones((6, 8))))(clouds[perm], clouds)
    np.testing.assert_array_equal(np.asarray(idx), np.asarray(jnp.argsort(perm)))
    # random clouds: still one-to-one
    x, y = S2.random_uniform(kd, (7, 5)), S2.random_uniform(kp, (7, 5))
    idx = match_clouds(S2, x, y, jnp.ones((7, 5)))
    assert sorted(np.asarray(idx).tolist()) == list(range(7))


def test_chamfer_and_emd_against_exact_small_problems(key):
    kx, ky = jax.random.split(key)
    x = T2.random_uniform(kx, (3, 6))
    y = T2.random_uniform(ky, (2, 6))
    a, b = jnp.ones((3, 6)), jnp.ones((2, 6))
    c = np.asarray(chamfer_distances(T2, x, a, y, b))
    emd, ok = emd_distances(T2, x, a, y, b, epsilon=1e-3)
    assert bool(jnp.all(ok))
    for i in range(3):
        for j in range(2):
            d2 = np.asarray(T2.pairwise_sqdist(x[i], y[j]))
            ref = d2.min(axis=1).mean() + d2.min(axis=0).mean()
            np.testing.assert_allclose(c[i, j], ref, rtol=1e-5)
            # uniform masses of equal size: the exact EMD is an assignment problem. The
            # entropic plan at eps = 1e-3 of the largest cost is within 1% of it (its blur
            # and Sinkhorn's 1e-3 marginal error move the cost by far less than that).
            d = np.sqrt(d2)
            r, cidx = linear_sum_assignment(d)
            exact = d[r, cidx].mean()
            assert abs(float(emd[i, j]) - exact) <= 0.01 * exact, (float(emd[i, j]), exact)
    # padding: a zero-mass point changes nothing
    xp = x.at[0, 5].set(jnp.array([3.0, 3.0]))
    ap = a.at[0, 5].set(0.0)
    cp = chamfer_distances(T2, xp[:1, :], ap[:1], y, b)
    cref = chamfer_distances(T2, x[:1, :5], a[:1, :5], y, b)
    np.testing.assert_allclose(cp, cref, rtol=1e-6)


def test_min_matching_and_bandwidth_closed_forms():
    d = jnp.array([[0.0, 3.0, 1.0], [2.0, 1.0, 5.0]])
    assert float(min_matching_distance(d)) == pytest.approx((0.0 + 1.0 + 1.0) / 3)
    dyy = jnp.array([[0.0, 1.0, 4.0], [1.0, 0.0, 2.0], [4.0, 2.0, 0.0]])
    assert float(median_bandwidth(dyy)) == 2.0


def test_a_nan_weight_is_not_padding_under_a_trace(key):
    # Under jit the boundary checks cannot see values: a NaN mass must give a NaN loss, not
    # be read as padding (NaN > 0 is False) and silently dropped.
    x = T2.random_uniform(key, (2, 4))
    w = jnp.ones((2, 4)).at[0, 1].set(jnp.nan)
    model = VectorField(T2, width=8, depth=1, heads=1)
    params = model.init(key, x, jnp.ones((2, 4), bool), jnp.zeros(2))
    loss = jax.jit(make_loss(T2, model, NoiseModel(T2), pairing="none", sinkhorn_iterations=20))
    assert bool(jnp.isnan(loss(params, key, CloudBatch(x, w))))
    assert bool(jnp.isfinite(loss(params, key, CloudBatch(x, jnp.ones((2, 4)).at[0, 1].set(0.0)))))


def test_seam_clouds_straddle_the_seam(key):
    x = wrapped_normal_mixture_clouds(key, 6, 50, scale_range=(0.01, 0.01), seam_width=0.5)
    # every centre angle within 0.5 of +-pi; points within 6 sd (0.06) of a centre
    seam = jnp.full(x.shape, jnp.pi)
    assert float(jnp.max(jnp.abs(T2.log(seam, x)))) <= 0.56
    with pytest.raises(ValueError, match="seam_width"):
        wrapped_normal_mixture_clouds(key, 2, 3, seam_width=0.0)


def test_the_torus_field_sees_periodic_features(key):
    # the network's input is manifold.features: angles and angles + 2 pi give the same field
    model = VectorField(T2, width=8, depth=1, heads=1)
    x = T2.random_uniform(key, (1, 4))
    m, t = jnp.ones((1, 4), bool), jnp.zeros(1)
    params = model.init(key, x, m, t)
    params = jax.tree.map(lambda p: p + 0.3, params)
    np.testing.assert_allclose(
        model.apply(params, x, m, t), model.apply(params, x + 2 * jnp.pi, m, t), atol=1e-4
    )
