"""Offline RL data sets generated here (never downloaded), stored as npz with D4RL field names.

PointMaze (gymnasium-robotics ``PointMaze_UMaze-v3``): a scripted noisy waypoint oracle, in the
manner of D4RL's maze2d (Fu et al. 2020, arXiv 2004.07219), drives the point mass to goals that
the environment resamples each time one is reached (``continuing_task=True``,
``reset_target=True``). The oracle follows the shortest path over the maze's free cells (breadth
first search) with a PD controller ``a = clip(10 (w - x) - v, -1, 1)`` towards the next cell
centre ``w`` (the goal itself in the goal's cell), plus Gaussian action noise.

Fields (D4RL names): ``observations [N, 4]`` (x, y, vx, vy), ``actions [N, 2]``,
``rewards [N]`` (sparse: 1 when the next position is within 0.5 of ``task_goal``),
``next_observations [N, 4]``, ``terminals [N]`` (all 0: mazes do not terminate),
``timeouts [N]`` (1 at the last step of each episode), ``infos/goal [N, 2]`` (the goal the oracle
was driving to), ``infos/qpos [N, 2]``, ``infos/qvel [N, 2]``, and ``task_goal [2]``.

Locomotion (gymnasium MuJoCo ``HalfCheetah-v5``, ``Hopper-v5``, ``Walker2d-v5``), in the manner
of D4RL's locomotion sets: a soft actor-critic (``hexad.policy.sac``) is trained online here in a
gymnasium vector env, with a deterministic evaluation and a parameter snapshot every
``snapshot_every`` env steps. *random* is the untrained (initial) policy, *expert* the best
snapshot we trained (its return is recorded: at our CPU budget it is far below D4RL's experts),
*medium* the earliest snapshot whose return reaches a third of the way from random to expert (as
D4RL's medium is about a third of its expert), and *medium-replay* the replay buffer up to the
medium snapshot (uniform random actions for the first ``start_steps``). Each of random / medium /
expert is ``n_per_level`` transitions of that snapshot's stochastic policy. Extra fields:
``infos/x_velocity [N]``, ``infos/reward_forward [N]`` (so a shifted objective can be computed
from the data), and scalars ``meta/policy_return`` (the snapshot's deterministic return),
``meta/snapshot_step``, ``meta/random_return``, ``meta/expert_return``. Generate with
``python -m hexad.data.offline_rl locomotion --env HalfCheetah-v5 [--steps N]``. With the
defaults (20k online steps, 64-wide networks, snapshots every 2000 steps, 500-step evaluation
episodes) we measured, as deterministic 500-step returns: HalfCheetah random -84, medium 311
(step 16k), expert 748 (step 20k, 1.75 m/s); Hopper random 12, medium 187 (step 4k), expert
368 (step 20k); Walker2d random -2, medium 314 (step 4k), expert 320 (step 16k; the snapshot
returns were -2, 4, 314, 261, 290, 49, 215, 256, 320, 316, 199 every 2k steps, so medium and
expert are nearly the same quality and medium-replay is 4000 mostly random transitions). These
are far below D4RL's experts: the CPU budget allowed 20k SAC steps.

AntMaze (gymnasium-robotics ``AntMaze_UMaze-v5``, :mod:`hexad.data._antmaze`, re-exported
here): D4RL's antmaze recipe at our scale. A direction-commanded ant controller is trained here
with SAC on ``Ant-v5`` (:func:`train_ant_controller`, chunked, resumable and cached through
``hexad.cachex``), and the scripted noisy oracle drives it towards the next waypoint of the
:class:`MazeGeometry` shortest path (cells of size 4). Fields: those of PointMaze with
``observations [N, 29]`` (x, y, then ``Ant-v5``'s 27, D4RL's ant layout), ``actions [N, 8]``,
``infos/qpos [N, 15]``, ``infos/qvel [N, 14]``, ``task_goal`` the centre of cell (3, 1), and
``meta/controller_curve``. Generate with ``python -m hexad.data.offline_rl antmaze``. Measured
(session 5, 2-core CPU): the controller's 400k SAC steps took 1704 s of wall time (about 235
env steps/s, one update per step); mean velocity along the command over each 50k-step chunk
0.06, 0.26, 0.51, 0.76, 0.93, 1.05, 1.16, 1.24 m/s, episodes ended by turning upside down per
chunk 76, 35, 34, 22, 35, 19, 13, 22; deterministically 1.1-1.7 m/s along 4 commands. From
cell (1, 1) to the goal cell (3, 1) (path about 24 long, 700 steps, 48 episodes) the noiseless
oracle reached the goal in 33 of 48 episodes and the noisy one (std 0.2, the data's) in 28 of
48; 11 of the 15 and 12 of the 20 failures ended upside down. The 200k-transition data set
(2.3 min to generate) reached 662 goals in 270 episodes (70 of them cut when the ant turned
over), mean planar speed 1.05 m/s, every free cell visited (15.9k-41.2k steps each), reward
fraction 0.0058. Without the upside-down termination (``Ant-v5``'s health check is the
torso's height, which an ant on its back passes) the same training reached 0.95 m/s in the
last chunk, its noiseless oracle succeeded in 9 of 16 episodes, and 40% of its data set's
steps were an ant lying on its back.

Files are generated once and cached under ``$HEXAD_CACHE`` (default ``~/.cache/hexad``) in
``offline_rl/``; a file with missing fields or non-finite values is refused.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import json
import os
import types
from pathlib import Path

import numpy as np

from hexad.data import _bundled
from hexad.data._bundled import load_npz

# AntMaze lives in hexad.data._antmaze (it imports this module) and is re-exported lazily.
_ANTMAZE_NAMES = (
    "ANTMAZE_ENV",
    "ANT_INPUT_DIM",
    "ant_command_features",
    "antmaze_dataset",
    "antmaze_geometry",
    "antmaze_obs",
    "antmaze_oracle",
    "evaluate_antmaze",
    "generate_antmaze",
    "train_ant_controller",
)

__all__ = [
    *_ANTMAZE_NAMES,
    "D4RL_FIELDS",
    "MazeGeometry",
    "cache_dir",
    "LOCOMOTION_ENVS",
    "LOCOMOTION_LEVELS",
    "evaluate_locomotion",
    "evaluate_pointmaze",
    "generate_locomotion",
    "generate_pointmaze",
    "locomotion_dataset",
    "sample_free_goals",
    "load_offline_rl",
    "pointmaze_dataset",
    "pointmaze_oracle",
    "save_offline_rl",
]

D4RL_FIELDS = (
    "observations",
    "actions",
    "rewards",
    "next_observations",
    "terminals",
    "timeouts",
)

UMAZE = (
    (1, 1, 1, 1, 1),
    (1, 0, 0, 0, 1),
    (1, 1, 1, 0, 1),
    (1, 0, 0, 0, 1),
    (1, 1, 1, 1, 1),
)


def __getattr__(name: str):
    if name in _ANTMAZE_NAMES:
        from hexad.data import _antmaze

        return getattr(_antmaze, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def cache_dir() -> Path:
    """Returns the cache folder for generated data sets (``$HEXAD_CACHE/offline_rl``)."""
    return _bundled.cache_dir("offline_rl")


class MazeGeometry:
    """Cell <-> coordinate maps and shortest-path next cells of a gymnasium-robotics maze.

    Coordinates follow gymnasium-robotics: cell ``(r, c)`` has centre
    ``x = (c + 0.5) s - W s / 2``, ``y = H s / 2 - (r + 0.5) s`` for a ``H x W`` map and
    scaling ``s``.

    >>> g = MazeGeometry(UMAZE)
    >>> g.cell_center((3, 1)).tolist()
    [-1.0, -1.0]
    """

    def __init__(self, maze_map=UMAZE, scaling: float = 1.0):
        self.map = np.asarray(maze_map, dtype=np.int64)
        if self.map.ndim != 2:
            raise ValueError(f"maze_map: expected a 2-d grid, got shape {self.map.shape}")
        self.scaling = float(scaling)
        self.h, self.w = self.map.shape
        self.free = [(r, c) for r in range(self.h) for c in range(self.w) if self.map[r, c] == 0]
        self._next = {g: self._bfs(g) for g in self.free}

    def cell_center(self, rc) -> np.ndarray:
        r, c = rc
        s = self.scaling
        return np.array([(c + 0.5) * s - self.w * s / 2, self.h * s / 2 - (r + 0.5) * s])

    def cell_of(self, xy: np.ndarray) -> np.ndarray:
        """``[..., 2]`` coordinates -> ``[..., 2]`` int (row, col), clipped to the grid."""
        xy = np.asarray(xy, dtype=np.float64)
        s = self.scaling
        col = np.floor((xy[..., 0] + self.w * s / 2) / s).astype(np.int64)
        row = np.floor((self.h * s / 2 - xy[..., 1]) / s).astype(np.int64)
        return np.stack([np.clip(row, 0, self.h - 1), np.clip(col, 0, self.w - 1)], axis=-1)

    def is_free(self, xy: np.ndarray) -> np.ndarray:
        rc = self.cell_of(xy)
        return self.map[rc[..., 0], rc[..., 1]] == 0

    def _bfs(self, goal):
        nxt = {goal: goal}
        queue = collections.deque([goal])
        while queue:
            cur = queue.popleft()
            r, c = cur
            for nb in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
                if nb in self.free and nb not in nxt:
                    nxt[nb] = cur  # from nb, step to cur: one step closer to the goal
                    queue.append(nb)
        return nxt

    def waypoint(self, pos: np.ndarray, goal: np.ndarray) -> np.ndarray:
        """``[n, 2]`` next waypoints: the next cell's centre on a shortest path, or the goal."""
        pos = np.atleast_2d(pos)
        goal = np.atleast_2d(goal)
        cur = self.cell_of(pos)
        gc = self.cell_of(goal)
        out = np.array(goal, dtype=np.float64, copy=True)
        for i in range(pos.shape[0]):
            c, g = tuple(cur[i]), tuple(gc[i])
            if c != g and g in self._next and c in self._next[g]:
                out[i] = self.cell_center(self._next[g][c])
        return out


def pointmaze_oracle(geom: MazeGeometry, obs: np.ndarray, goal: np.ndarray) -> np.ndarray:
    """Returns the noiseless oracle's actions ``[n, 2]`` for obs ``[n, 4]`` and goals ``[n, 2]``.

    >>> pointmaze_oracle(MazeGeometry(), np.array([[-1.0, -1.0, 0, 0]]), np.array([[-1.0, -1.0]]))
    array([[0., 0.]])
    """
    obs = np.atleast_2d(obs)
    w = geom.waypoint(obs[:, :2], goal)
    return np.clip(10.0 * (w - obs[:, :2]) - obs[:, 2:4], -1.0, 1.0)


def _make_vec(n_envs: int, max_episode_steps: int, env_id: str = "PointMaze_UMaze-v3", **kwargs):
    import gymnasium as gym
    import gymnasium_robotics

    gym.register_envs(gymnasium_robotics)
    return gym.make_vec(
        env_id,
        num_envs=n_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
        max_episode_steps=max_episode_steps,
        **kwargs,
    )


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

    Args:
      n_transitions: number of transitions ``N`` (rounded up to a multiple of ``n_envs``).
      seed: seed of the environments and of the action noise.
      noise_std: std of the Gaussian action noise (before clipping to ``[-1, 1]``).
      n_envs: parallel environments (gymnasium ``SyncVectorEnv``).
      episode_steps: steps per episode before a timeout.
      task_goal: ``[2]`` the fixed goal that defines ``rewards`` (D4RL's sparse maze reward).
      random_action_frac: fraction of steps whose action is uniform random instead.

    Returns:
      a dict with the fields listed in the module docstring, trajectories stored contiguously.
    """
    _check_maze_args(n_transitions, n_envs, episode_steps, random_action_frac)
    geom = MazeGeometry()
    env = _make_vec(n_envs, episode_steps, continuing_task=True, reset_target=True)
    out = _collect_maze(
        env,
        n_transitions,
        seed,
        lambda obs: obs["observation"],
        lambda o, goal: pointmaze_oracle(geom, o, goal),
        noise_std,
        random_action_frac,
    )
    return _maze_fields(out, task_goal, qpos=slice(0, 2), qvel=slice(2, 4))


def _check_int(name: str, v, lo: int = 1) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise ValueError(f"{name}: expected an int >= {lo}, got {v!r}")


def _check_maze_args(n_transitions, n_envs, episode_steps, random_action_frac) -> None:
    """The checks every maze generator makes before it creates an env."""
    _check_int("n_transitions", n_transitions)
    _check_int("n_envs", n_envs)
    _check_int("episode_steps", episode_steps, 2)
    if not 0.0 <= random_action_frac <= 1.0:
        raise ValueError(
            f"random_action_frac: expected a value in [0, 1], got {random_action_frac}"
        )


def _collect_maze(
    env, n_transitions, seed, flat_obs, oracle, noise_std, random_action_frac, cut_if=None
):
    """Steps a maze ``SyncVectorEnv`` with a noisy oracle; env-major D4RL fields + ``infos/goal``.

    ``flat_obs(obs_dict) -> [E, o]`` gives the stored observation; ``oracle(o, goal) -> [E, d]``
    the noiseless action, to which Gaussian noise (``noise_std``) is added; a fraction
    ``random_action_frac`` of the actions is uniform random instead. Actions are clipped to
    ``[-1, 1]``. With ``cut_if(next_o) -> [E] bool``, an episode whose next observation meets
    it ends there as a timeout and that env alone is reset. The env is closed at the end.
    """
    n_envs = env.num_envs
    act_dim = env.single_action_space.shape[0]
    rng = np.random.default_rng(seed)
    steps = -(-n_transitions // n_envs)
    buf = collections.defaultdict(list)
    obs, _ = env.reset(seed=seed)
    try:
        for _ in range(steps):
            o = flat_obs(obs)
            goal = obs["desired_goal"]
            act = oracle(o, goal) + noise_std * rng.standard_normal((n_envs, act_dim))
            rand = rng.random(n_envs) < random_action_frac
            act = np.where(rand[:, None], rng.uniform(-1, 1, (n_envs, act_dim)), act)
            act = np.clip(act, -1.0, 1.0).astype(np.float32)
            nobs, _, term, trunc, info = env.step(act)
            nxt = flat_obs(nobs).copy()
            done = np.logical_or(term, trunc)
            if np.any(done):
                final = info["final_obs"]
                for i in np.flatnonzero(done):
                    nxt[i] = flat_obs({k: v[None] for k, v in final[i].items()})[0]
            if cut_if is not None:
                cut = cut_if(nxt) & ~done
                for i in np.flatnonzero(cut):
                    fresh, _ = env.unwrapped.envs[i].reset()
                    for k in nobs:
                        nobs[k][i] = fresh[k]
                trunc = np.logical_or(trunc, cut)
            buf["observations"].append(o)
            buf["actions"].append(act)
            buf["next_observations"].append(nxt)
            buf["terminals"].append(np.asarray(term, np.float32))
            buf["timeouts"].append(np.asarray(trunc, np.float32))
            buf["infos/goal"].append(goal)
            obs = nobs
    finally:
        env.close()
    # [steps, n_envs, ...] -> env-major so that each env's trajectories are contiguous.
    out = {k: np.swapaxes(np.stack(v), 0, 1).reshape(steps * n_envs, -1) for k, v in buf.items()}
    for k in ("terminals", "timeouts"):
        out[k] = out[k][:, 0]
    ends = np.zeros(steps * n_envs, np.float32)
    ends[steps - 1 :: steps] = 1.0  # each env's stream ends: a timeout for trajectory splitting
    out["timeouts"] = np.maximum(out["timeouts"], ends)
    out = {k: v[:n_transitions] for k, v in out.items()}
    out["timeouts"][-1] = 1.0
    return out


def _maze_fields(out, task_goal, qpos: slice, qvel: slice) -> dict[str, np.ndarray]:
    """Adds the sparse task reward (next x, y within 0.5 of ``task_goal``), qpos / qvel, dtypes."""
    tg = np.asarray(task_goal, np.float64)
    dist = np.linalg.norm(out["next_observations"][:, :2] - tg[None], axis=-1)
    out["rewards"] = (dist <= 0.5).astype(np.float32)
    out["infos/qpos"] = out["observations"][:, qpos].copy()
    out["infos/qvel"] = out["observations"][:, qvel].copy()
    out["task_goal"] = tg
    for k in ("observations", "next_observations", "infos/goal", "infos/qpos", "infos/qvel"):
        out[k] = out[k].astype(np.float32)
    return out


def save_offline_rl(path, data: dict[str, np.ndarray]) -> Path:
    """Writes ``data`` to ``path`` as an uncompressed npz (no pickle), checking it first."""
    _validate(data, str(path))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, **data)
    os.replace(tmp, path)
    return path


def _validate(data: dict[str, np.ndarray], where: str) -> None:
    missing = [k for k in D4RL_FIELDS if k not in data]
    if missing:
        raise ValueError(f"{where}: missing fields {missing}; expected {list(D4RL_FIELDS)}")
    n = data["observations"].shape[0]
    for k, v in data.items():
        v = np.asarray(v)
        if v.dtype.kind not in "fiub":
            raise ValueError(f"{where}[{k!r}]: expected a numeric array, got dtype {v.dtype}")
        if k in D4RL_FIELDS and (v.ndim == 0 or v.shape[0] != n):
            raise ValueError(f"{where}[{k!r}]: expected {n} rows, got shape {v.shape}")
        if v.dtype.kind == "f" and not np.all(np.isfinite(v)):
            raise ValueError(f"{where}[{k!r}]: expected finite values, got NaN or inf")


def load_offline_rl(path) -> dict[str, np.ndarray]:
    """Reads an offline-RL npz (no pickle) and checks the D4RL fields, row counts and NaNs.

    Args:
      path: the ``.npz`` file.

    Returns:
      a dict of numpy arrays.
    """
    data = load_npz(path, required=D4RL_FIELDS)
    _validate(data, Path(path).name)
    return data


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
      path: an explicit npz path; default a file in :func:`cache_dir` named by the settings.

    Returns:
      a dict with the D4RL fields.
    """
    spec = {
        "env": "PointMaze_UMaze-v3",
        "n": int(n_transitions),
        "seed": int(seed),
        "noise": float(noise_std),
        "rand": float(random_action_frac),
        "version": 1,
    }
    if path is None:
        tag = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
        path = cache_dir() / f"pointmaze_umaze_{tag}.npz"
    path = Path(path)
    if path.is_file():
        return load_offline_rl(path)
    data = generate_pointmaze(
        n_transitions, seed=seed, noise_std=noise_std, random_action_frac=random_action_frac
    )
    save_offline_rl(path, data)
    return data


def sample_free_goals(
    rng: np.random.Generator,
    center,
    radius: float,
    n: int,
    margin: float = 0.2,
    geom: MazeGeometry | None = None,
) -> np.ndarray:
    """Returns ``[n, 2]`` goals uniform in the disk ``|g - center| <= radius`` of free space.

    A goal is kept only if it and the four points ``margin`` away along each axis lie in free
    cells of the maze (rejection sampling), so it is reachable. ``geom`` defaults to
    PointMaze's UMaze (scaling 1).
    """
    geom = MazeGeometry() if geom is None else geom
    center = np.asarray(center, np.float64)
    out = []
    offsets = np.array([[0, 0], [margin, 0], [-margin, 0], [0, margin], [0, -margin]])
    while len(out) < n:
        r = radius * np.sqrt(rng.random())
        th = 2 * np.pi * rng.random()
        g = center + r * np.array([np.cos(th), np.sin(th)])
        if np.all(geom.is_free(g[None] + offsets)):
            out.append(g)
    return np.stack(out)


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
    """
    return _evaluate_maze(
        _make_vec(n_envs, episode_steps + 1, continuing_task=True, reset_target=False),
        lambda obs: obs["observation"],
        policy,
        goals,
        specs,
        seeds,
        episode_steps,
        reset_cell,
        progress,
    )


def _evaluate_maze(
    env, flat_obs, policy, goals, specs, seeds, episode_steps, reset_cell, progress, reached=False
):
    """Deterministic maze episodes, ``env.num_envs`` at a time (see :func:`evaluate_pointmaze`).

    ``env`` must time out after more than ``episode_steps`` steps (so no autoreset happens inside
    an episode); ``flat_obs(obs_dict) -> [E, o]`` is what the policy sees. Success is a final
    distance <= 0.45, or with ``reached`` a distance <= 0.45 at any step. The env is closed.
    """
    goals = np.asarray(goals, np.float64)
    specs = np.asarray(specs)
    seeds = np.asarray(seeds)
    m = goals.shape[0]
    n_envs = env.num_envs
    if goals.shape != (m, 2) or specs.shape[0] != m or seeds.shape != (m,):
        env.close()
        raise ValueError(
            f"goals, specs, seeds: expected [M, 2], [M, k], [M], got "
            f"{goals.shape}, {specs.shape}, {seeds.shape}"
        )
    ret, final, closest = np.zeros(m), np.zeros(m), np.zeros(m)
    chunks = range(0, m, n_envs)
    if progress is not None:
        chunks = progress(chunks, "rollouts")
    try:
        for start in chunks:
            idx = np.arange(start, start + n_envs) % m  # pad the last chunk with repeats
            # goal_cell only fixes where the reset puts the goal; it is overwritten right after.
            opts = {"reset_cell": np.array(reset_cell), "goal_cell": np.array([3, 1])}
            obs, _ = env.reset(seed=[int(s) for s in seeds[idx]], options=opts)
            for i, sub in enumerate(env.unwrapped.envs):
                sub.unwrapped.goal = goals[idx[i]].copy()
                sub.unwrapped.update_target_site_pos()
            r, d_min = np.zeros(n_envs), np.full(n_envs, np.inf)
            for _ in range(episode_steps):
                act = np.asarray(policy(flat_obs(obs), goals[idx], specs[idx]))
                obs, *_ = env.step(np.clip(act, -1.0, 1.0).astype(np.float32))
                d = np.linalg.norm(obs["achieved_goal"] - goals[idx], axis=-1)
                r += np.exp(-d)
                d_min = np.minimum(d_min, d)
            n_real = min(n_envs, m - start)
            ret[idx[:n_real]] = r[:n_real]
            final[idx[:n_real]] = d[:n_real]
            closest[idx[:n_real]] = d_min[:n_real]
    finally:
        env.close()
    success = (closest if reached else final) <= 0.45
    return {
        "success": success.astype(np.float64),
        "return": ret,
        "final_distance": final,
        "min_distance": closest,
    }


# --------------------------------------------------------------------------------------------
# Locomotion: SAC behaviour policies trained here, D4RL-style levels
# --------------------------------------------------------------------------------------------

LOCOMOTION_ENVS = ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5")
LOCOMOTION_LEVELS = ("random", "medium", "expert", "medium-replay")


def _check_env_id(env_id: str) -> None:
    if env_id not in LOCOMOTION_ENVS:
        raise ValueError(f"env_id: expected one of {LOCOMOTION_ENVS}, got {env_id!r}")


def _make_locomotion_vec(env_id: str, n_envs: int, max_episode_steps: int):
    import gymnasium as gym

    return gym.make_vec(
        env_id,
        num_envs=n_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
        max_episode_steps=max_episode_steps,
    )


def _vec_step(env, obs: np.ndarray, act: np.ndarray, info_keys=("x_velocity", "reward_forward")):
    """One vector step; returns (transition dict of ``[E, ...]`` arrays, next obs after resets).

    ``next_observations`` and each ``infos/<k>`` for ``k`` in ``info_keys`` are those of the
    step itself, also for envs that reset in it (read from ``final_obs`` / ``final_info``).
    """
    nobs, rew, term, trunc, info = env.step(act)
    nxt = np.array(nobs, copy=True)
    done = np.logical_or(term, trunc)
    # When every env resets in this step, info holds only the reset infos.
    extra = {k: np.array(info.get(k, np.zeros(len(act))), np.float64, copy=True) for k in info_keys}
    if np.any(done):
        fin = info["final_info"]
        for i in np.flatnonzero(done):
            nxt[i] = info["final_obs"][i]
            for k in info_keys:
                extra[k][i] = fin[k][i]
    tr = {
        "observations": obs,
        "actions": act,
        "rewards": np.asarray(rew, np.float32),
        "next_observations": nxt,
        "terminals": np.asarray(term, np.float32),
        "timeouts": np.asarray(trunc, np.float32),
    }
    return tr | {f"infos/{k}": v for k, v in extra.items()}, nobs


def _env_major(steps: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """``[T]`` list of ``[E, ...]`` transitions -> env-major contiguous trajectories ``[T E, ...]``.

    The last step of each env's stream is marked as a timeout so trajectories never run from one
    env's stream into the next one's.
    """
    t, e = len(steps), steps[0]["actions"].shape[0]
    out = {}
    for k in steps[0]:
        x = np.stack([s[k] for s in steps])  # [T, E, ...]
        out[k] = np.swapaxes(x, 0, 1).reshape(t * e, *x.shape[2:])
    ends = np.zeros(t * e, np.float32)
    ends[t - 1 :: t] = 1.0
    out["timeouts"] = np.maximum(out["timeouts"], ends) * (1.0 - out["terminals"])
    for k in ("observations", "actions", "next_observations", "infos/x_velocity"):
        out[k] = out[k].astype(np.float32)
    out["infos/reward_forward"] = out["infos/reward_forward"].astype(np.float32)
    return out


def evaluate_locomotion(
    policy,
    env_id: str,
    specs: np.ndarray,
    seeds: np.ndarray,
    n_envs: int = 16,
    episode_steps: int = 1000,
    target_velocity: float | None = None,
    progress=None,
) -> dict[str, np.ndarray]:
    """Runs deterministic episodes of ``policy`` in a gymnasium MuJoCo ``SyncVectorEnv``.

    Episode ``i`` is reset with ``seeds[i]`` and driven by ``policy(obs [E, o], spec [E, k]) ->
    actions [E, d]``; ``specs[i]`` tells the policy which method to run, so many methods share one
    batched policy call per step. An episode ends at ``episode_steps`` or when the task
    terminates (Hopper or Walker2d falling); later steps are ignored.

    With ``target_velocity`` ``v*`` the *shifted* reward of a step replaces the environment's
    forward term by a tracking term: ``r - reward_forward - |x_velocity - v*|`` (keeping the
    control cost and, for Hopper and Walker2d, the healthy bonus).

    Args:
      policy: host-callable returning actions in ``[-1, 1]``.
      env_id: one of ``LOCOMOTION_ENVS``.
      specs: ``[M, k]`` per-episode method descriptors (passed through to ``policy``).
      seeds: ``[M]`` int reset seeds (the same seed gives the same start for every method).
      n_envs: environments stepped together.
      episode_steps: steps per episode.
      target_velocity: ``v*`` of the shifted reward, or None.
      progress: optional ``progress(iterable, desc)`` wrapper for a progress bar.

    Returns:
      ``{"return": [M], "velocity": [M] (mean x velocity over the episode), "length": [M]}``,
      plus ``"shifted_return": [M]`` with ``target_velocity``.
    """
    _check_env_id(env_id)
    specs = np.asarray(specs)
    seeds = np.asarray(seeds)
    m = seeds.shape[0]
    if seeds.shape != (m,) or specs.shape[0] != m:
        raise ValueError(f"specs, seeds: expected [M, k], [M], got {specs.shape}, {seeds.shape}")
    env = _make_locomotion_vec(env_id, n_envs, episode_steps + 1)
    out = {k: np.zeros(m) for k in ("return", "velocity", "length", "shifted_return")}
    chunks = range(0, m, n_envs)
    if progress is not None:
        chunks = progress(chunks, "rollouts")
    try:
        for start in chunks:
            idx = np.arange(start, start + n_envs) % m
            obs, _ = env.reset(seed=[int(s) for s in seeds[idx]])
            alive = np.ones(n_envs, bool)
            acc = {k: np.zeros(n_envs) for k in out}
            for _ in range(episode_steps):
                act = np.clip(np.asarray(policy(obs, specs[idx])), -1.0, 1.0).astype(np.float32)
                tr, obs = _vec_step(env, obs, act)
                w = alive.astype(np.float64)
                acc["return"] += w * tr["rewards"]
                acc["velocity"] += w * tr["infos/x_velocity"]
                acc["length"] += w
                if target_velocity is not None:
                    track = np.abs(tr["infos/x_velocity"] - target_velocity)
                    acc["shifted_return"] += w * (
                        tr["rewards"] - tr["infos/reward_forward"] - track
                    )
                alive &= tr["terminals"] == 0
                if not alive.any():
                    break
            n_real = min(n_envs, m - start)
            for k in out:
                out[k][idx[:n_real]] = acc[k][:n_real]
    finally:
        env.close()
    out["velocity"] = out["velocity"] / np.maximum(out["length"], 1)
    if target_velocity is None:
        del out["shifted_return"]
    return out


@functools.lru_cache(maxsize=16)
def _sac_kit(obs_dim: int, act_dim: int, hidden: int, lr: float) -> types.SimpleNamespace:
    """The pieces of an online SAC loop (``hexad.policy.sac``, two ``hidden``-wide layers, Adam
    ``lr`` for actor, critics and temperature), with jitted functions compiled once per setting.

    Fields: ``actor``, ``algo``, ``dummy`` (a one-row ``Batch`` for ``algo.init``),
    ``sample(key, params, obs)``, ``mean_action(params, obs)`` (tanh of the mean), and
    ``update(key, state, rng, buf, filled, n, batch_size) -> state``: ``n`` SAC updates in one
    jitted ``lax.scan``, on minibatches drawn with ``rng`` uniformly from the first ``filled``
    rows of the replay buffer ``buf`` (a dict of the ``Batch`` fields).
    """
    import jax
    import jax.numpy as jnp
    import optax

    from hexad import policy as P

    hid = (hidden, hidden)
    actor = P.GaussianActor(act_dim, hid)
    opt = optax.adam(lr)
    algo = P.sac(actor, P.TwinCritic(hid), opt, opt, opt)
    dummy = P.Batch(
        jnp.zeros((1, obs_dim)),
        jnp.zeros((1, act_dim)),
        jnp.zeros(1),
        jnp.zeros((1, obs_dim)),
        jnp.zeros(1),
    )

    @jax.jit
    def scan_updates(key, state, batches):
        keys = jax.random.split(key, batches.rewards.shape[0])
        return jax.lax.scan(lambda s, kb: algo.step(kb[0], s, kb[1]), state, (keys, batches))[0]

    def update(key, state, rng, buf, filled, n, batch_size):
        idx = rng.integers(0, filled, (n, batch_size))
        batches = P.Batch(*(jnp.asarray(buf[f][idx]) for f in P.Batch._fields))
        return scan_updates(key, state, batches)

    return types.SimpleNamespace(
        actor=actor,
        algo=algo,
        dummy=dummy,
        sample=jax.jit(lambda key, params, obs: P.sample_action(key, actor.apply(params, obs))[0]),
        mean_action=jax.jit(lambda params, obs: jnp.tanh(actor.apply(params, obs).mean)),
        update=update,
    )


def generate_locomotion(
    env_id: str,
    total_steps: int = 20_000,
    seed: int = 0,
    n_envs: int = 4,
    hidden: int = 64,
    batch_size: int = 256,
    lr: float = 1e-3,
    start_steps: int = 2000,
    snapshot_every: int = 2000,
    n_eval_episodes: int = 2,
    eval_steps: int = 500,
    n_per_level: int = 20_000,
    episode_steps: int = 1000,
    progress=None,
) -> dict[str, dict[str, np.ndarray]]:
    """Trains SAC online on ``env_id`` and returns the four D4RL-style levels (module docstring).

    One SAC update per environment step (update-to-data ratio 1), ``n_envs`` updates per vector
    step in one jitted ``lax.scan`` over minibatches drawn uniformly from the replay buffer.

    Args:
      env_id: one of ``LOCOMOTION_ENVS``.
      total_steps: online environment steps (rounded up to a multiple of ``n_envs``).
      seed: seed of the environments, the networks and the sampling.
      n_envs: parallel training environments.
      hidden: width of the two hidden layers of the actor and of each critic.
      batch_size: SAC minibatch size.
      lr: Adam learning rate of actor, critic and temperature.
      start_steps: initial steps with uniform random actions (no updates before them).
      snapshot_every: env steps between snapshots (deterministic evaluations).
      n_eval_episodes: episodes per evaluation.
      eval_steps: steps per evaluation episode.
      n_per_level: transitions of each of random / medium / expert.
      episode_steps: episode length of the training and collection envs.
      progress: optional ``progress(iterable, desc)`` wrapper for a progress bar.

    Returns:
      ``{level: data}`` for every level in ``LOCOMOTION_LEVELS``.
    """
    import jax
    import jax.numpy as jnp

    _check_env_id(env_id)
    for name, v in (("total_steps", total_steps), ("n_envs", n_envs), ("n_per_level", n_per_level)):
        _check_int(name, v)
    if snapshot_every < n_envs or snapshot_every % n_envs:
        raise ValueError(
            f"snapshot_every: expected a multiple of n_envs={n_envs}, got {snapshot_every}"
        )
    env = _make_locomotion_vec(env_id, n_envs, episode_steps)
    obs_dim = env.single_observation_space.shape[0]
    act_dim = env.single_action_space.shape[0]
    kit = _sac_kit(obs_dim, act_dim, hidden, lr)
    key = jax.random.key(seed)
    k_init, key = jax.random.split(key)
    state = kit.algo.init(k_init, kit.dummy)
    sample, mean_action = kit.sample, kit.mean_action

    def evaluate(params):
        res = evaluate_locomotion(
            lambda o, _: mean_action(params, jnp.asarray(o, jnp.float32)),
            env_id,
            np.zeros((n_eval_episodes, 1)),
            10_000 + np.arange(n_eval_episodes),
            n_envs=n_eval_episodes,
            episode_steps=eval_steps,
        )
        return float(res["return"].mean())

    rng = np.random.default_rng(seed)
    n_vec = -(-total_steps // n_envs)
    cap = n_vec * n_envs
    buf = {
        "observations": np.zeros((cap, obs_dim), np.float32),
        "actions": np.zeros((cap, act_dim), np.float32),
        "rewards": np.zeros(cap, np.float32),
        "next_observations": np.zeros((cap, obs_dim), np.float32),
        "terminals": np.zeros(cap, np.float32),
    }
    steps: list[dict[str, np.ndarray]] = []
    snapshots = [(0, state.actor_params, evaluate(state.actor_params))]
    obs, _ = env.reset(seed=seed)
    it = range(n_vec)
    if progress is not None:
        it = progress(it, f"SAC {env_id}")
    try:
        for t in it:
            if t * n_envs < start_steps:
                act = rng.uniform(-1.0, 1.0, (n_envs, act_dim)).astype(np.float32)
            else:
                key, k = jax.random.split(key)
                act = np.asarray(sample(k, state.actor_params, jnp.asarray(obs, jnp.float32)))
            tr, obs = _vec_step(env, obs.astype(np.float32), act)
            steps.append(tr)
            sl = slice(t * n_envs, (t + 1) * n_envs)
            for k_ in buf:
                buf[k_][sl] = tr[k_]
            filled = (t + 1) * n_envs
            if filled >= start_steps and filled >= batch_size:
                key, k = jax.random.split(key)
                state = kit.update(k, state, rng, buf, filled, n_envs, batch_size)
            if filled % snapshot_every == 0:
                snapshots.append((filled, state.actor_params, evaluate(state.actor_params)))
    finally:
        env.close()
    rets = np.array([r for _, _, r in snapshots])
    best = int(np.argmax(rets))
    third = rets[0] + (rets[best] - rets[0]) / 3.0
    medium = int(np.flatnonzero(rets[: best + 1] >= third)[0]) if best > 0 else 0
    picks = {"random": 0, "medium": medium, "expert": best}
    meta = {"meta/random_return": rets[0], "meta/expert_return": rets[best]}

    out = {}
    for level, i in picks.items():
        step, params, ret = snapshots[i]
        cenv = _make_locomotion_vec(env_id, n_envs, episode_steps)
        cobs, _ = cenv.reset(seed=seed + 1 + i)
        coll = []
        try:
            for _ in range(-(-n_per_level // n_envs)):
                key, k = jax.random.split(key)
                act = np.asarray(sample(k, params, jnp.asarray(cobs, jnp.float32)))
                tr, cobs = _vec_step(cenv, cobs.astype(np.float32), act)
                coll.append(tr)
        finally:
            cenv.close()
        d = {k_: v[:n_per_level] for k_, v in _env_major(coll).items()}
        d["timeouts"][-1] = 1.0 - d["terminals"][-1]
        out[level] = d | {"meta/policy_return": ret, "meta/snapshot_step": step} | meta
    m_step, _, m_ret = snapshots[medium]
    replay = _env_major(steps[: max(m_step // n_envs, 1)])
    out["medium-replay"] = replay | {"meta/policy_return": m_ret, "meta/snapshot_step": m_step}
    out["medium-replay"] |= meta
    for d in out.values():
        for k_ in [k_ for k_ in d if k_.startswith("meta/")]:
            d[k_] = np.asarray(d[k_], np.float64)
    out["meta/snapshot_returns"] = rets
    return out


def locomotion_dataset(
    env_id: str,
    level: str,
    total_steps: int = 20_000,
    seed: int = 0,
    n_per_level: int = 20_000,
    hidden: int = 64,
    path_dir=None,
    progress=None,
    **kwargs,
) -> dict[str, np.ndarray]:
    """Returns one level of the locomotion data, generating and caching all four on first use.

    Args:
      env_id: one of ``LOCOMOTION_ENVS``.
      level: one of ``LOCOMOTION_LEVELS``.
      total_steps, seed, n_per_level, hidden, kwargs: see :func:`generate_locomotion`.
      path_dir: folder of the npz files; default :func:`cache_dir`.
      progress: optional progress-bar wrapper, used only when generating.

    Returns:
      a dict with the D4RL fields and the extras listed in the module docstring; the snapshot
      returns of the whole SAC run are in ``meta/snapshot_returns`` (every level).
    """
    _check_env_id(env_id)
    if level not in LOCOMOTION_LEVELS:
        raise ValueError(f"level: expected one of {LOCOMOTION_LEVELS}, got {level!r}")
    spec = {
        "env": env_id,
        "steps": int(total_steps),
        "seed": int(seed),
        "n": int(n_per_level),
        "hidden": int(hidden),
        "kw": {k: kwargs[k] for k in sorted(kwargs)},
        "version": 1,
    }
    tag = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    folder = Path(path_dir) if path_dir is not None else cache_dir()
    name = env_id.split("-")[0].lower()
    paths = {lv: folder / f"{name}_{lv}_{tag}.npz" for lv in LOCOMOTION_LEVELS}
    if not paths[level].is_file():
        gen = generate_locomotion(
            env_id,
            total_steps,
            seed=seed,
            n_per_level=n_per_level,
            hidden=hidden,
            progress=progress,
            **kwargs,
        )
        rets = gen.pop("meta/snapshot_returns")
        for lv, d in gen.items():
            save_offline_rl(paths[lv], d | {"meta/snapshot_returns": rets})
    return load_offline_rl(paths[level])


def _main(argv=None) -> None:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m hexad.data.offline_rl",
        description="Generate and cache offline-RL data sets (D4RL field names, npz).",
    )
    sub = ap.add_subparsers(dest="what", required=True)
    lo = sub.add_parser("locomotion", help="SAC behaviour policies on a gymnasium MuJoCo task")
    lo.add_argument("--env", default="HalfCheetah-v5", choices=LOCOMOTION_ENVS)
    lo.add_argument("--steps", type=int, default=20_000, help="online SAC env steps")
    lo.add_argument("--seed", type=int, default=0)
    lo.add_argument("--n-per-level", type=int, default=20_000)
    lo.add_argument("--hidden", type=int, default=64)
    pm = sub.add_parser("pointmaze", help="scripted noisy oracle on PointMaze_UMaze-v3")
    pm.add_argument("--n", type=int, default=100_000)
    pm.add_argument("--seed", type=int, default=0)
    am = sub.add_parser(
        "antmaze", help="SAC ant controller + BFS planner, noisy oracle on AntMaze_UMaze-v5"
    )
    am.add_argument("--n", type=int, default=200_000)
    am.add_argument("--seed", type=int, default=0)
    am.add_argument("--controller-steps", type=int, default=400_000, help="online SAC env steps")
    args = ap.parse_args(argv)
    if args.what == "pointmaze":
        d = pointmaze_dataset(args.n, seed=args.seed)
        print(f"pointmaze: {d['observations'].shape[0]} transitions")
        return
    from tqdm import tqdm

    if args.what == "antmaze":
        from hexad.data._antmaze import antmaze_dataset

        d = antmaze_dataset(
            args.n,
            seed=args.seed,
            controller_kwargs={"total_steps": args.controller_steps},
            progress=lambda it, desc: tqdm(it, desc=desc, mininterval=10),
        )
        curve = d["meta/controller_curve"]
        print(
            f"antmaze: {d['observations'].shape[0]} transitions, reward fraction "
            f"{float(d['rewards'].mean()):.4f}; controller velocity along the command per "
            f"chunk: {np.round(curve[:, 1], 2).tolist()}"
        )
        return

    for level in LOCOMOTION_LEVELS:
        d = locomotion_dataset(
            args.env,
            level,
            args.steps,
            seed=args.seed,
            n_per_level=args.n_per_level,
            hidden=args.hidden,
            progress=lambda it, desc: tqdm(it, desc=desc),
        )
        ends = np.flatnonzero((d["terminals"] + d["timeouts"]) > 0)
        ep_ret = np.add.reduceat(d["rewards"], np.r_[0, ends[:-1] + 1]) if len(ends) else []
        print(
            f"{args.env} {level}: {d['observations'].shape[0]} transitions, snapshot step "
            f"{int(d['meta/snapshot_step'])}, policy return {float(d['meta/policy_return']):.1f}, "
            f"mean episode return in data {np.mean(ep_ret):.1f}, mean x velocity "
            f"{float(d['infos/x_velocity'].mean()):.2f}"
        )
    print("snapshot returns:", np.round(d["meta/snapshot_returns"], 1).tolist())


if __name__ == "__main__":
    _main()
