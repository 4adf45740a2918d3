"""MuJoCo locomotion (HalfCheetah, Hopper, Walker2d): environments, collection with a given
policy, D4RL-style level selection, the velocity-tracking objective, and evaluation. The behaviour
policies themselves are trained in :mod:`hexad.policy` (``locomotion_dataset``)."""

from __future__ import annotations

import numpy as np

from hexad._base import check_int
from hexad.data.offline_rl._gym import env_major, make_vec, vec_step

__all__ = [
    "LOCOMOTION_ENVS",
    "LOCOMOTION_LEVELS",
    "LocomotionEnv",
    "check_env_id",
    "collect_locomotion",
    "evaluate_locomotion",
    "locomotion_levels",
    "tracking_return_bound",
    "tracking_reward",
    "velocity_features",
]

LOCOMOTION_ENVS = ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5")
"""The gymnasium MuJoCo tasks of the locomotion data sets."""
LOCOMOTION_LEVELS = ("random", "medium", "expert", "medium-replay")
"""The D4RL-style levels of each locomotion task (:func:`locomotion_levels`)."""
# Each task's per-step healthy bonus (gymnasium's default ``healthy_reward``; HalfCheetah has none).
_HEALTHY_REWARD = {"HalfCheetah-v5": 0.0, "Hopper-v5": 1.0, "Walker2d-v5": 1.0}


def check_env_id(env_id: str) -> str:
    """Returns ``env_id`` or raises a ValueError unless it is one of ``LOCOMOTION_ENVS``.

    >>> check_env_id("Hopper-v4")
    Traceback (most recent call last):
    ...
    ValueError: env_id: expected one of ('HalfCheetah-v5', ...), got 'Hopper-v4'
    """
    if env_id not in LOCOMOTION_ENVS:
        raise ValueError(f"env_id: expected one of {LOCOMOTION_ENVS}, got {env_id!r}")
    return env_id


class LocomotionEnv:
    """A locomotion vector env in the shape :func:`hexad.policy.train_online` steps.

    ``reset(rng)`` resets every env with ``seed`` (not with ``rng``) and returns the float32
    observations ``[E, o]``; ``step(rng, act)`` returns ``(transition, next observations)``
    with the transition of :func:`~hexad.data.offline_rl.vec_step` (D4RL fields,
    ``infos/x_velocity``, ``infos/reward_forward``). Environments autoreset.

    Args:
      env_id: one of ``LOCOMOTION_ENVS``.
      n_envs: parallel environments.
      episode_steps: episode length before a timeout.
      seed: the reset seed.

    >>> env = LocomotionEnv("Hopper-v5", 2, 10)
    >>> obs = env.reset(np.random.default_rng(0))
    >>> tr, obs = env.step(None, np.zeros((2, 3), np.float32))
    >>> env.obs_dim, env.act_dim, obs.dtype
    (11, 3, dtype('float32'))
    >>> env.close()
    """

    def __init__(self, env_id: str, n_envs: int, episode_steps: int, seed: int = 0):
        check_env_id(env_id)
        self.env = make_vec(env_id, check_int("n_envs", n_envs), episode_steps)
        self.num_envs = n_envs
        self.obs_dim = self.env.single_observation_space.shape[0]
        self.act_dim = self.env.single_action_space.shape[0]
        self.seed = seed
        self._obs = None

    def reset(self, rng: np.random.Generator) -> np.ndarray:
        del rng
        obs, _ = self.env.reset(seed=self.seed)
        self._obs = obs.astype(np.float32)
        return self._obs

    def step(self, rng: np.random.Generator, act: np.ndarray):
        del rng
        tr, nobs = vec_step(self.env, self._obs, act)
        self._obs = nobs.astype(np.float32)
        return tr, self._obs

    def close(self) -> None:
        self.env.close()


def collect_locomotion(
    policy,
    env_id: str,
    n_transitions: int,
    *,
    seed: int = 0,
    n_envs: int = 4,
    episode_steps: int = 1000,
) -> dict[str, np.ndarray]:
    """Returns ``n_transitions`` of ``policy`` in ``env_id`` as env-major D4RL fields.

    Args:
      policy: host-callable ``policy(obs [E, o] float32) -> actions [E, d]`` (it may hold state,
        e.g. a JAX key it splits at each call).
      env_id: one of ``LOCOMOTION_ENVS``.
      n_transitions: number of transitions ``N`` (rounded up to a multiple of ``n_envs`` while
        collecting, then cut).
      seed: reset seed of the environments.
      n_envs: parallel environments.
      episode_steps: episode length before a timeout.

    Returns:
      the D4RL fields, ``infos/x_velocity`` and ``infos/reward_forward`` (``[N, ...]``); the
      last row ends its trajectory (a timeout unless it is a terminal).

    >>> d = collect_locomotion(lambda o: np.zeros((o.shape[0], 3), np.float32), "Hopper-v5", 6,
    ...                        n_envs=2, episode_steps=5)
    >>> d["observations"].shape, float(d["timeouts"][-1] + d["terminals"][-1])
    ((6, 11), 1.0)
    """
    check_env_id(env_id)
    n_transitions = check_int("n_transitions", n_transitions)
    env = make_vec(env_id, check_int("n_envs", n_envs), episode_steps)
    obs, _ = env.reset(seed=seed)
    steps = []
    try:
        for _ in range(-(-n_transitions // n_envs)):
            obs = obs.astype(np.float32)
            tr, obs = vec_step(env, obs, np.asarray(policy(obs)))
            steps.append(tr)
    finally:
        env.close()
    d = {k: v[:n_transitions] for k, v in env_major(steps).items()}
    d["timeouts"][-1] = 1.0 - d["terminals"][-1]
    return d


def locomotion_levels(snapshot_returns) -> dict[str, int]:
    """Returns the snapshot index of each of D4RL's random / medium / expert levels.

    *random* is the first snapshot (the untrained policy), *expert* the one with the highest
    return, and *medium* the earliest snapshot up to the expert whose return reaches a third
    of the way from random to expert (D4RL's medium is about a third of its expert).

    Args:
      snapshot_returns: ``[S]`` returns of the snapshots, in training order.

    >>> locomotion_levels([0.0, 5.0, 2.0, 9.0, 4.0])
    {'random': 0, 'medium': 1, 'expert': 3}
    """
    rets = np.asarray(snapshot_returns, np.float64)
    if rets.ndim != 1 or rets.size == 0:
        raise ValueError(f"snapshot_returns: expected shape [S] with S >= 1, got {rets.shape}")
    best = int(np.argmax(rets))
    third = rets[0] + (rets[best] - rets[0]) / 3.0
    medium = int(np.flatnonzero(rets[: best + 1] >= third)[0]) if best > 0 else 0
    return {"random": 0, "medium": medium, "expert": best}


def tracking_reward(data, target_velocity) -> np.ndarray:
    """Returns ``[N]`` float64 the velocity-tracking reward ``r - reward_forward - |v - v*|``.

    The environment's reward with its forward term replaced by a tracking term: the control
    cost and, for Hopper and Walker2d, the healthy bonus are kept. ``v - v*`` is taken in the
    promoted dtype of ``infos/x_velocity`` and ``target_velocity``, the rest in float64.

    Args:
      data: a mapping with ``rewards [N]``, ``infos/reward_forward [N]`` and
        ``infos/x_velocity [N]`` (the locomotion data's fields, or one :func:`vec_step`).
      target_velocity: ``v*``, a scalar or ``[N]`` (e.g. each transition's hindsight goal).

    >>> d = {"rewards": np.array([3.0, 0.5]), "infos/reward_forward": np.array([2.0, 1.0]),
    ...      "infos/x_velocity": np.array([2.0, 1.0])}
    >>> tracking_reward(d, 1.5).tolist()
    [0.5, -1.0]
    """
    r, fwd, v = (
        np.asarray(data[k]) for k in ("rewards", "infos/reward_forward", "infos/x_velocity")
    )
    if r.ndim != 1 or fwd.shape != r.shape or v.shape != r.shape:
        raise ValueError(
            "data: expected rewards, infos/reward_forward, infos/x_velocity of one shape [N], "
            f"got {r.shape}, {fwd.shape}, {v.shape}"
        )
    target = np.asarray(target_velocity)
    if target.shape not in ((), r.shape):
        raise ValueError(
            f"target_velocity: expected a scalar or shape {r.shape}, got {target.shape}"
        )
    return (r - fwd).astype(np.float64) - np.abs(v - target_velocity)


def velocity_features(data, grid) -> np.ndarray:
    """Returns ``[N, M + 1]`` float32 features ``[-|v - c_m|]_m, r - reward_forward``.

    The successor features' ``phi`` of the tracking objective: one tracking term per grid
    velocity ``c_m``, then the rest of the environment's reward (control cost, healthy bonus).
    :func:`tracking_reward` for ``v* = c_m`` is exactly ``phi_m + phi_M`` (up to rounding), and
    for any other ``v*`` it is approximately linear in ``phi``. Computed in float64.

    Args:
      data: a mapping with ``rewards [N]``, ``infos/reward_forward [N]``, ``infos/x_velocity [N]``.
      grid: ``[M]`` velocities ``c_m``.

    >>> d = {"rewards": np.array([3.0]), "infos/reward_forward": np.array([2.0]),
    ...      "infos/x_velocity": np.array([2.0])}
    >>> velocity_features(d, np.array([0.0, 1.5])).tolist()
    [[-2.0, -0.5, 1.0]]
    """
    c = np.asarray(grid)
    if c.ndim != 1:
        raise ValueError(f"grid: expected shape [M], got {c.shape}")
    v = np.asarray(data["infos/x_velocity"]).astype(np.float64)[:, None]
    rest = np.asarray(data["rewards"]) - np.asarray(data["infos/reward_forward"])
    rest = rest.astype(np.float64)[:, None]
    return np.concatenate([-np.abs(v - c[None]), rest], -1).astype(np.float32)


def tracking_return_bound(env_id: str, episode_steps: int) -> float:
    """Returns the highest return of the tracking objective over ``episode_steps`` steps.

    Exact tracking with zero control cost, healthy at every step: ``episode_steps`` times the
    task's healthy bonus (1 for Hopper and Walker2d, 0 for HalfCheetah). No policy reaches it;
    it is the 100 of a normalised tracking score.

    Args:
      env_id: one of ``LOCOMOTION_ENVS``.
      episode_steps: steps per episode, ``>= 1``.

    >>> tracking_return_bound("Hopper-v5", 1000), tracking_return_bound("HalfCheetah-v5", 1000)
    (1000.0, 0.0)
    """
    check_env_id(env_id)
    return _HEALTHY_REWARD[env_id] * check_int("episode_steps", episode_steps)


def evaluate_locomotion(
    policy,
    env_id: str,
    specs: np.ndarray,
    seeds: np.ndarray,
    n_envs: int = 16,
    episode_steps: int = 1000,
    target_velocity: float | np.ndarray | None = None,
    progress=None,
) -> dict[str, np.ndarray]:
    """Runs deterministic episodes of ``policy`` in a gymnasium MuJoCo ``SyncVectorEnv``.

    Episode ``i`` is reset with ``seeds[i]`` and driven by ``policy(obs [E, o], spec [E, k]) ->
    actions [E, d]``; ``specs[i]`` tells the policy which method to run, so many methods share one
    batched policy call per step. An episode ends at ``episode_steps`` or when the task
    terminates (Hopper or Walker2d falling); later steps are ignored.

    With ``target_velocity`` ``v*`` the *shifted* reward of a step is :func:`tracking_reward`:
    the environment's forward term replaced by ``-|x_velocity - v*|`` (keeping the control cost
    and, for Hopper and Walker2d, the healthy bonus); a ``[M]`` array gives each episode its
    own ``v*`` (e.g. one per actor being evaluated).

    Args:
      policy: host-callable returning actions in ``[-1, 1]``.
      env_id: one of ``LOCOMOTION_ENVS``.
      specs: ``[M, k]`` per-episode method descriptors (passed through to ``policy``).
      seeds: ``[M]`` int reset seeds (the same seed gives the same start for every method).
      n_envs: environments stepped together.
      episode_steps: steps per episode.
      target_velocity: ``v*`` of the shifted reward (a scalar, or ``[M]`` per episode), or
        None.
      progress: optional ``progress(iterable, desc)`` wrapper for a progress bar.

    Returns:
      ``{"return": [M], "velocity": [M] (mean x velocity over the episode), "length": [M]}``,
      plus ``"shifted_return": [M]`` with ``target_velocity``.

    >>> res = evaluate_locomotion(lambda o, s: np.zeros((o.shape[0], 3)), "Hopper-v5",
    ...                           np.zeros((2, 1)), np.arange(2), n_envs=2, episode_steps=5)
    >>> res["length"].tolist()
    [5.0, 5.0]
    """
    check_env_id(env_id)
    specs = np.asarray(specs)
    seeds = np.asarray(seeds)
    m = seeds.shape[0]
    if seeds.shape != (m,) or specs.shape[0] != m:
        raise ValueError(f"specs, seeds: expected [M, k], [M], got {specs.shape}, {seeds.shape}")
    target = None
    if target_velocity is not None:
        target = np.asarray(target_velocity, np.float64)
        target = np.full(m, target) if target.ndim == 0 else target
        if target.shape != (m,) or not np.isfinite(target).all():
            raise ValueError(
                f"target_velocity: expected a finite scalar or [{m}] array, got {target_velocity!r}"
            )
    env = make_vec(env_id, n_envs, episode_steps + 1)
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
                tr, obs = vec_step(env, obs, act)
                w = alive.astype(np.float64)
                acc["return"] += w * tr["rewards"]
                acc["velocity"] += w * tr["infos/x_velocity"]
                acc["length"] += w
                if target is not None:
                    acc["shifted_return"] += w * tracking_reward(tr, target[idx])
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
