"""Successor features and generalised policy improvement (Barreto et al. 2017, arXiv 1606.05312).

A library of ``K`` fixed policies ``pi_k`` and features ``phi(s, a, s') in R^F``. The successor
features of policy ``k`` are ``psi^k(s, a) = E[sum_t gamma^t phi_t | s, a, pi_k]`` (eq. 3), so
for any task whose reward is linear in the features, ``r = phi . w``, the policy's action values
are ``Q^k_w(s, a) = psi^k(s, a) . w`` without further learning. The ``psi^k`` satisfy a Bellman
equation ``psi^k(s, a) = phi + gamma E[psi^k(s', pi_k(s'))]`` (eq. 4) and are learned here by TD
from offline transitions, all ``K`` at once by one network with a ``[K, F]`` head. For a new
task the weights ``w`` come from least squares of rewards on features, and GPI (Theorem 1) acts
by ``argmax_a max_k psi^k(s, a) . w``; over continuous actions the argmax runs over a finite
candidate set (here: the library policies' own actions at ``s``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from hexad._base import Algorithm, check_positive, check_unit
from hexad.policy._networks import MLP
from hexad.policy._offline import Batch, _descend, _polyak

__all__ = [
    "SFBatch",
    "SFInfo",
    "SFState",
    "SuccessorFeatures",
    "gpi",
    "sf_td",
    "task_fit",
    "task_weights",
]

Params = Any


class SFBatch(NamedTuple):
    """Transitions with their features.

    Attributes:
      observations: ``[B, o]``.
      actions: ``[B, d]``.
      features: ``[B, F]`` ``phi(s, a, s')`` of each transition.
      next_observations: ``[B, o]``.
      terminals: ``[B]`` 1.0 where the episode ended in a terminal state (no bootstrap).
    """

    observations: jax.Array
    actions: jax.Array
    features: jax.Array
    next_observations: jax.Array
    terminals: jax.Array

    @classmethod
    def from_batch(cls, batch: Batch, features) -> SFBatch:
        """Returns the transitions of ``batch`` with their ``features [B, F]`` (rewards dropped).

        >>> b = Batch(jnp.zeros((3, 2)), jnp.zeros((3, 1)), jnp.zeros(3), jnp.ones((3, 2)),
        ...           jnp.zeros(3))
        >>> SFBatch.from_batch(b, jnp.ones((3, 4))).features.shape
        (3, 4)
        """
        n, fs = jnp.shape(batch.observations)[0], jnp.shape(features)
        if len(fs) != 2 or fs[0] != n:
            raise ValueError(f"features: expected shape [{n}, F] (the batch's rows), got {fs}")
        obs, nxt = batch.observations, batch.next_observations
        return cls(obs, batch.actions, features, nxt, batch.terminals)


class SFState(NamedTuple):
    """State of successor-feature TD: parameters, Polyak target, optimiser state, step count."""

    params: Params
    target_params: Params
    opt_state: optax.OptState
    step: jax.Array


class SFInfo(NamedTuple):
    """Diagnostics of one update: ``loss`` (mean squared TD error), ``mean_psi_norm``."""

    loss: jax.Array
    mean_psi_norm: jax.Array


class SuccessorFeatures(nn.Module):
    """``psi(obs [..., o], act [..., d]) -> [..., K, F]``: an MLP on ``[obs, act]``.

    Attributes:
      n_policies: ``K`` (static).
      n_features: ``F`` (static).
      hidden: hidden widths (static).
    """

    n_policies: int
    n_features: int
    hidden: Sequence[int] = (256, 256)

    @nn.compact
    def __call__(self, obs, act):
        x = jnp.concatenate([obs, act], axis=-1)
        out = MLP(self.hidden, self.n_policies * self.n_features)(x)
        return out.reshape(*out.shape[:-1], self.n_policies, self.n_features)


def sf_td(
    psi_net: nn.Module,
    optimizer: optax.GradientTransformation,
    next_actions: Callable,
    *,
    discount: float = 0.99,
    tau: float = 0.005,
) -> Algorithm:
    r"""Returns TD learning of the successor features of ``K`` fixed policies (arXiv 1606.05312).

    One step regresses :math:`\psi^k(s, a)` on the target
    :math:`\phi(s, a, s') + \gamma (1 - d)\, \psi^k_{\text{target}}(s', \pi_k(s'))` for every
    :math:`k` (eq. 4), with loss :math:`\frac{1}{2} \operatorname{mean}_{B, K, F}
    (\psi - \text{target})^2`, then moves the target parameters by Polyak averaging
    (``tau = 1`` copies them: fitted SF iteration).

    Args:
      psi_net: a module ``(obs [B, o], act [B, d]) -> [B, K, F]``, e.g.
        :class:`SuccessorFeatures` (static).
      optimizer: an optax transformation (static).
      next_actions: ``next_actions(next_obs [B, o]) -> [B, K, d]``, the library policies'
        actions at the next states (static; close over the frozen policies' parameters).
      discount: gamma in ``[0, 1)``.
      tau: Polyak rate in ``(0, 1]``.

    Returns:
      ``Algorithm(init, step)`` with :class:`SFState` and :class:`SFInfo`; it takes
      :class:`SFBatch` es, and ``hexad.policy.make_train`` scans it.

    >>> net = SuccessorFeatures(n_policies=2, n_features=3, hidden=(8,))
    >>> algo = sf_td(net, optax.adam(1e-3), lambda s: jnp.zeros((s.shape[0], 2, 1)))
    >>> b = SFBatch(jnp.zeros((4, 2)), jnp.zeros((4, 1)), jnp.ones((4, 3)), jnp.zeros((4, 2)),
    ...             jnp.zeros(4))
    >>> state, info = jax.jit(algo.step)(jax.random.key(1), algo.init(jax.random.key(0), b), b)
    >>> info.loss.shape
    ()
    """
    check_unit("discount", discount, lo_open=False)
    check_unit("tau", tau, hi_open=False)
    if not callable(next_actions):
        raise TypeError(f"next_actions: expected a callable, got {type(next_actions).__name__}")

    def init(key, batch: SFBatch) -> SFState:
        params = psi_net.init(key, batch.observations, batch.actions)
        return SFState(params, params, optimizer.init(params), jnp.zeros((), jnp.int32))

    def step(key, state: SFState, batch: SFBatch):
        del key  # the update is deterministic given the batch
        a_next = next_actions(batch.next_observations)  # [B, K, d]
        b, k = a_next.shape[0], a_next.shape[1]
        s_rep = jnp.broadcast_to(
            batch.next_observations[:, None, :], (b, k, batch.next_observations.shape[-1])
        )
        psi_all = psi_net.apply(state.target_params, s_rep, a_next)  # [B, K(action), K, F]
        psi_next = jnp.diagonal(psi_all, axis1=1, axis2=2)  # [B, F, K]
        psi_next = jnp.swapaxes(psi_next, 1, 2)  # [B, K, F]
        cont = (1.0 - batch.terminals)[:, None, None]
        target = batch.features[:, None, :] + discount * cont * psi_next
        target = jax.lax.stop_gradient(target)

        def loss_fn(params):
            psi = psi_net.apply(params, batch.observations, batch.actions)
            return 0.5 * jnp.mean(jnp.square(psi - target)), psi

        params, opt_state, loss, psi = _descend(optimizer, loss_fn, state.params, state.opt_state)
        target_params = _polyak(state.target_params, params, tau)
        info = SFInfo(loss, jnp.mean(jnp.linalg.norm(psi, axis=-1)))
        return SFState(params, target_params, opt_state, state.step + 1), info

    return Algorithm(init, step)


def task_weights(features, rewards, ridge: float = 1e-6):
    r"""Returns ``w [F]`` minimising :math:`\|\Phi w - r\|^2 + \rho N \|w\|^2`, with
    :math:`\Phi` the ``features``, :math:`r` the ``rewards`` and :math:`\rho` the ``ridge``.

    The task vector of a new objective (arXiv 1606.05312, sec. 4: ``w`` is learned by
    regression of observed rewards on the features).

    Args:
      features: ``[N, F]`` ``phi(s, a, s')``.
      rewards: ``[N]`` rewards of the new objective on the same transitions.
      ridge: Tikhonov weight per sample, ``>= 0``.

    Returns:
      ``[F]`` weights.

    >>> phi = jnp.eye(3)
    >>> task_weights(phi, jnp.array([1.0, 2.0, 3.0]), ridge=0.0).round(4)
    Array([1., 2., 3.], dtype=float32)
    """
    fs, rs = jnp.shape(features), jnp.shape(rewards)
    if len(fs) != 2:
        raise ValueError(f"features: expected shape [N, F], got {fs}")
    if rs != (fs[0],):
        raise ValueError(f"rewards: expected shape ({fs[0]},) (features' rows), got {rs}")
    check_positive("ridge", ridge, allow_zero=True)
    n, f = fs
    gram = features.T @ features + (ridge * n) * jnp.eye(f, dtype=features.dtype)
    return jnp.linalg.solve(gram, features.T @ rewards)


def task_fit(features, rewards, ridge: float = 1e-6) -> tuple[jax.Array, float]:
    r"""Returns ``(w [F], r2)``: :func:`task_weights` and the :math:`R^2` of its fit of ``rewards``.

    :math:`w` is fitted in float32; with :math:`r` the rewards and :math:`\Phi` the features,
    :math:`R^2 = 1 - \|r - \Phi w\|^2 / \|r - \bar r\|^2` is evaluated on the host, the
    residuals in float64 (:math:`\Phi w` in the features' dtype). An :math:`R^2` near 1 says
    the new task is nearly linear in the features, so GPI's values :math:`\psi^\top w` are
    nearly its action values.

    Args:
      features: ``[N, F]`` ``phi(s, a, s')``.
      rewards: ``[N]`` rewards of the new objective on the same transitions, not all equal.
      ridge: Tikhonov weight per sample, ``>= 0``.

    >>> phi = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], np.float32)
    >>> w, r2 = task_fit(phi, np.array([1.0, 2.0, 3.0]), ridge=0.0)
    >>> w.round(4).tolist(), round(r2, 4)
    ([1.0, 2.0], 1.0)
    """
    phi, r = np.asarray(features), np.asarray(rewards, np.float64)
    w = task_weights(jnp.asarray(phi), jnp.asarray(r, jnp.float32), ridge)
    dev = np.sum((r - r.mean()) ** 2)
    if not dev > 0:
        raise ValueError("rewards: expected values that are not all equal (R^2 is undefined)")
    return w, float(1.0 - np.sum((r - phi @ np.asarray(w)) ** 2) / dev)


def gpi(psi_fn: Callable, obs, candidates, w, policy_mask=None):
    r"""Returns the GPI action :math:`\operatorname{argmax}_c \max_k \psi^k(s, c)^\top w` over
    candidate actions.

    Theorem 1 of arXiv 1606.05312: the resulting policy's value is at least every library
    policy's (up to the SF approximation error).

    Args:
      psi_fn: ``psi_fn(obs [M, o], act [M, d]) -> [M, K, F]`` (closes over the parameters).
      obs: ``[B, o]`` states.
      candidates: ``[B, C, d]`` candidate actions per state.
      w: ``[F]`` task weights, or ``[B, F]`` one task per state.
      policy_mask: optional ``[K]`` bool, the library members GPI may use (all by default).

    Returns:
      ``(actions [B, d], values [B])``: the chosen candidate and its
      :math:`\max_k \psi^k(s, c)^\top w`.

    >>> psi = lambda s, a: a[:, None, :]  # K = 1 policy, F = d features
    >>> cands = jnp.array([[[1.0, 0.0], [0.0, 1.0]]])
    >>> gpi(psi, jnp.zeros((1, 3)), cands, jnp.array([0.2, 0.5]))[0]
    Array([[0., 1.]], dtype=float32)
    """
    os_, cs = jnp.shape(obs), jnp.shape(candidates)
    if len(os_) != 2:
        raise ValueError(f"obs: expected shape [B, o], got {os_}")
    if len(cs) != 3 or cs[0] != os_[0]:
        raise ValueError(f"candidates: expected shape [{os_[0]}, C, d], got {cs}")
    if jnp.ndim(w) not in (1, 2) or (jnp.ndim(w) == 2 and jnp.shape(w)[0] != os_[0]):
        raise ValueError(f"w: expected shape [F] or [{os_[0]}, F], got {jnp.shape(w)}")
    b, c, d = cs
    s_rep = jnp.broadcast_to(obs[:, None, :], (b, c, os_[1])).reshape(b * c, os_[1])
    psi = psi_fn(s_rep, candidates.reshape(b * c, d))  # [B C, K, F]
    if psi.ndim != 3 or psi.shape[-1] != jnp.shape(w)[-1]:
        raise ValueError(
            f"w: expected {psi.shape[-1]} features (psi_fn's last axis), got {jnp.shape(w)}"
        )
    psi = psi.reshape(b, c, psi.shape[1], psi.shape[2])
    wb = w if jnp.ndim(w) == 2 else jnp.broadcast_to(w, (b, jnp.shape(w)[0]))
    q = jnp.einsum("bckf,bf->bck", psi, wb)  # [B, C, K]
    if policy_mask is not None:
        if jnp.shape(policy_mask) != (q.shape[2],):
            raise ValueError(
                f"policy_mask: expected shape ({q.shape[2]},), got {jnp.shape(policy_mask)}"
            )
        q = jnp.where(jnp.asarray(policy_mask)[None, None, :], q, -jnp.inf)
    v = jnp.max(q, axis=2)  # [B, C]
    best = jnp.argmax(v, axis=1)  # [B]
    act = jnp.take_along_axis(candidates, best[:, None, None], axis=1)[:, 0]
    return act, jnp.take_along_axis(v, best[:, None], axis=1)[:, 0]
