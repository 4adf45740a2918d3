"""Chain diagnostics: effective sample size and potential scale reduction (R-hat).

Own implementations (BlackJAX is only a test dependency) of the estimators used by Stan and
``blackjax.diagnostics``; the tests check agreement with BlackJAX's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["effective_sample_size", "potential_scale_reduction"]


def _check(samples: jax.Array, name: str) -> jax.Array:
    samples = jnp.asarray(samples)
    if samples.ndim < 2 or samples.shape[1] < 4:
        raise ValueError(
            f"{name}: expected an array [chains, samples >= 4, ...], got {samples.shape}"
        )
    return samples


def potential_scale_reduction(samples: jax.Array) -> jax.Array:
    """Returns Gelman-Rubin's R-hat per variable, ``sqrt((B/W + n - 1) / n)``.

    Args:
      samples: ``[chains >= 2, n, ...]`` draws.

    Returns:
      ``[...]`` R-hat; close to 1 when the chains agree.

    >>> x = jax.random.normal(jax.random.key(0), (4, 100))
    >>> bool(abs(potential_scale_reduction(x) - 1.0) < 0.05)
    True
    """
    samples = _check(samples, "samples")
    if samples.shape[0] < 2:
        raise ValueError(f"samples: R-hat needs >= 2 chains, got shape {samples.shape}")
    return _rhat(samples)


@jax.jit
def _rhat(samples):
    n = samples.shape[1]
    means = jnp.mean(samples, axis=1)
    within = jnp.mean(jnp.var(samples, axis=1, ddof=1), axis=0)
    between = n * jnp.var(means, axis=0, ddof=1)
    return jnp.sqrt((between / within + n - 1.0) / n)


def effective_sample_size(samples: jax.Array) -> jax.Array:
    """Returns the multi-chain effective sample size per variable (Geyer's monotone sequence).

    Autocovariances by FFT per chain, combined with the between-chain variance (Stan's
    estimator, Gelman et al. BDA3 §11.5); the autocorrelation sum is truncated at the first
    non-positive pair sum and made monotone (Geyer 1992).

    Args:
      samples: ``[chains, n, ...]`` draws.

    Returns:
      ``[...]`` ESS over all chains together (at most about ``chains * n`` for i.i.d. draws;
      can exceed it for antithetic chains).

    >>> x = jax.random.normal(jax.random.key(0), (4, 500))
    >>> bool(1500 < effective_sample_size(x) < 2600)
    True
    """
    return _ess(_check(samples, "samples"))


@jax.jit
def _ess(samples):
    samples = samples.astype(jnp.result_type(float))
    m, n = samples.shape[:2]
    x = jnp.moveaxis(samples, 1, -1)  # [m, ..., n]
    centred = x - jnp.mean(x, axis=-1, keepdims=True)
    size = 1 << (2 * n - 1).bit_length()
    f = jnp.fft.rfft(centred, n=size, axis=-1)
    acov = jnp.fft.irfft(f * jnp.conj(f), n=size, axis=-1)[..., :n] / n  # [m, ..., n]
    mean_acov = jnp.mean(acov, axis=0)  # [..., n]
    var0 = mean_acov[..., 0] * n / (n - 1.0)
    chain_means = jnp.mean(x, axis=-1)  # [m, ...]
    var_plus = var0 * (n - 1.0) / n
    if m > 1:
        var_plus = var_plus + jnp.var(chain_means, axis=0, ddof=1)
    rho = 1.0 - (var0[..., None] - mean_acov) / var_plus[..., None]  # [..., n], rho[0] = 1
    rho = rho.at[..., 0].set(1.0)
    n_even = n - n % 2
    pairs = rho[..., 0:n_even:2] + rho[..., 1:n_even:2]  # [..., n/2]
    positive = jnp.cumprod((pairs > 0).astype(pairs.dtype), axis=-1)
    # Geyer's initial monotone sequence: running minimum over the positive prefix.
    monotone = jax.lax.cummin(jnp.where(positive > 0, pairs, jnp.inf), axis=pairs.ndim - 1)
    monotone = jnp.where(positive > 0, monotone, 0.0)
    tau = -1.0 + 2.0 * jnp.sum(monotone, axis=-1)
    tau = jnp.maximum(tau, 1.0 / jnp.log10(m * n))
    degenerate = ~(var0 > 0)
    return jnp.where(degenerate, 0.0, m * n / tau)
