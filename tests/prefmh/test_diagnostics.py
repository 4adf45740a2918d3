"""Chain diagnostics against references computed apart: R-hat and ESS against a NumPy/SciPy
rank-normalised split R-hat and BlackJAX's basic ESS of hand rank-normalised split draws (plus
the properties that set them apart from the classic estimators), sliced W1 and grid total
variation against closed forms and NumPy/SciPy references."""

import blackjax.diagnostics as bjd
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from hexad import prefmh


def _split(x):
    """``[m, n, ...]`` -> ``[2m, n // 2, ...]``: each chain's halves (an odd last draw left out)."""
    half = x.shape[1] // 2
    return np.concatenate([x[:, :half], x[:, half : 2 * half]], axis=0)


def _rank_normal(x):
    """Normal scores of the ranks over chains and draws together (ties: average rank), at the
    Blom plotting position ``(r - 3/8) / (N + 1/4)`` (Vehtari et al. 2021, arXiv:1903.08008)."""
    flat = x.reshape(-1, *x.shape[2:])
    r = stats.rankdata(flat, method="average", axis=0)
    return stats.norm.ppf((r - 0.375) / (flat.shape[0] + 0.25)).reshape(x.shape)


def _gelman_rubin(z):
    n = z.shape[1]
    within = z.var(axis=1, ddof=1).mean(axis=0)
    between = n * z.mean(axis=1).var(axis=0, ddof=1)
    return np.sqrt((between / within + n - 1) / n)


def _rhat_reference(x):
    s = _split(np.asarray(x, np.float64))
    folded = np.abs(s - np.median(s.reshape(-1, *s.shape[2:]), axis=0))
    return np.maximum(_gelman_rubin(_rank_normal(s)), _gelman_rubin(_rank_normal(folded)))


def _ar1(rng, phi, shape):
    """AR(1) chains along axis 1 with unit stationary variance, started in stationarity."""
    e = rng.standard_normal(shape)
    x = np.empty(shape)
    x[:, 0] = e[:, 0]
    for t in range(1, shape[1]):
        x[:, t] = phi * x[:, t - 1] + np.sqrt(1 - phi**2) * e[:, t]
    return x.astype(np.float32)


def test_rhat_is_the_rank_normalised_split_rhat():
    rng = np.random.default_rng(0)
    # 51 draws (odd: the split leaves the last out); chains differ in location and spread so
    # that R-hat is away from 1, and the third variable is discrete (ties).
    x = rng.standard_normal((4, 51, 3)) * [[[1.0]], [[1.0]], [[1.5]], [[1.0]]]
    x = x + np.array([0.0, 0.0, 0.0, 1.5])[:, None, None]
    x[..., 2] = np.round(x[..., 2])
    x = x.astype(np.float32)
    got = prefmh.potential_scale_reduction(x)
    assert got.shape == (3,) and got.dtype == jnp.float32
    np.testing.assert_allclose(got, _rhat_reference(x), rtol=1e-5)
    assert float(jnp.min(got)) > 1.05  # not a comparison of two values near 1


def test_ess_is_the_basic_ess_of_rank_normalised_split_chains():
    rng = np.random.default_rng(1)
    x = _ar1(rng, 0.6, (3, 101, 2))
    x[..., 1] = np.floor(2 * x[..., 1])  # a discrete variable: tied draws
    want = bjd.effective_sample_size(_rank_normal(_split(x)).astype(np.float32))
    got = prefmh.effective_sample_size(x)
    assert got.shape == (2,) and got.dtype == jnp.float32
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_ess_of_an_indicator_is_the_split_chain_ess_of_the_indicator():
    # Average ranks send the two values of an indicator to two normal scores: an increasing
    # affine map, which leaves the ESS as it is. Ordinal ranks of the ties would not.
    x = (_ar1(np.random.default_rng(2), 0.5, (4, 301)) > 0.5).astype(np.float32)
    want = bjd.effective_sample_size(_split(x))
    np.testing.assert_allclose(prefmh.effective_sample_size(x), want, rtol=1e-5)


def test_rank_based_diagnostics_are_unchanged_by_an_increasing_map():
    x = _ar1(np.random.default_rng(3), 0.9, (4, 400))
    y = np.exp(2.0 * x)
    np.testing.assert_allclose(
        prefmh.effective_sample_size(y), prefmh.effective_sample_size(x), rtol=1e-5
    )
    np.testing.assert_allclose(
        prefmh.potential_scale_reduction(y), prefmh.potential_scale_reduction(x), rtol=1e-5
    )
    # The ESS of the raw draws (the former definition) does change: the check is not vacuous.
    raw = bjd.effective_sample_size(y) / bjd.effective_sample_size(x)
    assert float(raw) > 1.5


def test_split_and_folded_rhat_flag_what_the_classic_rhat_misses():
    z = np.random.default_rng(4).standard_normal((4, 400)).astype(np.float32)
    spread = z * np.array([[1.0], [1.0], [1.0], [3.0]], np.float32)  # one chain 3x as wide
    drift = 0.3 * z + np.linspace(-1.0, 1.0, 400, dtype=np.float32)  # every chain drifts alike
    # Measured over seeds 0-4: classic R-hat 0.999-1.002 for both; rank-normalised split
    # R-hat 1.12-1.17 (spread, through the folded draws) and 1.53-1.55 (drift, through the split).
    for x, floor in ((spread, 1.08), (drift, 1.3)):
        assert float(bjd.potential_scale_reduction(x)) < 1.01
        assert float(prefmh.potential_scale_reduction(x)) > floor


@pytest.mark.parametrize("shape", [(3, 20), (3, 20, 1), (3, 21, 2, 1), (1, 20, 2)])
def test_diagnostics_keep_the_variable_axes(shape):
    # BlackJAX squeezes size-1 variable axes away; each variable is also computed on its own.
    x = jax.random.normal(jax.random.key(5), shape)
    fns = [prefmh.effective_sample_size] + ([prefmh.potential_scale_reduction] * (shape[0] > 1))
    for f in fns:
        got = f(x)
        assert got.shape == shape[2:] and got.dtype == jnp.float32
        for idx in np.ndindex(*shape[2:]):
            np.testing.assert_allclose(got[idx], f(x[(slice(None), slice(None), *idx)]), rtol=1e-6)


def test_diagnostics_of_integer_draws_are_float():
    x = jax.random.randint(jax.random.key(6), (4, 30), 0, 5)
    assert prefmh.effective_sample_size(x).dtype == jnp.float32
    assert prefmh.potential_scale_reduction(x).dtype == jnp.float32
    np.testing.assert_allclose(
        prefmh.effective_sample_size(x), prefmh.effective_sample_size(x.astype(jnp.float32))
    )


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
    # SciPy's one-dimensional W1 on each projection (not a squared or W2 cost).
    scipy_w1 = np.mean([stats.wasserstein_distance(a @ t, b @ t) for t in dirs])
    assert float(prefmh.sliced_w1(a, b, dirs)) == pytest.approx(scipy_w1, rel=1e-5)


def test_sliced_w1_gradient_of_a_translation():
    # b = a - c, held fixed, with theta . c > 0 for every direction: the sorted pairs stay
    # matched, the distance is mean_theta theta . (a_i - b_i) averaged over i, so
    # d/da_i = mean(directions) / n for every point, and d/db_i its opposite.
    rng = np.random.default_rng(2)
    a = rng.normal(size=(50, 2)).astype(np.float32)
    dirs = np.abs(_unit(rng, 8, 2)).astype(np.float32)
    c = np.array([[0.7, 0.4]], np.float32)
    b = a - c
    g = jax.grad(lambda a: prefmh.sliced_w1(a, b, dirs))(jnp.asarray(a))
    np.testing.assert_allclose(g, np.broadcast_to(dirs.mean(0) / 50, a.shape), rtol=1e-5)
    g_b = jax.grad(lambda b: prefmh.sliced_w1(a, b, dirs))(jnp.asarray(b))
    np.testing.assert_allclose(g_b, -g, rtol=1e-5)


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
    with pytest.raises(ValueError, match="samples: R-hat needs >= 2 chains"):
        prefmh.potential_scale_reduction(jnp.zeros((1, 8)))
    with pytest.raises(ValueError, match="samples: expected an array"):
        prefmh.potential_scale_reduction(jnp.zeros(8))
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
