"""Offline RL in the init/step shape: behaviour cloning, IQL and CQL, and a scanned trainer.

Each algorithm is a factory that closes over its networks, optimisers and hyper-parameters
(all static) and returns :class:`hexad._base.Algorithm` ``(init, step)`` with

    init(key, batch) -> State              # shapes taken from one example batch
    step(key, state, batch) -> (State, Info)

Both are pure; the user jits (``jax.jit(algo.step)``) or scans them with :func:`make_train`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from hexad import sharding
from hexad._base import Algorithm, TrainState, check_int, check_positive, check_unit
from hexad.policy._networks import gaussian_log_prob, sample_action

__all__ = [
    "BCInfo",
    "Batch",
    "CQLInfo",
    "CQLState",
    "IQLInfo",
    "IQLState",
    "Normaliser",
    "batch_from_dataset",
    "bc",
    "cql",
    "expectile_loss",
    "iql",
    "make_train",
]

Params = Any


class Batch(NamedTuple):
    """Transitions, named as in D4RL.

    Attributes:
      observations: ``[B, o]`` float32.
      actions: ``[B, d]`` float32 in ``(-1, 1)`` for squashed actors.
      rewards: ``[B]`` float32.
      next_observations: ``[B, o]`` float32.
      terminals: ``[B]`` float32, 1.0 where the episode ended in a terminal state.
    """

    observations: jax.Array
    actions: jax.Array
    rewards: jax.Array
    next_observations: jax.Array
    terminals: jax.Array


def batch_from_dataset(data: Mapping[str, Any], dtype=jnp.float32) -> Batch:
    """Returns a :class:`Batch` of the whole data set, checking fields, shapes and NaNs.

    Args:
      data: a mapping with the D4RL keys ``observations [N, o]``, ``actions [N, d]``,
        ``rewards [N]``, ``next_observations [N, o]``, ``terminals [N]``.
      dtype: float dtype of the arrays.

    Returns:
      a ``Batch`` of device arrays.

    >>> d = {"observations": np.zeros((3, 2)), "actions": np.zeros((3, 1)),
    ...      "rewards": np.zeros(3), "next_observations": np.zeros((3, 2)),
    ...      "terminals": np.zeros(3)}
    >>> batch_from_dataset(d).actions.shape
    (3, 1)
    """
    if not isinstance(data, Mapping):
        raise TypeError(f"data: expected a mapping of arrays, got {type(data).__name__}")
    missing = [k for k in Batch._fields if k not in data]
    if missing:
        raise ValueError(f"data: missing fields {missing}; expected {list(Batch._fields)}")
    arrs = {k: np.asarray(data[k]) for k in Batch._fields}
    n = arrs["observations"].shape[0]
    want = {
        "observations": 2,
        "actions": 2,
        "rewards": 1,
        "next_observations": 2,
        "terminals": 1,
    }
    for k, nd in want.items():
        a = arrs[k]
        if a.ndim != nd or a.shape[0] != n:
            raise ValueError(f"data[{k!r}]: expected {nd} axes with {n} rows, got shape {a.shape}")
        if not np.all(np.isfinite(a.astype(np.float64))):
            raise ValueError(f"data[{k!r}]: expected finite values, got NaN or inf")
    if arrs["next_observations"].shape != arrs["observations"].shape:
        raise ValueError(
            "data['next_observations']: expected shape "
            f"{arrs['observations'].shape}, got {arrs['next_observations'].shape}"
        )
    return Batch(**{k: jnp.asarray(v, dtype) for k, v in arrs.items()})


@flax.struct.dataclass
class Normaliser:
    """Per-feature standardisation of observations, ``(obs - mean) / std``.

    Fitted on a data set and then applied to every network's input, at training and at
    deployment, so all of them see the same scale.

    Attributes:
      mean: ``[1, o]`` float32.
      std: ``[1, o]`` float32, positive.
    """

    mean: jax.Array
    std: jax.Array

    @classmethod
    def fit(cls, observations, eps: float = 1e-3) -> Normaliser:
        """Returns the normaliser of ``observations [N, o]``: their mean and ``std + eps``.

        The statistics are taken over the rows in the observations' own dtype, then stored
        as float32.

        Args:
          observations: ``[N, o]``, ``N >= 1``.
          eps: added to each standard deviation, ``> 0`` (a constant feature stays finite).

        >>> norm = Normaliser.fit(np.array([[0.0, 1.0], [2.0, 1.0]]), eps=0.5)
        >>> norm.mean.tolist(), norm.std.tolist()
        ([[1.0, 1.0]], [[1.5, 0.5]])
        """
        x = np.asarray(observations)
        if x.ndim != 2 or x.shape[0] < 1:
            raise ValueError(f"observations: expected shape [N, o] with N >= 1, got {x.shape}")
        check_positive("eps", eps)
        mean = jnp.asarray(x.mean(0, keepdims=True), jnp.float32)
        return cls(mean, jnp.asarray(x.std(0, keepdims=True) + eps, jnp.float32))

    def __call__(self, obs) -> jax.Array:
        """Returns ``[B, o]`` the standardised ``obs [B, o]`` (traceable).

        >>> norm = Normaliser(jnp.ones((1, 2)), jnp.full((1, 2), 2.0))
        >>> norm(jnp.array([[3.0, 1.0]])).tolist()
        [[1.0, 0.0]]
        """
        return (obs - self.mean) / self.std

    def batch(self, batch: Batch) -> Batch:
        """Returns ``batch`` with its observations and next observations standardised.

        >>> norm = Normaliser(jnp.ones((1, 2)), jnp.full((1, 2), 2.0))
        >>> b = Batch(jnp.ones((3, 2)), jnp.zeros((3, 1)), jnp.zeros(3), jnp.full((3, 2), 5.0),
        ...           jnp.zeros(3))
        >>> out = norm.batch(b)
        >>> out.observations[0].tolist(), out.next_observations[0].tolist()
        ([0.0, 0.0], [2.0, 2.0])
        """
        obs, nxt = self(batch.observations), self(batch.next_observations)
        return batch._replace(observations=obs, next_observations=nxt)


def expectile_loss(diff, expectile: float):
    r"""Returns IQL's asymmetric squared loss :math:`|\tau - \mathbf{1}(u < 0)|\, u^2`
    (arXiv 2110.06169, eq. 5).

    Its minimiser over a constant :math:`m` for :math:`u = x - m` is the :math:`\tau`-expectile
    of :math:`x`.

    Args:
      diff: ``[...]`` residuals ``u = target - prediction``.
      expectile: ``tau`` in ``(0, 1)`` (static).

    Returns:
      ``[...]`` losses.

    >>> expectile_loss(jnp.array([-2.0, 1.0]), 0.7)
    Array([1.2, 0.7], dtype=float32)
    """
    weight = jnp.where(diff > 0, expectile, 1.0 - expectile)
    return weight * jnp.square(diff)


def _polyak(target, online, tau: float):
    # optax's Polyak update: tau * online + (1 - tau) * target, leaf by leaf.
    return optax.incremental_update(online, target, tau)


def _descend(optimizer: optax.GradientTransformation, loss_fn, params, opt_state):
    """One optimiser step on ``loss_fn(params) -> (loss, aux)``.

    Returns ``(new_params, new_opt_state, loss, aux)``.
    """
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, aux


# --------------------------------------------------------------------------------------------
# Behaviour cloning
# --------------------------------------------------------------------------------------------


class BCInfo(NamedTuple):
    """Diagnostics of one BC update: ``loss`` (mean negative log-likelihood), ``grad_norm``."""

    loss: jax.Array
    grad_norm: jax.Array


def bc(actor: nn.Module, optimizer: optax.GradientTransformation) -> Algorithm:
    """Returns behaviour cloning by maximum likelihood of the data's actions.

    Args:
      actor: a ``GaussianActor`` (static); its ``squash`` flag decides the likelihood.
      optimizer: an optax transformation (static).

    Returns:
      ``Algorithm(init, step)`` with ``TrainState`` and ``BCInfo``.

    >>> from hexad.policy import GaussianActor
    >>> algo = bc(GaussianActor(1, hidden=(8,)), optax.adam(1e-3))
    >>> b = Batch(jnp.zeros((4, 2)), jnp.zeros((4, 1)), jnp.zeros(4), jnp.zeros((4, 2)),
    ...           jnp.zeros(4))
    >>> state, info = jax.jit(algo.step)(jax.random.key(1), algo.init(jax.random.key(0), b), b)
    >>> int(state.step)
    1
    """
    squash = bool(getattr(actor, "squash", True))

    def init(key, batch: Batch) -> TrainState:
        params = actor.init(key, batch.observations)
        return TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32))

    def step(key, state: TrainState, batch: Batch):
        del key  # BC's update is deterministic given the batch.

        def loss_fn(params):
            dist = actor.apply(params, batch.observations)
            return -jnp.mean(gaussian_log_prob(dist, batch.actions, squash))

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        info = BCInfo(loss, optax.tree.norm(grads))
        return TrainState(params, opt_state, state.step + 1), info

    return Algorithm(init, step)


# --------------------------------------------------------------------------------------------
# IQL (Kostrikov, Nair, Levine 2021, arXiv 2110.06169)
# --------------------------------------------------------------------------------------------


class IQLState(NamedTuple):
    """State of IQL: actor, twin critic (+ Polyak target), value network, optimiser states."""

    actor_params: Params
    critic_params: Params
    target_critic_params: Params
    value_params: Params
    actor_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    value_opt_state: optax.OptState
    step: jax.Array


class IQLInfo(NamedTuple):
    """Diagnostics of one IQL update (all ``[]``)."""

    value_loss: jax.Array
    critic_loss: jax.Array
    actor_loss: jax.Array
    mean_v: jax.Array
    mean_q: jax.Array
    mean_adv: jax.Array


def iql(
    actor: nn.Module,
    critic: nn.Module,
    value: nn.Module,
    actor_optimizer: optax.GradientTransformation,
    critic_optimizer: optax.GradientTransformation,
    value_optimizer: optax.GradientTransformation,
    *,
    discount: float = 0.99,
    expectile: float = 0.7,
    temperature: float = 3.0,
    tau: float = 0.005,
    max_weight: float = 100.0,
) -> Algorithm:
    r"""Returns implicit Q-learning (arXiv 2110.06169, eqs. 5-7 and the AWR actor of sec. 4.3).

    One step updates, in order: the value :math:`V` by expectile regression on
    :math:`\min(Q_1, Q_2)` of the target critic; the actor by advantage-weighted regression with
    weights :math:`\min(\exp(\beta (Q_{\text{target}} - V)), w_{\max})` (:math:`\beta` the
    ``temperature``, :math:`w_{\max}` the ``max_weight``); the twin critic towards
    :math:`r + \gamma (1 - d) V(s')`; then the target critic by Polyak averaging.

    Args:
      actor: ``GaussianActor`` (static).
      critic: ``TwinCritic`` (static).
      value: ``ValueNet`` (static).
      actor_optimizer, critic_optimizer, value_optimizer: optax transformations (static).
      discount: gamma in ``[0, 1]``.
      expectile: tau of the expectile loss, in ``(0, 1)``.
      temperature: inverse temperature of the AWR weights, ``> 0``.
      tau: Polyak rate in ``(0, 1]``.
      max_weight: clip of the AWR weights.

    Returns:
      ``Algorithm(init, step)`` with ``IQLState`` and ``IQLInfo``.

    >>> from hexad.policy import GaussianActor, TwinCritic, ValueNet
    >>> algo = iql(GaussianActor(1, (8,)), TwinCritic((8,)), ValueNet((8,)),
    ...            optax.adam(1e-3), optax.adam(1e-3), optax.adam(1e-3))
    >>> b = Batch(jnp.zeros((4, 2)), jnp.zeros((4, 1)), jnp.ones(4), jnp.zeros((4, 2)),
    ...           jnp.zeros(4))
    >>> state, info = jax.jit(algo.step)(jax.random.key(1), algo.init(jax.random.key(0), b), b)
    >>> info.value_loss.shape
    ()
    """
    check_unit("discount", discount, lo_open=False, hi_open=False)
    check_unit("expectile", expectile)
    check_unit("tau", tau, hi_open=False)
    check_positive("temperature", temperature)
    squash = bool(getattr(actor, "squash", True))

    def init(key, batch: Batch) -> IQLState:
        ka, kc, kv = jax.random.split(key, 3)
        ap = actor.init(ka, batch.observations)
        cp = critic.init(kc, batch.observations, batch.actions)
        vp = value.init(kv, batch.observations)
        return IQLState(
            ap,
            cp,
            cp,
            vp,
            actor_optimizer.init(ap),
            critic_optimizer.init(cp),
            value_optimizer.init(vp),
            jnp.zeros((), jnp.int32),
        )

    def step(key, state: IQLState, batch: Batch):
        del key  # IQL's update is deterministic given the batch.
        obs, act = batch.observations, batch.actions
        tq1, tq2 = critic.apply(state.target_critic_params, obs, act)
        target_q = jax.lax.stop_gradient(jnp.minimum(tq1, tq2))

        def value_loss(vp):
            v = value.apply(vp, obs)
            return jnp.mean(expectile_loss(target_q - v, expectile)), v

        value_params, value_opt_state, v_loss, v = _descend(
            value_optimizer, value_loss, state.value_params, state.value_opt_state
        )

        adv = target_q - jax.lax.stop_gradient(value.apply(value_params, obs))
        weights = jnp.minimum(jnp.exp(temperature * adv), max_weight)

        def actor_loss(ap):
            dist = actor.apply(ap, obs)
            return -jnp.mean(weights * gaussian_log_prob(dist, act, squash)), None

        actor_params, actor_opt_state, a_loss, _ = _descend(
            actor_optimizer, actor_loss, state.actor_params, state.actor_opt_state
        )

        next_v = value.apply(value_params, batch.next_observations)
        backup = batch.rewards + discount * (1.0 - batch.terminals) * next_v
        backup = jax.lax.stop_gradient(backup)

        def critic_loss(cp):
            q1, q2 = critic.apply(cp, obs, act)
            return jnp.mean(jnp.square(q1 - backup) + jnp.square(q2 - backup)), q1

        critic_params, critic_opt_state, c_loss, q1 = _descend(
            critic_optimizer, critic_loss, state.critic_params, state.critic_opt_state
        )
        target = _polyak(state.target_critic_params, critic_params, tau)

        new_state = IQLState(
            actor_params,
            critic_params,
            target,
            value_params,
            actor_opt_state,
            critic_opt_state,
            value_opt_state,
            state.step + 1,
        )
        info = IQLInfo(v_loss, c_loss, a_loss, jnp.mean(v), jnp.mean(q1), jnp.mean(adv))
        return new_state, info

    return Algorithm(init, step)


# --------------------------------------------------------------------------------------------
# CQL (Kumar et al. 2020, arXiv 2006.04779), the CQL(H) variant with importance sampling
# --------------------------------------------------------------------------------------------


class CQLState(NamedTuple):
    """State of CQL: actor, twin critic (+ Polyak target) and their optimiser states."""

    actor_params: Params
    critic_params: Params
    target_critic_params: Params
    actor_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    step: jax.Array


class CQLInfo(NamedTuple):
    """Diagnostics of one CQL update (all ``[]``)."""

    critic_loss: jax.Array
    cql_gap: jax.Array
    actor_loss: jax.Array
    mean_q: jax.Array
    entropy: jax.Array


def cql(
    actor: nn.Module,
    critic: nn.Module,
    actor_optimizer: optax.GradientTransformation,
    critic_optimizer: optax.GradientTransformation,
    *,
    discount: float = 0.99,
    cql_weight: float = 5.0,
    n_action_samples: int = 10,
    entropy_coef: float = 0.1,
    tau: float = 0.005,
) -> Algorithm:
    r"""Returns conservative Q-learning, CQL(H) (arXiv 2006.04779, eq. 4 and appendix F).

    The critic minimises the TD error to
    :math:`r + \gamma (1 - d) \min Q_{\text{target}}(s', a')` with :math:`a' \sim \pi(s')`
    (:math:`\gamma` the ``discount``, :math:`d` the terminal flag), plus ``cql_weight`` times the
    gap :math:`\log \sum_a \exp Q(s, a) - Q(s, a_{\text{data}})`, where the log-sum-exp over
    actions is estimated by importance sampling from ``n_action_samples`` uniform and
    ``n_action_samples`` policy actions. The actor maximises
    :math:`\min(Q_1, Q_2)(s, a) - c \log \pi(a \mid s)`, :math:`c` the ``entropy_coef`` (a fixed
    entropy coefficient, not SAC's learned one). Actions are assumed in ``[-1, 1]``.

    Args:
      actor: a squashed ``GaussianActor`` (static).
      critic: ``TwinCritic`` (static).
      actor_optimizer, critic_optimizer: optax transformations (static).
      discount: gamma in ``[0, 1]``.
      cql_weight: weight of the conservative gap, ``>= 0``.
      n_action_samples: samples of each kind for the log-sum-exp (static).
      entropy_coef: fixed entropy bonus of the actor, ``>= 0``.
      tau: Polyak rate in ``(0, 1]``.

    Returns:
      ``Algorithm(init, step)`` with ``CQLState`` and ``CQLInfo``.

    >>> from hexad.policy import GaussianActor, TwinCritic
    >>> algo = cql(GaussianActor(1, (8,)), TwinCritic((8,)), optax.adam(1e-3), optax.adam(1e-3))
    >>> b = Batch(jnp.zeros((4, 2)), jnp.zeros((4, 1)), jnp.ones(4), jnp.zeros((4, 2)),
    ...           jnp.zeros(4))
    >>> state, info = jax.jit(algo.step)(jax.random.key(1), algo.init(jax.random.key(0), b), b)
    >>> info.cql_gap.shape
    ()
    """
    check_unit("discount", discount, lo_open=False, hi_open=False)
    check_unit("tau", tau, hi_open=False)
    check_positive("cql_weight", cql_weight, allow_zero=True)
    check_positive("entropy_coef", entropy_coef, allow_zero=True)
    n = check_int("n_action_samples", n_action_samples)
    if not getattr(actor, "squash", True):
        raise ValueError("actor: CQL needs a squashed actor (actions in [-1, 1]), got squash=False")

    def init(key, batch: Batch) -> CQLState:
        ka, kc = jax.random.split(key)
        ap = actor.init(ka, batch.observations)
        cp = critic.init(kc, batch.observations, batch.actions)
        return CQLState(
            ap,
            cp,
            cp,
            actor_optimizer.init(ap),
            critic_optimizer.init(cp),
            jnp.zeros((), jnp.int32),
        )

    def _repeat(x):  # [B, o] -> [n, B, o]
        return jnp.broadcast_to(x[None], (n, *x.shape))

    def step(key, state: CQLState, batch: Batch):
        k_next, k_rand, k_pi, k_actor = jax.random.split(key, 4)
        obs, act = batch.observations, batch.actions
        bsz, d = act.shape
        pi_next = actor.apply(state.actor_params, batch.next_observations)
        a_next, _ = sample_action(k_next, pi_next)
        tq1, tq2 = critic.apply(state.target_critic_params, batch.next_observations, a_next)
        backup = batch.rewards + discount * (1.0 - batch.terminals) * jnp.minimum(tq1, tq2)
        backup = jax.lax.stop_gradient(backup)

        a_rand = jax.random.uniform(k_rand, (n, bsz, d), minval=-1.0, maxval=1.0)
        log_unif = -d * jnp.log(2.0)
        pi_now = actor.apply(state.actor_params, obs)
        pi_rep = jax.tree.map(_repeat, pi_now)
        a_pi, logp_pi = sample_action(k_pi, pi_rep)
        a_pi, logp_pi = jax.lax.stop_gradient((a_pi, logp_pi))
        obs_rep = _repeat(obs)

        def critic_loss(cp):
            q1, q2 = critic.apply(cp, obs, act)
            td = jnp.mean(jnp.square(q1 - backup) + jnp.square(q2 - backup))
            r1, r2 = critic.apply(cp, obs_rep, a_rand)
            p1, p2 = critic.apply(cp, obs_rep, a_pi)
            # Importance-sampled log-sum-exp: half the samples uniform, half from pi.
            cat1 = jnp.concatenate([r1 - log_unif, p1 - logp_pi], axis=0)
            cat2 = jnp.concatenate([r2 - log_unif, p2 - logp_pi], axis=0)
            lse1 = jax.nn.logsumexp(cat1, axis=0) - jnp.log(2.0 * n)
            lse2 = jax.nn.logsumexp(cat2, axis=0) - jnp.log(2.0 * n)
            gap = jnp.mean(lse1 - q1) + jnp.mean(lse2 - q2)
            return td + cql_weight * gap, (gap, q1)

        critic_params, critic_opt_state, c_loss, (gap, q1) = _descend(
            critic_optimizer, critic_loss, state.critic_params, state.critic_opt_state
        )

        def actor_loss(ap):
            dist = actor.apply(ap, obs)
            a, logp = sample_action(k_actor, dist)
            q1, q2 = critic.apply(critic_params, obs, a)
            return jnp.mean(entropy_coef * logp - jnp.minimum(q1, q2)), -jnp.mean(logp)

        actor_params, actor_opt_state, a_loss, ent = _descend(
            actor_optimizer, actor_loss, state.actor_params, state.actor_opt_state
        )
        target = _polyak(state.target_critic_params, critic_params, tau)
        new_state = CQLState(
            actor_params, critic_params, target, actor_opt_state, critic_opt_state, state.step + 1
        )
        return new_state, CQLInfo(c_loss, gap, a_loss, jnp.mean(q1), ent)

    return Algorithm(init, step)


# --------------------------------------------------------------------------------------------
# Scanned training loop
# --------------------------------------------------------------------------------------------


def make_train(
    algorithm: Algorithm,
    n_steps: int,
    batch_size: int,
    *,
    mesh: jax.sharding.Mesh | None = None,
    axis: str = "data",
) -> Callable:
    """Returns ``train(key, state, data) -> (state, infos)``: ``n_steps`` updates in a ``lax.scan``.

    Each update draws ``batch_size`` transitions uniformly with replacement from ``data``.
    With ``mesh`` (any mesh, e.g. ``hexad.sharding.data_mesh()`` or ``jax.make_mesh``'s
    Explicit default, converted to Auto axes by ``hexad.sharding.batch_sharding``) each
    minibatch is constrained to be split along ``axis``, and XLA inserts the gradient
    all-reduce.

    Args:
      algorithm: an :class:`hexad._base.Algorithm` (static).
      n_steps: updates per call (static).
      batch_size: minibatch size (static); divisible by the mesh axis when sharded.
      mesh: optional mesh whose ``axis`` splits the minibatch (static).
      axis: the data axis name of ``mesh`` (static).

    Returns:
      ``train(key, state, data)`` returning the final state and the stacked ``Info`` (each
      field ``[n_steps]``). Jit it; call it repeatedly for chunks with a progress bar.

    >>> from hexad.policy import GaussianActor
    >>> algo = bc(GaussianActor(1, hidden=()), optax.adam(1e-2))
    >>> b = Batch(jnp.ones((8, 2)), jnp.zeros((8, 1)), jnp.zeros(8), jnp.ones((8, 2)),
    ...           jnp.zeros(8))
    >>> train = jax.jit(make_train(algo, n_steps=5, batch_size=4))
    >>> state, infos = train(jax.random.key(1), algo.init(jax.random.key(0), b), b)
    >>> infos.loss.shape
    (5,)
    """
    check_int("n_steps", n_steps)
    check_int("batch_size", batch_size)
    batch_spec = None
    if mesh is not None:
        batch_spec = sharding.batch_sharding(mesh, axis)
        sharding.check_divisible(batch_spec.mesh, axis, batch_size, "batch_size")

    def train(key, state, data):
        n = jax.tree.leaves(data)[0].shape[0]

        def body(state, k):
            k_idx, k_step = jax.random.split(k)
            idx = jax.random.randint(k_idx, (batch_size,), 0, n)
            batch = jax.tree.map(lambda x: x[idx], data)
            if batch_spec is not None:
                batch = jax.lax.with_sharding_constraint(batch, batch_spec)
            return algorithm.step(k_step, state, batch)

        return jax.lax.scan(body, state, jax.random.split(key, n_steps))

    return train
