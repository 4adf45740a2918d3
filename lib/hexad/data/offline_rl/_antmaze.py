"""AntMaze-UMaze: the direction-commanded ant's environment, the planner oracle, data, evaluation.

The low-level controller walks in a commanded direction: its input is the 27-d ``Ant-v5``
observation followed by ``(cos, sin)`` of the command angle relative to the torso's yaw (read
from the quaternion ``obs[1:5]``). :class:`AntCommandEnv` is the environment it is trained in
(by :func:`hexad.policy.train_ant_controller`). In the maze (gymnasium-robotics
``AntMaze_UMaze-v5``, cells of size 4) the command is the direction to the next waypoint of
:class:`~hexad.data.offline_rl.MazeGeometry`'s shortest path; with Gaussian action noise this
is the scripted oracle of the data set, in the manner of D4RL's antmaze (Fu et al. 2020, arXiv
2004.07219), whose low-level ant was also a trained goal-reaching policy. Every function here
takes the controller as a callable ``controller(features [n, 29]) -> actions [n, 8]``.
"""

from __future__ import annotations

import numpy as np

from hexad._base import check_int
from hexad.data.offline_rl._gym import make_vec, vec_step
from hexad.data.offline_rl._maze import (
    UMAZE,
    MazeGeometry,
    check_maze_args,
    collect_maze,
    evaluate_maze,
    maze_fields,
)

__all__ = [
    "ANTMAZE_ENV",
    "ANTMAZE_SCALING",
    "ANT_ACT_DIM",
    "ANT_INPUT_DIM",
    "ANT_OBS_DIM",
    "AntCommandEnv",
    "ant_command_features",
    "antmaze_geometry",
    "antmaze_obs",
    "antmaze_oracle",
    "evaluate_antmaze",
    "generate_antmaze",
    "torso_yaw",
    "upright",
]

ANTMAZE_ENV = "AntMaze_UMaze-v5"
"""The gymnasium-robotics environment of the AntMaze data sets."""
ANTMAZE_SCALING = 4.0
"""The side length of an AntMaze cell (gymnasium-robotics' ``maze_size_scaling``)."""
ANT_OBS_DIM = 27
"""The size of an ``Ant-v5`` observation without the torso's x, y position."""
ANT_ACT_DIM = 8
"""The size of an ant action (eight joint torques)."""
ANT_INPUT_DIM = ANT_OBS_DIM + 2
"""The size of the controller's input, the observation and then the (cos, sin) of the command
relative to the torso's yaw (:func:`ant_command_features`)."""


def torso_yaw(obs: np.ndarray) -> np.ndarray:
    """``[n]`` yaw of the torso from ``[n, >=5]`` Ant observations (quaternion ``obs[:, 1:5]``).

    >>> q = np.zeros((1, 5)); q[0, 1] = 1.0
    >>> torso_yaw(q).tolist()
    [0.0]
    """
    w, x, y, z = (obs[:, i] for i in range(1, 5))
    return np.arctan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z))


def upright(obs: np.ndarray) -> np.ndarray:
    """``[n]`` the world-z component of the torso's z axis (1 upright, -1 on its back) from
    ``[n, >=5]`` Ant observations (quaternion ``obs[:, 1:5]``).

    >>> q = np.zeros((2, 5)); q[0, 1] = 1.0; q[1, 2] = 1.0
    >>> upright(q).tolist()
    [1.0, -1.0]
    """
    x, y = obs[:, 2], obs[:, 3]
    return 1.0 - 2.0 * (x * x + y * y)


def ant_command_features(obs: np.ndarray, command: np.ndarray) -> np.ndarray:
    """Returns the controller's input ``[n, 29]``: the 27-d Ant observation, then the command.

    Args:
      obs: ``[n, 27]`` Ant observations (``Ant-v5``'s, or AntMaze's ``observation`` field).
      command: ``[n]`` command angles in the world frame (radians).

    >>> q = np.zeros((1, 27)); q[0, 1] = 1.0  # identity quaternion: yaw 0
    >>> ant_command_features(q, np.array([np.pi / 2]))[0, -2:].round(6).tolist()
    [0.0, 1.0]
    """
    obs = np.atleast_2d(np.asarray(obs, np.float64))
    command = np.asarray(command, np.float64).reshape(-1)
    if obs.shape[1] != ANT_OBS_DIM or command.shape[0] != obs.shape[0]:
        raise ValueError(
            f"obs, command: expected [n, {ANT_OBS_DIM}] and [n], got {obs.shape}, {command.shape}"
        )
    rel = command - torso_yaw(obs)
    return np.concatenate([obs, np.cos(rel)[:, None], np.sin(rel)[:, None]], 1).astype(np.float32)


class AntCommandEnv:
    r"""``Ant-v5`` with a commanded direction, in the shape :func:`hexad.policy.train_online` steps.

    The policy sees :func:`ant_command_features` ``[E, 29]``. The reward of a step is
    :math:`v^\top (\cos \theta, \sin \theta) + 1 - c \|a\|^2`, with :math:`v` the torso's
    planar velocity, :math:`\theta` the command, 1 the healthy bonus and :math:`c` the
    ``ctrl_cost``. An episode terminates when
    ``Ant-v5`` finds the torso unhealthy (height outside [0.2, 1]) and, with
    ``terminate_flipped``, when the torso turns upside down (that env alone is then reset).
    The command is redrawn uniformly every ``command_every`` steps and at every reset.

    ``reset(rng)`` resets every env with a seed drawn from ``rng`` and draws the commands;
    ``step(rng, act)`` returns ``(transition, next features)``, the transition holding the
    replay fields (``observations`` and ``next_observations`` as features under the step's
    command, the shaped ``rewards``, ``terminals`` including flips), ``timeouts``,
    ``infos/command_velocity [E]`` (velocity along the command) and ``infos/flipped [E]``.
    Flip resets and command redraws draw from ``rng``.

    Args:
      n_envs: parallel environments (``SyncVectorEnv``).
      episode_steps: episode length (timeout).
      command_every: steps between command redraws.
      ctrl_cost: weight of :math:`\|a\|^2` in the reward.
      terminate_flipped: end an episode as a termination when the torso turns upside down.
        ``Ant-v5``'s own health check is the torso height alone, which an ant lying on its
        back passes.

    >>> env = AntCommandEnv(2, 10)
    >>> o = env.reset(np.random.default_rng(0))
    >>> tr, o = env.step(np.random.default_rng(1), np.zeros((2, 8), np.float32))
    >>> o.shape, tr["rewards"].shape
    ((2, 29), (2,))
    >>> env.close()
    """

    def __init__(
        self,
        n_envs: int,
        episode_steps: int,
        command_every: int = 100,
        ctrl_cost: float = 0.05,
        terminate_flipped: bool = True,
    ):
        self.num_envs = check_int("n_envs", n_envs)
        self.command_every = check_int("command_every", command_every)
        self.ctrl_cost = float(ctrl_cost)
        self.terminate_flipped = bool(terminate_flipped)
        self.obs_dim, self.act_dim = ANT_INPUT_DIM, ANT_ACT_DIM
        self.env = make_vec("Ant-v5", n_envs, check_int("episode_steps", episode_steps))

    def reset(self, rng: np.random.Generator) -> np.ndarray:
        self._obs, _ = self.env.reset(seed=int(rng.integers(2**31)))
        self._theta = rng.uniform(-np.pi, np.pi, self.num_envs)
        self._tick = np.zeros(self.num_envs, np.int64)
        return ant_command_features(self._obs[:, :ANT_OBS_DIM], self._theta)

    def step(self, rng: np.random.Generator, act: np.ndarray):
        n_envs, theta = self.num_envs, self._theta
        o = ant_command_features(self._obs[:, :ANT_OBS_DIM], theta)
        tr, nobs = vec_step(self.env, self._obs, act, ("x_velocity", "y_velocity"))
        term, nxt = tr["terminals"], tr["next_observations"]
        flip = np.zeros(n_envs, bool)
        if self.terminate_flipped:
            flip = (upright(nxt) < 0) & (term + tr["timeouts"] == 0)
            for i in np.flatnonzero(flip):  # end it here: reset that env alone
                nobs[i] = self.env.unwrapped.envs[i].reset(seed=int(rng.integers(2**31)))[0]
            term = np.maximum(term, flip.astype(np.float32))
        done = (term + tr["timeouts"]) > 0
        vx, vy = tr["infos/x_velocity"], tr["infos/y_velocity"]
        v_cmd = vx * np.cos(theta) + vy * np.sin(theta)
        out = {
            "observations": o,
            "actions": act,
            "rewards": v_cmd + (1.0 - term) - self.ctrl_cost * np.sum(act * act, 1),
            "next_observations": ant_command_features(nxt[:, :ANT_OBS_DIM], theta),
            "terminals": term,
            "timeouts": tr["timeouts"],
            "infos/command_velocity": v_cmd,
            "infos/flipped": flip.astype(np.float32),
        }
        self._tick += 1
        redraw = done | (self._tick % self.command_every == 0)
        self._theta = np.where(redraw, rng.uniform(-np.pi, np.pi, n_envs), theta)
        self._tick[done] = 0
        self._obs = nobs
        return out, ant_command_features(nobs[:, :ANT_OBS_DIM], self._theta)

    def close(self) -> None:
        self.env.close()


def antmaze_geometry() -> MazeGeometry:
    """The UMaze of ``AntMaze_UMaze-v5`` (cells of size 4).

    >>> antmaze_geometry().cell_center((1, 1)).tolist()
    [-4.0, 4.0]
    """
    return MazeGeometry(UMAZE, scaling=ANTMAZE_SCALING)


def antmaze_obs(obs: dict) -> np.ndarray:
    """``[E, 29]`` D4RL's ant layout from an AntMaze observation dict: x, y, then the first 27
    entries of ``observation`` (``qpos[2:]``, ``qvel``; the 78 contact forces after them are
    dropped, as in D4RL), so ``qpos`` is ``[:, :15]`` and ``qvel`` ``[:, 15:]``.

    >>> antmaze_obs({"achieved_goal": np.zeros((1, 2)), "observation": np.ones((1, 105))}).shape
    (1, 29)
    """
    return np.concatenate([obs["achieved_goal"], obs["observation"][:, :ANT_OBS_DIM]], -1)


def antmaze_oracle(controller, obs: np.ndarray, goal: np.ndarray, geom=None) -> np.ndarray:
    """The noiseless scripted oracle: the controller walking towards the next BFS waypoint.

    Args:
      controller: ``controller(features [n, 29]) -> actions [n, 8]`` (e.g. the
        :class:`hexad.policy.AntController` of ``train_ant_controller``).
      obs: ``[n, 29]`` observations in :func:`antmaze_obs`'s layout.
      goal: ``[n, 2]`` goals.
      geom: the maze; default :func:`antmaze_geometry`.

    Returns:
      ``[n, 8]`` float64 actions.

    >>> obs = np.zeros((1, 29)); obs[0, 3] = 1.0; obs[0, :2] = (-4.0, 4.0)
    >>> antmaze_oracle(lambda f: f[:, -2:], obs, np.array([[4.0, 4.0]])).round(6).tolist()
    [[1.0, 0.0]]
    """
    geom = antmaze_geometry() if geom is None else geom
    obs = np.atleast_2d(np.asarray(obs, np.float64))
    if obs.shape[1] != ANT_INPUT_DIM:
        raise ValueError(f"obs: expected [n, {ANT_INPUT_DIM}] (x, y, then 27), got {obs.shape}")
    d = geom.waypoint(obs[:, :2], goal) - obs[:, :2]
    feats = ant_command_features(obs[:, 2:], np.arctan2(d[:, 1], d[:, 0]))
    return np.asarray(controller(feats), np.float64)


def generate_antmaze(
    controller,
    n_transitions: int,
    seed: int = 0,
    noise_std: float = 0.2,
    n_envs: int = 8,
    episode_steps: int = 1000,
    task_goal=(-4.0, -4.0),
    random_action_frac: float = 0.0,
    reset_flipped: bool = True,
) -> dict[str, np.ndarray]:
    """Generates an AntMaze-UMaze data set with the noisy scripted oracle in a vector env.

    Start cells and goals are the environment's own draws (any free cell, with its position
    noise); a new goal is drawn each time one is reached (``continuing_task=True``,
    ``reset_target=True``), in the manner of D4RL's antmaze "diverse" sets.

    Args:
      controller: ``controller(features [n, 29]) -> actions [n, 8]`` (see
        :func:`antmaze_oracle`).
      n_transitions: number of transitions ``N`` (rounded up to a multiple of ``n_envs``).
      seed: seed of the environments and of the action noise.
      noise_std: std of the Gaussian action noise (before clipping to ``[-1, 1]``).
      n_envs: parallel environments (gymnasium ``SyncVectorEnv``).
      episode_steps: steps per episode before a timeout.
      task_goal: ``[2]`` the fixed goal that defines ``rewards`` (sparse, within 0.5); the
        default is the centre of cell (3, 1), the far end of the U from cell (1, 1).
      random_action_frac: fraction of steps whose action is uniform random instead.
      reset_flipped: end an episode (as a timeout) when the ant turns upside down, and reset
        that env; an ant on its back cannot right itself, so without this the rest of the
        episode is an ant lying still.

    Returns:
      the fields of :func:`~hexad.data.offline_rl.generate_pointmaze` with 29-d observations
      (x, y, then ``Ant-v5``'s 27), 8-d actions, ``infos/qpos [N, 15]``, ``infos/qvel [N, 14]``.

    >>> d = generate_antmaze(lambda f: np.zeros((f.shape[0], 8)), 4, n_envs=2, episode_steps=3)
    >>> d["observations"].shape, d["infos/qpos"].shape
    ((4, 29), (4, 15))
    """
    check_maze_args(n_transitions, n_envs, episode_steps, random_action_frac)
    if not noise_std >= 0:
        raise ValueError(f"noise_std: expected >= 0, got {noise_std}")
    geom = antmaze_geometry()
    env = make_vec(ANTMAZE_ENV, n_envs, episode_steps, continuing_task=True, reset_target=True)
    out = collect_maze(
        env,
        n_transitions,
        seed,
        antmaze_obs,
        lambda o, goal: antmaze_oracle(controller, o, goal, geom),
        noise_std,
        random_action_frac,
        (lambda o: upright(o[:, 2:]) < 0) if reset_flipped else None,
    )
    return maze_fields(out, task_goal, qpos=slice(0, 15), qvel=slice(15, 29))


def evaluate_antmaze(
    policy,
    goals: np.ndarray,
    specs: np.ndarray,
    seeds: np.ndarray,
    n_envs: int = 16,
    episode_steps: int = 700,
    reset_cell=(1, 1),
    progress=None,
) -> dict[str, np.ndarray]:
    """Runs deterministic episodes of ``policy`` in an AntMaze-UMaze ``SyncVectorEnv``.

    As :func:`~hexad.data.offline_rl.evaluate_pointmaze`, with observations ``[E, 29]`` in
    :func:`antmaze_obs`'s layout and actions ``[E, 8]``; success is D4RL's antmaze criterion,
    reaching the goal (distance <= 0.45) at any step of the episode (700 steps for the UMaze).

    Args:
      policy: ``policy(obs [E, 29], goal [E, 2], spec [E, k]) -> actions [E, 8]``.
      goals: ``[M, 2]`` goals.
      specs: ``[M, k]`` per-episode method descriptors (passed through to ``policy``).
      seeds: ``[M]`` int reset seeds.
      n_envs: environments stepped together.
      episode_steps: steps per episode.
      reset_cell: start cell ``(row, col)``.
      progress: optional ``progress(iterable, desc)`` wrapper for a progress bar.

    Returns:
      ``{"success": [M], "return": [M] (sum of exp(-distance)), "final_distance": [M],
      "min_distance": [M]}``.

    >>> res = evaluate_antmaze(lambda o, g, s: np.zeros((o.shape[0], 8)),
    ...                        np.array([[-4.0, -4.0]]), np.zeros((1, 1)), np.arange(1),
    ...                        n_envs=1, episode_steps=2)
    >>> res["success"].tolist()
    [0.0]
    """
    return evaluate_maze(
        make_vec(ANTMAZE_ENV, n_envs, episode_steps + 1, continuing_task=True, reset_target=False),
        antmaze_obs,
        policy,
        goals,
        specs,
        seeds,
        episode_steps,
        reset_cell,
        progress,
        reached=True,
    )
