"""Goal-conditioned priors: hindsight relabelling (goal indices, mean future values), goals in a
batch's observations, and the prior kinds of the graceful-degradation test (parameter noise,
output noise, shuffled goals, random networks), priors of known precision (the precision-ratio
family) and the random-perturbation control."""

from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hexad._base import check_int
from hexad.policy._gaussian import DiagGaussian, _check_gaussian
from hexad.policy._offline import Batch

__all__ = [
    "PRECISION_RATIOS",
    "PRIOR_KINDS",
    "VelocityGoals",
    "degrade_params",
    "future_goal_indices",
    "goal_conditioned",
    "hindsight_mean",
    "make_prior",
    "perturbation_prior",
    "poe_prior_weight",
    "precision_prior",
    "return_range_scale",
    "shuffle_goals_across_trajectories",
    "state_noise",
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


PRIOR_KINDS = (
    "good",
    "param_noise",
    "output_noise",
    "output_noise_x3",
    "data_corrupted",
    "random_init",
    "random_wide",
)
"""The prior kinds of the graceful-degradation test (:func:`make_prior` describes each)."""


def shuffle_goals_across_trajectories(key, goals, ends) -> np.ndarray:
    """Returns ``goals`` with each trajectory's goals taken from another trajectory.

    The data-corrupted prior's labels: trajectory ``t`` (in storage order) receives the goal
    sequence of trajectory ``perm[t]`` for a random permutation ``perm`` (relative step ``k``
    gets that trajectory's step ``min(k, len - 1)``), so every goal is one the data holds but
    not the one its actions pursued. Host-side (numpy) preprocessing.

    Args:
      key: PRNG key.
      goals: ``[N, g]`` goals, trajectories stored consecutively.
      ends: ``[N]`` trajectory ends (:func:`trajectory_ends`).

    Returns:
      ``[N, g]`` float32 goals.

    >>> ends = trajectory_ends(np.array([0, 1, 0, 1]), np.zeros(4))
    >>> g = shuffle_goals_across_trajectories(jax.random.key(1), np.arange(4.0)[:, None], ends)
    >>> sorted(g[:, 0].tolist())
    [0.0, 1.0, 2.0, 3.0]
    """
    g = np.asarray(goals)
    e = np.asarray(ends)
    if g.ndim != 2 or e.shape != g.shape[:1]:
        raise ValueError(f"goals, ends: expected [N, g] and [N], got {g.shape} and {e.shape}")
    starts = np.flatnonzero(np.r_[True, e[1:] != e[:-1]])
    lengths = e[starts] - starts + 1
    perm = np.asarray(jax.random.permutation(key, starts.shape[0]))
    traj = np.repeat(np.arange(starts.shape[0]), lengths)
    rel = np.arange(g.shape[0]) - starts[traj]
    src = starts[perm[traj]] + np.minimum(rel, lengths[perm[traj]] - 1)
    return g[src].astype(np.float32)


def state_noise(key, in_dim: int, out_dim: int, n_features: int = 64):
    r"""Returns ``eps(x) -> [..., out_dim]``: a fixed smooth random function of the input.

    :math:`\epsilon(x) = \sqrt{2 / F} \cos(x W + b) V` with :math:`W \sim \mathcal{N}(0, 1)`
    ``[in_dim, F]``, :math:`b` uniform on :math:`[0, 2\pi)` and :math:`V \sim \mathcal{N}(0, 1)`
    ``[F, out_dim]``: random Fourier features, so each
    output has variance about 1 over random draws and the same input always gets the same
    noise. The output-noise prior's ``eps(s)`` (:func:`make_prior`).

    >>> f = state_noise(jax.random.key(0), 3, 2)
    >>> x = jnp.ones((5, 3))
    >>> bool(jnp.all(f(x) == f(x))), f(x).shape
    (True, (5, 2))
    """
    check_int("in_dim", in_dim)
    check_int("out_dim", out_dim)
    check_int("n_features", n_features)
    kw, kb, kv = jax.random.split(key, 3)
    w = jax.random.normal(kw, (in_dim, n_features))
    b = jax.random.uniform(kb, (n_features,), maxval=2 * jnp.pi)
    v = jax.random.normal(kv, (n_features, out_dim))

    def eps(x):
        phase = jnp.reshape(b, (1,) * (jnp.ndim(x) - 1) + (n_features,))
        return jnp.sqrt(2.0 / n_features) * jnp.cos(x @ w + phase) @ v

    return eps


def make_prior(
    kind: str,
    net,
    good_params,
    key,
    example_input,
    *,
    corrupted_params=None,
    marginal_std=None,
    degrade_scale: float = 1.0,
):
    r"""Returns ``prior(obs_goal [B, o + g]) -> DiagGaussian [B, d]``, a prior of one kind.

    The kinds (:data:`PRIOR_KINDS`), ``DiagGaussian`` in the network's likelihood space:

    - ``good``: the trained goal-conditioned network ``net`` with ``good_params``;
    - ``param_noise``: its weights with noise (:func:`degrade_params`, ``degrade_scale``),
      the std head included, so it may be confidently wrong;
    - ``output_noise`` / ``output_noise_x3``: :math:`\mu(x) + \sigma(x) \epsilon(x)`, with
      :math:`\mu, \sigma` the ``good`` prior's, and a fixed smooth random :math:`\epsilon`
      (:func:`state_noise`), std :math:`\sigma` (kept) or :math:`3 \sigma` (a wrong prior that
      says it is unsure);
    - ``data_corrupted``: ``net`` with ``corrupted_params`` (trained on goals shuffled across
      trajectories, :func:`shuffle_goals_across_trajectories`);
    - ``random_init``: an untrained ``net`` (its init std);
    - ``random_wide``: the untrained mean with std ``marginal_std`` ``[d]`` (the data's marginal
      action std in this space), an uninformative prior.

    Args:
      kind: one of :data:`PRIOR_KINDS`.
      net: a ``GaussianActor`` on ``[obs, goal]`` (static).
      good_params: the trained prior's parameters.
      key: PRNG key (noise, random init).
      example_input: ``[1, o + g]`` an input for ``net.init``.
      corrupted_params: needed for ``data_corrupted``.
      marginal_std: ``[d]`` positive, needed for ``random_wide``.
      degrade_scale: ``param_noise``'s relative noise, ``>= 0``.

    >>> from hexad.policy import GaussianActor
    >>> net = GaussianActor(2, (4,))
    >>> x = jnp.zeros((1, 3))
    >>> p = net.init(jax.random.key(0), x)
    >>> wide = make_prior("random_wide", net, p, jax.random.key(1), x, marginal_std=jnp.ones(2))
    >>> wide(jnp.zeros((4, 3))).std.tolist()[0]
    [1.0, 1.0]
    """
    if kind not in PRIOR_KINDS:
        raise ValueError(f"kind: expected one of {PRIOR_KINDS}, got {kind!r}")

    def apply(params):
        return lambda x: net.apply(params, x)

    if kind == "good":
        return apply(good_params)
    if kind == "param_noise":
        return apply(degrade_params(key, good_params, degrade_scale))
    if kind == "data_corrupted":
        if corrupted_params is None:
            raise ValueError("corrupted_params: expected the parameters for 'data_corrupted'")
        return apply(corrupted_params)
    if kind.startswith("output_noise"):
        d = net.apply(good_params, example_input).mean.shape[-1]
        eps = state_noise(key, example_input.shape[-1], d)
        widen = 3.0 if kind == "output_noise_x3" else 1.0

        def noisy(x):
            g = net.apply(good_params, x)
            return DiagGaussian(g.mean + g.std * eps(x), widen * g.std)

        return noisy
    rand = net.init(key, example_input)
    if kind == "random_init":
        return apply(rand)
    if marginal_std is None or not np.all(np.asarray(marginal_std) > 0):
        raise ValueError(f"marginal_std: expected [d] positive stds, got {marginal_std!r}")
    std = jnp.asarray(marginal_std, jnp.float32)

    def wide(x):
        m = net.apply(rand, x).mean
        return DiagGaussian(m, jnp.broadcast_to(std, m.shape))

    return wide


def return_range_scale(rewards, terminals, timeouts, target: float = 1000.0) -> float:
    """Returns ``target / (max R - min R)`` over the data's trajectory returns ``R``.

    The IQL reference's reward normalisation on MuJoCo (Kostrikov et al. 2021, arXiv
    2110.06169): rewards are multiplied by this factor before training, so AWR temperatures
    mean the same across tasks. Host-side numpy.

    >>> return_range_scale(np.array([1.0, 1.0, 3.0]), np.array([0, 1, 0]), np.zeros(3), 1.0)
    1.0
    """
    r = np.asarray(rewards, np.float64)
    ends = trajectory_ends(terminals, timeouts)
    if r.shape != ends.shape:
        raise ValueError(f"rewards: expected shape {ends.shape}, got {r.shape}")
    _, first = np.unique(ends, return_index=True)
    returns = np.add.reduceat(r, np.sort(first))
    spread = float(returns.max() - returns.min())
    if not spread > 0:
        raise ValueError(f"rewards: expected trajectory returns that differ, got {returns}")
    return target / spread


# --------------------------------------------------------------------------------------------
# Priors of known precision (the precision-ratio family) and the random-perturbation control
# --------------------------------------------------------------------------------------------

#: The precision ratios :math:`r = \lambda_P / \lambda_A` of the precision-ratio family
#: (:func:`precision_prior`), below, at and above the actor's own precision.
PRECISION_RATIOS = (0.25, 0.5, 1.0, 2.0, 4.0)


def _check_positive(name: str, value) -> float:
    """``value`` as a float if it is a concrete finite number > 0, else a ValueError."""
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not (real and math.isfinite(value) and value > 0):
        raise ValueError(f"{name}: expected a finite number > 0, got {value!r}")
    return float(value)


def _check_noise(actor: DiagGaussian, noise) -> jax.Array:
    z = jnp.asarray(noise)
    if jnp.shape(z) != jnp.shape(actor.mean):
        raise ValueError(
            f"noise: expected the actor's shape {jnp.shape(actor.mean)} (one value per state and "
            f"action dimension), got {jnp.shape(z)}"
        )
    return z


def precision_prior(actor: DiagGaussian, noise, ratio: float, mean_error: float = 1.0):
    r"""Returns the prior :math:`\mathcal{N}(\mu_A + e\, s_A\, \text{noise}, s_A / \sqrt{r})` of the
    actor, :math:`e` the ``mean_error`` and :math:`r` the ``ratio``.

    A prior whose precision is set on purpose: per state and action dimension its precision is
    exactly ``ratio`` times the actor's (:math:`\lambda_P = r \lambda_A`), while its mean is the
    actor's moved by ``mean_error`` actor stds along a fixed ``noise`` (a smooth random function of
    the state, :func:`state_noise`, with unit variance), the same for every ``ratio``. The family
    ``ratio`` in :data:`PRECISION_RATIOS` at one ``mean_error`` isolates what the precision does:
    the composed means of PoE and of additive blending move from :math:`\mu_A` towards :math:`\mu_P`
    by :math:`w` and by :math:`\alpha`, with :math:`w` = :func:`poe_prior_weight` ``(alpha,
    ratio)``, so for a prior whose direction is bad PoE is the better of the two iff ``ratio < 1``
    (and the two coincide at ``ratio = 1``).

    Args:
      actor: the actor's Gaussians, ``[..., d]``.
      noise: ``[..., d]`` the mean error's direction at the same states (the actor's shape).
      ratio: the precision ratio :math:`\lambda_P / \lambda_A`, a finite number ``> 0``.
      mean_error: the mean error in actor stds, a finite number ``>= 0``.

    Returns:
      a ``DiagGaussian`` of the actor's shape.

    >>> a = DiagGaussian(jnp.zeros((1, 2)), jnp.full((1, 2), 2.0))
    >>> p = precision_prior(a, jnp.ones((1, 2)), 4.0, mean_error=0.5)
    >>> p.mean.tolist(), p.std.tolist()  # mean moved by half an actor std; std 2 / sqrt(4)
    ([[1.0, 1.0]], [[1.0, 1.0]])
    """
    _check_gaussian("actor", actor)
    z = _check_noise(actor, noise)
    r = _check_positive("ratio", ratio)
    real = isinstance(mean_error, numbers.Real) and not isinstance(mean_error, bool)
    if not (real and math.isfinite(mean_error) and mean_error >= 0):
        raise ValueError(f"mean_error: expected a finite number >= 0, got {mean_error!r}")
    return DiagGaussian(actor.mean + mean_error * actor.std * z, actor.std / np.sqrt(r))


def perturbation_prior(actor: DiagGaussian, prior: DiagGaussian, noise) -> DiagGaussian:
    r"""Returns the random-perturbation control of ``prior``: its precision, a random direction.

    :math:`\mathcal{N}(\mu_A + |\mu_P - \mu_A| \operatorname{sign}(\text{noise}), s_P)`: at each
    state and action dimension the
    control has the prior's std (so its PoE weight is the prior's) and moves the actor's mean
    by exactly as much as the prior would, but in a direction given by the sign of a fixed
    random ``noise`` (:func:`state_noise`) instead of by the prior's knowledge. A composition
    that "helps" with this control rewards perturbing the actor, not the prior's information.

    Args:
      actor: the actor's Gaussians, ``[..., d]``.
      prior: the informed prior at the same states, ``[..., d]`` (the actor's action
        dimension).
      noise: ``[..., d]`` at the same states (the actor's shape); its sign is the direction.

    Returns:
      a ``DiagGaussian`` of the actor's shape.

    >>> a = DiagGaussian(jnp.zeros((1, 2)), jnp.ones((1, 2)))
    >>> p = DiagGaussian(jnp.array([[0.5, -2.0]]), jnp.full((1, 2), 0.3))
    >>> c = perturbation_prior(a, p, jnp.array([[-1.0, -1.0]]))
    >>> c.mean.tolist(), [round(s, 3) for s in c.std[0].tolist()]
    ([[-0.5, -2.0]], [0.3, 0.3])
    """
    _check_gaussian("actor", actor)
    _check_gaussian("prior", prior)
    da, dp = jnp.shape(actor.mean)[-1], jnp.shape(prior.mean)[-1]
    if da != dp:
        raise ValueError(f"prior: expected action dimension {da} (the actor's), got {dp}")
    z = _check_noise(actor, noise)
    sign = jnp.where(z >= 0, 1.0, -1.0)
    shift = jnp.abs(prior.mean - actor.mean)
    std = jnp.broadcast_to(prior.std, jnp.shape(actor.mean))
    return DiagGaussian(actor.mean + shift * sign, std)


def poe_prior_weight(alpha, ratio):
    r"""Returns :math:`w = \alpha r / (\alpha r + 1 - \alpha)`: how far PoE moves the actor's mean
    towards the prior's, where additive blending moves it by :math:`\alpha`.

    At a common weight :math:`\alpha` and precision ratio :math:`r = \lambda_P / \lambda_A` (the
    same at every state, as in :func:`precision_prior`), PoE's composed mean is
    :math:`\mu_A + w (\mu_P - \mu_A)` and additive's :math:`\mu_A + \alpha (\mu_P - \mu_A)`;
    :math:`w < \alpha` iff :math:`r < 1`, so PoE trusts a less precise prior less than
    additive does and a more precise one more. Host-side.

    Args:
      alpha: the common weight, a number in the open interval ``(0, 1)`` (at 0 and 1 the two
        compositions coincide).
      ratio: ``r``, a finite number ``> 0``.

    >>> poe_prior_weight(0.5, 0.25), poe_prior_weight(0.5, 1.0), poe_prior_weight(0.5, 4.0)
    (0.2, 0.5, 0.8)
    """
    real = isinstance(alpha, numbers.Real) and not isinstance(alpha, bool)
    if not (real and 0 < alpha < 1):
        raise ValueError(f"alpha: expected a number in (0, 1), got {alpha!r}")
    r = _check_positive("ratio", ratio)
    return float(alpha * r / (alpha * r + 1.0 - alpha))
