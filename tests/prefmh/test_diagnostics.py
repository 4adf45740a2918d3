"""Distances of draws to a target: sliced W1 and grid total variation, against closed forms and
NumPy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hexad import prefmh


def _unit(rng, m, d):
    v = rng.standard_normal((m, d))
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_sliced_w1_of_a_translation_is_the_mean_projected_shift():
    # Translating every point by c shifts each sorted projection by theta . c exactly.
    rng = np.random.default_rng(0)
    a = rng.normal(size=(300, 3)).astype(np.float32)
    dirs = _unit(rng, 16, 3).astype(np.float32)
    c = np.array([0.5, -1.0, 2.0], np.float32)
    want = np.mean(np.abs(dirs @ c))
    assert float(prefmh.sliced_w1(a, a + c, dirs)) == pytest.approx(want, rel=1e-5)
    # A permutation of the same points is at distance 0, and the distance is symmetric.
    assert float(prefmh.sliced_w1(a, a[rng.permutation(300)], dirs)) == 0.0
    b = rng.normal(size=(300, 3)).astype(np.float32)
    np.testing.assert_allclose(prefmh.sliced_w1(a, b, dirs), prefmh.sliced_w1(b, a, dirs))
    ref = np.mean(np.abs(np.sort(a @ dirs.T, 0) - np.sort(b @ dirs.T, 0)))
    assert float(prefmh.sliced_w1(a, b, dirs)) == pytest.approx(ref, rel=1e-5)


def _grid_tv_numpy(samples, probs, half):
    h = np.histogramdd(samples, bins=probs.shape, range=[(-half, half)] * samples.shape[1])[0]
    h = h / len(samples)
    return 0.5 * (np.abs(h - probs).sum() + abs((1 - h.sum()) - (1 - probs.sum())))


def test_grid_tv_matches_numpy_histogram_including_edges_and_outside_points():
    rng = np.random.default_rng(1)
    x = rng.normal(scale=2.5, size=(5000, 2)).astype(np.float32)  # some fall outside
    # Points on cell edges (multiples of 0.25, exact in float32) and on the outer edges.
    x[:8] = [[0.25, 0.0], [-6.0, -6.0], [6.0, 6.0], [6.0, 0.5], [-6.0, 1.0], [1.5, 6.0]] + [
        [0.0, 0.0]
    ] * 2
    probs = rng.dirichlet(np.ones(48 * 48)).reshape(48, 48) * 0.99  # 1% outside
    got = float(prefmh.grid_tv(x, probs, 6.0))
    assert got == pytest.approx(_grid_tv_numpy(x, probs, 6.0), rel=1e-5, abs=1e-7)
    # 3-D grid, and the exact cell fractions are at distance 0.
    x3 = rng.uniform(-1, 1, size=(4000, 3)).astype(np.float32)
    frac = np.histogramdd(x3, bins=(4, 3, 2), range=[(-1, 1)] * 3)[0] / len(x3)
    assert float(prefmh.grid_tv(x3, frac, 1.0)) == pytest.approx(0.0, abs=1e-6)


def test_grid_tv_disjoint_supports_is_one():
    probs = jnp.zeros((4, 4)).at[0, 0].set(1.0)
    assert float(prefmh.grid_tv(jnp.full((10, 2), 0.9), probs, 1.0)) == pytest.approx(1.0)
    # All draws outside the grid: the outside cell carries their whole mass.
    assert float(prefmh.grid_tv(jnp.full((10, 2), 5.0), probs, 1.0)) == pytest.approx(1.0)


def test_grid_tv_of_integer_samples():
    # Integer draws land in the cells of their float values: the edges are not truncated.
    s = np.array([[-2], [-1], [1], [2]])  # one per cell of [-2.5, -1.25, 0, 1.25, 2.5]
    for half, bins in ((2.5, 4), (2.0, 4), (1.5, 2)):
        probs = np.full((bins,), 1.0 / bins)
        got = float(prefmh.grid_tv(jnp.asarray(s, jnp.int32), probs, half))
        want = float(prefmh.grid_tv(jnp.asarray(s, jnp.float32), probs, half))
        assert got == pytest.approx(want, abs=1e-7)
        assert got == pytest.approx(_grid_tv_numpy(s, probs, half), abs=1e-7)


def test_bad_input_raises():
    a = jnp.zeros((5, 2))
    with pytest.raises(ValueError, match="a, b"):
        prefmh.sliced_w1(a, jnp.zeros((4, 2)), jnp.ones((3, 2)))
    with pytest.raises(ValueError, match="directions"):
        prefmh.sliced_w1(a, a, jnp.ones((3, 3)))
    with pytest.raises(ValueError, match="samples"):
        prefmh.grid_tv(jnp.zeros((5, 3)), jnp.ones((2, 2)), 1.0)
    with pytest.raises(ValueError, match="half_width: expected a finite number > 0"):
        prefmh.grid_tv(a, jnp.ones((2, 2)), 0.0)


def test_diagnostics_run_under_jit():
    x = jax.random.normal(jax.random.key(0), (64, 2))
    f = jax.jit(
        lambda x: prefmh.sliced_w1(x, -x, jnp.eye(2)) + prefmh.grid_tv(x, jnp.ones((2, 2)) / 4, 3.0)
    )
    assert np.isfinite(float(f(x)))
