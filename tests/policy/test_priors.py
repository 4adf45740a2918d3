"""Hindsight relabelling: trajectory ends, future goal indices, window means of future values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hexad import policy


def test_hindsight_mean_stops_at_the_trajectory_end():
    # Two trajectories: steps 0-2 (terminal at 2) and 3-5 (timeout at 5).
    ends = policy.trajectory_ends(np.array([0, 0, 1, 0, 0, 0]), np.array([0, 0, 0, 0, 0, 1]))
    v = np.array([1.0, 2.0, 4.0, 10.0, 20.0, 40.0])
    got = policy.hindsight_mean(v, ends, 2)
    # [1, 2], [2, 4], [4] (end), [10, 20], [20, 40], [40] (end)
    np.testing.assert_array_equal(got, np.float32([1.5, 3.0, 4.0, 15.0, 30.0, 40.0]))
    assert got.dtype == np.float32
    # A horizon past every end: the mean of the rest of each trajectory.
    np.testing.assert_allclose(
        policy.hindsight_mean(v, ends, 100), [7 / 3, 3.0, 4.0, 70 / 3, 30.0, 40.0], rtol=1e-6
    )
    # Horizon 1 is the value itself.
    np.testing.assert_array_equal(policy.hindsight_mean(v, ends, 1), v.astype(np.float32))


def test_hindsight_mean_validates():
    ends = np.array([1, 1])
    with pytest.raises(ValueError, match="horizon"):
        policy.hindsight_mean(np.zeros(2), ends, 0)
    with pytest.raises(ValueError, match="ends"):
        policy.hindsight_mean(np.zeros(2), np.array([0, 0]), 2)  # e_1 < 1
    with pytest.raises(ValueError, match="values"):
        policy.hindsight_mean(np.zeros((2, 1)), ends, 2)


def test_future_goal_indices_stay_in_their_trajectory():
    ends = policy.trajectory_ends(np.array([0, 0, 1, 0, 0]), np.array([0, 0, 0, 0, 1]))
    np.testing.assert_array_equal(ends, [2, 2, 2, 4, 4])
    idx = np.asarray(policy.future_goal_indices(jax.random.key(0), jnp.asarray(ends)))
    i = np.arange(5)
    assert np.all((idx >= i) & (idx <= ends))


def test_goal_conditioned_appends_the_goal_to_both_observations():
    b = policy.Batch(
        jnp.arange(6.0).reshape(3, 2),
        jnp.zeros((3, 1)),
        jnp.array([1.0, 2.0, 3.0]),
        10 + jnp.arange(6.0).reshape(3, 2),
        jnp.array([0.0, 0.0, 1.0]),
    )
    g = jnp.array([[7.0], [8.0], [9.0]])
    out = policy.goal_conditioned(b, g)
    np.testing.assert_array_equal(out.observations, [[0, 1, 7], [2, 3, 8], [4, 5, 9]])
    np.testing.assert_array_equal(out.next_observations, [[10, 11, 7], [12, 13, 8], [14, 15, 9]])
    np.testing.assert_array_equal(out.rewards, b.rewards)
    np.testing.assert_array_equal(out.terminals, b.terminals)
    np.testing.assert_array_equal(policy.goal_conditioned(b, g, -b.rewards).rewards, -b.rewards)
    with pytest.raises(ValueError, match="goals"):
        policy.goal_conditioned(b, g[:2])
    with pytest.raises(ValueError, match="rewards"):
        policy.goal_conditioned(b, g, jnp.zeros(2))


def test_velocity_goals_are_hindsight_means_of_the_x_velocity():
    rng = np.random.default_rng(0)
    d = {
        "infos/x_velocity": rng.normal(size=12).astype(np.float32),
        "terminals": np.zeros(12),
        "timeouts": (np.arange(12) % 4 == 3).astype(float),
    }
    vg = policy.velocity_goals(d, 3, eps=0.5)
    ends = policy.trajectory_ends(d["terminals"], d["timeouts"])
    want = policy.hindsight_mean(d["infos/x_velocity"], ends, 3)
    np.testing.assert_array_equal(vg.goals, want)
    assert vg.scale == pytest.approx(float(np.std(want)) + 0.5, rel=1e-6)
    # The network input v / scale: [..., 1] float32, scalars and grids alike.
    np.testing.assert_allclose(vg.inputs(vg.goals)[:, 0], want / vg.scale, rtol=1e-6)
    assert vg.inputs(2.0).shape == (1,) and vg.inputs(2.0).dtype == jnp.float32
    assert float(vg.inputs(2.0)[0]) == np.float32(2.0 / vg.scale)
    with pytest.raises(ValueError, match="eps"):
        policy.velocity_goals(d, 3, eps=-1.0)
    with pytest.raises(ValueError, match="horizon"):
        policy.velocity_goals(d, 0)


def test_shuffled_goals_keep_the_data_goals_but_move_them_across_trajectories():
    # Four trajectories of lengths 2, 3, 1, 2, each with its own constant goal.
    ends = policy.trajectory_ends(np.array([0, 1, 0, 0, 1, 1, 0, 1]), np.zeros(8))
    goals = np.repeat(np.arange(4.0), [2, 3, 1, 2])[:, None]
    got = policy.shuffle_goals_across_trajectories(jax.random.key(3), goals, ends)[:, 0]
    # Each trajectory still holds one constant goal, and each source goal is used once.
    segs = np.split(got, [2, 5, 6])
    assert all(np.all(s == s[0]) for s in segs)
    assert sorted(s[0] for s in segs) == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="goals"):
        policy.shuffle_goals_across_trajectories(jax.random.key(0), np.zeros(8), ends)


def test_make_prior_kinds():
    net = policy.GaussianActor(2, (8,))
    x = jax.random.normal(jax.random.key(0), (32, 3))
    good = net.init(jax.random.key(1), x[:1])
    g = net.apply(good, x)
    key = jax.random.key(2)

    def make(kind, **kw):
        return policy.make_prior(kind, net, good, key, x[:1], **kw)(x)

    np.testing.assert_array_equal(make("good").mean, g.mean)
    # Output noise keeps (or triples) the good std and moves the mean by std * eps(x), the
    # same eps for both and a deterministic function of x.
    on, on3 = make("output_noise"), make("output_noise_x3")
    np.testing.assert_allclose(on.std, g.std, rtol=1e-6)
    np.testing.assert_allclose(on3.std, 3 * g.std, rtol=1e-6)
    np.testing.assert_allclose(on.mean, on3.mean, rtol=1e-6)
    eps = (on.mean - g.mean) / g.std
    np.testing.assert_allclose(eps, policy.state_noise(key, 3, 2)(x), rtol=1e-4, atol=1e-5)
    wide = make("random_wide", marginal_std=np.array([0.5, 2.0]))
    np.testing.assert_array_equal(wide.std, np.broadcast_to([0.5, 2.0], (32, 2)))
    np.testing.assert_array_equal(wide.mean, make("random_init").mean)
    other = net.init(jax.random.key(9), x[:1])
    np.testing.assert_array_equal(
        make("data_corrupted", corrupted_params=other).mean, net.apply(other, x).mean
    )
    assert not np.allclose(make("param_noise").mean, g.mean)
    with pytest.raises(ValueError, match="kind"):
        make("degraded")
    with pytest.raises(ValueError, match="corrupted_params"):
        make("data_corrupted")
    with pytest.raises(ValueError, match="marginal_std"):
        make("random_wide", marginal_std=np.array([0.0, 1.0]))


def test_state_noise_has_unit_variance_over_draws():
    # Var eps_j(x) = |v_j|^2 (2 / F) E cos^2 = |v_j|^2 / F, so 1 in expectation over V; over
    # 400 independent functions at one x the sample variance has sd about sqrt(2 / 400) ~ 0.07
    # (plus the spread of |v|^2 / F, F = 64): 0.25 is over 3 sd.
    x = jnp.ones((1, 3))
    vals = jnp.stack([policy.state_noise(jax.random.key(i), 3, 1)(x)[0, 0] for i in range(400)])
    assert abs(float(jnp.var(vals)) - 1.0) < 0.25


def test_return_range_scale():
    # Returns 3 and 10 over two trajectories: 1000 / 7.
    r, term = np.array([1.0, 2.0, 10.0]), np.array([0, 1, 0])
    assert policy.return_range_scale(r, term, np.zeros(3)) == pytest.approx(1000 / 7)
    with pytest.raises(ValueError, match="rewards"):
        policy.return_range_scale(np.ones(2), np.array([1, 0]), np.zeros(2))


def _actor(key, shape=(40, 3)):
    ka, kb = jax.random.split(key)
    return policy.DiagGaussian(jax.random.normal(ka, shape), jnp.exp(jax.random.normal(kb, shape)))


def test_the_precision_family_has_its_stated_ratio_in_closed_form(key):
    a = _actor(key)
    noise = policy.state_noise(jax.random.key(5), 4, 3)(jnp.ones((40, 4)) * jnp.arange(40)[:, None])
    means = []
    for r in policy.PRECISION_RATIOS:
        p = policy.precision_prior(a, noise, r, mean_error=2.0)
        # lam_P / lam_A = r at every state and dimension (float32 rounding only)
        np.testing.assert_allclose(policy.precision_ratio(a, p), r, rtol=1e-5)
        # the mean error is fixed across the family: mu_A + 2 s_A eps
        np.testing.assert_allclose(p.mean, a.mean + 2.0 * a.std * noise, rtol=1e-6)
        means.append(p.mean)
    assert all(bool(jnp.all(m == means[0])) for m in means)
    assert policy.PRECISION_RATIOS == (0.25, 0.5, 1.0, 2.0, 4.0)


def test_poe_against_additive_follows_the_precision_ratio(key):
    # PoE moves the actor's mean towards the prior's by w = alpha r / (alpha r + 1 - alpha),
    # additive by alpha: the same point at r = 1, less for r < 1, more for r > 1.
    a = _actor(key)
    noise = jnp.ones((40, 3))
    for r in policy.PRECISION_RATIOS:
        p = policy.precision_prior(a, noise, r, mean_error=1.0)
        for alpha in (0.3, 0.5, 0.8):
            w = policy.poe_prior_weight(alpha, r)
            step = p.mean - a.mean
            np.testing.assert_allclose(
                policy.poe(a, p, alpha).mean, a.mean + w * step, rtol=1e-4, atol=1e-5
            )
            np.testing.assert_allclose(
                policy.additive(a, p, alpha).mean, a.mean + alpha * step, rtol=1e-5, atol=1e-6
            )
            assert (w < alpha) == (r < 1) and (w > alpha) == (r > 1)
            if r == 1.0:
                assert w == pytest.approx(alpha)
    assert policy.poe_prior_weight(0.5, 0.25) == pytest.approx(0.2)
    assert policy.poe_prior_weight(0.5, 4.0) == pytest.approx(0.8)


def test_the_perturbation_control_keeps_the_priors_precision_and_step(key):
    a = _actor(key)
    good = _actor(jax.random.fold_in(key, 1))
    noise = jax.random.normal(jax.random.fold_in(key, 2), (40, 3))
    c = policy.perturbation_prior(a, good, noise)
    np.testing.assert_array_equal(c.std, good.std)  # the prior's precision exactly
    # the same step size per state and dimension as the prior's, in the noise's direction
    np.testing.assert_allclose(jnp.abs(c.mean - a.mean), jnp.abs(good.mean - a.mean), rtol=1e-5)
    moved = jnp.abs(good.mean - a.mean) > 1e-3
    np.testing.assert_array_equal(
        jnp.sign(c.mean - a.mean)[moved], jnp.where(noise >= 0, 1.0, -1.0)[moved]
    )
    # so PoE at any alpha moves the actor exactly as far as with the prior
    for alpha in (0.3, 0.7):
        np.testing.assert_allclose(
            jnp.abs(policy.poe(a, c, alpha).mean - a.mean),
            jnp.abs(policy.poe(a, good, alpha).mean - a.mean),
            rtol=1e-4,
            atol=1e-5,
        )


def test_the_families_reject_bad_input(key):
    a = _actor(key, (5, 2))
    z = jnp.ones((5, 2))
    # a prior or a noise of another action dimension
    other = policy.DiagGaussian(jnp.zeros((5, 3)), jnp.ones((5, 3)))
    with pytest.raises(ValueError, match="^prior: expected action dimension 2"):
        policy.perturbation_prior(a, other, z)
    with pytest.raises(ValueError, match="^noise"):
        policy.precision_prior(a, jnp.ones((5, 3)), 1.0)
    with pytest.raises(ValueError, match="^noise"):
        policy.perturbation_prior(a, a, jnp.ones((5, 3)))
    with pytest.raises(ValueError, match="^prior: expected action dimension 2"):
        policy.poe(a, other, 0.5)
    # a non-finite or non-positive precision
    for bad in (float("inf"), float("nan"), 0.0, -1.0, True):
        with pytest.raises(ValueError, match="^ratio"):
            policy.precision_prior(a, z, bad)
        with pytest.raises(ValueError, match="^ratio"):
            policy.poe_prior_weight(0.5, bad)
    with pytest.raises(ValueError, match="std"):  # a prior of infinite precision (std 0)
        policy.perturbation_prior(a, policy.DiagGaussian(a.mean, jnp.zeros((5, 2))), z)
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="^mean_error"):
            policy.precision_prior(a, z, 1.0, mean_error=bad)
    # alpha outside the open interval (0, 1), where PoE and additive coincide or mean nothing
    for bad in (0.0, 1.0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="^alpha"):
            policy.poe_prior_weight(bad, 1.0)
