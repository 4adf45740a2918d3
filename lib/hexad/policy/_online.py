"""Online soft actor-critic in the init/step shape: the behaviour policies of the locomotion data.

``sac`` returns the same :class:`hexad._base.Algorithm` ``(init, step)`` pair as the offline
methods, so one update is ``step(key, state, batch)`` on a minibatch from a replay buffer, and
``make_train`` or a ``lax.scan`` over pre-sampled minibatches runs many of them in one jitted
call.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from hexad._base import Algorithm, check_positive, check_unit
from hexad.policy._networks import sample_action
from hexad.policy._offline import Batch, _descend, _polyak

__all__ = ["SACInfo", "SACState", "sac", "soft_td_target"]

Params = Any


class SACState(NamedTuple):
    """State of SAC: actor, twin critic (+ Polyak target), log temperature, optimiser states."""

    actor_params: Params
    critic_params: Params
    target_critic_params: Params
    log_alpha: jax.Array
    actor_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    alpha_opt_state: optax.OptState
    step: jax.Array


class SACInfo(NamedTuple):
    """Diagnostics of one SAC update (all ``[]``)."""

    critic_loss: jax.Array
    actor_loss: jax.Array
    alpha: jax.Array
    entropy: jax.Array
    mean_q: jax.Array


def soft_td_target(rewards, terminals, next_q1, next_q2, next_log_prob, discount, alpha):
    r"""Returns SAC's soft TD target
    :math:`r + \gamma (1 - d) (\min(Q_1', Q_2') - \alpha \log \pi(a' \mid s'))`.

    arXiv 1812.05905, eqs. 2-3 with the clipped double-Q of TD3 (arXiv 1802.09477).

    Args:
      rewards, terminals: ``[B]``.
      next_q1, next_q2: ``[B]`` target critics at :math:`(s', a')` with :math:`a' \sim \pi(s')`.
      next_log_prob: ``[B]`` :math:`\log \pi(a' \mid s')`.
      discount: gamma.
      alpha: the entropy temperature ``[]``.

    Returns:
      ``[B]`` targets.

    >>> soft_td_target(jnp.ones(1), jnp.zeros(1), jnp.full(1, 2.0), jnp.full(1, 3.0),
    ...                jnp.full(1, -1.0), 0.5, 0.1)
    Array([2.05], dtype=float32)
    """
    soft_v = jnp.minimum(next_q1, next_q2) - alpha * next_log_prob
    return rewards + discount * (1.0 - terminals) * soft_v


def sac(
    actor: nn.Module,
    critic: nn.Module,
    actor_optimizer: optax.GradientTransformation,
    critic_optimizer: optax.GradientTransformation,
    alpha_optimizer: optax.GradientTransformation,
    *,
    discount: float = 0.99,
    tau: float = 0.005,
    target_entropy: float | None = None,
    init_alpha: float = 1.0,
) -> Algorithm:
    r"""Returns soft actor-critic with a learned temperature (arXiv 1812.05905, algorithm 1).

    One step updates, in order: the twin critic towards :func:`soft_td_target` with
    :math:`a' \sim \pi(s')` and the Polyak target critic; the actor by minimising
    :math:`\mathbb{E}[\alpha \log \pi(a \mid s) - \min(Q_1, Q_2)(s, a)]` with reparameterised
    :math:`a`; the log temperature by minimising
    :math:`-\log \alpha\, (\log \pi(a \mid s) + \bar{\mathcal{H}})` (eq. 18,
    :math:`\bar{\mathcal{H}}` the ``target_entropy``); then the target critic by Polyak
    averaging.

    Args:
      actor: a squashed ``GaussianActor`` (static).
      critic: ``TwinCritic`` (static).
      actor_optimizer, critic_optimizer, alpha_optimizer: optax transformations (static).
      discount: gamma in ``[0, 1]``.
      tau: Polyak rate in ``(0, 1]``.
      target_entropy: the entropy the temperature aims for; default ``-action_dim``.
      init_alpha: initial temperature, ``> 0``.

    Returns:
      ``Algorithm(init, step)`` with ``SACState`` and ``SACInfo``.

    >>> from hexad.policy import GaussianActor, TwinCritic
    >>> algo = sac(GaussianActor(1, (8,)), TwinCritic((8,)), optax.adam(1e-3), optax.adam(1e-3),
    ...            optax.adam(1e-3))
    >>> b = Batch(jnp.zeros((4, 2)), jnp.zeros((4, 1)), jnp.ones(4), jnp.zeros((4, 2)),
    ...           jnp.zeros(4))
    >>> state, info = jax.jit(algo.step)(jax.random.key(1), algo.init(jax.random.key(0), b), b)
    >>> info.alpha.shape
    ()
    """
    check_unit("discount", discount, lo_open=False, hi_open=False)
    check_unit("tau", tau, hi_open=False)
    check_positive("init_alpha", init_alpha)
    if not getattr(actor, "squash", True):
        raise ValueError("actor: SAC needs a squashed actor (actions in [-1, 1]), got squash=False")
    if target_entropy is None:
        target_entropy = -float(actor.action_dim)

    def init(key, batch: Batch) -> SACState:
        ka, kc = jax.random.split(key)
        ap = actor.init(ka, batch.observations)
        cp = critic.init(kc, batch.observations, batch.actions)
        log_alpha = jnp.log(jnp.asarray(init_alpha, jnp.float32))
        return SACState(
            ap,
            cp,
            cp,
            log_alpha,
            actor_optimizer.init(ap),
            critic_optimizer.init(cp),
            alpha_optimizer.init(log_alpha),
            jnp.zeros((), jnp.int32),
        )

    def step(key, state: SACState, batch: Batch):
        k_next, k_actor = jax.random.split(key)
        obs, act = batch.observations, batch.actions
        alpha = jnp.exp(state.log_alpha)
        a_next, logp_next = sample_action(
            k_next, actor.apply(state.actor_params, batch.next_observations)
        )
        tq1, tq2 = critic.apply(state.target_critic_params, batch.next_observations, a_next)
        backup = soft_td_target(
            batch.rewards, batch.terminals, tq1, tq2, logp_next, discount, alpha
        )
        backup = jax.lax.stop_gradient(backup)

        def critic_loss(cp):
            q1, q2 = critic.apply(cp, obs, act)
            return jnp.mean(jnp.square(q1 - backup) + jnp.square(q2 - backup)), q1

        critic_params, critic_opt_state, c_loss, q1 = _descend(
            critic_optimizer, critic_loss, state.critic_params, state.critic_opt_state
        )

        def actor_loss(ap):
            a, logp = sample_action(k_actor, actor.apply(ap, obs))
            q1, q2 = critic.apply(critic_params, obs, a)
            return jnp.mean(alpha * logp - jnp.minimum(q1, q2)), logp

        actor_params, actor_opt_state, a_loss, logp = _descend(
            actor_optimizer, actor_loss, state.actor_params, state.actor_opt_state
        )

        logp = jax.lax.stop_gradient(logp)
        alpha_grad = jax.grad(lambda la: -la * jnp.mean(logp + target_entropy))(state.log_alpha)
        al_upd, alpha_opt_state = alpha_optimizer.update(
            alpha_grad, state.alpha_opt_state, state.log_alpha
        )
        log_alpha = optax.apply_updates(state.log_alpha, al_upd)
        target = _polyak(state.target_critic_params, critic_params, tau)
        new_state = SACState(
            actor_params,
            critic_params,
            target,
            log_alpha,
            actor_opt_state,
            critic_opt_state,
            alpha_opt_state,
            state.step + 1,
        )
        info = SACInfo(c_loss, a_loss, alpha, -jnp.mean(logp), jnp.mean(q1))
        return new_state, info

    return Algorithm(init, step)
