"""gymnasium vector-env helpers shared by the generators: make, step, and gather transitions."""

from __future__ import annotations

import tempfile

import numpy as np

from hexad.data._optional import require

__all__ = ["env_major", "make_vec", "vec_step"]


def make_vec(env_id: str, n_envs: int, max_episode_steps: int, **kwargs):
    """Returns a gymnasium ``SyncVectorEnv`` of ``n_envs`` copies of ``env_id``.

    Environments autoreset in the step that ends an episode (``AutoresetMode.SAME_STEP``), so
    the final observation of an episode is in ``info["final_obs"]``. gymnasium-robotics'
    environments (PointMaze, AntMaze) are registered when ``env_id`` is not a gymnasium one.

    Args:
      env_id: a registered environment id, e.g. ``"Hopper-v5"`` or ``"PointMaze_UMaze-v3"``.
      n_envs: number of environments.
      max_episode_steps: episode length before a timeout (truncation).
      kwargs: keyword arguments of the environment's constructor.

    >>> env = make_vec("Hopper-v5", 2, 10)
    >>> env.num_envs, env.single_action_space.shape
    (2, (3,))
    >>> env.close()
    """
    gym = require("gymnasium", "policy")
    if env_id not in gym.registry:
        gym.register_envs(require("gymnasium_robotics", "policy"))
    # gymnasium-robotics' mazes write their model to an XML file in the system temporary
    # folder on construction and never delete it (one file per environment); the file is read
    # only while the environment is built, so it goes into a folder removed right after.
    with tempfile.TemporaryDirectory(prefix="hexad-env-") as tmp:
        saved, tempfile.tempdir = tempfile.tempdir, tmp
        try:
            return gym.make_vec(
                env_id,
                num_envs=n_envs,
                vectorization_mode="sync",
                vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
                max_episode_steps=max_episode_steps,
                **kwargs,
            )
        finally:
            tempfile.tempdir = saved


def vec_step(env, obs: np.ndarray, act: np.ndarray, info_keys=("x_velocity", "reward_forward")):
    """Steps a :func:`make_vec` env once; returns ``(transition, next obs after resets)``.

    The transition holds ``[E, ...]`` arrays with the D4RL fields and ``infos/<k>`` for each
    ``k`` in ``info_keys``. ``next_observations`` and the infos are those of the step itself,
    also for environments that reset in it (read from ``final_obs`` / ``final_info``); a key
    missing from the step's info (when every environment resets in the step, the info holds
    only the reset infos) reads as 0.

    Args:
      env: the vector env.
      obs: ``[E, o]`` the current observations (stored as ``observations``).
      act: ``[E, d]`` the actions.
      info_keys: the per-step info entries to keep (static).

    >>> env = make_vec("Hopper-v5", 2, 10)
    >>> obs, _ = env.reset(seed=0)
    >>> tr, nobs = vec_step(env, obs, np.zeros((2, 3), np.float32))
    >>> sorted(tr)[:3], tr["rewards"].shape
    (['actions', 'infos/reward_forward', 'infos/x_velocity'], (2,))
    >>> env.close()
    """
    nobs, rew, term, trunc, info = env.step(act)
    nxt = np.array(nobs, copy=True)
    done = np.logical_or(term, trunc)
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


def env_major(steps: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """``[T]`` list of :func:`vec_step` transitions -> env-major trajectories ``[T E, ...]``.

    Each env's stream is stored contiguously, and its last step is marked as a timeout (unless
    it is a terminal) so trajectories never run from one env's stream into the next one's.
    Observations, actions and the locomotion infos are cast to float32.

    Args:
      steps: ``T`` transitions of ``[E, ...]`` arrays with the keys of :func:`vec_step` and
        its default ``info_keys``.

    Returns:
      a dict of ``[T E, ...]`` arrays.

    >>> s = {"observations": np.zeros((2, 1)), "actions": np.zeros((2, 1)),
    ...      "next_observations": np.zeros((2, 1)), "terminals": np.zeros(2),
    ...      "timeouts": np.zeros(2), "infos/x_velocity": np.zeros(2),
    ...      "infos/reward_forward": np.zeros(2)}
    >>> env_major([s, s, s])["timeouts"].tolist()
    [0.0, 0.0, 1.0, 0.0, 0.0, 1.0]
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
