"""Geometry: round trips, metric axioms, invariants, edge cases (small angles, antipodes, seam)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hexad.geometry import (
    Euclidean,
    Manifold,
    Product,
    Sphere,
    Torus,
    check_points,
    check_weights,
    wrap_angle,
)

MANIFOLDS = [Euclidean(3), Sphere(3), Sphere(5), Torus(2), Product((Sphere(3), Torus(2)))]


def _points(m, key, n):
    if isinstance(m, Euclidean):
        return jax.random.normal(key, (n, m.dim))
    return m.random_uniform(key, (n,))


@pytest.mark.parametrize("m", MANIFOLDS, ids=lambda m: type(m).__name__ + str(m.dim))
def test_exp_log_round_trip_and_metric_axioms(m, key):
    kx, ky, kz = jax.random.split(key, 3)
    x, y, z = _points(m, kx, 64), _points(m, ky, 64), _points(m, kz, 64)
    if isinstance(m, (Sphere, Product)):
        # Keep away from the cut locus (antipodes), where log is not unique.
        y = m.exp(x, 0.9 * m.log(x, y))
    v = m.log(x, y)
    # exp_x(log_x y) = y, checked through the distance so the torus seam does not matter.
    np.testing.assert_allclose(m.dist(m.exp(x, v), y), 0.0, atol=2e-5)
    # |log_x y| = d(x, y)
    np.testing.assert_allclose(jnp.sqrt(m.inner(x, v, v)), m.dist(x, y), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(m.dist(x, y), m.dist(y, x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m.dist(x, x), 0.0, atol=1e-6)
    assert bool(jnp.all(m.dist(x, z) <= m.dist(x, y) + m.dist(y, z) + 1e-5))
    # the log is tangent; exp lands on the manifold
    np.testing.assert_allclose(m.proj_tangent(x, v), v, atol=1e-6)
    assert float(jnp.max(m.manifold_error(m.exp(x, 3.0 * v)))) < 1e-6
    # the vectorised forms agree with the point-wise ones
    np.testing.assert_allclose(m.pairwise_sqdist(x, y), m.sqdist(x[:, None], y[None]), atol=2e-5)
    w = jax.nn.softmax(jax.random.normal(kz, (64, 64)), axis=-1)
    ref = jnp.einsum("ij,ijd->id", w, m.log(x[:, None], y[None]))
    mask = jnp.max(m.pairwise_sqdist(x, y), axis=1) < (math.pi - 0.05) ** 2
    if isinstance(m, Torus):  # wrap ties at exactly +-pi have measure zero
        mask = jnp.ones_like(mask)
    np.testing.assert_allclose(m.weighted_log(x, w, y)[mask], ref[mask], atol=3e-5)


def test_sphere_small_angles_and_antipodes():
    s = Sphere(3)
    x = jnp.array([1.0, 0.0, 0.0])
    for ang in (1e-6, 1e-4, 1e-2):
        y = jnp.array([math.cos(ang), math.sin(ang), 0.0])
        np.testing.assert_allclose(s.dist(x, y), ang, rtol=1e-3)
        np.testing.assert_allclose(s.log(x, y), [0.0, ang, 0.0], rtol=1e-3, atol=1e-9)
    # antipode: finite, of length pi (or zero where the direction is not unique)
    y = jnp.array([-1.0, 1e-4, 0.0])
    y = y / jnp.linalg.norm(y)
    v = s.log(x, y)
    np.testing.assert_allclose(jnp.linalg.norm(v), s.dist(x, y), rtol=1e-4)
    assert bool(jnp.all(jnp.isfinite(s.log(x, -x))))
    np.testing.assert_allclose(s.dist(x, -x), math.pi, rtol=1e-6)
    # gradients are finite where points coincide
    g = jax.grad(lambda a: s.sqdist(a, x))(x)
    assert bool(jnp.all(jnp.isfinite(g)))
    g = jax.grad(lambda a: jnp.sum(s.exp(x, a)))(jnp.zeros(3))
    assert bool(jnp.all(jnp.isfinite(g)))


def test_torus_seam():
    t = Torus(2)
    x = jnp.array([math.pi - 0.1, -math.pi + 0.05])
    y = jnp.array([-math.pi + 0.1, math.pi - 0.05])
    np.testing.assert_allclose(t.log(x, y), [0.2, -0.1], atol=1e-5)
    np.testing.assert_allclose(t.dist(x, y), math.hypot(0.2, 0.1), atol=1e-5)
    z = t.exp(x, jnp.array([0.3, -0.3]))
    assert float(t.manifold_error(z)) == 0.0
    assert float(wrap_angle(jnp.float32(math.pi))) == pytest.approx(-math.pi)


def test_geodesic_velocity_matches_autodiff():
    s = Sphere(3)
    x = jnp.array([0.0, 0.6, 0.8])
    v = s.proj_tangent(x, jnp.array([1.0, 0.5, -0.2]))
    t = jnp.float32(0.37)
    xt, vt = s.geodesic(x, v, t)
    _, jvp = jax.jvp(lambda tt: s.exp(x, tt * v), (t,), (jnp.float32(1.0),))
    np.testing.assert_allclose(xt, s.exp(x, t * v), atol=1e-6)
    np.testing.assert_allclose(vt, jvp, atol=1e-5)
    # the speed along a geodesic is constant
    np.testing.assert_allclose(jnp.linalg.norm(vt), jnp.linalg.norm(v), rtol=1e-5)


@pytest.mark.slow  # ~20 s of CPU: vMF rejection sampler compiled eagerly
def test_vmf_and_wrapped_normal_statistics(key):
    k1, k2, k3 = jax.random.split(key, 3)
    n, kappa = 4000, 20.0
    mu = jnp.array([0.0, 0.0, 1.0])
    x = Sphere(3).random_vmf(k1, mu, kappa, (n,))
    # On S^2, E[<x, mu>] = coth(kappa) - 1/kappa; sd of the cosine < 0.1 here, so 4 standard
    # errors are below 0.007.
    np.testing.assert_allclose(jnp.mean(x @ mu), 1.0 / math.tanh(kappa) - 1.0 / kappa, atol=7e-3)
    # On S^4, E[<x, mu>] = I_{5/2}(k) / I_{3/2}(k) = coth k - 1/k - ... ; check against the
    # large-kappa expansion 1 - (p-1)/(2k) within a loose 0.01 (series error ~ 1/k^2).
    mu5 = jnp.array([0.0, 0.0, 0.0, 0.0, 1.0])
    x5 = Sphere(5).random_vmf(k2, mu5, 100.0, (2000,))
    np.testing.assert_allclose(jnp.mean(x5 @ mu5), 1.0 - 4.0 / 200.0, atol=0.01)
    assert float(jnp.max(Sphere(5).manifold_error(x5))) < 1e-6
    # wrapped normal on the circle: the mean resultant length is exp(-sigma^2 / 2)
    a = Torus(1).random_normal(k3, jnp.array([3.0]), 0.5, (n,))
    r = jnp.abs(jnp.mean(jnp.exp(1j * a[:, 0])))
    np.testing.assert_allclose(r, math.exp(-0.125), atol=0.02)


def test_checks_name_the_argument():
    s = Sphere(3)
    with pytest.raises(ValueError, match="x: expected points on"):
        check_points(s, np.array([[2.0, 0.0, 0.0]]), "x")
    with pytest.raises(ValueError, match=r"y: expected points of shape \[..., 3\]"):
        check_points(s, np.zeros((4, 2)), "y")
    with pytest.raises(ValueError, match="finite"):
        check_points(s, np.array([[np.nan, 0.0, 1.0]]), "x")
    with pytest.raises(ValueError, match="all-zero"):
        check_weights(np.zeros((2, 3)), "b", (2, 3))
    with pytest.raises(ValueError, match="non-negative"):
        check_weights(np.array([1.0, -1.0]), "a", (2,))
    check_points(Torus(2), np.array([[math.pi - 1e-7, -math.pi]]), "x")


@pytest.mark.parametrize("m", MANIFOLDS, ids=lambda m: type(m).__name__ + str(m.dim))
def test_every_manifold_satisfies_the_protocol(m):
    assert isinstance(m, Manifold)


def test_a_class_without_mean_is_not_a_manifold():
    # the protocol is structural: every other member present, ``mean`` missing -> not one
    def stub(*args):
        return None

    class NoMean:
        dim = intrinsic_dim = 2
        exp = log = dist = sqdist = proj = proj_tangent = inner = geodesic = stub
        pairwise_sqdist = weighted_log = manifold_error = random_normal = features = stub

    assert not isinstance(NoMean(), Manifold)
    NoMean.mean = stub
    assert isinstance(NoMean(), Manifold)


def test_circular_mean_across_the_seam():
    # pi - 0.1 and -pi + 0.3 (= pi + 0.3) are 0.4 apart across the seam: their circular mean
    # is the midpoint pi + 0.1 = -pi + 0.1, where the arithmetic mean of the angles is 0.1.
    t = Torus(1)
    x = jnp.array([[math.pi - 0.1], [-math.pi + 0.3]])
    np.testing.assert_allclose(t.mean(x, jnp.ones(2)), [-math.pi + 0.1], atol=1e-6)
    # weights 3 : 1 pull it toward the first angle: the weighted resultant's angle
    w = jnp.array([3.0, 1.0])
    want = math.atan2(
        3 * math.sin(math.pi - 0.1) + math.sin(0.3 - math.pi),
        3 * math.cos(math.pi - 0.1) + math.cos(0.3 - math.pi),
    )
    np.testing.assert_allclose(t.mean(x, w), [want], atol=1e-6)
    # per angle on T^2, and invariant to rescaling the weights
    t2 = Torus(2)
    y = jnp.array([[math.pi - 0.1, 0.5], [-math.pi + 0.3, 0.7]])
    np.testing.assert_allclose(t2.mean(y, jnp.ones(2)), [-math.pi + 0.1, 0.6], atol=1e-6)
    np.testing.assert_array_equal(t2.mean(y, 5.0 * w), t2.mean(y, w))


def test_sphere_mean_of_symmetric_points(key):
    # A ring of k equal-weight points at colatitude 1.2 around a random axis u: the average
    # is cos(1.2) u, whose projection is u exactly (up to rounding).
    s = Sphere(3)
    u = s.random_uniform(key)
    e = s.proj(s.proj_tangent(u, jnp.array([1.0, 2.0, 3.0])))
    f = jnp.cross(u, e)
    phi = jnp.linspace(0.0, 2 * math.pi, 7)[:-1]
    ring = jnp.cos(1.2) * u[None, :] + jnp.sin(1.2) * (
        jnp.cos(phi)[:, None] * e[None, :] + jnp.sin(phi)[:, None] * f[None, :]
    )
    np.testing.assert_allclose(s.mean(ring, jnp.ones(6)), u, atol=1e-6)
    # two points: the geodesic midpoint; with weights 2:1, the direction of the chord average
    a, b = jnp.array([1.0, 0.0, 0.0]), jnp.array([0.0, 1.0, 0.0])
    np.testing.assert_allclose(s.mean(jnp.stack([a, b]), jnp.ones(2)), s.proj(a + b), atol=1e-7)
    np.testing.assert_allclose(
        s.mean(jnp.stack([a, b]), jnp.array([2.0, 1.0])), s.proj(2 * a + b), atol=1e-7
    )
    assert float(s.manifold_error(s.mean(ring, jnp.arange(6.0)))) < 1e-6


def test_euclidean_and_product_means(key):
    kx, kw = jax.random.split(key)
    e = Euclidean(3)
    x = jax.random.normal(kx, (5, 3))
    w = jax.random.uniform(kw, (5,))
    np.testing.assert_allclose(e.mean(x, w), np.sum(w[:, None] * x, 0) / np.sum(w), rtol=1e-5)
    # zero weights drop points: the mean of the rest
    np.testing.assert_allclose(e.mean(x, jnp.array([1.0, 1, 0, 0, 0])), (x[0] + x[1]) / 2, 1e-6)
    # a product's mean is its factors' means, exactly
    p = Product((Sphere(3), Torus(2), Euclidean(1)))
    y = jnp.concatenate(
        [Sphere(3).random_uniform(kx, (5,)), Torus(2).random_uniform(kw, (5,)), x[:, :1]], -1
    )
    want = jnp.concatenate(
        [Sphere(3).mean(y[:, :3], w), Torus(2).mean(y[:, 3:5], w), Euclidean(1).mean(y[:, 5:], w)]
    )
    np.testing.assert_array_equal(p.mean(y, w), want)
    assert p.mean(y, w).shape == (6,)


def test_mean_names_bad_shapes():
    s = Sphere(3)
    with pytest.raises(ValueError, match=r"x: expected points of shape \[n, 3\]"):
        s.mean(jnp.zeros((4, 2)), jnp.ones(4))
    with pytest.raises(ValueError, match=r"w: expected weights of shape \(4,\)"):
        s.mean(s.random_uniform(jax.random.key(0), (4,)), jnp.ones(3))


def test_fast_arccos_matches_float64():
    from hexad.geometry._manifolds import fast_arccos

    c = np.concatenate(
        [np.linspace(-1, 1, 20001), 1 - np.logspace(-7, -1, 200), -1 + np.logspace(-7, -1, 200)]
    ).astype(np.float32)
    ref = np.arccos(c.astype(np.float64))
    got = np.asarray(jax.jit(fast_arccos)(jnp.asarray(c)))
    # jnp.arccos itself is 2.5e-7 off at float32; a few ulps of pi is 5e-7
    np.testing.assert_allclose(got, ref, atol=5e-7, rtol=3e-7)
    assert np.isfinite(jax.grad(fast_arccos)(jnp.float32(1 - 1.2e-7)))


# --------------------------------------------------------------------------------------------
# Non-finite inputs propagate: no guard may turn a NaN/inf into a plausible number.
# --------------------------------------------------------------------------------------------

NONFINITE_MANIFOLDS = [Euclidean(3), Sphere(3), Torus(2), Product((Sphere(3), Torus(2)))]


def _two_points(m):
    x = m.random_uniform(jax.random.key(3), (2,)) if not isinstance(m, Euclidean) else None
    if x is None:
        x = jnp.array([[0.3, -0.2, 0.5], [0.1, 0.4, -0.6]])
    return x[0], x[1]


@jax.jit
def _all_ops(m, x, y, v):
    """Every point-wise and vectorised method, with the bad coordinate in ``x`` or ``v``."""
    w = jnp.ones((1, 1))
    return {
        "dist(x, y)": m.dist(x, y),
        "dist(y, x)": m.dist(y, x),
        "sqdist": m.sqdist(x, y),
        "log(x, y)": m.log(x, y),
        "log(y, x)": m.log(y, x),
        "exp(x, 0)": m.exp(x, jnp.zeros_like(v)),
        "exp(y, v)": m.exp(y, v),
        "geodesic(y, v)": m.geodesic(y, v, jnp.float32(0.5))[0],
        "pairwise_sqdist": m.pairwise_sqdist(x[None], y[None]),
        "pairwise_sqdist^T": m.pairwise_sqdist(y[None], x[None]),
        "weighted_log(x)": m.weighted_log(x[None], w, y[None]),
        "weighted_log(y)": m.weighted_log(y[None], w, x[None]),
        "manifold_error": m.manifold_error(x),
        "proj": m.proj(x),
    }


def test_sphere_dist_of_nan_is_nan():
    # the double-where in the safe norm used to return 0.0
    d = Sphere(2).dist(jnp.array([jnp.nan, 0.0, 1.0]), jnp.array([0.0, 0.0, 1.0]))
    assert np.isnan(float(d))
    d = Sphere(3).dist(jnp.array([jnp.nan, 0.0, 1.0]), jnp.array([0.0, 0.0, 1.0]))
    assert np.isnan(float(d))
    # atan2(inf, inf) = pi / 4 used to give a plausible pi / 2
    d = Sphere(3).dist(jnp.array([jnp.inf, 0.0, 1.0]), jnp.array([0.0, 0.0, 1.0]))
    assert not np.isfinite(float(d))


@pytest.mark.parametrize("m", NONFINITE_MANIFOLDS, ids=lambda m: type(m).__name__ + str(m.dim))
def test_nonfinite_inputs_give_nonfinite_outputs(m):
    x, y = _two_points(m)
    for bad in (jnp.nan, jnp.inf, -jnp.inf):
        out = _all_ops(m, x.at[0].set(bad), y, jnp.zeros(m.dim).at[0].set(bad))
        for name, val in out.items():
            val = np.asarray(val)
            if name == "manifold_error" and isinstance(m, Euclidean):
                continue  # every point is on R^d
            if np.isnan(bad):
                assert np.any(np.isnan(val)), (name, bad, val)
            else:
                assert not np.all(np.isfinite(val)), (name, bad, val)


@jax.jit
def _zero_grads(m, x):
    v0 = jnp.zeros(m.dim)
    return [
        jax.grad(lambda a: m.dist(a, x))(x),
        jax.grad(lambda a: m.dist(x, a))(x),
        jax.grad(lambda a: m.sqdist(a, x))(x),
        jax.grad(lambda a: jnp.sum(m.log(x, a)))(x),
        jax.grad(lambda a: jnp.sum(m.exp(x, a)))(v0),
        jax.grad(lambda a: jnp.sum(m.geodesic(x, a, 0.5)[0]))(v0),
        jax.grad(lambda a: jnp.sum(m.pairwise_sqdist(a[None], x[None])))(x),
    ]


@pytest.mark.parametrize("m", NONFINITE_MANIFOLDS, ids=lambda m: type(m).__name__ + str(m.dim))
def test_gradients_finite_at_zero_distance_and_zero_tangent(m):
    x, _ = _two_points(m)
    grads = _zero_grads(m, x)
    for g in grads:
        assert bool(jnp.all(jnp.isfinite(g))), g
    # d(x, x) is 0 with a zero (sub)gradient, not a NaN from sqrt'(0)
    np.testing.assert_allclose(grads[0], 0.0, atol=1e-6)


def test_safe_helpers_propagate_nan_and_keep_zero_gradients():
    from hexad.geometry._manifolds import _clip_cos, _safe_norm, _safe_sqrt, _sinc, fast_arccos

    @jax.jit
    def run(nan, inf):
        one = jnp.ones_like(nan)
        return {
            "sqrt(nan)": _safe_sqrt(nan),
            "sqrt(inf)": _safe_sqrt(inf),
            "sqrt(-1)": _safe_sqrt(-one),
            "sqrt(4)": _safe_sqrt(4.0 * one),
            "norm(nan)": _safe_norm(jnp.stack([nan, 0.0 * one])),
            "norm(inf)": _safe_norm(jnp.stack([inf, 0.0 * one])),
            "norm(3, 4)": _safe_norm(jnp.stack([3.0 * one, 4.0 * one])),
            "sinc(nan)": _sinc(nan),
            "sinc(inf)": _sinc(inf),
            "arccos(nan)": fast_arccos(nan),
            "arccos(2)": fast_arccos(2.0 * one),  # like arccos outside [-1, 1]
            "clip(nan)": _clip_cos(nan),
            "clip(inf)": _clip_cos(inf),
            "clip(-inf)": _clip_cos(-inf),
            "clip(1.5)": _clip_cos(1.5 * one),
            # the double-where's purpose: a zero (not NaN) gradient at exactly zero
            "norm'(0)": jax.grad(_safe_norm)(jnp.zeros(3)),
            "sqrt'(0)": jax.grad(_safe_sqrt)(0.0 * one),
            "sinc'(0)": jax.grad(_sinc)(0.0 * one),
        }

    out = {k: np.asarray(v) for k, v in run(jnp.float32(jnp.nan), jnp.float32(jnp.inf)).items()}
    for k in ("sqrt(nan)", "norm(nan)", "sinc(nan)", "sinc(inf)", "arccos(nan)", "arccos(2)"):
        assert np.isnan(out[k]), k
    for k in ("clip(nan)", "clip(inf)", "clip(-inf)"):
        assert np.isnan(out[k]), k
    assert out["sqrt(inf)"] == math.inf and out["norm(inf)"] == math.inf
    assert out["sqrt(-1)"] == 0.0  # sqrt(max(s, 0))
    assert out["sqrt(4)"] == 2.0 and out["norm(3, 4)"] == 5.0
    assert out["clip(1.5)"] == np.float32(1.0) - np.finfo(np.float32).eps
    for k in ("norm'(0)", "sqrt'(0)", "sinc'(0)"):
        np.testing.assert_array_equal(out[k], 0.0, err_msg=k)


def test_vmf_nan_kappa_terminates_with_nan(fast_compile):
    # Wood's rejection loop used to reject a NaN forever (NaN >= log u is False): a hang.
    x = jax.jit(lambda k: Sphere(5).random_vmf(jax.random.key(0), jnp.eye(5)[0], k, (2,)))(
        jnp.float32(jnp.nan)
    )
    assert bool(jnp.all(jnp.isnan(x)))
