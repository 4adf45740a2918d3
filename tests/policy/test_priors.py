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
