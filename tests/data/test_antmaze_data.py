"""AntMaze data: command features, the planner's command, the controller's training env, D4RL
fields and evaluation. The controller is any callable here; the trained one is tested in
tests/policy/test_behaviour.py."""

import numpy as np
import pytest

from hexad.data import offline_rl as D
from hexad.data.offline_rl import _antmaze as A  # for monkeypatching the upright test

W = np.random.default_rng(0).normal(size=(29, 8)) / 10.0


def linear_controller(features):
    """A fixed untrained stand-in for the trained ant: tanh of a random linear map."""
    return np.tanh(features @ W)


def test_command_features_closed_form():
    rng = np.random.default_rng(0)
    yaw, cmd = rng.uniform(-np.pi, np.pi, 16), rng.uniform(-np.pi, np.pi, 16)
    obs = rng.normal(size=(16, 27))
    obs[:, 1:5] = np.stack([np.cos(yaw / 2), 0 * yaw, 0 * yaw, np.sin(yaw / 2)], 1)  # yaw-only
    f = D.ant_command_features(obs, cmd)
    assert f.shape == (16, 29) and f.dtype == np.float32
    np.testing.assert_allclose(f[:, :27], obs, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(f[:, 27], np.cos(cmd - yaw), atol=1e-6)
    np.testing.assert_allclose(f[:, 28], np.sin(cmd - yaw), atol=1e-6)
    with pytest.raises(ValueError, match="obs, command"):
        D.ant_command_features(obs[:, :26], cmd)


def test_oracle_commands_the_next_waypoint():
    # A controller that returns its command features: the oracle's output is (cos, sin) of the
    # commanded direction relative to the torso's yaw (0 here).
    geom = D.antmaze_geometry()
    start, goal = geom.cell_center((1, 1)), geom.cell_center((3, 1))
    np.testing.assert_allclose(start, [-4.0, 4.0])
    obs = np.zeros((3, 29))
    obs[:, 3] = 1.0  # identity quaternion
    obs[0, :2] = start  # top-left: walk east along the top of the U
    obs[1, :2] = geom.cell_center((1, 3))  # top-right: walk south
    obs[2, :2] = goal + np.array([1.0, 0.0])  # in the goal's cell: walk straight to the goal
    act = D.antmaze_oracle(lambda f: f[:, -2:], obs, np.tile(goal, (3, 1)), geom)
    np.testing.assert_allclose(act, [[1.0, 0.0], [0.0, -1.0], [-1.0, 0.0]], atol=1e-6)
    assert act.dtype == np.float64
    with pytest.raises(ValueError, match="obs"):
        D.antmaze_oracle(lambda f: f[:, -2:], obs[:, :27], goal[None])


def test_generated_fields_are_consistent(tmp_path):
    n = 300
    d = D.generate_antmaze(linear_controller, n, seed=2, n_envs=2, episode_steps=100)
    assert d["observations"].shape == (n, 29) and d["actions"].shape == (n, 8)
    assert d["infos/qpos"].shape == (n, 15) and d["infos/qvel"].shape == (n, 14)
    np.testing.assert_array_equal(d["infos/qpos"][:, :2], d["observations"][:, :2])
    assert np.all(np.abs(d["actions"]) <= 1.0) and np.all(d["terminals"] == 0)
    cont = d["timeouts"][:-1] == 0
    np.testing.assert_allclose(d["next_observations"][:-1][cont], d["observations"][1:][cont])
    assert d["timeouts"].sum() >= 2  # the two env streams, and their 100-step episodes
    dist = np.linalg.norm(d["next_observations"][:, :2] - d["task_goal"][None], axis=-1)
    np.testing.assert_array_equal(d["rewards"], (dist <= 0.5).astype(np.float32))
    geom = D.antmaze_geometry()
    assert np.all(geom.is_free(d["infos/goal"])) and np.all(geom.is_free(d["observations"][:, :2]))
    D.save_offline_rl(tmp_path / "am.npz", d)  # passes the D4RL checks
    with pytest.raises(ValueError, match="random_action_frac"):
        D.generate_antmaze(linear_controller, 10, random_action_frac=2.0)
    with pytest.raises(ValueError, match="noise_std"):
        D.generate_antmaze(linear_controller, 10, noise_std=-1.0)


def test_evaluate_antmaze_success_is_reaching():
    goals = np.array([[-4.0, -4.0], [-4.0, 4.0]])  # far end of the U; the start cell's centre
    res = D.evaluate_antmaze(
        lambda o, g, s: np.zeros((o.shape[0], 8)),
        goals,
        np.zeros((2, 1)),
        np.arange(2),
        n_envs=2,
        episode_steps=5,
    )
    # D4RL's antmaze criterion: success is reaching the goal at any step, not the final state.
    np.testing.assert_array_equal(res["success"], res["min_distance"] <= 0.45)
    assert np.all(res["min_distance"] <= res["final_distance"] + 1e-12)
    assert res["success"][0] == 0.0 and res["min_distance"][0] > 6.0
    assert res["final_distance"][1] < 1.5  # reset noise: up to 0.25 cells per axis
    with pytest.raises(ValueError, match="goals, specs, seeds"):
        D.evaluate_antmaze(lambda o, g, s: o, goals[:1], np.zeros((2, 1)), np.arange(2))


def test_command_env_reward_and_redraws():
    env = D.AntCommandEnv(3, 50, command_every=2, ctrl_cost=0.5)
    try:
        rng = np.random.default_rng(0)
        o = env.reset(rng)
        assert o.shape == (3, 29) and o.dtype == np.float32
        act = np.full((3, 8), 0.5, np.float32)
        cmds = []
        for _ in range(4):
            tr, o_next = env.step(rng, act)
            cmds.append(np.arctan2(tr["observations"][:, 28], tr["observations"][:, 27]))
            np.testing.assert_array_equal(tr["observations"], o)
            # reward = velocity along the command + healthy (1 - terminal) - ctrl_cost |a|^2
            want = tr["infos/command_velocity"] + (1.0 - tr["terminals"]) - 0.5 * 8 * 0.25
            np.testing.assert_allclose(tr["rewards"], want, rtol=1e-6)
            o = o_next
    finally:
        env.close()
    # The command (relative to the yaw) is kept for command_every = 2 steps, then redrawn: the
    # features of steps 0 and 1 share it up to the yaw's change in one step.
    assert np.all(np.abs(np.angle(np.exp(1j * (cmds[1] - cmds[0])))) < 0.2)


def test_upside_down_ends_episodes(monkeypatch):
    q = np.zeros((2, 27))
    q[0, 1] = 1.0  # identity: upright
    q[1, 2] = 1.0  # half a turn about the x axis: on its back
    np.testing.assert_allclose(D.upright(q), [1.0, -1.0])
    monkeypatch.setattr(A, "upright", lambda o: -np.ones(o.shape[0]))  # always on its back
    # The controller's env: every step ends its episode as a termination.
    env = D.AntCommandEnv(2, 100)
    try:
        rng = np.random.default_rng(0)
        env.reset(rng)
        for _ in range(3):
            tr, _ = env.step(rng, np.zeros((2, 8), np.float32))
            np.testing.assert_array_equal(tr["infos/flipped"], [1.0, 1.0])
            np.testing.assert_array_equal(tr["terminals"], [1.0, 1.0])
    finally:
        env.close()
    # Data: every step ends its episode as a timeout (never a terminal).
    d = D.generate_antmaze(linear_controller, 40, seed=1, n_envs=2, episode_steps=100)
    assert np.all(d["timeouts"] == 1) and np.all(d["terminals"] == 0)
    d = D.generate_antmaze(linear_controller, 40, seed=1, n_envs=2, reset_flipped=False)
    assert d["timeouts"].sum() == 2  # the two env streams' ends only
