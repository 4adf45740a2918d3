"""Proposals: ``propose(key, x) -> (y, log_rho)``.

``log_rho`` is everything in the Metropolis-Hastings log-ratio that the judge does not see:
``log rho = log [mu(y) q(y -> x)] - log [mu(x) q(x -> y)]``, where the chain's target is
``pi(x) ∝ mu(x) exp(s(x))``, ``s`` is the judge's Bradley-Terry score and ``mu`` a known base
measure (Lebesgue for a log-density judge; the generator's law ``p0`` for a judge that tilts a
generator; the latent prior for latent-space moves). Positions are arrays ``[d]`` (any shape;
unbatched, vmap over chains).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from hexad._base import check_positive, check_unit

__all__ = ["autoregressive", "independent", "latent_random_walk", "random_walk"]


def random_walk(sigma: float) -> Callable:
    r"""Returns the Gaussian random walk :math:`y = x + \sigma\, \mathcal{N}(0, I)`; symmetric,
    ``log_rho = 0``.

    Args:
      sigma: (static) step size, > 0.

    >>> y, log_rho = random_walk(0.5)(jax.random.key(0), jnp.zeros(2))
    >>> y.shape, float(log_rho)
    ((2,), 0.0)
    """
    sigma = check_positive("sigma", sigma)

    def propose(key, x):
        x = jnp.asarray(x)
        y = x + sigma * jax.random.normal(key, x.shape, x.dtype)
        return y, jnp.zeros((), x.dtype)

    return propose


def autoregressive(sigma: float, shrink: float) -> Callable:
    r"""Returns the asymmetric AR(1) proposal :math:`y = (1 - s) x + \sigma\, \mathcal{N}(0, I)`,
    :math:`s` the ``shrink``.

    :math:`\log \rho = \log \mathcal{N}(x; (1 - s) y, \sigma^2) - \log \mathcal{N}(y; (1 - s) x,
    \sigma^2)` (Lebesgue base measure). Used to exercise the asymmetric rules.

    Args:
      sigma: (static) noise scale, > 0.
      shrink: (static) pull towards the origin, in ``[0, 1)``.

    >>> y, log_rho = autoregressive(0.5, 0.2)(jax.random.key(0), jnp.ones(2))
    >>> y.shape
    (2,)
    """
    sigma = check_positive("sigma", sigma)
    shrink = check_unit("shrink", shrink, lo_open=False)
    c = 1.0 - shrink

    def propose(key, x):
        x = jnp.asarray(x)
        y = c * x + sigma * jax.random.normal(key, x.shape, x.dtype)
        log_fwd = -0.5 * jnp.sum((y - c * x) ** 2) / sigma**2
        log_bwd = -0.5 * jnp.sum((x - c * y) ** 2) / sigma**2
        return y, log_bwd - log_fwd

    return propose


def independent(
    sample_fn: Callable[[jax.Array], jax.Array],
    log_prob_fn: Callable[[jax.Array], jax.Array] | None = None,
) -> Callable:
    r"""Returns independent proposals :math:`y \sim p_0` from a generator.

    With ``log_prob_fn=None`` the target is the judge-tilted generator
    :math:`\pi \propto p_0 \exp(s)` and ``log_rho = 0``: the MH ratio reduces to the judge's
    odds :math:`\exp(s(y) - s(x))`. With ``log_prob_fn`` :math:`= \log p_0` the target is
    :math:`\exp(s)` against Lebesgue measure and :math:`\log \rho = \log p_0(x) - \log p_0(y)`.

    Args:
      sample_fn: ``sample_fn(key) -> y`` draws one candidate from the generator.
      log_prob_fn: optional ``log p0(x) -> []``.

    >>> propose = independent(lambda k: jax.random.normal(k, (2,)))
    >>> float(propose(jax.random.key(0), jnp.zeros(2))[1])
    0.0
    """
    if not callable(sample_fn):
        raise TypeError(f"sample_fn: expected a callable, got {type(sample_fn).__name__}")
    if log_prob_fn is not None and not callable(log_prob_fn):
        raise TypeError(f"log_prob_fn: expected a callable, got {type(log_prob_fn).__name__}")

    def propose(key, x):
        y = sample_fn(key)
        if log_prob_fn is None:
            return y, jnp.zeros((), jnp.result_type(float))
        return y, jnp.asarray(log_prob_fn(x)) - jnp.asarray(log_prob_fn(y))

    return propose


def latent_random_walk(sigma: float, log_prior_fn: Callable | None = None) -> Callable:
    r"""Returns a random walk in a generator's latent space with the prior ratio in ``rho``.

    The chain moves :math:`z`; its target is :math:`\pi(z) \propto p(z) \exp(s(G(z)))`, with
    :math:`p` the prior, where the judge (:func:`~hexad.prefmh.pullback_judge`) compares decoded
    :math:`G(z)`. The walk is symmetric, so :math:`\log \rho = \log p(y) - \log p(z)`; the default
    prior is :math:`\mathcal{N}(0, I)`.

    Args:
      sigma: (static) latent step size, > 0.
      log_prior_fn: ``log prior(z) -> []``; default standard normal.

    >>> y, log_rho = latent_random_walk(0.1)(jax.random.key(0), jnp.zeros(3))
    >>> bool(log_rho <= 0)
    True
    """
    sigma = check_positive("sigma", sigma)
    if log_prior_fn is None:
        log_prior_fn = lambda z: -0.5 * jnp.sum(z**2)
    elif not callable(log_prior_fn):
        raise TypeError(f"log_prior_fn: expected a callable, got {type(log_prior_fn).__name__}")

    def propose(key, z):
        z = jnp.asarray(z)
        y = z + sigma * jax.random.normal(key, z.shape, z.dtype)
        return y, jnp.asarray(log_prior_fn(y)) - jnp.asarray(log_prior_fn(z))

    return propose
