"""Chain diagnostics: mixing (ESS, R-hat) and distance of the draws to a known target.

:func:`effective_sample_size` and :func:`potential_scale_reduction` are BlackJAX's
rank-normalised split-chain estimators (``blackjax.diagnostics.ess_bulk`` and
``blackjax.diagnostics.rhat``; Vehtari et al. 2021, arXiv:1903.08008) behind hexad's input
checks. :func:`sliced_w1` (to exact reference draws) is ott-jax's sliced Wasserstein distance
(``ott.tools.sliced.sliced_wasserstein``) with the ground cost ``|x - y|``, and :func:`grid_tv`
(to exact cell probabilities) the total variation on a grid; both measure how far the draws are
from the target: run them on i.i.d. draws of the same size for the Monte-Carlo floor.

BlackJAX (not in the core install; ``hexad[prefmh]``) and ``ott.tools`` (seconds to import) are
imported when a function first needs them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from hexad._base import check_finite, check_int, check_positive, is_traced
from hexad.data import require

__all__ = ["effective_sample_size", "grid_tv", "potential_scale_reduction", "sliced_w1"]


def _check(samples: jax.Array, name: str) -> jax.Array:
    check_finite(name, samples, "draws")
    samples = jnp.asarray(samples)
    if samples.ndim < 2 or samples.shape[1] < 4:
        raise ValueError(
            f"{name}: expected an array [chains, samples >= 4, ...], got {samples.shape}"
        )
    return samples


def _blackjax(name: str, samples: jax.Array) -> jax.Array:
    """``blackjax.diagnostics.<name>(samples)`` over chains (axis 0) and draws (axis 1)."""
    fn = getattr(require("blackjax.diagnostics", "prefmh"), name)
    # BlackJAX broadcasts per-variable statistics against the draws by rank promotion.
    with jax.numpy_rank_promotion("allow"):
        return fn(samples)


def _per_variable(value: jax.Array, samples: jax.Array, dtype) -> jax.Array:
    """BlackJAX's ``value`` as ``[...]`` (``samples.shape[2:]``) in ``dtype``, NaN for every
    variable with a non-finite draw."""
    # BlackJAX squeezes its result, size-1 variable axes included; the size is unchanged.
    value = jnp.reshape(value, samples.shape[2:]).astype(dtype)
    # BlackJAX's own NaN guard skips the last draw of an odd-length chain (its split drops it)
    # and lets an infinite draw through to a number; concrete draws never get here with either.
    finite = jnp.all(jnp.isfinite(samples), axis=(0, 1))
    return jnp.where(finite, value, jnp.nan)


def potential_scale_reduction(samples: jax.Array) -> jax.Array:
    """Returns the rank-normalised split R-hat per variable (``blackjax.diagnostics.rhat``).

    Each chain is split into halves (the last draw of an odd-length chain is left out); the
    draws of all halves are rank-normalised together (average ranks for ties, then the normal
    quantile of ``(rank - 3/8) / (N + 1/4)``), and Gelman-Rubin's ``sqrt((B/W + n - 1) / n)`` of
    the halves is computed on them and on the same draws folded about their median; the larger
    of the two is returned (Vehtari et al. 2021, arXiv:1903.08008; ArviZ's default). Splitting
    catches a trend within chains and folding a difference in spread, which the classic R-hat of
    the raw unsplit draws (``blackjax.diagnostics.potential_scale_reduction``, what this function
    returned before) misses. Being rank-based, it is unchanged by any increasing transformation of
    a variable, and its gradient is zero.

    Args:
      samples: ``[chains >= 2, n >= 4, ...]`` draws.

    Returns:
      ``[...]`` R-hat, in the draws' floating dtype; close to 1 when the chains agree (Vehtari
      et al. suggest < 1.01), NaN for a constant variable. Concrete draws must be finite (a
      ValueError names ``samples``); under a trace a variable with a non-finite draw is NaN.

    >>> x = jax.random.normal(jax.random.key(0), (4, 100))
    >>> bool(abs(potential_scale_reduction(x) - 1.0) < 0.05)
    True
    >>> bool(potential_scale_reduction(x * jnp.array([[1.0], [1.0], [1.0], [3.0]])) > 1.05)
    True
    """
    samples = _check(samples, "samples")
    if samples.shape[0] < 2:
        raise ValueError(f"samples: R-hat needs >= 2 chains, got shape {samples.shape}")
    return _rhat(samples)


@jax.jit
def _rhat(samples):
    value = _blackjax("rhat", samples)
    return _per_variable(value, samples, jnp.result_type(samples.dtype, float))


def effective_sample_size(samples: jax.Array) -> jax.Array:
    """Returns the bulk effective sample size per variable (``blackjax.diagnostics.ess_bulk``).

    Each chain is split into halves (the last draw of an odd-length chain is left out), the draws
    are rank-normalised over all halves (as in :func:`potential_scale_reduction`), and Stan's
    multi-chain estimator is applied to them: autocovariances by FFT, combined with the
    between-chain variance, the autocorrelation sum truncated by Geyer's initial monotone
    sequence (Vehtari et al. 2021, arXiv:1903.08008; Gelman et al. BDA3 §11.5). Before, this
    function applied that estimator to the raw unsplit draws
    (``blackjax.diagnostics.effective_sample_size``). The two agree for mixed, roughly normal
    draws; the bulk ESS is unchanged by increasing transformations, stays finite for heavy tails,
    and drops when the chains have not mixed or drift. For the Monte-Carlo standard error of the
    mean of a far-from-normal variable, ``blackjax.diagnostics.effective_sample_size`` of the
    variable itself is the one to use. Its gradient is zero.

    Args:
      samples: ``[chains, n >= 4, ...]`` draws.

    Returns:
      ``[...]`` ESS over all chains together, in the default float dtype (about ``chains * n``
      for i.i.d. draws; it can exceed it for antithetic chains), 0 for a constant variable.
      Concrete draws must be finite (a ValueError names ``samples``); under a trace a variable
      with a non-finite draw is NaN.

    >>> x = jax.random.normal(jax.random.key(0), (4, 500))
    >>> bool(1500 < effective_sample_size(x) < 2600)
    True
    >>> bool(effective_sample_size(jnp.exp(x)) == effective_sample_size(x))  # rank-based
    True
    """
    return _ess(_check(samples, "samples"))


@jax.jit
def _ess(samples):
    value = _blackjax("ess_bulk", samples)
    return _per_variable(value, samples, jnp.result_type(float))


def _project(x: jax.Array, directions: jax.Array) -> jax.Array:
    return x @ directions.T


def sliced_w1(a: jax.Array, b: jax.Array, directions: jax.Array) -> jax.Array:
    """Returns the sliced Wasserstein-1 distance between two equal-size empirical measures.

    ``mean_theta W1(theta . a, theta . b)`` over the given directions; in one dimension W1 of
    two ``n``-point measures is the mean absolute difference of the sorted values. Computed by
    ott-jax: ``ott.tools.sliced.sliced_wasserstein`` with the projections onto ``directions``
    and the ground cost ``costs.PNormP(1)`` (``|x - y|``; ott's default would be the squared
    distance, a sliced W2 squared).

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
    from ott.geometry import costs
    from ott.tools import sliced

    distance, _ = sliced.sliced_wasserstein(
        a, b, cost_fn=costs.PNormP(1), proj_fn=_project, directions=directions
    )
    return distance


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
