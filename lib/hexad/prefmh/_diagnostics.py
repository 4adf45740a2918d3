"""Chain diagnostics: mixing (ESS, R-hat) and distance of the draws to a known target.

:func:`effective_sample_size` and :func:`potential_scale_reduction` are own implementations
(BlackJAX is only a test dependency) of the estimators used by Stan and
``blackjax.diagnostics``; the tests check agreement with BlackJAX's. :func:`sliced_w1` (to exact
reference draws) and :func:`grid_tv` (to exact cell probabilities) measure how far the draws
are from the target; run them on i.i.d. draws of the same size for the Monte-Carlo floor.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from hexad._base import check_finite, check_int, check_positive, is_traced

__all__ = ["effective_sample_size", "grid_tv", "potential_scale_reduction", "sliced_w1"]


def _check(samples: jax.Array, name: str) -> jax.Array:
    check_finite(name, samples, "draws")
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
      can exceed it for antithetic chains). Concrete draws must be finite (a ValueError
      names ``samples``); under a trace a NaN draw gives a NaN ESS.

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
    # var0 <= 0 (constant draws) is an ESS of 0; a NaN variance stays NaN, not a plausible 0.
    ess = jnp.where(var0 <= 0, 0.0, m * n / tau)
    return jnp.where(jnp.isnan(var0), jnp.nan, ess)


def sliced_w1(a: jax.Array, b: jax.Array, directions: jax.Array) -> jax.Array:
    """Returns the sliced Wasserstein-1 distance between two equal-size empirical measures.

    ``mean_theta W1(theta . a, theta . b)`` over the given directions; in one dimension W1 of
    two ``n``-point measures is the mean absolute difference of the sorted values.

    Args:
      a: ``[n, d]`` draws.
      b: ``[n, d]`` draws (e.g. exact i.i.d. draws of the target).
      directions: ``[m, d]`` projection directions (unit vectors, e.g. normalised Gaussians).

    Returns:
      ``[]`` the distance (0 for equal multisets of points).

    >>> a = jnp.array([[0.0, 0.0], [1.0, 0.0]])
    >>> float(sliced_w1(a, a + jnp.array([[2.0, 0.0]]), jnp.eye(2)))  # (2 + 0) / 2
    1.0
    """
    for name, v in (("a", a), ("b", b), ("directions", directions)):
        check_finite(name, v)
    a, b, directions = jnp.asarray(a), jnp.asarray(b), jnp.asarray(directions)
    if a.ndim != 2 or a.shape != b.shape:
        raise ValueError(f"a, b: expected equal shapes [n, d], got {a.shape} and {b.shape}")
    if directions.ndim != 2 or directions.shape[1] != a.shape[1]:
        raise ValueError(f"directions: expected [m, {a.shape[1]}], got shape {directions.shape}")
    return _sliced_w1(a, b, directions)


@jax.jit
def _sliced_w1(a, b, directions):
    pa = jnp.sort(a @ directions.T, axis=0)
    pb = jnp.sort(b @ directions.T, axis=0)
    return jnp.mean(jnp.abs(pa - pb))


def grid_tv(samples: jax.Array, probs: jax.Array, half_width: float) -> jax.Array:
    """Returns the total variation between the draws' and the target's masses on a grid.

    The grid splits ``[-half_width, half_width]^d`` into ``probs.shape`` equal cells (cell
    ``i`` holds ``[e_i, e_{i+1})``, the last one also its upper edge, as in
    ``numpy.histogramdd``); everything outside is one more cell, of mass ``1 - sum(probs)``
    for the target. Returns ``(sum_cells |h - p| + |h_out - p_out|) / 2`` with ``h`` the
    fractions of the draws.

    Args:
      samples: ``[N, d]`` draws.
      probs: ``[bins_1, ..., bins_d]`` the target's exact mass of each cell (static shape).
      half_width: (static) half the side of the grid, ``> 0``.

    >>> probs = jnp.array([[0.5, 0.0], [0.0, 0.5]])
    >>> float(grid_tv(jnp.array([[-0.5, -0.5], [-0.5, -0.5]]), probs, 1.0))
    0.5
    """
    check_finite("samples", samples, "draws")
    check_finite("probs", probs, "cell masses")
    if not is_traced(probs) and np.any(np.asarray(probs) < 0):
        raise ValueError("probs: expected non-negative cell masses, got a negative one")
    samples, probs = jnp.asarray(samples), jnp.asarray(probs)
    if samples.ndim != 2 or samples.shape[1] != probs.ndim or samples.shape[0] < 1:
        raise ValueError(
            f"samples: expected [N >= 1, {probs.ndim}] (one column per axis of probs), "
            f"got shape {samples.shape}"
        )
    for i, bins in enumerate(probs.shape):
        check_int(f"probs.shape[{i}]", bins)
    return _grid_tv(samples, probs, check_positive("half_width", half_width))


@functools.partial(jax.jit, static_argnums=2)
def _grid_tv(samples, probs, half_width):
    index = jnp.zeros(samples.shape[0], jnp.int32)
    inside = jnp.ones(samples.shape[0], bool)
    # Edges in a float dtype: integer samples would truncate them (and land in wrong cells).
    etype = jnp.result_type(samples.dtype, float)
    for axis, bins in enumerate(probs.shape):
        x = samples[:, axis].astype(etype)
        edges = jnp.linspace(-half_width, half_width, bins + 1, dtype=etype)
        cell = jnp.searchsorted(edges, x, side="right") - 1
        cell = jnp.where(x == edges[-1], bins - 1, cell)
        inside = inside & (cell >= 0) & (cell < bins)
        index = index * bins + jnp.clip(cell, 0, bins - 1)
    ftype = jnp.result_type(float)
    counts = jax.ops.segment_sum(inside.astype(ftype), index, probs.size)
    h = counts.reshape(probs.shape) / samples.shape[0]
    outside = (1.0 - jnp.sum(h)) - (1.0 - jnp.sum(probs))
    return 0.5 * (jnp.sum(jnp.abs(h - probs)) + jnp.abs(outside))
