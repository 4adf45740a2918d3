"""PointMaze-UMaze: the scripted noisy waypoint oracle, its cached data set, evaluation."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hexad.data.offline_rl._gym import make_vec
from hexad.data.offline_rl._io import load_offline_rl, offline_rl_path, save_offline_rl
from hexad.data.offline_rl._maze import (
    MazeGeometry,
    check_maze_args,
    collect_maze,
    evaluate_maze,
    maze_fields,
)

__all__ = [
    "POINTMAZE_ENV",
    "evaluate_pointmaze",
    "generate_pointmaze",
    "pointmaze_dataset",
    "pointmaze_oracle",
]

POINTMAZE_ENV = "PointMaze_UMaze-v3"
"""The gymnasium-robotics environment of the PointMaze data sets."""


def pointmaze_oracle(geom: MazeGeometry, obs: np.ndarray, goal: np.ndarray) -> np.ndarray:
    """Returns the noiseless oracle's actions ``[n, 2]`` for obs ``[n, 4]`` and goals ``[n, 2]``.

    A PD controller ``clip(10 (w - x) - v, -1, 1)`` towards the next waypoint ``w`` of
    ``geom``'s shortest path.

    >>> pointmaze_oracle(MazeGeometry(), np.array([[-1.0, -1.0, 0, 0]]), np.array([[-1.0, -1.0]]))
    array([[0., 0.]])
    """
    obs = np.atleast_2d(obs)
    w = geom.waypoint(obs[:, :2], goal)
    return np.clip(10.0 * (w - obs[:, :2]) - obs[:, 2:4], -1.0, 1.0)


def generate_pointmaze(
    n_transitions: int,
    seed: int = 0,
    noise_std: float = 0.3,
    n_envs: int = 8,
    episode_steps: int = 1000,
    task_goal=(-1.0, -1.0),
    random_action_frac: float = 0.0,
) -> dict[str, np.ndarray]:
    """Generates a PointMaze-UMaze data set with the scripted noisy oracle in a vector env.

    Goals are resampled each time one is reached (``continuing_task=True``,
    ``reset_target=True``).

    Args:
      n_transitions: number of transitions ``N`` (rounded up to a multiple of ``n_envs``).
      seed: seed of the environments and of the action noise.
      noise_std: std of the Gaussian action noise (before clipping to ``[-1, 1]``).
      n_envs: parallel environments (gymnasium ``SyncVectorEnv``).
      episode_steps: steps per episode before a timeout.
      task_goal: ``[2]`` the fixed goal that defines ``rewards`` (D4RL's sparse maze reward).
      random_action_frac: fraction of steps whose action is uniform random instead.

    Returns:
      a dict with the fields listed in :mod:`hexad.data.offline_rl`, trajectories stored
      contiguously.

    >>> d = generate_pointmaze(8, n_envs=2, episode_steps=4)
    >>> d["observations"].shape, d["actions"].shape, float(d["timeouts"][-1])
    ((8, 4), (8, 2), 1.0)
    """
    check_maze_args(n_transitions, n_envs, episode_steps, random_action_frac)
    geom = MazeGeometry()
    env = make_vec(POINTMAZE_ENV, n_envs, episode_steps, continuing_task=True, reset_target=True)
    out = collect_maze(
        env,
        n_transitions,
        seed,
        lambda obs: obs["observation"],
        lambda o, goal: pointmaze_oracle(geom, o, goal),
        noise_std,
        random_action_frac,
    )
    return maze_fields(out, task_goal, qpos=slice(0, 2), qvel=slice(2, 4))


def pointmaze_dataset(
    n_transitions: int = 100_000,
    seed: int = 0,
    noise_std: float = 0.3,
    random_action_frac: float = 0.0,
    path=None,
) -> dict[str, np.ndarray]:
    """Returns the PointMaze-UMaze oracle data set, generating and caching it on first use.

    Args:
      n_transitions, seed, noise_std, random_action_frac: see :func:`generate_pointmaze`.
      path: an explicit npz path; default a file in ``hexad.data.cache_dir("offline_rl")``
        named by the settings.

    Returns:
      a dict with the D4RL fields.

    >>> import tempfile
    >>> d = pointmaze_dataset(16, path=Path(tempfile.mkdtemp()) / "pm.npz")
    >>> d["rewards"].shape
    (16,)
    """
    spec = {
        "env": POINTMAZE_ENV,
        "n": int(n_transitions),
        "seed": int(seed),
        "noise": float(noise_std),
        "rand": float(random_action_frac),
        "version": 1,
    }
    path = Path(path) if path is not None else offline_rl_path("pointmaze_umaze", spec)
    if path.is_file():
        return load_offline_rl(path)
    data = generate_pointmaze(
        n_transitions, seed=seed, noise_std=noise_std, random_action_frac=random_action_frac
    )
    save_offline_rl(path, data)
    return data


def evaluate_pointmaze(
    policy,
    goals: np.ndarray,
    specs: np.ndarray,
    seeds: np.ndarray,
    n_envs: int = 32,
    episode_steps: int = 300,
    reset_cell=(1, 1),
    progress=None,
) -> dict[str, np.ndarray]:
    """Runs deterministic episodes of ``policy`` in a PointMaze-UMaze ``SyncVectorEnv``.

    Episode ``i`` starts in ``reset_cell`` (with the environment's position noise, seeded by
    ``seeds[i]``), targets ``goals[i]`` and is driven by ``policy(obs [E, 4], goal [E, 2],
    spec [E, k]) -> actions [E, 2]``; ``specs[i]`` tells the policy which method to run, so many
    methods share one batched, jitted policy call per step. Episodes run ``n_envs`` at a time.

    Args:
      policy: host-callable returning actions in ``[-1, 1]``.
      goals: ``[M, 2]`` goals.
      specs: ``[M, k]`` per-episode method descriptors (passed through to ``policy``).
      seeds: ``[M]`` int reset seeds (the same seed gives the same start for every method).
      n_envs: environments stepped together.
      episode_steps: steps per episode.
      reset_cell: start cell ``(row, col)``.
      progress: optional ``progress(iterable, desc)`` wrapper for a progress bar.

    Returns:
      ``{"success": [M] float (final distance <= 0.45), "return": [M] (sum of the dense
      reward exp(-distance)), "final_distance": [M], "min_distance": [M]}``.

    >>> geom = MazeGeometry()
    >>> res = evaluate_pointmaze(lambda o, g, s: pointmaze_oracle(geom, o, g),
    ...                          np.array([[-1.0, 1.0]]), np.zeros((1, 1)), np.arange(1),
    ...                          n_envs=1, episode_steps=50)
    >>> res["success"].tolist()
    [1.0]
    """
    return evaluate_maze(
        make_vec(
            POINTMAZE_ENV, n_envs, episode_steps + 1, continuing_task=True, reset_target=False
        ),
        lambda obs: obs["observation"],
        policy,
        goals,
        specs,
        seeds,
        episode_steps,
        reset_cell,
        progress,
    )
