"""The durability model: lognormal body, Gumbel tail, quantiles and C*_p(n)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hexad import cachex


def test_fit_lognormal_recovers_parameters(key):
    mu, sigma, n = 1.3, 0.4, 20000
    t = jnp.exp(mu + sigma * jax.random.normal(key, (n,)))
    mu_hat, sigma_hat = cachex.fit_lognormal(t)
    # SE(mu) = sigma / sqrt(n) = 0.0028, SE(sigma) = sigma / sqrt(2n) = 0.002: 5 SE.
    assert abs(float(mu_hat) - mu) < 0.015
    assert abs(float(sigma_hat) - sigma) < 0.01


def test_fit_gumbel_recovers_parameters(key):
    loc, scale, n = 2.0, 0.5, 20000
    x = loc + scale * jax.random.gumbel(key, (n,))
    loc_hat, scale_hat = jax.jit(cachex.fit_gumbel)(x)
    # MLE SEs: ~1.05 scale / sqrt(n) = 0.0037 for loc, ~0.78 scale / sqrt(n) = 0.0028: 5 SE.
    assert abs(float(loc_hat) - loc) < 0.02
    assert abs(float(scale_hat) - scale) < 0.015


def test_fit_durability_model_from_simulated_writers(key):
    mu, sigma, saves, n, c = -2.0, 0.3, 4000, 16, 0.25
    z = jax.random.normal(key, (saves, n))
    t = jnp.exp(mu + jnp.log1p(c * (n - 1)) + sigma * z)
    fit = jax.jit(cachex.fit_durability_model, static_argnames="contention")
    model = fit(t, contention=c)
    assert abs(float(model.mu) - mu) < 0.01  # SE = 0.3 / sqrt(64000) = 0.0012
    assert abs(float(model.sigma) - sigma) < 0.01
    # The fitted Gumbel tail and the exact max-of-lognormals quantile agree on the p50/p90 of
    # the slowest writer. The Gumbel is only the limit law (normal maxima converge like
    # 1 / log n). Measured over keys 0..19 x {default, AVX2, SSE4_2} ISAs (identical): the
    # fitted tail is -1.24% +- 0.16% (sd) off at p50 (worst -1.48%) and +3.66% +- 0.40% at
    # p90 (worst +4.63%); allow 6.5%, 7 sd beyond the p90 mean.
    for p in (0.5, 0.9):
        g = float(model.gumbel_loc - model.gumbel_scale * jnp.log(-jnp.log(p)))
        exact = float(cachex.pfs_time_quantile(model.mu, model.sigma, n, p, c))
        assert np.exp(g) == pytest.approx(exact, rel=0.065)


def test_quantile_matches_monte_carlo(key):
    mu, sigma, n, p = 0.0, 0.5, 8, 0.9
    t = jnp.exp(mu + sigma * jax.random.normal(key, (50000, n))).max(axis=1)
    mc = float(jnp.quantile(t, p))
    # The empirical 0.9-quantile of 50000 maxima has ~0.3% relative SE; allow 2%.
    assert float(cachex.pfs_time_quantile(mu, sigma, n, p)) == pytest.approx(mc, rel=0.02)


def test_gumbel_constants_of_normal_maxima():
    loc, scale = cachex.gumbel_of_max_lognormal(1.0, 2.0, 100)
    b = 2.3263478740408408  # Phi^-1(0.99)
    phi = np.exp(-0.5 * b * b) / np.sqrt(2 * np.pi)
    assert float(loc) == pytest.approx(1.0 + 2.0 * b, rel=1e-5)
    assert float(scale) == pytest.approx(2.0 / (100 * phi), rel=1e-5)
    with pytest.raises(ValueError, match="n"):
        cachex.gumbel_of_max_lognormal(0.0, 1.0, 1)


def test_critical_contention_is_the_crossing_point():
    mu, sigma, n, p, t_stage = -1.0, 0.4, 32, 0.99, 2.0
    c_star = cachex.critical_contention(mu, sigma, n, p, t_stage)
    at = cachex.pfs_time_quantile(mu, sigma, n, p, c_star)
    assert float(at) == pytest.approx(t_stage, rel=1e-5)
    assert not bool(cachex.choose_path(mu, sigma, n, p, t_stage, 0.9 * c_star))
    assert bool(cachex.choose_path(mu, sigma, n, p, t_stage, 1.1 * c_star))
    # A stage path slower than even the uncontended PFS: the PFS always wins (C* clipped at 0
    # means "stage only for c > 0", and the crossing is never reached from above).
    assert float(cachex.critical_contention(mu, sigma, n, p, 1e-6)) == 0.0
    # More writers -> a slower slowest writer -> a lower threshold.
    c64 = cachex.critical_contention(mu, sigma, 64, p, t_stage)
    assert float(c64) < float(c_star)


def test_model_functions_trace_once():
    @jax.jit
    @chex.assert_max_traces(n=1)
    def go(t, t_stage):
        m = cachex.fit_durability_model(t)
        return cachex.critical_contention(m.mu, m.sigma, 4, 0.99, t_stage)

    for i in range(3):
        go(jnp.exp(jnp.arange(12.0).reshape(3, 4) / 10 + i), jnp.float32(1.0 + i))


def test_critical_contention_over_an_array_of_writer_counts():
    # the curve over n at once is the scalar C*_p(n) at each n
    ns = np.array([2, 5, 64, 1000])
    curve = cachex.critical_contention(-3.0, 0.5, ns, 0.99, 0.2)
    want = [float(cachex.critical_contention(-3.0, 0.5, int(n), 0.99, 0.2)) for n in ns]
    np.testing.assert_allclose(np.asarray(curve), want, rtol=1e-6)
    for bad in (1, np.array([2, 1]), 2.5):
        with pytest.raises(ValueError, match="n: expected an int or a \\[k\\] int array"):
            cachex.critical_contention(0.0, 0.5, bad, 0.5, 1.0)


def test_pfs_model_lognormal_body_and_spread_match_its_draws():
    model = cachex.PFSModel(bandwidth=1e8, n_writers=16, contention=0.3, sigma=0.4)
    nbytes = 2**20
    mu, sigma = model.lognormal(nbytes)
    draws = model.sample(np.random.default_rng(0), nbytes, size=(400, 16))
    fit = cachex.fit_durability_model(draws.astype(np.float32), contention=0.3)
    # 6400 draws: SE(mu) = 0.4 / 80 = 0.005, SE(sigma) = 0.4 / sqrt(2 * 6400) = 0.0035
    assert abs(float(fit.mu) - mu) < 0.02 and abs(float(fit.sigma) - sigma) < 0.015
    ratio = np.quantile(draws, 0.9) / np.median(draws)
    # the p90/p50 of 6400 lognormal draws is within a few percent of exp(sigma z_0.9)
    assert abs(ratio / model.quantile_ratio(0.9) - 1) < 0.05
    with pytest.raises(ValueError, match="p: expected a probability in \\(0, 1\\)"):
        model.quantile_ratio(1.0)


def test_choose_path_compares_with_the_pfs_quantile_at_the_given_contention():
    # staging (0.5 s) beats even the uncontended PFS (1 s): stage at contention 0 too
    assert float(cachex.pfs_time_quantile(0.0, 0.0, 2, 0.5, 0.0)) == pytest.approx(1.0)
    assert bool(cachex.choose_path(0.0, 0.0, 2, 0.5, 0.5, 0.0))
    # staging (3 s) beats the PFS only beyond C* = 2
    assert not bool(cachex.choose_path(0.0, 0.0, 2, 0.5, 3.0, 0.0))
    assert not bool(cachex.choose_path(0.0, 0.0, 2, 0.5, 3.0, 1.5))
    assert bool(cachex.choose_path(0.0, 0.0, 2, 0.5, 3.0, 2.5))
    with pytest.raises(ValueError, match="n: expected an int or a \\[k\\] int array"):
        cachex.choose_path(0.0, 0.5, 1, 0.5, 1.0, 0.0)


def test_too_few_saves_or_a_p_outside_0_1_is_an_error():
    t = jnp.exp(jax.random.normal(jax.random.key(0), (2, 8)))
    assert np.isfinite(np.asarray(cachex.fit_durability_model(t))).all()
    for saves in (0, 1):
        with pytest.raises(ValueError, match="times: expected .* >= 2 saves"):
            cachex.fit_durability_model(t[:saves])
    for p in (0.0, 1.0, 1.5, -0.1, float("nan")):
        with pytest.raises(ValueError, match="p: expected a probability in \\(0, 1\\)"):
            cachex.critical_contention(0.0, 0.5, 4, p, 2.0)
        with pytest.raises(ValueError, match="p: expected a probability in \\(0, 1\\)"):
            cachex.pfs_time_quantile(0.0, 0.5, 4, p)
        with pytest.raises(ValueError, match="p: expected a probability in \\(0, 1\\)"):
            cachex.choose_path(0.0, 0.5, 4, p, 2.0, 0.1)
