"""AntMaze data: command features, the planner's command, a resumable controller, D4RL fields.

No real controller is trained here (that takes about 30 min): a tiny SAC run checks the
chunked training and its resume, and the data checks use that tiny (untrained) controller.
"""

import shutil

import jax
import numpy as np
import pytest

from hexad.data import _antmaze as A
from hexad.data import offline_rl as D

TINY = dict(
    total_steps=64,
    chunk_steps=32,
    n_envs=4,
    start_steps=16,
    batch_size=8,
    hidden=8,
    episode_steps=5,  # every env times out in the same step: info then has no x_velocity
    command_every=3,
)


@pytest.fixture(scope="module")
def tiny_controller(tmp_path_factory):
    root = tmp_path_factory.mktemp("ant")
    before = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)  # compile-bound
    try:
        full = A.train_ant_controller(directory=root / "full", **TINY)
        # An interrupted run: the second chunk's checkpoint is lost, so a rerun resumes there.
        part = A.train_ant_controller(directory=root / "part", **TINY)
        shutil.rmtree(root / "part" / "steps" / "1")
        resumed = A.train_ant_controller(directory=root / "part", **TINY)
    finally:
        jax.config.update("jax_disable_most_optimizations", before)
    return root, full, part, resumed


def test_command_features_closed_form():
    rng = np.random.default_rng(0)
    yaw, cmd = rng.uniform(-np.pi, np.pi, 16), rng.uniform(-np.pi, np.pi, 16)
    obs = rng.normal(size=(16, 27))
    obs[:, 1:5] = np.stack([np.cos(yaw / 2), 0 * yaw, 0 * yaw, np.sin(yaw / 2)], 1)  # yaw-only
    f = A.ant_command_features(obs, cmd)
    assert f.shape == (16, 29) and f.dtype == np.float32
    np.testing.assert_allclose(f[:, :27], obs, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(f[:, 27], np.cos(cmd - yaw), atol=1e-6)
    np.testing.assert_allclose(f[:, 28], np.sin(cmd - yaw), atol=1e-6)
    with pytest.raises(ValueError, match="obs, command"):
        A.ant_command_features(obs[:, :26], cmd)


def test_oracle_commands_the_next_waypoint(monkeypatch):
    # Replace the controller by "return the command features", so the oracle's output is
    # (cos, sin) of the commanded direction relative to the torso's yaw (0 here).
    monkeypatch.setattr(A, "_mean_action", lambda hidden: lambda p, o: o[:, -2:])
    geom = A.antmaze_geometry()
    start, goal = geom.cell_center((1, 1)), geom.cell_center((3, 1))
    np.testing.assert_allclose(start, [-4.0, 4.0])
    obs = np.zeros((3, 29))
    obs[:, 3] = 1.0  # identity quaternion
    obs[0, :2] = start  # top-left: walk east along the top of the U
    obs[1, :2] = geom.cell_center((1, 3))  # top-right: walk south
    obs[2, :2] = goal + np.array([1.0, 0.0])  # in the goal's cell: walk straight to the goal
    act = A.antmaze_oracle({"params": None, "hidden": 8}, obs, np.tile(goal, (3, 1)), geom)
    np.testing.assert_allclose(act, [[1.0, 0.0], [0.0, -1.0], [-1.0, 0.0]], atol=1e-12)
    with pytest.raises(ValueError, match="obs"):
        A.antmaze_oracle({"params": None, "hidden": 8}, obs[:, :27], goal[None])


def test_controller_resume_is_exact(tiny_controller):
    _, full, _, resumed = tiny_controller
    same = jax.tree.map(lambda x, y: np.array_equal(x, y), full["params"], resumed["params"])
    assert all(jax.tree.leaves(same))
    np.testing.assert_array_equal(full["curve"][:, 0], [32, 64])
    np.testing.assert_array_equal(full["curve"][:, :2], resumed["curve"][:, :2])


def test_controller_cache_and_refusals(tiny_controller):
    root, full, _, _ = tiny_controller
    again = A.train_ant_controller(directory=root / "full", **TINY)  # loads, trains nothing
    np.testing.assert_array_equal(again["curve"], full["curve"])
    with pytest.raises(ValueError, match="directory"):
        A.train_ant_controller(directory=root / "full", **(TINY | {"hidden": 16}))
    with pytest.raises(ValueError, match="chunk_steps"):
        A.train_ant_controller(directory=root / "x", **(TINY | {"chunk_steps": 30}))
    with pytest.raises(ValueError, match="n_envs"):
        A.train_ant_controller(directory=root / "x", **(TINY | {"n_envs": 0}))


def test_generated_fields_are_consistent(tiny_controller):
    full = tiny_controller[1]
    n = 300
    d = A.generate_antmaze(full, n, seed=2, n_envs=2, episode_steps=100)
    assert d["observations"].shape == (n, 29) and d["actions"].shape == (n, 8)
    assert d["infos/qpos"].shape == (n, 15) and d["infos/qvel"].shape == (n, 14)
    np.testing.assert_array_equal(d["infos/qpos"][:, :2], d["observations"][:, :2])
    assert np.all(np.abs(d["actions"]) <= 1.0) and np.all(d["terminals"] == 0)
    cont = d["timeouts"][:-1] == 0
    np.testing.assert_allclose(d["next_observations"][:-1][cont], d["observations"][1:][cont])
    assert d["timeouts"].sum() >= 2  # the two env streams, and their 100-step episodes
    dist = np.linalg.norm(d["next_observations"][:, :2] - d["task_goal"][None], axis=-1)
    np.testing.assert_array_equal(d["rewards"], (dist <= 0.5).astype(np.float32))
    geom = A.antmaze_geometry()
    assert np.all(geom.is_free(d["infos/goal"])) and np.all(geom.is_free(d["observations"][:, :2]))
    D.save_offline_rl(tiny_controller[0] / "am.npz", d)  # passes the D4RL checks
    with pytest.raises(ValueError, match="random_action_frac"):
        A.generate_antmaze(full, 10, random_action_frac=2.0)


def test_evaluate_antmaze_success_is_reaching():
    goals = np.array([[-4.0, -4.0], [-4.0, 4.0]])  # far end of the U; the start cell's centre
    res = A.evaluate_antmaze(
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
        A.evaluate_antmaze(lambda o, g, s: o, goals[:1], np.zeros((2, 1)), np.arange(2))


def test_upside_down_ends_episodes(tiny_controller, monkeypatch, tmp_path):
    q = np.zeros((2, 27))
    q[0, 1] = 1.0  # identity: upright
    q[1, 2] = 1.0  # half a turn about the x axis: on its back
    np.testing.assert_allclose(A.upright(q), [1.0, -1.0])
    monkeypatch.setattr(A, "upright", lambda o: -np.ones(o.shape[0]))  # always on its back
    # Training: every step ends its episode (a termination) and resets that env alone.
    out = A.train_ant_controller(directory=tmp_path / "c", **TINY)
    np.testing.assert_array_equal(out["curve"][:, 3], [32, 32])
    # Data: every step ends its episode as a timeout (never a terminal).
    d = A.generate_antmaze(tiny_controller[1], 40, seed=1, n_envs=2, episode_steps=100)
    assert np.all(d["timeouts"] == 1) and np.all(d["terminals"] == 0)
    d = A.generate_antmaze(tiny_controller[1], 40, seed=1, n_envs=2, reset_flipped=False)
    assert d["timeouts"].sum() == 2  # the two env streams' ends only
    with pytest.raises(ValueError, match="controller settings"):
        A.antmaze_dataset(10, controller_kwargs={"widht": 8}, path=tmp_path / "x.npz")
