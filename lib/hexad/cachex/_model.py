"""The CacheX durability model: lognormal body, Gumbel tail of the slowest writer, C*_p(n).

CacheX (NeurIPS 2026) models rank-local checkpoint completion times as lognormal,
``log T_i ~ N(mu, sigma^2)``; a checkpoint is PFS-durable when the slowest of its ``n``
writers finishes, so its completion time is the maximum ``M_n = max_i T_i``, whose log is in
the Gumbel domain of attraction (Fisher-Tippett-Gnedenko; normal maxima):
``log M_n ~ Gumbel(mu + sigma * b_n, sigma * a_n)`` with ``b_n = Phi^-1(1 - 1/n)`` and
``a_n = 1 / (n * phi(b_n))``. The exact ``p``-quantile is
``exp(mu + sigma * Phi^-1(p^(1/n)))``.

Contention (our parametrisation, matching :class:`hexad.cachex.PFSModel`): with ``n``
concurrent writers and contention ``c`` each rank's median scales by ``1 + c (n - 1)``. The
threshold ``C*_p(n)`` is the contention beyond which the ``p``-quantile of the PFS's slowest
writer exceeds the stage-and-replicate time ``t_stage``, i.e. the PFS stops being the fastest
path to durable persistence:
``C*_p(n) = (t_stage / exp(mu + sigma * Phi^-1(p^(1/n))) - 1) / (n - 1)``, clipped at 0.

All functions are pure ``jnp`` and jittable; ``n`` and iteration counts are static.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp, ndtri

from hexad._base import is_traced

__all__ = [
    "DurabilityModel",
    "choose_path",
    "critical_contention",
    "fit_durability_model",
    "fit_gumbel",
    "fit_lognormal",
    "gumbel_of_max_lognormal",
    "pfs_time_quantile",
]


class DurabilityModel(NamedTuple):
    """A fitted durability model.

    Attributes:
      mu: ``[]`` mean of log per-rank completion time, contention removed.
      sigma: ``[]`` std of log per-rank completion time.
      gumbel_loc: ``[]`` Gumbel location of the log slowest-writer time (as measured).
      gumbel_scale: ``[]`` Gumbel scale of the log slowest-writer time (as measured).
    """

    mu: jax.Array
    sigma: jax.Array
    gumbel_loc: jax.Array
    gumbel_scale: jax.Array


def fit_lognormal(times: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Returns the lognormal MLE ``(mu, sigma)`` of positive ``times`` ``[m]``.

    >>> mu, sigma = fit_lognormal(jnp.exp(jnp.array([0.0, 1.0, 2.0])))
    >>> round(float(mu), 3)
    1.0
    """
    logt = jnp.log(times)
    mu = jnp.mean(logt)
    sigma = jnp.sqrt(jnp.mean(jnp.square(logt - mu)))
    return mu, sigma


def fit_gumbel(x: jax.Array, n_iters: int = 200) -> tuple[jax.Array, jax.Array]:
    """Returns the Gumbel (max) MLE ``(loc, scale)`` of samples ``x`` ``[m]``.

    The scale solves ``beta = mean(x) - sum(x w) / sum(w)``, ``w = exp(-x / beta)`` (the
    score equation), by fixed-point iteration from the moment estimate
    ``beta0 = std(x) sqrt(6) / pi``; then ``loc = -beta log(mean(exp(-x / beta)))``.

    Args:
      x: ``[m]`` samples.
      n_iters: fixed-point iterations (static).

    >>> loc, scale = fit_gumbel(jnp.array([0.1, 0.5, 0.9, 1.6, 2.5]))
    >>> bool(scale > 0)
    True
    """
    x = jnp.asarray(x)
    xbar = jnp.mean(x)
    beta0 = jnp.std(x) * jnp.sqrt(6.0) / jnp.pi
    xc = x - xbar

    def body(_, beta):
        w = jax.nn.softmax(-xc / beta)
        return jnp.maximum(-jnp.sum(xc * w), 1e-12 * (1.0 + jnp.abs(beta0)))

    beta = jax.lax.fori_loop(0, n_iters, body, beta0)
    loc = xbar - beta * (logsumexp(-xc / beta) - jnp.log(x.shape[0]))
    return loc, beta


def gumbel_of_max_lognormal(mu: jax.Array, sigma: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
    r"""Returns the Gumbel ``(loc, scale)`` approximating ``log max`` of ``n`` lognormals.

    :math:`\text{loc} = \mu + \sigma b_n`, :math:`\text{scale} = \sigma a_n`, with the normal
    maxima's normalising constants :math:`b_n = \Phi^{-1}(1 - 1/n)` and
    :math:`a_n = 1 / (n\, \varphi(b_n))`.

    Args:
      mu, sigma: lognormal parameters.
      n: number of writers (static), >= 2.

    >>> loc, scale = gumbel_of_max_lognormal(0.0, 1.0, 64)
    >>> round(float(loc), 2)
    2.15
    """
    if n < 2:
        raise ValueError(f"n: expected >= 2 writers for a maximum, got {n}")
    b = ndtri(1.0 - 1.0 / n)
    phi = jnp.exp(-0.5 * b * b) / jnp.sqrt(2.0 * jnp.pi)
    a = 1.0 / (n * phi)
    return mu + sigma * b, sigma * a


def _check_p(p: float) -> None:
    if is_traced(p):
        return  # a traced p has no value to check here
    q = np.asarray(p)
    if not np.all((q > 0.0) & (q < 1.0)):
        raise ValueError(f"p: expected a probability in (0, 1), got {p!r}")


def _check_writers(n: int | np.ndarray) -> np.ndarray:
    counts = np.asarray(n)
    if counts.dtype.kind not in "iu" or counts.ndim > 1 or not np.all(counts >= 2):
        raise ValueError(
            f"n: expected an int or a [k] int array of writers >= 2 (contention needs "
            f"company), got {n!r}"
        )
    return counts


def pfs_time_quantile(
    mu: jax.Array, sigma: jax.Array, n: int, p: float, contention: jax.Array = 0.0
) -> jax.Array:
    r"""Returns the exact ``p``-quantile (seconds) of the slowest of ``n`` contended writers.

    :math:`\exp\big(\mu + \log(1 + c (n - 1)) + \sigma \Phi^{-1}(p^{1/n})\big)`, :math:`c` the
    ``contention``; ``p`` in (0, 1).

    >>> round(float(pfs_time_quantile(0.0, 0.5, 1, 0.5)), 3)
    1.0
    """
    _check_p(p)
    z = ndtri(jnp.power(p, 1.0 / n))
    return jnp.exp(mu + jnp.log1p(contention * (n - 1)) + sigma * z)


def critical_contention(
    mu: jax.Array, sigma: jax.Array, n: int | np.ndarray, p: float, t_stage: jax.Array
) -> jax.Array:
    r"""Returns :math:`C^*_p(n)`: the contention beyond which staging beats the PFS at quantile
    :math:`p`.

    .. math::

       C^*_p(n) = \max\Big(0, \frac{t_{\text{stage}} / \exp(\mu + \sigma \Phi^{-1}(p^{1/n})) - 1}
         {n - 1}\Big)

    Args:
      mu, sigma: uncontended lognormal body of per-rank PFS write time.
      n: writers (static), >= 2: an int, or an int array ``[k]`` for the curve over ``k``
        writer counts at once.
      p: quantile in (0, 1), e.g. 0.99.
      t_stage: ``[...]`` seconds of the stage-and-replicate path (its p-quantile); it
        broadcasts against ``n``.

    >>> round(float(critical_contention(0.0, 0.0, 2, 0.5, 3.0)), 4)
    2.0
    >>> [round(float(c), 3) for c in critical_contention(0.0, 0.0, np.array([2, 3, 5]), 0.5, 3.0)]
    [2.0, 1.0, 0.5]
    """
    counts = _check_writers(n)
    base = pfs_time_quantile(mu, sigma, n, p, 0.0)
    return jnp.maximum((t_stage / base - 1.0) / (counts - 1), 0.0)


def choose_path(
    mu: jax.Array, sigma: jax.Array, n: int, p: float, t_stage: jax.Array, contention: jax.Array
) -> jax.Array:
    """Returns True where stage-and-replicate is the faster durable path: ``t_stage`` below
    the PFS's ``p``-quantile at ``contention`` (:math:`c > C^*_p(n)`, or any :math:`c` when
    staging beats even the uncontended PFS, where :math:`C^*_p(n)` is clipped at 0).

    >>> bool(choose_path(0.0, 0.0, 2, 0.5, 3.0, 2.5))
    True
    >>> bool(choose_path(0.0, 0.0, 2, 0.5, 0.5, 0.0))
    True
    """
    _check_writers(n)
    return t_stage < pfs_time_quantile(mu, sigma, n, p, contention)


def fit_durability_model(times: jax.Array, contention: float = 0.0) -> DurabilityModel:
    """Fits the model to completion times ``[saves, n]`` (one row per save, one column a rank).

    The lognormal body pools all entries (and removes the contention factor
    ``log(1 + c (n - 1))`` from ``mu``); the Gumbel tail is fitted to the log of each save's
    slowest writer.

    >>> t = jnp.exp(jax.random.normal(jax.random.key(0), (50, 8)))
    >>> m = fit_durability_model(t)
    >>> bool(jnp.abs(m.mu) < 0.2)
    True
    """
    if times.ndim != 2 or times.shape[0] < 2 or times.shape[1] < 1:
        raise ValueError(
            f"times: expected shape [saves, n] with >= 2 saves (the Gumbel tail is fitted to "
            f"each save's slowest writer) and n >= 1, got {times.shape}"
        )
    n = times.shape[1]
    mu, sigma = fit_lognormal(times.reshape(-1))
    loc, scale = fit_gumbel(jnp.log(jnp.max(times, axis=1)))
    return DurabilityModel(mu - jnp.log1p(contention * (n - 1)), sigma, loc, scale)
