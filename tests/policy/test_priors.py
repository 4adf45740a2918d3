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
