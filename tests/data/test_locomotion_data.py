"""Locomotion offline data: D4RL fields and levels of hexad.policy.locomotion_dataset, caching,
refusals, level selection, collection, the tracking objective and the shifted-reward evaluation."""

import functools

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
    # (zero control cost), and the mean velocity is the same episode's. Each episode has its
    # own v*; three episodes on two environments, so the second batch wraps around.
    target = np.array([1.0, 2.0, 1.5])
    res = D.evaluate_locomotion(
        lambda o, s: np.zeros((o.shape[0], 6)),
        "HalfCheetah-v5",
        np.zeros((3, 1)),
        np.arange(3),
        n_envs=2,
        episode_steps=20,
        target_velocity=target,
    )
    assert np.all(res["length"] == 20)
    # It barely moves: max |v| over 2 episodes, measured over 20 seed pairs (MuJoCo, no XLA):
    # mean 0.039, sd 0.017, max 0.071 (these seeds 0.011).
    assert np.all(np.abs(res["velocity"]) < 0.5)
    # |v - v*| = v* - v when |v| < 1 <= v*: shifted return = -(20 v* - 20 mean v).
    want = -(20 * target - 20 * res["velocity"])
    np.testing.assert_allclose(res["shifted_return"], want, rtol=1e-5)
    with pytest.raises(ValueError, match="target_velocity"):
        D.evaluate_locomotion(
            lambda o, s: np.zeros((o.shape[0], 6)), "HalfCheetah-v5", np.zeros((3, 1)),
            np.arange(3), target_velocity=np.ones(2),
        )  # fmt: skip


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


def _steps(r, fwd, v):
    return {
        "rewards": np.asarray(r, np.float32),
        "infos/reward_forward": np.asarray(fwd, np.float32),
        "infos/x_velocity": np.asarray(v, np.float32),
    }


def test_tracking_reward_replaces_the_forward_term():
    # r = healthy 1 + forward v - control 0.25: the tracking reward is 1 - 0.25 - |v - v*|.
    v = np.array([0.0, 1.0, 2.5])
    d = _steps(1.0 + v - 0.25, v, v)
    got = D.tracking_reward(d, 1.0)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, 0.75 - np.abs(v - 1.0), rtol=1e-6)
    # One target per transition (a hindsight goal each).
    np.testing.assert_allclose(D.tracking_reward(d, v), [0.75, 0.75, 0.75], rtol=1e-6)
    with pytest.raises(ValueError, match="target_velocity"):
        D.tracking_reward(d, np.zeros(2))
    with pytest.raises(ValueError, match="data"):
        D.tracking_reward(_steps([1.0], [1.0, 2.0], [1.0]), 0.0)


def test_velocity_features_make_each_grid_target_linear():
    # Tracking a grid velocity c_m is exactly phi_m + phi_M: the SF task weights are one-hot
    # plus the rest term, which is why SF + GPI can track any grid velocity without learning.
    rng = np.random.default_rng(0)
    v = rng.normal(size=50)
    d = _steps(1.0 + v - rng.uniform(0, 1, 50), v, v)
    grid = np.array([-0.5, 0.0, 1.25], np.float32)
    phi = D.velocity_features(d, grid)
    assert phi.shape == (50, 4) and phi.dtype == np.float32
    for m, c in enumerate(grid):
        np.testing.assert_allclose(phi[:, m] + phi[:, -1], D.tracking_reward(d, c), atol=1e-5)
    with pytest.raises(ValueError, match="grid"):
        D.velocity_features(d, grid[:, None])


def test_tracking_return_bound_is_the_healthy_bonus_per_step():
    # Checked against gymnasium's own default healthy_reward (HalfCheetah has none).
    import inspect

    import gymnasium as gym

    for env_id in D.LOCOMOTION_ENVS:
        env = gym.make(env_id)
        try:
            params = inspect.signature(type(env.unwrapped).__init__).parameters
        finally:
            env.close()
        healthy = params["healthy_reward"].default if "healthy_reward" in params else 0.0
        assert D.tracking_return_bound(env_id, 7) == 7 * healthy
    with pytest.raises(ValueError, match="env_id"):
        D.tracking_return_bound("Hopper-v4", 7)
    with pytest.raises(ValueError, match="episode_steps"):
        D.tracking_return_bound("Hopper-v5", 0)


def test_default_settings_name_the_same_cache_files(levels, monkeypatch):
    # Passing a generator default explicitly reads the files its omission wrote: generation
    # would raise here, so only a cache hit passes. A non-default value names other files.
    folder, data = levels
    from hexad.policy import _behaviour

    original = _behaviour.generate_locomotion

    @functools.wraps(original)
    def refuse(*args, **kwargs):
        raise AssertionError("generated instead of reading the cache")

    monkeypatch.setattr(_behaviour, "generate_locomotion", refuse)
    defaults = dict(lr=1e-3, n_envs=4, episode_steps=1000, n_eval_episodes=2)
    again = P.locomotion_dataset("Hopper-v5", "medium", path_dir=folder, **TINY_HOPPER, **defaults)
    np.testing.assert_array_equal(again["actions"], data["medium"]["actions"])
    with pytest.raises(AssertionError, match="generated"):
        P.locomotion_dataset("Hopper-v5", "medium", path_dir=folder, **TINY_HOPPER, lr=1e-2)
    with pytest.raises(TypeError, match="kwargs.*widht"):
        P.locomotion_dataset("Hopper-v5", "medium", path_dir=folder, **TINY_HOPPER, widht=8)
