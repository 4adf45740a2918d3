"""Setting up a study: spaces, disjoint splits, precision ratios; the KL budget's reward-free
calibration and the mean-only KL selector."""

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


def test_precision_ratio():
    a = policy.DiagGaussian(jnp.zeros((3, 2)), jnp.full((3, 2), 2.0))
    p = policy.DiagGaussian(jnp.zeros((3, 2)), jnp.full((3, 2), 0.5))
    np.testing.assert_allclose(policy.precision_ratio(a, p), 16.0)


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


def test_the_calibrated_budget_is_the_actors_own_between_state_kl():
    # State-independent std s and means m_i: the pair (i, i + n/2) has KL (m_j - m_i)^2 / 2s^2
    # per dimension. Means 0, 1, 3, 7 (n = 4, pairs 0-2, 1-3, 2-0, 3-1) with s = 2 on one
    # dimension: KLs 9/8, 36/8, 9/8, 36/8, median 22.5/8; times fraction 0.4 -> 1.125.
    m = jnp.array([[0.0], [1.0], [3.0], [7.0]])
    a = policy.DiagGaussian(m, jnp.full((4, 1), 2.0))
    assert float(policy.calibrate_kl_budget(a, 0.4)) == pytest.approx(0.4 * 22.5 / 8, rel=1e-6)
    # The same actor in other action units (an affine map of the actions scales means and
    # stds alike): the budget, in nats, does not change.
    b = policy.DiagGaussian(3.0 * m + 1.0, jnp.full((4, 1), 6.0))
    assert float(policy.calibrate_kl_budget(b, 0.4)) == pytest.approx(0.4 * 22.5 / 8, rel=1e-6)
    # and it scales with the fraction
    assert float(policy.calibrate_kl_budget(a, 0.8)) == pytest.approx(0.8 * 22.5 / 8, rel=1e-6)


def test_the_budget_calibration_reads_no_reward(key):
    import inspect

    # Its signature cannot take a reward (nor a data set or a prior): only the actor's
    # Gaussians at the data's states and the fraction.
    assert list(inspect.signature(policy.calibrate_kl_budget).parameters) == ["actor", "fraction"]
    # From a data set to a budget, as a study does it: replacing the data set's rewards by
    # anything leaves the budget unchanged, bit for bit.
    ko, ka, kr, kn = jax.random.split(key, 4)
    obs = jax.random.normal(ko, (64, 3))
    batch = policy.Batch(obs, jnp.tanh(jax.random.normal(ka, (64, 2))), jnp.zeros(64), obs,
                         jnp.zeros(64))  # fmt: skip
    net = policy.GaussianActor(2, (8,))
    params = net.init(kn, obs[:1])

    def budget(data):
        return float(policy.calibrate_kl_budget(net.apply(params, data.observations), 0.5))

    noisy = batch._replace(rewards=jax.random.normal(kr, (64,)) * 100.0)
    assert budget(batch) == budget(noisy) == budget(batch._replace(rewards=-batch.rewards + 7))
    assert budget(batch) > 0


def test_the_budget_calibration_rejects_bad_input():
    a = policy.DiagGaussian(jnp.array([[0.0], [1.0]]), jnp.ones((2, 1)))
    for bad in (0.0, -1.0, float("nan"), float("inf"), True, "half"):
        with pytest.raises(ValueError, match="^fraction"):
            policy.calibrate_kl_budget(a, bad)
    with pytest.raises(ValueError, match="^actor"):  # one state: no pair
        policy.calibrate_kl_budget(policy.DiagGaussian(jnp.zeros((1, 1)), jnp.ones((1, 1))))
    with pytest.raises(ValueError, match="^actor"):  # the same Gaussian everywhere: KL 0
        policy.calibrate_kl_budget(policy.DiagGaussian(jnp.zeros((4, 2)), jnp.ones((4, 2))))
    with pytest.raises(ValueError, match="std"):  # a non-finite precision (std 0)
        policy.calibrate_kl_budget(policy.DiagGaussian(jnp.zeros((2, 1)), jnp.zeros((2, 1))))
    # the selector itself refuses a budget <= 0, naming it
    with pytest.raises(ValueError, match="^budget"):
        policy.kl_budget_alpha(a, a, 0.0)


def test_the_calibrated_budget_runs_under_jit():
    a = policy.DiagGaussian(jnp.array([[0.0], [1.0], [3.0], [7.0]]), jnp.full((4, 1), 2.0))
    got = jax.jit(lambda g: policy.calibrate_kl_budget(g, 0.4))(a)
    assert float(got) == pytest.approx(0.4 * 22.5 / 8, rel=1e-6)
