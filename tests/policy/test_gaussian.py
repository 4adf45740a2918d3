"""Closed-form composition: PoE vs KL-regularised, KL, selectors, edge cases, bad input."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hexad import policy as P

# Small eager and jitted programs: compile-bound, so compile with most optimisations off.
pytestmark = pytest.mark.usefixtures("fast_compile")


def _rand_pair(key, n=64, d=3, dtype=jnp.float32):
    k = jax.random.split(key, 4)
    actor = P.DiagGaussian(
        jax.random.normal(k[0], (n, d), dtype), jnp.exp(jax.random.normal(k[1], (n, d), dtype))
    )
    prior = P.DiagGaussian(
        2.0 * jax.random.normal(k[2], (n, d), dtype),
        jnp.exp(jax.random.normal(k[3], (n, d), dtype)),
    )
    return actor, prior


@pytest.mark.parametrize("alpha", [0.1, 0.37, 0.5, 0.9, 0.999])
def test_poe_and_kl_regularised_share_the_mean(float64, key, alpha):
    actor, prior = _rand_pair(key, dtype=jnp.float64)
    beta = alpha / (1.0 - alpha)
    g_poe = P.poe(actor, prior, alpha)
    g_kl = P.kl_regularised(actor, prior, beta)
    # Same closed form, two algebraic routes: agreement to float64 rounding.
    np.testing.assert_allclose(g_poe.mean, g_kl.mean, rtol=1e-10, atol=1e-10)
    # PoE is wider by 1 / sqrt(1 - alpha), exactly.
    np.testing.assert_allclose(g_poe.std / g_kl.std, 1.0 / np.sqrt(1.0 - alpha), rtol=1e-10)


def test_poe_mean_equivalence_float32(key):
    actor, prior = _rand_pair(key)
    g_poe = P.poe(actor, prior, 0.3)
    g_kl = P.kl_regularised(actor, prior, 0.3 / 0.7)
    np.testing.assert_allclose(g_poe.mean, g_kl.mean, rtol=2e-5, atol=2e-5)  # float32 eps x 100


def test_poe_endpoints_and_precision_weighting(key):
    actor, prior = _rand_pair(key)
    g0 = P.poe(actor, prior, 0.0)
    g1 = P.poe(actor, prior, 1.0)
    np.testing.assert_allclose(g0.mean, actor.mean, rtol=1e-6)
    np.testing.assert_allclose(g0.std, actor.std, rtol=1e-6)
    np.testing.assert_allclose(g1.mean, prior.mean, rtol=1e-6)
    np.testing.assert_allclose(g1.std, prior.std, rtol=1e-6)
    # A very wide prior leaves the actor's mean in place (precision weighting).
    wide = P.DiagGaussian(prior.mean, 1e4 * jnp.ones_like(prior.std))
    np.testing.assert_allclose(P.poe(actor, wide, 0.9).mean, actor.mean, atol=1e-4)
    # Product of two equal-precision unit Gaussians at alpha: mean interpolates linearly.
    a = P.DiagGaussian(jnp.zeros(2), jnp.ones(2))
    p = P.DiagGaussian(jnp.full(2, 4.0), jnp.ones(2))
    np.testing.assert_allclose(P.poe(a, p, 0.25).mean, [1.0, 1.0], rtol=1e-6)


def test_poe_per_state_alpha_matches_scalar(key):
    actor, prior = _rand_pair(key, n=5)
    alphas = jnp.linspace(0.0, 1.0, 5)
    g = P.poe(actor, prior, alphas)
    for i in range(5):
        gi = P.poe(
            P.DiagGaussian(actor.mean[i], actor.std[i]),
            P.DiagGaussian(prior.mean[i], prior.std[i]),
            alphas[i],
        )
        np.testing.assert_allclose(g.mean[i], gi.mean, rtol=1e-6)


def test_kl_closed_form_and_monte_carlo(key):
    p = P.DiagGaussian(jnp.array([0.3, -1.0]), jnp.array([0.5, 2.0]))
    q = P.DiagGaussian(jnp.array([1.0, 0.0]), jnp.array([1.5, 1.0]))
    kl = P.kl_diag_gaussian(p, q)
    x = p.mean[None] + p.std[None] * jax.random.normal(key, (200_000, 2))

    def logpdf(g, x):
        return jnp.sum(
            -0.5 * ((x - g.mean[None]) / g.std[None]) ** 2 - jnp.log(g.std[None]), axis=-1
        )

    mc = jnp.mean(logpdf(p, x) - logpdf(q, x))
    sd = jnp.std(logpdf(p, x) - logpdf(q, x)) / np.sqrt(x.shape[0])
    # 4 Monte-Carlo standard errors. (kl - mc) / sd measured over 20 keys x {default, AVX2,
    # SSE4_2}: mean 0.04, sd 0.87, max |z| 1.72 (this key -1.10).
    assert abs(float(kl - mc)) < 4 * float(sd)
    assert float(P.kl_diag_gaussian(p, p)) == pytest.approx(0.0, abs=1e-7)


def test_kl_monotone_in_alpha(key):
    actor, prior = _rand_pair(key)
    alphas = jnp.linspace(0.0, 1.0, 101)
    kls = jax.vmap(lambda a: jnp.mean(P.poe_kl_to_actor(actor, prior, a)))(alphas)
    assert float(kls[0]) == pytest.approx(0.0, abs=1e-6)
    assert np.all(np.diff(np.asarray(kls)) >= -1e-5)  # float32 rounding slack only


@pytest.mark.parametrize("budget", [0.01, 0.3, 2.0])
def test_global_selector_returns_largest_feasible_alpha(key, budget):
    actor, prior = _rand_pair(key)
    alpha = float(P.kl_budget_alpha(actor, prior, budget, n_iters=30))

    def mean_kl(a):
        return float(jnp.mean(P.poe_kl_to_actor(actor, prior, a)))

    assert mean_kl(alpha) <= budget * (1 + 1e-5)
    if alpha < 1.0:
        assert mean_kl(min(alpha + 1e-4, 1.0)) > budget
    # Brute-force reference on a fine grid (vectorised over alpha).
    grid = jnp.linspace(0.0, 1.0, 2001)
    kls = np.asarray(jax.vmap(lambda a: jnp.mean(P.poe_kl_to_actor(actor, prior, a)))(grid))
    assert alpha >= float(np.max(np.asarray(grid)[kls <= budget])) - 1e-3


def test_global_selector_averages_over_the_broadcast_states():
    # One actor Gaussian against 4 prior states ([1, d] with [4, d], as poe broadcasts): the
    # mean KL is over the 4 states. KL = alpha^2 m^2 / 2 with m = 1: budget 0.125 -> 0.5 (a
    # sum over the states would give 0.25).
    one = P.DiagGaussian(jnp.zeros((1, 1)), jnp.ones((1, 1)))
    four = P.DiagGaussian(jnp.ones((4, 1)), jnp.ones((4, 1)))
    assert round(float(P.kl_budget_alpha(one, four, 0.125)), 4) == 0.5
    assert round(float(P.kl_budget_alpha(one, four, 0.125, weights=jnp.ones(4))), 4) == 0.5
    with pytest.raises(ValueError, match=r"weights: expected shape \(4,\)"):
        P.kl_budget_alpha(one, four, 0.125, weights=jnp.ones(1))


def test_global_selector_full_alpha_when_budget_is_loose(key):
    actor, prior = _rand_pair(key)
    assert float(P.kl_budget_alpha(actor, prior, 1e6)) == 1.0
    assert float(P.kl_budget_alpha(actor, prior, 1e-9)) < 1e-3


def test_per_state_selector(key):
    actor, prior = _rand_pair(key, n=16)
    budget = 0.2
    alphas = P.kl_budget_alpha_per_state(actor, prior, budget)
    assert alphas.shape == (16,)
    kl = P.poe_kl_to_actor(actor, prior, alphas)
    assert np.all(np.asarray(kl) <= budget * (1 + 1e-5))
    bumped = jnp.minimum(alphas + 1e-4, 1.0)
    kl_b = np.asarray(P.poe_kl_to_actor(actor, prior, bumped))
    inner = np.asarray(alphas) < 1.0
    assert np.all(kl_b[inner] > budget)


def test_selectors_trace_once(key):
    actor, prior = _rand_pair(key, n=8)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def select(actor, prior, budget):
        return (
            P.kl_budget_alpha(actor, prior, budget),
            P.kl_budget_alpha_per_state(actor, prior, budget),
            P.poe(actor, prior, 0.5).mean,
        )

    for b in (0.1, 0.2, 0.3):
        jax.block_until_ready(select(actor, prior, jnp.float32(b)))


def test_additive_and_prior_only():
    a = P.DiagGaussian(jnp.zeros((3, 2)), 0.01 * jnp.ones((3, 2)))
    p = P.DiagGaussian(jnp.ones((3, 2)), 100.0 * jnp.ones((3, 2)))
    # Additive ignores confidence: halfway regardless of the prior's huge std.
    np.testing.assert_allclose(P.additive(a, p, 0.5).mean, 0.5, rtol=1e-6)
    np.testing.assert_allclose(P.poe(a, p, 0.5).mean, 0.0, atol=1e-6)
    np.testing.assert_allclose(P.prior_only(a, p).mean, p.mean)
    np.testing.assert_allclose(P.additive(a, p, 1.0).mean, p.mean)
    np.testing.assert_allclose(
        P.squash(P.DiagGaussian(jnp.array([0.0, 100.0]), jnp.ones(2))), [0.0, 1.0]
    )


def test_bad_input():
    a = P.DiagGaussian(jnp.zeros(2), jnp.ones(2))
    p = P.DiagGaussian(jnp.ones(2), jnp.ones(2))
    with pytest.raises(ValueError, match="alpha"):
        P.poe(a, p, 1.5)
    with pytest.raises(ValueError, match="alpha"):
        P.additive(a, p, -0.1)
    with pytest.raises(ValueError, match="std"):
        P.poe(a, P.DiagGaussian(jnp.ones(2), jnp.array([1.0, 0.0])), 0.5)
    with pytest.raises(ValueError, match="action dimension"):
        P.poe(a, P.DiagGaussian(jnp.ones(3), jnp.ones(3)), 0.5)
    with pytest.raises(ValueError, match="mean"):
        P.poe(P.DiagGaussian(jnp.array([jnp.nan, 0.0]), jnp.ones(2)), p, 0.5)
    with pytest.raises(ValueError, match="beta"):
        P.kl_regularised(a, p, -1.0)
    for bad in (0.0, -0.5):
        with pytest.raises(ValueError, match="budget"):
            P.kl_budget_alpha(
                P.DiagGaussian(a.mean[None], a.std[None]),
                P.DiagGaussian(p.mean[None], p.std[None]),
                bad,
            )
    with pytest.raises(ValueError, match="budget"):
        P.kl_budget_alpha_per_state(
            P.DiagGaussian(a.mean[None], a.std[None]),
            P.DiagGaussian(p.mean[None], p.std[None]),
            -0.5,
        )
    batch_a = P.DiagGaussian(a.mean[None], a.std[None])
    batch_p = P.DiagGaussian(p.mean[None], p.std[None])
    with pytest.raises(ValueError, match="weights"):
        P.kl_budget_alpha(batch_a, batch_p, 0.5, weights=jnp.zeros(1))
    with pytest.raises(TypeError, match="DiagGaussian"):
        P.poe((a.mean, a.std), p, 0.5)
