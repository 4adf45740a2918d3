"""Evaluation between sets of clouds: Sinkhorn W2 on M, 1-NN two-sample accuracy, MMD."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hexad.geometry import Manifold
from hexad.ot import sinkhorn_w2

__all__ = ["cloud_distances", "mmd", "one_nn_accuracy", "set_w2"]

Array = jax.Array


def cloud_distances(
    manifold: Manifold,
    xs: Array,
    a: Array,
    ys: Array,
    b: Array,
    *,
    epsilon: float = 0.01,
    max_iterations: int = 300,
) -> Array:
    """Returns ``[N, M]`` Sinkhorn-divergence ``W_2`` on ``M`` between every pair of clouds.

    Args:
      manifold: the manifold (static).
      xs: ``[N, n, d]`` clouds with masses ``a [N, n]`` (zeros: padding).
      ys: ``[M, m, d]`` clouds with masses ``b [M, m]``.
      epsilon: entropic regularisation (static).
      max_iterations: Sinkhorn bound (static).

    >>> from hexad.geometry import Torus
    >>> x = Torus(2).random_uniform(jax.random.key(0), (2, 8))
    >>> cloud_distances(Torus(2), x, jnp.ones((2, 8)), x, jnp.ones((2, 8))).shape
    (2, 2)
    """

    def one(x, wa, y, wb):
        return sinkhorn_w2(manifold, x, y, wa, wb, epsilon=epsilon, max_iterations=max_iterations)

    row = jax.vmap(one, in_axes=(None, None, 0, 0))
    return jax.vmap(row, in_axes=(0, 0, None, None))(xs, a, ys, b)


def set_w2(d_xy: Array) -> Array:
    """Returns the symmetric nearest-cloud distance between two sets of clouds.

    ``(mean_i min_j D_ij + mean_j min_i D_ij) / 2`` for ``D = d_xy [N, M]`` (generated vs
    held-out): the first term penalises off-distribution clouds, the second missed modes.

    >>> float(set_w2(jnp.array([[0.0, 2.0], [2.0, 0.0]])))
    0.0
    """
    return 0.5 * (jnp.mean(jnp.min(d_xy, axis=1)) + jnp.mean(jnp.min(d_xy, axis=0)))


def one_nn_accuracy(d_xx: Array, d_yy: Array, d_xy: Array) -> Array:
    """Returns the leave-one-out 1-NN two-sample accuracy (0.5 is ideal, 1.0 separable).

    Every cloud of ``X ∪ Y`` is classified by its nearest other cloud (Lopez-Paz & Oquab,
    arXiv:1610.06545); ``d_xx [N, N]``, ``d_yy [M, M]``, ``d_xy [N, M]`` are the distances.

    >>> d = jnp.array([[0.0, 1.0], [1.0, 0.0]])
    >>> float(one_nn_accuracy(d, d, jnp.full((2, 2), 5.0)))
    1.0
    """
    n, m = d_xx.shape[0], d_yy.shape[0]
    big = jnp.inf
    dxx = d_xx + jnp.where(jnp.eye(n, dtype=bool), big, 0.0)
    dyy = d_yy + jnp.where(jnp.eye(m, dtype=bool), big, 0.0)
    x_ok = jnp.min(dxx, axis=1) < jnp.min(d_xy, axis=1)
    y_ok = jnp.min(dyy, axis=1) < jnp.min(d_xy, axis=0)
    acc = (jnp.sum(x_ok) + jnp.sum(y_ok)) / (n + m)
    # A NaN distance compares False (a silent misclassification): report NaN instead.
    nan = jnp.isnan(jnp.sum(d_xx) + jnp.sum(d_yy) + jnp.sum(d_xy))
    return jnp.where(nan, jnp.nan, acc)


def mmd(d_xx: Array, d_yy: Array, d_xy: Array, bandwidth: Array | float | None = None) -> Array:
    """Returns the (biased) squared MMD with the kernel ``exp(-D^2 / (2 h^2))`` on cloud distances.

    ``h`` defaults to the median of ``d_xy`` (median heuristic).

    >>> d = jnp.zeros((2, 2))
    >>> float(mmd(d, d, d, 1.0))
    0.0
    """
    h = jnp.median(d_xy) if bandwidth is None else bandwidth
    h = jnp.maximum(h, 1e-12)

    def k(d):
        return jnp.exp(-jnp.square(d) / (2.0 * h * h))

    return jnp.mean(k(d_xx)) + jnp.mean(k(d_yy)) - 2.0 * jnp.mean(k(d_xy))
