"""PointMaze offline data and the shared pieces of hexad.data.offline_rl: the oracle reaches
goals, D4RL fields are consistent, npz round trip and refusals, cache names."""

import numpy as np
import pytest

from hexad.data import offline_rl as D


@pytest.fixture(scope="module")
def small():
    return D.generate_pointmaze(400, seed=3, n_envs=2, episode_steps=120)


def test_fields_and_consistency(small):
    d = small
    n = 400
    assert d["observations"].shape == (n, 4) and d["actions"].shape == (n, 2)
    for k in ("rewards", "terminals", "timeouts"):
        assert d[k].shape == (n,)
    assert d["infos/goal"].shape == (n, 2)
    assert np.all(np.abs(d["actions"]) <= 1.0)
    assert np.all(d["terminals"] == 0)  # mazes never terminate
    # next_observations[t] == observations[t + 1] except across a timeout.
    cont = d["timeouts"][:-1] == 0
    np.testing.assert_allclose(d["next_observations"][:-1][cont], d["observations"][1:][cont])
    # Sparse reward = next position within 0.5 of the task goal.
    dist = np.linalg.norm(d["next_observations"][:, :2] - d["task_goal"][None], axis=-1)
    np.testing.assert_array_equal(d["rewards"], (dist <= 0.5).astype(np.float32))
    # Positions stay inside the maze's outer walls.
    assert np.all(np.abs(d["observations"][:, :2]) < 2.0)


def test_oracle_reaches_goals():
    geom = D.MazeGeometry()
    goals = np.array([[-1.0, -1.0], [1.0, 0.0], [0.0, -1.0], [-1.0, 1.0]])
    res = D.evaluate_pointmaze(
        lambda o, g, s: D.pointmaze_oracle(geom, o, g),
        goals,
        np.zeros((4, 1)),
        np.arange(4),
        n_envs=4,
        episode_steps=250,
    )
    # The noiseless scripted oracle reaches every goal of the U from the far end and stays:
    # over 20 sets of 4 reset seeds (MuJoCo and numpy, no XLA) success 1 in all 80 episodes,
    # final distance at most 4e-8.
    assert np.all(res["success"] == 1.0)
    assert np.all(res["final_distance"] < 0.1)


def test_geometry():
    g = D.MazeGeometry()
    np.testing.assert_array_equal(g.cell_of(np.array([[-1.0, -1.0], [1.0, 0.0]])), [[3, 1], [2, 3]])
    assert not g.is_free(np.array([-1.0, 0.0]))  # the U's inner wall
    wp = g.waypoint(np.array([[-1.0, 1.0]]), np.array([[-1.0, -1.0]]))
    np.testing.assert_allclose(wp, [[0.0, 1.0]])  # first step of the path round the U
    goals = D.sample_free_goals(np.random.default_rng(0), (-1.0, -1.0), 1.0, 50)
    assert np.all(g.is_free(goals)) and np.all(np.linalg.norm(goals + 1.0, axis=1) <= 1.0)
    with pytest.raises(ValueError, match="maze_map"):
        D.MazeGeometry(np.zeros(5))


def test_npz_round_trip_and_refusals(small, tmp_path):
    path = D.save_offline_rl(tmp_path / "pm.npz", small)
    back = D.load_offline_rl(path)
    for k, v in small.items():
        np.testing.assert_array_equal(back[k], v)
    bad = dict(small)
    del bad["rewards"]
    np.savez(tmp_path / "missing.npz", **bad)
    with pytest.raises(ValueError, match="rewards"):
        D.load_offline_rl(tmp_path / "missing.npz")
    nan = dict(small, observations=small["observations"].copy())
    nan["observations"][5, 0] = np.nan
    with pytest.raises(ValueError, match="observations"):
        D.save_offline_rl(tmp_path / "nan.npz", nan)
    np.savez(tmp_path / "nan2.npz", **nan)
    with pytest.raises(ValueError, match="finite"):
        D.load_offline_rl(tmp_path / "nan2.npz")
    with pytest.raises(ValueError, match="rows"):
        D.validate_offline_rl(dict(small, rewards=small["rewards"][:-1]), "x")
    with pytest.raises(FileNotFoundError):
        D.load_offline_rl(tmp_path / "absent.npz")


def test_argument_checks():
    with pytest.raises(ValueError, match="n_transitions"):
        D.generate_pointmaze(0)
    with pytest.raises(ValueError, match="episode_steps"):
        D.generate_pointmaze(10, episode_steps=1)
    with pytest.raises(ValueError, match="random_action_frac"):
        D.generate_pointmaze(10, random_action_frac=1.5)
    with pytest.raises(ValueError, match="n_envs"):
        D.generate_pointmaze(10, n_envs=True)  # a bool is not an int


def test_cached_dataset(tmp_path):
    a = D.pointmaze_dataset(64, seed=1, path=tmp_path / "c.npz")
    assert (tmp_path / "c.npz").is_file()
    b = D.pointmaze_dataset(64, seed=1, path=tmp_path / "c.npz")
    np.testing.assert_array_equal(a["actions"], b["actions"])


def test_cache_names_are_the_spec_hash(monkeypatch, tmp_path):
    # The name is sha1 of the settings as sorted JSON: existing caches keep hitting only if
    # neither the spec nor its hashing changes. The literal is the name the files have had
    # since the data set was introduced.
    monkeypatch.setenv("HEXAD_CACHE", str(tmp_path))
    spec = {"env": "PointMaze_UMaze-v3", "n": 2000, "seed": 0, "noise": 0.3, "rand": 0.0}
    path = D.offline_rl_path("pointmaze_umaze", spec | {"version": 1})
    assert path == tmp_path / "offline_rl" / "pointmaze_umaze_efd1363851ba.npz"
    assert D.spec_tag({"b": 1, "a": 2}) == D.spec_tag({"a": 2, "b": 1})


def test_maze_envs_leave_no_files_in_the_temporary_folder(tmp_path, monkeypatch):
    # gymnasium-robotics writes each maze's model XML to the temporary folder and never
    # deletes it; make_vec builds the environments in a private folder it removes.
    import tempfile

    from hexad.data.offline_rl._gym import make_vec

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    env = make_vec("PointMaze_UMaze-v3", 2, 5)
    env.reset(seed=0)
    env.step(np.zeros((2, 2)))
    env.close()
    assert list(tmp_path.iterdir()) == [] and tempfile.tempdir == str(tmp_path)
