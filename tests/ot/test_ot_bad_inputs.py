"""Bad inputs to hexad.ot get a clear error naming the argument; closed-over clouds jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hexad import ot
from hexad.geometry import Euclidean, Sphere, Torus


def _clouds(m, n=6):
    if isinstance(m, Euclidean):
        return jax.random.normal(jax.random.key(0), (2, n, m.dim))
    return m.random_uniform(jax.random.key(0), (2, n))


@pytest.mark.parametrize("m", [Sphere(3), Torus(2), Euclidean(2)], ids=repr)
def test_closed_over_target_cloud_jits_and_grads(m):
    # The ott-jax pattern of the issue: y fixed, closed over; failed with
    # TracerArrayConversionError on all three manifolds.
    x, y = _clouds(m)
    mapped = jax.jit(lambda p: ot.entropic_map(m, p, y, epsilon=0.1).mapped)(x)
    eager = ot.entropic_map(m, x, y, epsilon=0.1).mapped
    np.testing.assert_allclose(mapped, eager, rtol=1e-4, atol=1e-5)
    g = jax.jit(jax.grad(lambda p: ot.sinkhorn_divergence(m, p, y, epsilon=0.1)))(x)
    assert g.shape == x.shape and np.all(np.isfinite(g))


def test_a_closed_over_cloud_off_the_manifold_is_still_named_under_jit():
    x = _clouds(Sphere(3))[0]
    off = 2.0 * x  # concrete, closed over below
    with pytest.raises(ValueError, match="y: expected points on"):
        jax.jit(lambda p: ot.entropic_map(Sphere(3), p, off).mapped)(x)


@pytest.mark.parametrize("plan", [jnp.full((3, 3), jnp.nan), jnp.eye(3).at[1, 2].set(jnp.inf)])
def test_greedy_matching_rejects_a_non_finite_plan(plan):
    with pytest.raises(ValueError, match="plan: expected finite"):
        ot.greedy_matching(plan)  # was the identity [0, 1, 2]


@pytest.mark.parametrize("shape", [(4,), (2, 3), (2, 2, 2)])
def test_greedy_matching_rejects_a_plan_that_is_not_square(shape):
    with pytest.raises(ValueError, match="plan: expected a square"):
        ot.greedy_matching(jnp.ones(shape))


@pytest.mark.parametrize("epsilon", [-0.1, 0.0, float("nan"), float("inf")])
def test_sinkhorn_divergence_rejects_a_bad_epsilon(epsilon):
    x, y = _clouds(Sphere(3))
    with pytest.raises(ValueError, match="epsilon"):
        ot.sinkhorn_divergence(Sphere(3), x, y, epsilon=epsilon)  # was a number
    with pytest.raises(ValueError, match="epsilon"):
        ot.sinkhorn_w2(Sphere(3), x, y, epsilon=epsilon)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_iterations": -1}, "max_iterations"),
        ({"threshold": -1.0}, "threshold"),
        ({"batch_size": 0}, "batch_size"),
    ],
)
def test_sinkhorn_divergence_rejects_bad_settings(kwargs, match):
    x, y = _clouds(Torus(2))
    with pytest.raises(ValueError, match=match):
        ot.sinkhorn_divergence(Torus(2), x, y, **kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_iterations": -3}, "max_iterations"),
        ({"max_iterations": 2.5}, "max_iterations"),
        ({"inner_iterations": 0}, "inner_iterations"),
        ({"threshold": float("nan")}, "threshold"),
        ({"batch_size": -2}, "batch_size"),
        ({"epsilon": -1.0}, "epsilon"),
        ({"scale_cost": "mean"}, "scale_cost"),
    ],
)
def test_entropic_map_settings_are_checked_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ot.EntropicMap(Sphere(3), **kwargs)  # no call: the solver is never built broken
    if "inner_iterations" not in kwargs:  # not an argument of the function
        x, y = _clouds(Sphere(3))
        with pytest.raises(ValueError, match=match):
            ot.entropic_map(Sphere(3), x, y, **kwargs)


def test_entropic_emd_rejects_a_negative_threshold():
    x, y = _clouds(Sphere(3))
    with pytest.raises(ValueError, match="threshold"):
        ot.entropic_emd(Sphere(3), x, y, jnp.ones(6), jnp.ones(6), threshold=-1.0)


def test_a_cost_or_solver_without_a_manifold_is_a_type_error():
    with pytest.raises(TypeError, match="manifold"):
        ot.SqGeodesic(None)  # was an AttributeError at first use
    with pytest.raises(TypeError, match="manifold"):
        ot.EntropicMap(3)


@pytest.mark.parametrize("fn", [ot.chamfer, ot.entropic_emd], ids=lambda f: f.__name__)
def test_cloud_distances_reject_nan_points_and_negative_masses(fn):
    m = Torus(2)
    x, y = _clouds(m)
    ones = jnp.ones(x.shape[0])
    with pytest.raises(ValueError, match="x: expected finite"):
        fn(m, x.at[0, 0].set(jnp.nan), y, ones, ones)  # was a NaN distance
    with pytest.raises(ValueError, match="b: expected non-negative"):
        fn(m, x, y, ones, ones.at[1].set(-1.0))  # was a finite (wrong) number
    # under vmap (traced clouds) only shapes are checked: the metrics vmap these
    d = jax.vmap(lambda p: fn(m, p, y, ones, ones))(jnp.stack([x, y]))
    assert np.all(np.isfinite(d if fn is ot.chamfer else d[0]))


@pytest.mark.parametrize("t", [jnp.nan, 5.0, -0.5])
def test_mccann_interpolation_rejects_times_outside_the_unit_interval(t):
    x, tangent = jnp.zeros((2, 1)), jnp.ones((2, 1))
    with pytest.raises(ValueError, match=r"t: expected times in \[0, 1\]"):
        ot.mccann_interpolation(Euclidean(1), x, tangent, t)  # was NaN / an extrapolation
