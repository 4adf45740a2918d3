"""AntMaze: a direction-commanded SAC ant (trained here) driven by the BFS waypoint planner.

The low-level controller is a soft actor-critic (``hexad.policy.sac``) trained online on
gymnasium's ``Ant-v5`` to walk in a commanded direction: its input is the 27-d ``Ant-v5``
observation followed by ``(cos, sin)`` of the command angle relative to the torso's yaw (read
from the quaternion ``obs[1:5]``), and its reward is ``v . (cos, sin)(command) + 1 (healthy)
- ctrl_cost |a|^2``. An episode terminates when ``Ant-v5`` finds the torso unhealthy (height
outside [0.2, 1]) and, by default, when the torso turns upside down. The command is redrawn
uniformly every ``command_every`` steps and at every reset. In the maze (gymnasium-robotics
``AntMaze_UMaze-v5``, cells of size 4) the command is the direction to the next waypoint of
:class:`~hexad.data.offline_rl.MazeGeometry`'s shortest path; with Gaussian action noise this
is the scripted oracle of the data set, in the manner of D4RL's antmaze (Fu et al. 2020),
whose low-level ant was also a trained goal-reaching policy.

Training runs in chunks of ``chunk_steps`` env steps. Each chunk starts from freshly reset
environments and from a numpy generator and a JAX key derived from ``(seed, chunk)``, and is
checkpointed through :class:`hexad.cachex.CacheXManager` (SAC state, the whole replay buffer
and the learning curve) when it ends, so an interrupted run resumes at the last finished chunk
and ends with exactly the parameters of an uninterrupted one. The finished checkpoint is the
cache: a second call with the same settings loads it.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import time
from pathlib import Path

import numpy as np

from hexad.data import offline_rl as _orl

__all__ = [
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
]

ANTMAZE_ENV = "AntMaze_UMaze-v5"
ANTMAZE_SCALING = 4.0
ANT_OBS_DIM = 27  # Ant-v5 observation without the x, y position
ANT_ACT_DIM = 8
ANT_INPUT_DIM = ANT_OBS_DIM + 2  # + (cos, sin) of the command relative to the yaw


def torso_yaw(obs: np.ndarray) -> np.ndarray:
    """``[n]`` yaw of the torso from ``[n, >=5]`` Ant observations (quaternion ``obs[:, 1:5]``)."""
    w, x, y, z = (obs[:, i] for i in range(1, 5))
    return np.arctan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z))


def upright(obs: np.ndarray) -> np.ndarray:
    """``[n]`` the world-z component of the torso's z axis (1 upright, -1 on its back) from
    ``[n, >=5]`` Ant observations (quaternion ``obs[:, 1:5]``)."""
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


def _sac(hidden: int, lr: float):
    return _orl._sac_kit(ANT_INPUT_DIM, ANT_ACT_DIM, hidden, lr)


def _controller_spec(**overrides) -> dict:
    """The controller's full settings (:func:`train_ant_controller`'s defaults updated with
    ``overrides``) as the JSON dict that names its cache folder."""
    spec = dict(_CONTROLLER_DEFAULTS)
    unknown = sorted(set(overrides) - set(spec))
    if unknown:
        raise ValueError(f"controller settings: unknown {unknown}; expected some of {sorted(spec)}")
    spec.update(overrides)
    spec = {k: (float(v) if isinstance(v, float) else v) for k, v in spec.items()}
    # Folders trained before the option existed (without it) keep their names.
    if not spec.pop("terminate_flipped"):
        return spec | {"version": 1}
    return spec | {"version": 1, "terminate_flipped": True}


def train_ant_controller(
    total_steps: int = 400_000,
    seed: int = 0,
    *,
    n_envs: int = 4,
    hidden: int = 128,
    batch_size: int = 256,
    lr: float = 1e-3,
    start_steps: int = 5000,
    episode_steps: int = 200,
    command_every: int = 100,
    ctrl_cost: float = 0.05,
    terminate_flipped: bool = True,
    chunk_steps: int = 50_000,
    directory=None,
    progress=None,
) -> dict:
    """Trains (or resumes, or loads) the direction-commanded ant controller (module docstring).

    One SAC update per env step: ``n_envs`` updates per vector step in one jitted ``lax.scan``
    over minibatches drawn uniformly from the replay buffer (after ``start_steps`` uniform
    random steps).

    Args:
      total_steps: online env steps, a multiple of ``chunk_steps`` (400k: 28 min wall on
        the 2-core CPU).
      seed: seed of the environments, the networks and the sampling.
      n_envs: parallel ``Ant-v5`` environments (``SyncVectorEnv``).
      hidden: width of the two hidden layers of the actor and of each critic.
      batch_size: SAC minibatch size.
      lr: Adam learning rate of actor, critics and temperature.
      start_steps: initial env steps with uniform random actions and no updates.
      episode_steps: episode length (timeout) of the training envs.
      command_every: steps between command redraws.
      ctrl_cost: weight of ``|a|^2`` in the reward.
      terminate_flipped: also end an episode as a termination (no healthy bonus, no
        bootstrap) when the torso turns upside down. ``Ant-v5``'s own health check is the
        torso height alone, which an ant lying on its back passes, so without this the
        controller is paid for lying on its back.
      chunk_steps: env steps between checkpoints (a multiple of ``n_envs``).
      directory: the CacheX checkpoint folder; default a folder in the offline-RL cache named
        by the settings.
      progress: optional ``progress(iterable, desc)`` wrapper for a progress bar.

    Returns:
      ``{"params": actor params, "hidden": hidden, "curve": [n_chunks, 4] (env steps, mean
      velocity along the command over the chunk's stochastic steps, training seconds of the
      chunk, episodes ended by turning upside down), "directory": the checkpoint folder}``.
    """
    import jax
    import jax.numpy as jnp

    from hexad import cachex

    for name, v in (("total_steps", total_steps), ("n_envs", n_envs), ("hidden", hidden),
                    ("batch_size", batch_size), ("episode_steps", episode_steps),
                    ("command_every", command_every), ("chunk_steps", chunk_steps)):  # fmt: skip
        _orl._check_int(name, v)
    _orl._check_int("start_steps", start_steps, 0)
    if chunk_steps % n_envs or total_steps % chunk_steps:
        raise ValueError(
            f"chunk_steps, total_steps: expected chunk_steps a multiple of n_envs={n_envs} and "
            f"total_steps a multiple of chunk_steps, got {chunk_steps}, {total_steps}"
        )
    if not (lr > 0 and ctrl_cost >= 0):
        raise ValueError(f"lr, ctrl_cost: expected > 0 and >= 0, got {lr}, {ctrl_cost}")
    spec = _controller_spec(
        total_steps=total_steps, seed=seed, n_envs=n_envs, hidden=hidden,
        batch_size=batch_size, lr=lr, start_steps=start_steps, episode_steps=episode_steps,
        command_every=command_every, ctrl_cost=ctrl_cost, chunk_steps=chunk_steps,
        terminate_flipped=terminate_flipped,
    )  # fmt: skip
    if directory is None:
        tag = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
        directory = _orl.cache_dir() / f"ant_controller_{tag}"
    directory = Path(directory)
    n_chunks = total_steps // chunk_steps
    kit = _sac(hidden, lr)
    base_key = jax.random.key(seed)
    shapes = {"observations": (ANT_INPUT_DIM,), "actions": (ANT_ACT_DIM,), "rewards": (),
              "next_observations": (ANT_INPUT_DIM,), "terminals": ()}  # fmt: skip
    init = {
        "sac": jax.device_get(kit.algo.init(jax.random.fold_in(base_key, 2**31 - 1), kit.dummy)),
        "buffer": {k: np.zeros((total_steps, *s), np.float32) for k, s in shapes.items()},
        "curve": np.zeros((n_chunks, 4)),
    }
    spec_file = directory / "spec.json"
    if spec_file.is_file() and json.loads(spec_file.read_text()) != spec:
        raise ValueError(
            f"directory: the checkpoint under {directory} was trained with "
            f"{spec_file.read_text()}, expected {json.dumps(spec, sort_keys=True)}"
        )
    mngr = cachex.CacheXManager(directory, max_to_keep=1)
    try:
        spec_file.write_text(json.dumps(spec, sort_keys=True))
        first, st = cachex.resume(mngr, init)
        if first < n_chunks:
            st = _train_chunks(
                st, first, n_chunks, mngr, kit, base_key, seed=seed, n_envs=n_envs,
                batch_size=batch_size, start_steps=start_steps, episode_steps=episode_steps,
                command_every=command_every, ctrl_cost=ctrl_cost, chunk_steps=chunk_steps,
                terminate_flipped=terminate_flipped,
                progress=progress,
            )  # fmt: skip
    finally:
        mngr.close()
    return {
        "params": jax.tree.map(jnp.asarray, st["sac"].actor_params),
        "hidden": hidden,
        "curve": np.asarray(st["curve"]),
        "directory": directory,
    }


_CONTROLLER_DEFAULTS = {
    k: p.default
    for k, p in inspect.signature(train_ant_controller).parameters.items()
    if k not in ("directory", "progress")
}


def _train_chunks(st, first, n_chunks, mngr, kit, base_key, *, seed, n_envs, batch_size,
                  start_steps, episode_steps, command_every, ctrl_cost, terminate_flipped,
                  chunk_steps, progress):  # fmt: skip
    import gymnasium as gym
    import jax
    import jax.numpy as jnp

    buf = {k: np.array(v, np.float32, copy=True) for k, v in st["buffer"].items()}
    curve = np.array(st["curve"], np.float64, copy=True)
    state = jax.tree.map(jnp.asarray, st["sac"])
    env = gym.make_vec(
        "Ant-v5",
        num_envs=n_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
        max_episode_steps=episode_steps,
    )
    try:
        for c in range(first, n_chunks):
            t0 = time.perf_counter()
            rng = np.random.default_rng([seed, c])
            key = jax.random.fold_in(base_key, c)
            obs, _ = env.reset(seed=int(rng.integers(2**31)))
            theta = rng.uniform(-np.pi, np.pi, n_envs)
            tick = np.zeros(n_envs, np.int64)
            vel, flips = [], 0
            it = range(chunk_steps // n_envs)
            if progress is not None:
                it = progress(it, f"SAC Ant chunk {c + 1}/{n_chunks}")
            for t in it:
                n = c * chunk_steps + t * n_envs
                o = ant_command_features(obs[:, :ANT_OBS_DIM], theta)
                if n < start_steps:
                    act = rng.uniform(-1.0, 1.0, (n_envs, ANT_ACT_DIM)).astype(np.float32)
                else:
                    key, k = jax.random.split(key)
                    act = np.asarray(kit.sample(k, state.actor_params, o))
                tr, nobs = _orl._vec_step(env, obs, act, ("x_velocity", "y_velocity"))
                term, nxt = tr["terminals"], tr["next_observations"]
                if terminate_flipped:
                    flip = (upright(nxt) < 0) & (term + tr["timeouts"] == 0)
                    for i in np.flatnonzero(flip):  # end it here: reset that env alone
                        nobs[i] = env.unwrapped.envs[i].reset(seed=int(rng.integers(2**31)))[0]
                    term = np.maximum(term, flip.astype(np.float32))
                    flips += int(flip.sum())
                done = (term + tr["timeouts"]) > 0
                vx, vy = tr["infos/x_velocity"], tr["infos/y_velocity"]
                v_cmd = vx * np.cos(theta) + vy * np.sin(theta)
                sl = slice(n, n + n_envs)
                buf["observations"][sl] = o
                buf["actions"][sl] = act
                buf["rewards"][sl] = v_cmd + (1.0 - term) - ctrl_cost * np.sum(act * act, 1)
                buf["next_observations"][sl] = ant_command_features(nxt[:, :ANT_OBS_DIM], theta)
                buf["terminals"][sl] = term
                if n >= start_steps:
                    vel.append(v_cmd.mean())
                tick += 1
                redraw = done | (tick % command_every == 0)
                theta = np.where(redraw, rng.uniform(-np.pi, np.pi, n_envs), theta)
                tick[done] = 0
                obs = nobs
                filled = n + n_envs
                if filled >= max(start_steps, batch_size):
                    key, k = jax.random.split(key)
                    state = kit.update(k, state, rng, buf, filled, n_envs, batch_size)
            curve[c] = ((c + 1) * chunk_steps, np.mean(vel) if vel else 0.0,
                        time.perf_counter() - t0, flips)  # fmt: skip
            st = {"sac": jax.device_get(state), "buffer": buf, "curve": curve}
            mngr.save(c, st)
            mngr.wait_until_finished()
    finally:
        env.close()
    return st


# --------------------------------------------------------------------------------------------
# The maze: planner + controller oracle, data set, evaluation
# --------------------------------------------------------------------------------------------


def antmaze_geometry() -> _orl.MazeGeometry:
    """The UMaze of ``AntMaze_UMaze-v5`` (cells of size 4)."""
    return _orl.MazeGeometry(_orl.UMAZE, scaling=ANTMAZE_SCALING)


def antmaze_obs(obs: dict) -> np.ndarray:
    """``[E, 29]`` D4RL's ant layout from an AntMaze observation dict: x, y, then the first 27
    entries of ``observation`` (``qpos[2:]``, ``qvel``; the 78 contact forces after them are
    dropped, as in D4RL), so ``qpos`` is ``[:, :15]`` and ``qvel`` ``[:, 15:]``."""
    return np.concatenate([obs["achieved_goal"], obs["observation"][:, :ANT_OBS_DIM]], -1)


def _mean_action(hidden: int):
    return _sac(hidden, 1e-3).mean_action


def antmaze_oracle(controller: dict, obs: np.ndarray, goal: np.ndarray, geom=None) -> np.ndarray:
    """The noiseless scripted oracle: the controller walking towards the next BFS waypoint.

    Args:
      controller: the dict of :func:`train_ant_controller` (``params``, ``hidden``).
      obs: ``[n, 29]`` observations in :func:`antmaze_obs`'s layout.
      goal: ``[n, 2]`` goals.
      geom: the maze; default :func:`antmaze_geometry`.

    Returns:
      ``[n, 8]`` actions in ``[-1, 1]``.
    """
    geom = antmaze_geometry() if geom is None else geom
    obs = np.atleast_2d(np.asarray(obs, np.float64))
    if obs.shape[1] != ANT_INPUT_DIM:
        raise ValueError(f"obs: expected [n, {ANT_INPUT_DIM}] (x, y, then 27), got {obs.shape}")
    d = geom.waypoint(obs[:, :2], goal) - obs[:, :2]
    feats = ant_command_features(obs[:, 2:], np.arctan2(d[:, 1], d[:, 0]))
    act = _mean_action(int(controller["hidden"]))(controller["params"], feats)
    return np.asarray(act, np.float64)


def _make_antmaze(n_envs: int, max_episode_steps: int, **kwargs):
    return _orl._make_vec(n_envs, max_episode_steps, env_id=ANTMAZE_ENV, **kwargs)


def generate_antmaze(
    controller: dict,
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
      controller: the dict of :func:`train_ant_controller`.
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
      the fields of :func:`hexad.data.offline_rl.generate_pointmaze` with 29-d observations
      (x, y, then ``Ant-v5``'s 27), 8-d actions, ``infos/qpos [N, 15]``, ``infos/qvel [N, 14]``.
    """
    _orl._check_maze_args(n_transitions, n_envs, episode_steps, random_action_frac)
    if not noise_std >= 0:
        raise ValueError(f"noise_std: expected >= 0, got {noise_std}")
    geom = antmaze_geometry()
    env = _make_antmaze(n_envs, episode_steps, continuing_task=True, reset_target=True)
    out = _orl._collect_maze(
        env,
        n_transitions,
        seed,
        antmaze_obs,
        lambda o, goal: antmaze_oracle(controller, o, goal, geom),
        noise_std,
        random_action_frac,
        (lambda o: upright(o[:, 2:]) < 0) if reset_flipped else None,
    )
    return _orl._maze_fields(out, task_goal, qpos=slice(0, 15), qvel=slice(15, 29))


def antmaze_dataset(
    n_transitions: int = 200_000,
    seed: int = 0,
    noise_std: float = 0.2,
    random_action_frac: float = 0.0,
    reset_flipped: bool = True,
    path=None,
    controller_kwargs: dict | None = None,
    progress=None,
) -> dict[str, np.ndarray]:
    """Returns the AntMaze-UMaze oracle data set, generating and caching it on first use.

    The controller comes from :func:`train_ant_controller` (``controller_kwargs``), itself
    cached: the first call trains it (28 min wall on the 2-core CPU at the defaults).

    Args:
      n_transitions, seed, noise_std, random_action_frac, reset_flipped: see
        :func:`generate_antmaze`.
      path: an explicit npz path; default a file in the offline-RL cache named by the settings.
      controller_kwargs: keyword arguments of :func:`train_ant_controller`.
      progress: optional progress-bar wrapper, used only when training the controller.

    Returns:
      a dict with the D4RL fields, ``infos/goal``, ``infos/qpos``, ``infos/qvel``,
      ``task_goal`` and ``meta/controller_curve`` (the controller's learning curve).
    """
    ckw = dict(controller_kwargs or {})
    spec = {
        "env": ANTMAZE_ENV,
        "n": int(n_transitions),
        "seed": int(seed),
        "noise": float(noise_std),
        "rand": float(random_action_frac),
        "flip": bool(reset_flipped),
        "controller": _controller_spec(**{k: v for k, v in ckw.items() if k != "directory"}),
        "version": 1,
    }
    if path is None:
        tag = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
        path = _orl.cache_dir() / f"antmaze_umaze_{tag}.npz"
    path = Path(path)
    if path.is_file():
        return _orl.load_offline_rl(path)
    controller = train_ant_controller(progress=progress, **ckw)
    data = generate_antmaze(
        controller,
        n_transitions,
        seed=seed,
        noise_std=noise_std,
        random_action_frac=random_action_frac,
        reset_flipped=reset_flipped,
    )
    data["meta/controller_curve"] = controller["curve"]
    _orl.save_offline_rl(path, data)
    return data


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

    As :func:`hexad.data.offline_rl.evaluate_pointmaze`, with observations ``[E, 29]`` in
    :func:`antmaze_obs`'s layout and actions ``[E, 8]``; success is D4RL's antmaze criterion,
    reaching the goal (distance <= 0.45) at any step of the episode (700 steps for the UMaze).

    Returns:
      ``{"success": [M], "return": [M] (sum of exp(-distance)), "final_distance": [M],
      "min_distance": [M]}``.
    """
    return _orl._evaluate_maze(
        _make_antmaze(n_envs, episode_steps + 1, continuing_task=True, reset_target=False),
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
