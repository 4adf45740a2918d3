"""Locomotion offline data from SAC behaviour policies: D4RL fields, levels, caching."""

import numpy as np
import pytest

from hexad.data import offline_rl as D


@pytest.fixture(scope="module")
def levels(tiny_hopper_cache):
    root, data, _ = tiny_hopper_cache
    return root / "offline_rl", data


def test_levels_fields_and_consistency(levels):
    _, data = levels
    for lv, d in data.items():
        n = d["observations"].shape[0]
        assert d["observations"].shape[1] == 11 and d["actions"].shape == (n, 3)
        for k in ("rewards", "terminals", "timeouts", "infos/x_velocity"):
            assert d[k].shape == (n,), (lv, k)
        assert np.all(np.abs(d["actions"]) <= 1.0)
        # A step is never both terminal and a timeout; every trajectory ends in one of them.
        assert not np.any((d["terminals"] > 0) & (d["timeouts"] > 0))
        assert d["terminals"][-1] + d["timeouts"][-1] == 1.0
        # next_observations[t] == observations[t + 1] inside a trajectory.
        cont = (d["terminals"][:-1] + d["timeouts"][:-1]) == 0
        np.testing.assert_allclose(d["next_observations"][:-1][cont], d["observations"][1:][cont])
        # Hopper's reward: healthy bonus + forward reward + control cost (<= 0).
        ctrl = d["rewards"] - 1.0 - d["infos/reward_forward"]
        assert np.all(ctrl <= 1e-5)
        np.testing.assert_allclose(d["infos/reward_forward"], d["infos/x_velocity"], rtol=1e-5)
        assert 0 <= float(d["meta/snapshot_step"]) <= 32
    assert data["random"]["meta/snapshot_step"] == 0
    assert data["expert"]["meta/policy_return"] == data["expert"]["meta/expert_return"]
    # medium-replay is the replay buffer up to the medium snapshot (uniform actions first).
    # (at least one vector step of the 4 envs when the medium snapshot is the initial one).
    rows = data["medium-replay"]["observations"].shape[0]
    assert rows == max(int(data["medium"]["meta/snapshot_step"]), 4)


def test_cached_and_refusals(levels, tmp_path, tiny_hopper_cache):
    folder, data = levels
    kw = tiny_hopper_cache[2]
    again = D.locomotion_dataset("Hopper-v5", "medium", path_dir=folder, **kw)  # no retraining
    np.testing.assert_array_equal(again["actions"], data["medium"]["actions"])
    with pytest.raises(ValueError, match="level"):
        D.locomotion_dataset("Hopper-v5", "medium-expert", path_dir=folder, **kw)
    with pytest.raises(ValueError, match="env_id"):
        D.locomotion_dataset("Walker2d-v4", "medium", path_dir=folder, **kw)
    bad = {k: v for k, v in data["medium"].items() if k != "terminals"}
    np.savez(tmp_path / "bad.npz", **bad)
    with pytest.raises(ValueError, match="terminals"):
        D.load_offline_rl(tmp_path / "bad.npz")


def test_evaluate_locomotion_shifted_reward():
    # A zero-action policy on HalfCheetah: the shifted return is -sum |v - v*| exactly
    # (zero control cost), and the mean velocity is the same episode's.
    res = D.evaluate_locomotion(
        lambda o, s: np.zeros((o.shape[0], 6)),
        "HalfCheetah-v5",
        np.zeros((2, 1)),
        np.arange(2),
        n_envs=2,
        episode_steps=20,
        target_velocity=1.0,
    )
    assert np.all(res["length"] == 20)
    # It barely moves: max |v| over 2 episodes, measured over 20 seed pairs (MuJoCo, no XLA):
    # mean 0.039, sd 0.017, max 0.071 (these seeds 0.011).
    assert np.all(np.abs(res["velocity"]) < 0.5)
    # |v - 1| = 1 - v when |v| < 1: shifted return = -(20 - 20 mean v).
    np.testing.assert_allclose(res["shifted_return"], -(20 - 20 * res["velocity"]), rtol=1e-5)


def test_walker2d_shifted_reward_keeps_healthy_bonus():
    # Walker2d-v5 is one of the tasks; standing limp for a few steps it stays healthy, and the
    # shifted reward is healthy bonus (1) + control cost (0) - |v - v*| per step. With v* = -10
    # and |v| < 10, |v - v*| = v + 10, so the return is -9 L - L mean(v) exactly.
    assert "Walker2d-v5" in D.LOCOMOTION_ENVS
    res = D.evaluate_locomotion(
        lambda o, s: np.zeros((o.shape[0], 6)),
        "Walker2d-v5",
        np.zeros((1, 1)),
        np.arange(1),
        n_envs=1,
        episode_steps=5,
        target_velocity=-10.0,
    )
    n = res["length"]
    assert np.all(n == 5)
    np.testing.assert_allclose(res["shifted_return"], -9.0 * n - n * res["velocity"], rtol=1e-5)
