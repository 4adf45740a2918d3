"""Critic-guided action steering: the IQL/CQL-guided baseline for deployment-time adaptation."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from hexad._base import check_int, check_positive, is_traced

__all__ = ["q_steer"]


def q_steer(
    q_fn: Callable,
    obs,
    pre_tanh_action,
    step_size: float = 0.1,
    n_steps: int = 10,
    max_shift: float = 1.0,
):
    r"""Returns :math:`\tanh(u)` after ``n_steps`` of gradient ascent on :math:`Q(s, \tanh(u))`
    from :math:`u_0`.

    The baseline that steers a frozen actor's action with a critic of the new objective (for example
    a goal-conditioned IQL or CQL critic) instead of composing it with a prior: start at the actor's
    pre-tanh mean :math:`u_0` and follow :math:`\nabla_u Q` (the deterministic policy-gradient
    direction of DDPG, arXiv 1509.02971), keeping :math:`|u - u_0| \le` ``max_shift`` per dimension
    as a trust region around the actor. Each state is steered independently.

    Args:
      q_fn: ``q_fn(obs [B, o], action [B, d]) -> [B]`` (closes over the critic's parameters).
      obs: ``[B, o]`` observations.
      pre_tanh_action: ``[B, d]`` the actor's pre-tanh means ``u0``.
      step_size: ascent step on ``u`` (static), ``> 0``.
      n_steps: ascent steps (static), ``>= 0``.
      max_shift: trust-region half-width in pre-tanh units, ``> 0``: a scalar or ``[B]`` (one
        per state, so one batched call can sweep it).

    Returns:
      ``[B, d]`` actions in ``(-1, 1)``.

    >>> q = lambda s, a: -jnp.sum(jnp.square(a - 0.5), axis=-1)
    >>> a = q_steer(q, jnp.zeros((1, 1)), jnp.zeros((1, 1)), step_size=1.0, n_steps=200)
    >>> a.round(3)
    Array([[0.5]], dtype=float32)
    """
    check_positive("step_size", step_size)
    if not is_traced(max_shift) and not np.all(np.asarray(max_shift) > 0):
        raise ValueError(f"max_shift: expected values > 0, got {max_shift!r}")
    check_int("n_steps", n_steps, lo=0)
    if jnp.shape(obs)[0] != jnp.shape(pre_tanh_action)[0]:
        raise ValueError(
            f"pre_tanh_action: expected {jnp.shape(obs)[0]} rows (obs's), "
            f"got shape {jnp.shape(pre_tanh_action)}"
        )
    u0 = pre_tanh_action
    shift = jnp.asarray(max_shift)
    shift = shift[:, None] if shift.ndim == 1 else shift
    grad = jax.grad(lambda u: jnp.sum(q_fn(obs, jnp.tanh(u))))

    def body(_, u):
        u = u + step_size * grad(u)
        return jnp.clip(u, u0 - shift, u0 + shift)

    return jnp.tanh(jax.lax.fori_loop(0, n_steps, body, u0))
