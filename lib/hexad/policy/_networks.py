"""flax.linen networks for offline RL: Gaussian actors (tanh-squashed), twin Q, value."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from hexad._base import head_dtype
from hexad.policy._gaussian import DiagGaussian

__all__ = [
    "MLP",
    "GaussianActor",
    "TwinCritic",
    "ValueNet",
    "gaussian_log_prob",
    "sample_action",
]

_LOG_2PI = float(jnp.log(2.0 * jnp.pi))


class MLP(nn.Module):
    """A ReLU multilayer perceptron ``[..., i] -> [..., out]``.

    Attributes:
      hidden: widths of the hidden layers (static).
      out: output width (static).
      dtype: compute dtype of the hidden layers (static; ``None``: the parameters' float32,
        ``jnp.bfloat16``: mixed precision). Parameters stay float32; the output layer computes
        in ``head_dtype(dtype)`` (float32 for bfloat16).
    """

    hidden: Sequence[int]
    out: int
    dtype: Any = None

    @nn.compact
    def __call__(self, x):
        for h in self.hidden:
            x = nn.relu(nn.Dense(h, dtype=self.dtype)(x))
        return nn.Dense(self.out, dtype=head_dtype(self.dtype))(x)


class GaussianActor(nn.Module):
    """A diagonal-Gaussian policy ``obs [..., o] -> DiagGaussian [..., d]``.

    With ``squash`` (the default) the Gaussian is over pre-tanh actions and actions are
    ``tanh(u)`` in ``(-1, 1)``; compose such actors in pre-tanh space (see ``hexad.policy.poe``).

    Attributes:
      action_dim: ``d`` (static).
      hidden: hidden widths (static); ``()`` makes the mean linear in the observation.
      log_std_min, log_std_max: clip range of the log standard deviation (static).
      state_dependent_std: whether the std is a head of the network or a free parameter.
      squash: whether actions are ``tanh`` of the Gaussian variable (static).
      dtype: compute dtype of the hidden layers, as in :class:`MLP`; the mean and log-std
        heads, and so the returned Gaussian, are float32 under bfloat16.
    """

    action_dim: int
    hidden: Sequence[int] = (256, 256)
    log_std_min: float = -5.0
    log_std_max: float = 2.0
    state_dependent_std: bool = True
    squash: bool = True
    dtype: Any = None

    @nn.compact
    def __call__(self, obs) -> DiagGaussian:
        x = obs
        for h in self.hidden:
            x = nn.relu(nn.Dense(h, dtype=self.dtype)(x))
        hd = head_dtype(self.dtype)
        mean = nn.Dense(self.action_dim, dtype=hd, name="mean")(x)
        if self.state_dependent_std:
            log_std = nn.Dense(self.action_dim, dtype=hd, name="log_std")(x)
        else:
            log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,))
            log_std = jnp.broadcast_to(log_std, mean.shape)
        log_std = jnp.clip(log_std, self.log_std_min, self.log_std_max)
        return DiagGaussian(mean, jnp.exp(log_std))


class TwinCritic(nn.Module):
    """Two independent Q networks ``(obs [..., o], act [..., d]) -> ([...], [...])``.

    Attributes:
      hidden: hidden widths of each Q network (static).
      dtype: compute dtype, as in :class:`MLP` (the Q values are float32 under bfloat16).
    """

    hidden: Sequence[int] = (256, 256)
    dtype: Any = None

    @nn.compact
    def __call__(self, obs, act):
        x = jnp.concatenate([obs, act], axis=-1)
        q1 = MLP(self.hidden, 1, self.dtype, name="q1")(x)[..., 0]
        q2 = MLP(self.hidden, 1, self.dtype, name="q2")(x)[..., 0]
        return q1, q2


class ValueNet(nn.Module):
    """A state-value network ``obs [..., o] -> [...]``.

    Attributes:
      hidden: hidden widths (static).
      dtype: compute dtype, as in :class:`MLP`.
    """

    hidden: Sequence[int] = (256, 256)
    dtype: Any = None

    @nn.compact
    def __call__(self, obs):
        return MLP(self.hidden, 1, self.dtype)(obs)[..., 0]


def gaussian_log_prob(dist: DiagGaussian, actions, squash: bool = True, eps: float = 1e-6):
    r"""Returns :math:`\log \pi(\text{actions})` summed over the action axis.

    For a squashed policy the density of :math:`a = \tanh(u)` includes the change of variables
    :math:`-\sum \log(1 - a^2)`; actions are clipped to :math:`|a| \le 1 - \epsilon` before
    ``atanh``.

    Args:
      dist: ``DiagGaussian`` ``[..., d]``.
      actions: ``[..., d]`` actions (in ``(-1, 1)`` when ``squash``).
      squash: whether ``dist`` is over pre-tanh variables (static).
      eps: clip margin (static).

    Returns:
      ``[...]`` log densities.

    >>> d = DiagGaussian(jnp.zeros(1), jnp.ones(1))
    >>> round(float(gaussian_log_prob(d, jnp.zeros(1), squash=False)), 4)  # -log(2 pi) / 2
    -0.9189
    """
    if squash:
        a = jnp.clip(actions, -1.0 + eps, 1.0 - eps)
        u = jnp.arctanh(a)
        log_det = jnp.sum(jnp.log1p(-jnp.square(a)), axis=-1)
    else:
        u = actions
        log_det = 0.0
    z = (u - dist.mean) / dist.std
    logp = jnp.sum(-0.5 * jnp.square(z) - jnp.log(dist.std) - 0.5 * _LOG_2PI, axis=-1)
    return logp - log_det


def sample_action(key, dist: DiagGaussian, squash: bool = True):
    """Returns ``(action [..., d], log_prob [...])`` by reparameterised sampling.

    >>> a, lp = sample_action(jax.random.key(0), DiagGaussian(jnp.zeros(2), jnp.ones(2)))
    >>> a.shape, lp.shape
    ((2,), ())
    """
    eps = jax.random.normal(key, jnp.shape(dist.mean), jnp.result_type(dist.mean))
    u = dist.mean + dist.std * eps
    logp = jnp.sum(-0.5 * jnp.square(eps) - jnp.log(dist.std) - 0.5 * _LOG_2PI, axis=-1)
    if not squash:
        return u, logp
    a = jnp.tanh(u)
    # log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), stable for large |u|.
    log_det = jnp.sum(2.0 * (jnp.log(2.0) - u - jax.nn.softplus(-2.0 * u)), axis=-1)
    return a, logp - log_det
