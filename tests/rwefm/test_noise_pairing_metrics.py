"""RWEFM noise models, cloud matching, map-iteration calibration and the evaluation metrics:
closed forms, exact small problems, invariants and named errors."""

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
