"""Goal-conditioned priors: hindsight relabelling (goal indices, mean future values), goals in a
batch's observations, degraded priors."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hexad._base import check_int
from hexad.policy._offline import Batch

__all__ = [
    "VelocityGoals",
    "degrade_params",
    "future_goal_indices",
    "goal_conditioned",
    "hindsight_mean",
    "trajectory_ends",
    "velocity_goals",
]


def trajectory_ends(terminals, timeouts) -> np.ndarray:
    """Returns, for each transition, the index of the last transition of its trajectory.

    Host-side (numpy) preprocessing of a D4RL-style data set stored as consecutive
    trajectories; a trajectory ends where ``terminals`` or ``timeouts`` is set, or at the end.

    Args:
      terminals: ``[N]`` 0/1.
      timeouts: ``[N]`` 0/1.

    Returns:
      ``[N]`` int32 indices ``e_i >= i``.

    >>> trajectory_ends(np.array([0, 0, 1, 0]), np.array([0, 0, 0, 0]))
    array([2, 2, 2, 3], dtype=int32)
    """
    t = np.asarray(terminals).astype(bool) | np.asarray(timeouts).astype(bool)
    if t.ndim != 1:
        raise ValueError(f"terminals: expected shape [N], got {t.shape}")
    n = t.shape[0]
    ends = np.empty(n, np.int32)
    cur = n - 1
    for i in range(n - 1, -1, -1):
        if t[i]:
            cur = i
        ends[i] = cur
    return ends


def future_goal_indices(key, ends, future_p: float = 1.0):
    """Returns hindsight-relabelled goal indices: a uniform future step of the same trajectory.

    With probability ``future_p`` the goal index of transition ``i`` is uniform on
    ``[i + 1, e_i]`` (clipped to ``e_i``), otherwise uniform over the whole data set
    (Andrychowicz et al. 2017, arXiv 1707.01495, the "future" strategy).

    Args:
      key: PRNG key.
      ends: ``[N]`` int32 trajectory ends from :func:`trajectory_ends`.
      future_p: probability of a future goal (static).

    Returns:
      ``[N]`` int32 indices into the data set.

    >>> idx = future_goal_indices(jax.random.key(0), jnp.array([2, 2, 2]))
    >>> bool(jnp.all(idx >= jnp.arange(3)))
    True
    """
    ends = jnp.asarray(ends)
    n = ends.shape[0]
    k_u, k_mix, k_any = jax.random.split(key, 3)
    i = jnp.arange(n)
    span = jnp.maximum(ends - i, 1)
    j = jnp.minimum(i + 1 + jnp.floor(jax.random.uniform(k_u, (n,)) * span).astype(i.dtype), ends)
    anywhere = jax.random.randint(k_any, (n,), 0, n)
    use_future = jax.random.uniform(k_mix, (n,)) < future_p
    return jnp.where(use_future, j, anywhere).astype(jnp.int32)


def hindsight_mean(values, ends, horizon: int) -> np.ndarray:
    """Returns, for each transition, the mean of ``values`` over its next ``horizon`` steps.

    The hindsight goal of a goal-conditioned prior when the goal is a rate rather than a place
    (e.g. the x velocity a locomotion policy actually achieved): transition ``i`` is relabelled
    with ``mean(values[i : min(i + horizon, e_i + 1)])``, a window that starts at ``i`` itself
    and never crosses the end ``e_i`` of its trajectory, so it holds fewer than ``horizon``
    values near the end. Host-side (numpy) preprocessing, like :func:`trajectory_ends`;
    accumulated in float64.

    Args:
      values: ``[N]`` per-transition values, trajectories stored consecutively.
      ends: ``[N]`` int trajectory ends from :func:`trajectory_ends`.
      horizon: window length, ``>= 1``.

    Returns:
      ``[N]`` float32 window means.

    >>> ends = trajectory_ends(np.array([0, 0, 1, 0]), np.zeros(4))
    >>> hindsight_mean(np.array([1.0, 2.0, 4.0, 8.0]), ends, 2)
    array([1.5, 3. , 4. , 8. ], dtype=float32)
    """
    horizon = check_int("horizon", horizon)
    v = np.asarray(values).astype(np.float64)
    e = np.asarray(ends)
    if v.ndim != 1:
        raise ValueError(f"values: expected shape [N], got {v.shape}")
    i = np.arange(v.shape[0])
    if e.shape != v.shape or np.any(e < i) or np.any(e >= v.shape[0]):
        raise ValueError(
            f"ends: expected [{v.shape[0]}] indices e_i in [i, N) (trajectory_ends), got "
            f"shape {e.shape}"
        )
    cs = np.concatenate([[0.0], np.cumsum(v)])
    j = np.minimum(i + horizon, e + 1)
    return ((cs[j] - cs[i]) / (j - i)).astype(np.float32)


class VelocityGoals(NamedTuple):
    """Hindsight velocity goals of a locomotion data set, and the scale of their network input.

    Attributes:
      goals: ``[N]`` float32, each transition's mean x velocity over its next ``horizon``
        steps (:func:`hindsight_mean`).
      scale: ``std(goals) + eps`` (the std in float32); a velocity-conditioned network reads
        a goal ``v`` as ``v / scale`` (:meth:`inputs`).
    """

    goals: np.ndarray
    scale: float

    def inputs(self, velocities) -> jax.Array:
        """Returns ``[..., 1]`` float32 ``v / scale``, the network input of ``velocities [...]``.

        The division runs in NumPy in the velocities' own dtype (float64 for a Python float)
        and is then rounded to float32.

        >>> VelocityGoals(np.zeros(2, np.float32), 2.0).inputs(np.array([1.0, 3.0])).tolist()
        [[0.5], [1.5]]
        """
        return jnp.asarray(np.asarray(velocities) / self.scale, jnp.float32)[..., None]


def velocity_goals(data, horizon: int, eps: float = 1e-3) -> VelocityGoals:
    """Returns the hindsight velocity goals of ``data`` and their input scale.

    The goal of a velocity-conditioned prior: transition ``i`` is relabelled with the mean
    ``infos/x_velocity`` over its next ``horizon`` steps within its trajectory (ends from
    ``terminals`` and ``timeouts``), the velocity its own behaviour went on to achieve.

    Args:
      data: a mapping with ``infos/x_velocity [N]``, ``terminals [N]`` and ``timeouts [N]``
        (the locomotion data's fields).
      horizon: window length, ``>= 1``.
      eps: added to the goals' standard deviation for the scale, ``>= 0``.

    >>> d = {"infos/x_velocity": np.array([1.0, 3.0, 5.0, 7.0]), "terminals": np.zeros(4),
    ...      "timeouts": np.array([0.0, 1.0, 0.0, 1.0])}
    >>> vg = velocity_goals(d, 2, eps=0.0)
    >>> vg.goals.tolist(), round(vg.scale, 4)
    ([2.0, 3.0, 6.0, 7.0], 2.0616)
    """
    if not eps >= 0:
        raise ValueError(f"eps: expected a number >= 0, got {eps!r}")
    ends = trajectory_ends(data["terminals"], data["timeouts"])
    goals = hindsight_mean(data["infos/x_velocity"], ends, horizon)
    return VelocityGoals(goals, float(np.std(goals) + eps))


def goal_conditioned(batch: Batch, goals, rewards=None) -> Batch:
    """Returns ``batch`` with each transition's goal appended to its observations.

    The input of a goal-conditioned network: ``observations`` and ``next_observations`` become
    ``[N, o + g]`` (the goal stays fixed across the transition, as in hindsight relabelling);
    actions and terminals are unchanged, and so are the rewards unless ``rewards`` (the
    goal-dependent objective's) replace them.

    Args:
      batch: a :class:`Batch` of ``N`` transitions.
      goals: ``[N, g]`` goals (e.g. :meth:`VelocityGoals.inputs`).
      rewards: optional ``[N]`` rewards for these goals.

    >>> b = Batch(jnp.zeros((3, 2)), jnp.zeros((3, 1)), jnp.zeros(3), jnp.ones((3, 2)),
    ...           jnp.zeros(3))
    >>> g = goal_conditioned(b, jnp.full((3, 1), 7.0))
    >>> g.observations[0].tolist(), g.next_observations[0].tolist()
    ([0.0, 0.0, 7.0], [1.0, 1.0, 7.0])
    """
    g = jnp.asarray(goals)
    n = jnp.shape(batch.observations)[0]
    if g.ndim != 2 or g.shape[0] != n:
        raise ValueError(f"goals: expected shape [{n}, g] (the batch's rows), got {g.shape}")
    if rewards is not None and jnp.shape(rewards) != (n,):
        raise ValueError(
            f"rewards: expected shape ({n},) (the batch's rows), got {jnp.shape(rewards)}"
        )
    obs = jnp.concatenate([batch.observations, g], -1)
    nxt = jnp.concatenate([batch.next_observations, g], -1)
    out = batch._replace(observations=obs, next_observations=nxt)
    return out if rewards is None else out._replace(rewards=rewards)


def degrade_params(key, params: Any, scale: float) -> Any:
    """Returns ``params`` with Gaussian noise of ``scale`` times each leaf's own std added.

    A deliberately degraded prior: the same architecture and the same training, with its
    weights corrupted in proportion to their spread (``scale = 0`` returns ``params``).

    Args:
      key: PRNG key.
      params: a pytree of float arrays.
      scale: relative noise level, ``>= 0``.

    Returns:
      a pytree like ``params``.

    >>> p = {"w": jnp.arange(4.0)}
    >>> bool(jnp.all(degrade_params(jax.random.key(0), p, 0.0)["w"] == p["w"]))
    True
    """
    if not scale >= 0:
        raise ValueError(f"scale: expected a value >= 0, got {scale!r}")
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(key, len(leaves))
    out = []
    for k, x in zip(keys, leaves, strict=True):
        spread = jnp.std(x) if x.size > 1 else jnp.abs(x).mean()
        # only an exactly constant leaf falls back to unit noise; a NaN spread stays NaN
        spread = jnp.where(spread == 0, 1.0, spread)
        out.append(x + scale * spread * jax.random.normal(k, x.shape, x.dtype))
    return jax.tree.unflatten(treedef, out)
