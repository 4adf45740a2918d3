"""Mazes of gymnasium-robotics: geometry and shortest paths, oracle collection, evaluation."""

from __future__ import annotations

import collections

import numpy as np

from hexad._base import check_int

__all__ = [
    "UMAZE",
    "MazeGeometry",
    "check_maze_args",
    "collect_maze",
    "evaluate_maze",
    "maze_fields",
    "sample_free_goals",
]

UMAZE = (
    (1, 1, 1, 1, 1),
    (1, 0, 0, 0, 1),
    (1, 1, 1, 0, 1),
    (1, 0, 0, 0, 1),
    (1, 1, 1, 1, 1),
)
"""The U-shaped maze of PointMaze and AntMaze UMaze, ``[5, 5]`` cells, 1 a wall and 0 free."""


class MazeGeometry:
    r"""Cell <-> coordinate maps and shortest-path next cells of a gymnasium-robotics maze.

    Coordinates follow gymnasium-robotics: cell :math:`(r, c)` has centre :math:`x = (c +
    \frac{1}{2}) s - W s / 2`, :math:`y = H s / 2 - (r + \frac{1}{2}) s` for an :math:`H \times W`
    map and scaling :math:`s`. The next cell towards every goal cell is found by breadth-first
    search over the free cells (4-neighbourhood).

    Args:
      maze_map: ``[H, W]`` grid, 1 for a wall and 0 for a free cell.
      scaling: side length of a cell.

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
        """``[2]`` the centre of cell ``rc = (row, col)``."""
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
        """``[...]`` bool: whether each of the ``[..., 2]`` points lies in a free cell."""
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


def sample_free_goals(
    rng: np.random.Generator,
    center,
    radius: float,
    n: int,
    margin: float = 0.2,
    geom: MazeGeometry | None = None,
) -> np.ndarray:
    r"""Returns ``[n, 2]`` goals uniform in the disk :math:`\|g - \text{center}\| \le`
    ``radius`` of free space.

    A goal is kept only if it and the four points ``margin`` away along each axis lie in free
    cells of the maze (rejection sampling), so it is reachable.

    Args:
      rng: the numpy generator drawing the goals.
      center: ``[2]`` centre of the disk.
      radius: radius of the disk.
      n: number of goals.
      margin: clearance from the walls.
      geom: the maze; default PointMaze's UMaze (scaling 1).

    >>> g = sample_free_goals(np.random.default_rng(0), (-1.0, -1.0), 0.5, 3)
    >>> g.shape, bool(MazeGeometry().is_free(g).all())
    ((3, 2), True)
    """
    n = check_int("n", n)
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


def check_maze_args(n_transitions, n_envs, episode_steps, random_action_frac) -> None:
    """Raises a ValueError naming the argument: the checks of every maze generator.

    >>> check_maze_args(10, 2, 1, 0.0)
    Traceback (most recent call last):
    ...
    ValueError: episode_steps: expected an int >= 2, got 1
    """
    check_int("n_transitions", n_transitions)
    check_int("n_envs", n_envs)
    check_int("episode_steps", episode_steps, 2)
    if not 0.0 <= random_action_frac <= 1.0:
        raise ValueError(
            f"random_action_frac: expected a value in [0, 1], got {random_action_frac}"
        )


def collect_maze(
    env, n_transitions, seed, flat_obs, oracle, noise_std, random_action_frac, cut_if=None
) -> dict[str, np.ndarray]:
    """Steps a maze ``SyncVectorEnv`` with a noisy oracle; env-major D4RL fields + ``infos/goal``.

    Each step's action is ``oracle(o, goal)`` plus Gaussian noise of std ``noise_std``, or, for
    a fraction ``random_action_frac`` of the steps, uniform in ``[-1, 1]``; it is clipped to
    ``[-1, 1]``. The noise is drawn from ``numpy.random.default_rng(seed)``, and the env is
    reset with ``seed``. With ``cut_if``, an episode whose next observation meets it ends there
    as a timeout and that env alone is reset. The env is closed at the end.

    Args:
      env: a maze vector env from :func:`~hexad.data.offline_rl.make_vec` (dict observations
        with ``desired_goal``).
      n_transitions: number of transitions ``N`` (rounded up to a multiple of the envs, then
        cut).
      seed: seed of the env's reset and of the noise.
      flat_obs: ``flat_obs(obs_dict) -> [E, o]`` the stored observation.
      oracle: ``oracle(o [E, o], goal [E, 2]) -> [E, d]`` the noiseless action.
      noise_std: std of the Gaussian action noise.
      random_action_frac: fraction of uniform random actions.
      cut_if: optional ``cut_if(next_o [E, o]) -> [E] bool``.

    Returns:
      ``observations [N, o]``, ``actions [N, d]`` (float32), ``next_observations [N, o]``,
      ``terminals [N]``, ``timeouts [N]`` (1 at each env stream's end and at the last row),
      ``infos/goal [N, 2]``; each env's trajectories are contiguous.
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


def maze_fields(out, task_goal, qpos: slice, qvel: slice) -> dict[str, np.ndarray]:
    """Completes :func:`collect_maze`'s output: the sparse task reward, qpos / qvel, dtypes.

    ``rewards`` is 1 where the next x, y is within 0.5 of ``task_goal`` (D4RL's sparse maze
    reward); ``infos/qpos`` and ``infos/qvel`` are the ``qpos`` / ``qvel`` columns of the
    observations; ``task_goal`` is stored. ``out`` is updated in place and returned.

    >>> out = {"observations": np.zeros((2, 4)), "next_observations": np.zeros((2, 4)),
    ...        "infos/goal": np.zeros((2, 2))}
    >>> maze_fields(out, (0.0, 0.4), slice(0, 2), slice(2, 4))["rewards"].tolist()
    [1.0, 1.0]
    """
    tg = np.asarray(task_goal, np.float64)
    dist = np.linalg.norm(out["next_observations"][:, :2] - tg[None], axis=-1)
    out["rewards"] = (dist <= 0.5).astype(np.float32)
    out["infos/qpos"] = out["observations"][:, qpos].copy()
    out["infos/qvel"] = out["observations"][:, qvel].copy()
    out["task_goal"] = tg
    for k in ("observations", "next_observations", "infos/goal", "infos/qpos", "infos/qvel"):
        out[k] = out[k].astype(np.float32)
    return out


def evaluate_maze(
    env, flat_obs, policy, goals, specs, seeds, episode_steps, reset_cell, progress, reached=False
) -> dict[str, np.ndarray]:
    """Deterministic maze episodes, ``env.num_envs`` at a time; closes ``env``.

    Episode ``i`` starts in ``reset_cell`` (with the environment's position noise, seeded by
    ``seeds[i]``), targets ``goals[i]`` and is driven by ``policy(obs [E, o], goal [E, 2],
    spec [E, k]) -> actions``, where ``obs = flat_obs(obs_dict)``.

    Args:
      env: a maze vector env from :func:`~hexad.data.offline_rl.make_vec` that times out after
        more than ``episode_steps`` steps (so no autoreset happens inside an episode).
      flat_obs: ``flat_obs(obs_dict) -> [E, o]``, what the policy sees.
      policy: host-callable returning actions (clipped to ``[-1, 1]``).
      goals: ``[M, 2]`` goals.
      specs: ``[M, k]`` per-episode method descriptors (passed through to ``policy``).
      seeds: ``[M]`` int reset seeds.
      episode_steps: steps per episode.
      reset_cell: start cell ``(row, col)``.
      progress: optional ``progress(iterable, desc)`` wrapper for a progress bar.
      reached: success is a distance <= 0.45 at any step (else at the final step).

    Returns:
      ``{"success": [M] float, "return": [M] (sum of the dense reward exp(-distance)),
      "final_distance": [M], "min_distance": [M]}``.
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
