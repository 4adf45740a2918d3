"""Deciding a study: spaces, disjoint splits, the paired bootstrap, the verdict rule, spreads."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hexad import policy


def test_spaces_and_actions():
    assert policy.check_space("pretanh") == "pretanh"
    with pytest.raises(ValueError, match="space"):
        policy.check_space("logit")
    net = policy.actor_for_space("action", 2, (4,))
    assert not net.squash and not net.state_dependent_std
    assert policy.actor_for_space("pretanh", 2, (4,)).squash
    m = jnp.array([[3.0, -0.5], [3.0, -0.5]])
    out = policy.deterministic_action(m, jnp.array([True, False]))
    np.testing.assert_allclose(out, [[np.tanh(3.0), np.tanh(-0.5)], [1.0, -0.5]], rtol=1e-6)


def test_check_disjoint():
    policy.check_disjoint(np.arange(3), np.arange(3, 6))
    with pytest.raises(ValueError, match="select_seeds"):
        policy.check_disjoint(np.arange(3), np.arange(2, 6))


def test_paired_bootstrap_covers_a_known_mean():
    # 200 replicate data sets of 40 N(0.3, 1) differences in 2 strata: the 95% percentile
    # interval covers 0.3 in about 95% of them; with 200 replicates the binomial sd of the
    # coverage is 1.5%, so [0.88, 0.99] is more than 4 sd wide on either side.
    rng = np.random.default_rng(0)
    strata = np.repeat([0, 1], 20)
    hits = 0
    for i in range(200):
        d = 0.3 + rng.standard_normal(40)
        m, lo, hi = policy.paired_bootstrap_ci(d, strata, 500, seed=i)
        assert lo <= m <= hi and m == pytest.approx(d.mean())
        hits += lo <= 0.3 <= hi
    assert 0.88 <= hits / 200 <= 0.99
    with pytest.raises(ValueError, match="diffs"):
        policy.paired_bootstrap_ci(np.array([np.nan]))
    with pytest.raises(ValueError, match="strata"):
        policy.paired_bootstrap_ci(np.ones(3), np.zeros(2))


def test_verdict_rule():
    bad = [(-5.0, -6.0, -4.0)]
    assert policy.verdict((0.0, -0.5, 0.5), 1.0, bad) == "holds"
    assert policy.verdict((0.0, -1.5, 0.5), 1.0, bad) == "undecided"  # straddles -margin
    assert policy.verdict((0.0, -0.5, 0.5), 1.0, [(-1.0, -2.0, 0.0)]) == "undecided"
    assert policy.verdict((-3.0, -4.0, -2.0), 1.0, bad) == "fails"
    with pytest.raises(ValueError, match="margin"):
        policy.verdict((0.0, 0.0, 0.0), -1.0)


def test_spreads():
    a = policy.DiagGaussian(jnp.zeros((3, 2)), jnp.full((3, 2), 2.0))
    p = policy.DiagGaussian(jnp.zeros((3, 2)), jnp.full((3, 2), 0.5))
    np.testing.assert_allclose(policy.precision_ratio(a, p), 16.0)
    assert policy.std_quantiles(a) == [2.0, 2.0, 2.0]


def test_mean_only_kl_is_the_mean_part_and_its_selector_is_looser(key):
    ka, kb, kc, kd = jax.random.split(key, 4)
    a = policy.DiagGaussian(jax.random.normal(ka, (50, 3)), jnp.exp(jax.random.normal(kb, (50, 3))))
    p = policy.DiagGaussian(jax.random.normal(kc, (50, 3)), jnp.exp(jax.random.normal(kd, (50, 3))))
    for al in (0.0, 0.3, 0.9):
        c = policy.poe(a, p, al)
        want = 0.5 * jnp.sum(jnp.square((c.mean - a.mean) / a.std), -1)
        np.testing.assert_allclose(policy.poe_mean_kl_to_actor(a, p, al), want, rtol=1e-5)
        assert bool(jnp.all(want <= policy.poe_kl_to_actor(a, p, al) + 1e-6))
    for b in (0.05, 0.5):
        full = float(policy.kl_budget_alpha(a, p, b))
        mean = float(policy.kl_budget_alpha(a, p, b, mean_only=True))
        assert mean >= full
        assert float(policy.poe_mean_kl_to_actor(a, p, mean).mean()) <= b * (1 + 1e-5)
        per = policy.kl_budget_alpha_per_state(a, p, b, mean_only=True)
        assert bool(jnp.all(policy.poe_mean_kl_to_actor(a, p, per) <= b * (1 + 1e-5)))
