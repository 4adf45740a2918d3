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

Files are generated once and cached under ``$HEXAD_CACHE`` (default ``~/.cache/hexad``) in
``offline_rl/``; a file with missing fields or non-finite values is refused.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
from pathlib import Path

import numpy as np

from hexad.data import _bundled
from hexad.data._bundled import load_npz

__all__ = [
    "D4RL_FIELDS",
    "MazeGeometry",
    "cache_dir",
    "evaluate_pointmaze",
    "generate_pointmaze",
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


def _make_vec(n_envs: int, max_episode_steps: int, **kwargs):
    import gymnasium as gym
    import gymnasium_robotics

    gym.register_envs(gymnasium_robotics)
    return gym.make_vec(
        "PointMaze_UMaze-v3",
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
    if n_transitions < 1 or n_envs < 1 or episode_steps < 2:
        raise ValueError(
            f"n_transitions, n_envs, episode_steps: expected >= 1, 1, 2, got "
            f"{n_transitions}, {n_envs}, {episode_steps}"
        )
    if not 0.0 <= random_action_frac <= 1.0:
        raise ValueError(
            f"random_action_frac: expected a value in [0, 1], got {random_action_frac}"
        )
    geom = MazeGeometry()
    rng = np.random.default_rng(seed)
    env = _make_vec(n_envs, episode_steps, continuing_task=True, reset_target=True)
    steps = -(-n_transitions // n_envs)
    buf = collections.defaultdict(list)
    obs, _ = env.reset(seed=seed)
    try:
        for _ in range(steps):
            o = obs["observation"]
            goal = obs["desired_goal"]
            act = pointmaze_oracle(geom, o, goal) + noise_std * rng.standard_normal((n_envs, 2))
            rand = rng.random(n_envs) < random_action_frac
            act = np.where(rand[:, None], rng.uniform(-1, 1, (n_envs, 2)), act)
            act = np.clip(act, -1.0, 1.0).astype(np.float32)
            nobs, _, term, trunc, info = env.step(act)
            nxt = nobs["observation"].copy()
            done = np.logical_or(term, trunc)
            if np.any(done):
                final = info["final_obs"]
                for i in np.flatnonzero(done):
                    nxt[i] = final[i]["observation"]
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
    tg = np.asarray(task_goal, np.float64)
    dist = np.linalg.norm(out["next_observations"][:, :2] - tg[None], axis=-1)
    out["rewards"] = (dist <= 0.5).astype(np.float32)
    out["infos/qpos"] = out["observations"][:, :2].copy()
    out["infos/qvel"] = out["observations"][:, 2:4].copy()
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
    rng: np.random.Generator, center, radius: float, n: int, margin: float = 0.2
) -> np.ndarray:
    """Returns ``[n, 2]`` goals uniform in the disk ``|g - center| <= radius`` of free space.

    A goal is kept only if it and the four points ``margin`` away along each axis lie in free
    cells of the UMaze (rejection sampling), so it is reachable by the point mass.
    """
    geom = MazeGeometry()
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
      reward exp(-distance)), "final_distance": [M]}``.
    """
    goals = np.asarray(goals, np.float64)
    specs = np.asarray(specs)
    seeds = np.asarray(seeds)
    m = goals.shape[0]
    if goals.shape != (m, 2) or specs.shape[0] != m or seeds.shape != (m,):
        raise ValueError(
            f"goals, specs, seeds: expected [M, 2], [M, k], [M], got "
            f"{goals.shape}, {specs.shape}, {seeds.shape}"
        )
    # One step longer than the episode, so no truncation (and no autoreset) happens inside it.
    env = _make_vec(n_envs, episode_steps + 1, continuing_task=True, reset_target=False)
    ret = np.zeros(m)
    final = np.zeros(m)
    chunks = range(0, m, n_envs)
    if progress is not None:
        chunks = progress(chunks, "rollouts")
    try:
        for start in chunks:
            idx = np.arange(start, start + n_envs) % m  # pad the last chunk with repeats
            opts = {"reset_cell": np.array(reset_cell), "goal_cell": np.array([3, 1])}
            obs, _ = env.reset(seed=[int(s) for s in seeds[idx]], options=opts)
            for i, sub in enumerate(env.unwrapped.envs):
                sub.unwrapped.goal = goals[idx[i]].copy()
                sub.unwrapped.update_target_site_pos()
            r = np.zeros(n_envs)
            for _ in range(episode_steps):
                act = np.asarray(policy(obs["observation"], goals[idx], specs[idx]))
                obs, *_ = env.step(np.clip(act, -1.0, 1.0).astype(np.float32))
                d = np.linalg.norm(obs["achieved_goal"] - goals[idx], axis=-1)
                r += np.exp(-d)
            n_real = min(n_envs, m - start)
            ret[idx[:n_real]] = r[:n_real]
            final[idx[:n_real]] = d[:n_real]
    finally:
        env.close()
    return {"success": (final <= 0.45).astype(np.float64), "return": ret, "final_distance": final}
