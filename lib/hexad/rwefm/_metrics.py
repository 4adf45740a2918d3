"""Evaluation between sets of clouds, as the RWEFM reference scores generators.

Cloud distance matrices (Chamfer for ``d_M^2``, an entropic EMD for ``d_M`` run to
convergence, the Sinkhorn-divergence W2) and the statistics on them: 1-NN two-sample accuracy,
the minimum-matching distance, a kernel MMD with a bandwidth fixed by the caller, and the
symmetric nearest-cloud distance.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hexad.geometry import Manifold
from hexad.ot import chamfer, entropic_emd, sinkhorn_w2

__all__ = [
    "chamfer_distances",
    "cloud_distances",
    "emd_distances",
    "median_bandwidth",
    "min_matching_distance",
    "mmd",
    "one_nn_accuracy",
    "set_w2",
]

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
    >>> w = jnp.ones((2, 8))
    >>> jax.jit(cloud_distances, static_argnums=0)(Torus(2), x, w, x, w).shape
    (2, 2)
    """

    def one(x, wa, y, wb):
        return sinkhorn_w2(manifold, x, y, wa, wb, epsilon=epsilon, max_iterations=max_iterations)

    row = jax.vmap(one, in_axes=(None, None, 0, 0))
    return jax.vmap(row, in_axes=(0, 0, None, None))(xs, a, ys, b)


def _pairwise(one, xs, a, ys, b):
    """``[N, M]`` of ``one(x_i, a_i, y_j, b_j)``: rows one at a time (``lax.map``, memory
    ``O(M)`` cost matrices), each vmapped over the ``ys``."""

    def row(x, wa):
        return jax.vmap(lambda y, wb: one(x, wa, y, wb))(ys, b)

    return jax.lax.map(lambda xa: row(*xa), (xs, a))


def chamfer_distances(manifold: Manifold, xs: Array, a: Array, ys: Array, b: Array) -> Array:
    """Returns ``[N, M]`` Chamfer costs (:func:`hexad.ot.chamfer`) between every pair of clouds.

    Args:
      manifold: the manifold (static).
      xs: ``[N, n, d]`` clouds with masses ``a [N, n]``; ``ys``: ``[M, m, d]``, ``b [M, m]``.

    >>> from hexad.geometry import Torus
    >>> x = Torus(2).random_uniform(jax.random.key(0), (2, 8))
    >>> chamfer_distances(Torus(2), x, jnp.ones((2, 8)), x, jnp.ones((2, 8))).shape
    (2, 2)
    """

    return _pairwise(lambda x, wa, y, wb: chamfer(manifold, x, y, wa, wb), xs, a, ys, b)


def emd_distances(
    manifold: Manifold,
    xs: Array,
    a: Array,
    ys: Array,
    b: Array,
    *,
    epsilon: float = 0.05,
    max_iterations: int = 5000,
    threshold: float = 1e-3,
) -> tuple[Array, Array]:
    """Returns ``([N, M] entropic EMDs, [N, M] converged)`` (:func:`hexad.ot.entropic_emd`).

    Ground cost :math:`d_M`, ``epsilon`` relative to each pair's largest cost (the reference's
    0.05), Sinkhorn to ``threshold`` or ``max_iterations``; rows run one at a time
    (``lax.map``), each vmapped over ``ys``.

    >>> from hexad.geometry import Sphere
    >>> x = Sphere(3).random_uniform(jax.random.key(0), (2, 8))
    >>> w = jnp.ones((2, 8))
    >>> d, ok = jax.jit(emd_distances, static_argnums=0)(Sphere(3), x, w, x, w)
    >>> d.shape, bool(ok.all())
    ((2, 2), True)
    """

    def one(x, wa, y, wb):
        return entropic_emd(
            manifold,
            x,
            y,
            wa,
            wb,
            epsilon=epsilon,
            max_iterations=max_iterations,
            threshold=threshold,
        )

    return _pairwise(one, xs, a, ys, b)


def min_matching_distance(d_xy: Array) -> Array:
    r"""Returns :math:`\operatorname{mean}_j \min_i D_{ij}` for :math:`D` = ``d_xy [N generated, M
    real]``: the mean distance from a real cloud to its nearest generated cloud (the reference's
    "MMD").

    >>> float(min_matching_distance(jnp.array([[0.0, 3.0], [2.0, 1.0]])))
    0.5
    """
    return jnp.mean(jnp.min(d_xy, axis=0))


def median_bandwidth(d_yy: Array) -> Array:
    """Returns the median of the off-diagonal entries of ``d_yy [M, M]`` (real vs real): one
    kernel bandwidth for every model scored against the same real clouds.

    >>> float(median_bandwidth(jnp.array([[0.0, 1.0, 2.0], [1.0, 0.0, 3.0], [2.0, 3.0, 0.0]])))
    2.0
    """
    m = d_yy.shape[0]
    rows, cols = np.nonzero(~np.eye(m, dtype=bool))  # static indices: jittable, any backend
    return jnp.median(d_yy[rows, cols])


def set_w2(d_xy: Array) -> Array:
    """Returns the symmetric nearest-cloud distance between two sets of clouds.

    ``(mean_i min_j D_ij + mean_j min_i D_ij) / 2`` for ``D = d_xy [N, M]`` (generated vs
    held-out): the first term penalises off-distribution clouds, the second missed modes.

    >>> float(set_w2(jnp.array([[0.0, 2.0], [2.0, 0.0]])))
    0.0
    """
    return 0.5 * (jnp.mean(jnp.min(d_xy, axis=1)) + jnp.mean(jnp.min(d_xy, axis=0)))


def one_nn_accuracies(d_xx: Array, d_yy: Array, d_xy: Array) -> Array:
    """Returns ``[2]``: the leave-one-out 1-NN accuracy on ``X``'s clouds and on ``Y``'s.

    Each cloud of ``X ∪ Y`` is classified by its nearest other cloud; the first entry is the
    share of ``X``'s clouds whose nearest neighbour is in ``X``, the second the same for ``Y``.
    Scoring each half against 0.5, ``(|acc_X - 0.5| + |acc_Y - 0.5|) / 2``, is the RWEFM
    reference's 1-NNA (it cannot hide a generator that collapses, which the pooled accuracy
    of :func:`one_nn_accuracy` can when the two halves err in opposite directions).

    >>> d = jnp.array([[0.0, 1.0], [1.0, 0.0]])
    >>> one_nn_accuracies(d, d, jnp.full((2, 2), 5.0)).tolist()
    [1.0, 1.0]
    """
    n, m = d_xx.shape[0], d_yy.shape[0]
    big = jnp.inf
    dxx = d_xx + jnp.where(jnp.eye(n, dtype=bool), big, 0.0)
    dyy = d_yy + jnp.where(jnp.eye(m, dtype=bool), big, 0.0)
    x_ok = jnp.min(dxx, axis=1) < jnp.min(d_xy, axis=1)
    y_ok = jnp.min(dyy, axis=1) < jnp.min(d_xy, axis=0)
    acc = jnp.stack([jnp.mean(x_ok), jnp.mean(y_ok)])
    # A NaN distance compares False (a silent misclassification): report NaN instead.
    nan = jnp.isnan(jnp.sum(d_xx) + jnp.sum(d_yy) + jnp.sum(d_xy))
    return jnp.where(nan, jnp.nan, acc)


def one_nn_accuracy(d_xx: Array, d_yy: Array, d_xy: Array) -> Array:
    """Returns the leave-one-out 1-NN two-sample accuracy (0.5 is ideal, 1.0 separable).

    Every cloud of ``X ∪ Y`` is classified by its nearest other cloud (Lopez-Paz & Oquab,
    arXiv:1610.06545); ``d_xx [N, N]``, ``d_yy [M, M]``, ``d_xy [N, M]`` are the distances.
    :func:`one_nn_accuracies` gives the two halves' accuracies apart.

    >>> d = jnp.array([[0.0, 1.0], [1.0, 0.0]])
    >>> float(one_nn_accuracy(d, d, jnp.full((2, 2), 5.0)))
    1.0
    """
    n, m = d_xx.shape[0], d_yy.shape[0]
    acc = one_nn_accuracies(d_xx, d_yy, d_xy)
    return (n * acc[0] + m * acc[1]) / (n + m)


def mmd(d_xx: Array, d_yy: Array, d_xy: Array, bandwidth: Array | float) -> Array:
    r"""Returns the (biased) squared kernel MMD with the kernel :math:`\exp(-D^2 / (2 h^2))` on
    cloud distances :math:`D`.

    :math:`h` = ``bandwidth`` is given, not estimated from the scored model: compare models with
    one :math:`h` (e.g. :func:`median_bandwidth` of the real clouds' distances).

    >>> d = jnp.zeros((2, 2))
    >>> float(mmd(d, d, d, 1.0))
    0.0
    """
    h = jnp.maximum(bandwidth, 1e-12)

    def k(d):
        return jnp.exp(-jnp.square(d) / (2.0 * h * h))

    return jnp.mean(k(d_xx)) + jnp.mean(k(d_yy)) - 2.0 * jnp.mean(k(d_xy))
