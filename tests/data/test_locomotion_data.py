"""Locomotion offline data: D4RL fields and levels of hexad.policy.locomotion_dataset, caching,
refusals, level selection, collection and the shifted-reward evaluation."""

import jax
import numpy as np
import pytest

from hexad import policy as P
from hexad.data import offline_rl as D

# With 32 online steps and SAC's batch of 256 no update runs here; SAC's update is tested in
# tests/policy, and updates inside the online loop in tests/policy/test_behaviour.py.
TINY_HOPPER = dict(
    total_steps=32,
    hidden=8,
    n_per_level=64,
    start_steps=16,
    snapshot_every=16,
    eval_steps=10,
)


@pytest.fixture(scope="module")
def levels(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hexad_cache") / "offline_rl"
    before = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)  # compile-bound
    try:
        data = {
            lv: P.locomotion_dataset("Hopper-v5", lv, path_dir=folder, **TINY_HOPPER)
            for lv in D.LOCOMOTION_LEVELS
        }
    finally:
        jax.config.update("jax_disable_most_optimizations", before)
    return folder, data


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
        assert d["meta/snapshot_returns"].shape == (3,)  # steps 0, 16, 32
    assert data["random"]["meta/snapshot_step"] == 0
    assert data["expert"]["meta/policy_return"] == data["expert"]["meta/expert_return"]
    assert data["expert"]["meta/expert_return"] == data["expert"]["meta/snapshot_returns"].max()
    # medium-replay is the replay buffer up to the medium snapshot (uniform actions first).
    # (at least one vector step of the 4 envs when the medium snapshot is the initial one).
    rows = data["medium-replay"]["observations"].shape[0]
    assert rows == max(int(data["medium"]["meta/snapshot_step"]), 4)


def test_cached_and_refusals(levels, tmp_path):
    folder, data = levels
    again = P.locomotion_dataset("Hopper-v5", "medium", path_dir=folder, **TINY_HOPPER)
    np.testing.assert_array_equal(again["actions"], data["medium"]["actions"])
    with pytest.raises(ValueError, match="level"):
        P.locomotion_dataset("Hopper-v5", "medium-expert", path_dir=folder, **TINY_HOPPER)
    with pytest.raises(ValueError, match="env_id"):
        P.locomotion_dataset("Walker2d-v4", "medium", path_dir=folder, **TINY_HOPPER)
    with pytest.raises(ValueError, match="snapshot_every"):
        P.generate_locomotion("Hopper-v5", 32, snapshot_every=6)
    bad = {k: v for k, v in data["medium"].items() if k != "terminals"}
    np.savez(tmp_path / "bad.npz", **bad)
    with pytest.raises(ValueError, match="terminals"):
        D.load_offline_rl(tmp_path / "bad.npz")


def test_locomotion_levels_rule():
    # random is the first snapshot, expert the best, medium the earliest snapshot up to the
    # expert at least a third of the way from random to expert: here 0 + 9 / 3 = 3.
    assert D.locomotion_levels([0.0, 2.0, 3.0, 9.0, 4.0]) == {
        "random": 0,
        "medium": 2,
        "expert": 3,
    }
    assert D.locomotion_levels([5.0, 1.0]) == {"random": 0, "medium": 0, "expert": 0}
    with pytest.raises(ValueError, match="snapshot_returns"):
        D.locomotion_levels([])


def test_collect_locomotion_calls_the_policy_on_float32_observations():
    seen = []

    def policy(obs):
        seen.append(obs)
        return np.full((obs.shape[0], 3), 0.5, np.float32)

    d = D.collect_locomotion(policy, "Hopper-v5", 10, seed=3, n_envs=2, episode_steps=4)
    assert len(seen) == 5 and all(o.dtype == np.float32 and o.shape == (2, 11) for o in seen)
    assert d["observations"].shape == (10, 11) and np.all(d["actions"] == 0.5)
    # Env-major: env 0's five steps, then env 1's; the first rows are env 0's observations.
    np.testing.assert_array_equal(d["observations"][:5], np.stack([o[0] for o in seen]))


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
