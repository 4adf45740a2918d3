"""Baselines for transductive node classification that the convex programs are compared with.

:func:`label_propagation` is label spreading (Zhou, Bousquet, Lal, Weston & Schölkopf 2004,
"Learning with local and global consistency"): ``F <- alpha S F + (1 - alpha) Y`` with
``S = D^-1/2 A D^-1/2``, from ``F = Y``, over a sparse edge list (gathers and ``segment_sum``s;
nothing ``n x n`` is formed).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from hexad._base import check_int, check_unit, is_traced
from hexad.cvxclust._graphs import check_edges

__all__ = ["label_propagation"]


def label_propagation(
    edges, labels, labeled, num_classes: int, *, alpha: float = 0.99, num_iters: int = 200
) -> jax.Array:
    r"""Returns label spreading's ``[n]`` int32 predictions :math:`\operatorname{argmax}_c F_{vc}`.

    ``num_iters`` sweeps of

    .. math::

       F \leftarrow \alpha D^{-1/2} A D^{-1/2} F + (1 - \alpha) Y

    from :math:`F = Y`, where :math:`Y` holds the one-hot labels of the labelled nodes (zero
    rows elsewhere), :math:`A` the edges in both directions and :math:`D` its degrees. A node
    that no label reaches (:math:`F_v = 0`) gets class 0.

    Args:
      edges: ``[E, 2]`` int undirected edges without self loops; each row counts once in each
        direction (a list holding both ``(i, j)`` and ``(j, i)`` weighs that edge twice).
      labels: ``[n]`` int labels in ``[0, num_classes)`` (values on unlabelled nodes ignored);
        a concrete labelled value outside it raises a ValueError naming ``labels`` (under a
        trace it would be a zero row of ``Y``: no label).
      labeled: ``[n]`` bool, which labels are observed.
      num_classes: (static) number of classes.
      alpha: (static) propagation weight in ``[0, 1)``.
      num_iters: (static) number of sweeps, ``>= 1``.

    >>> import numpy as np
    >>> edges = np.array([[0, 1], [1, 2], [3, 4]])
    >>> labeled = np.array([True, False, False, False, True])
    >>> label_propagation(edges, np.array([0, 0, 0, 0, 1]), labeled, 2).tolist()
    [0, 0, 0, 1, 1]
    """
    raw = (labels, labeled)  # before jnp.asarray, which traces a NumPy input under a jit
    labels, labeled = jnp.asarray(labels), jnp.asarray(labeled)
    n = labels.shape[0] if labels.ndim == 1 else -1
    if labels.ndim != 1 or labeled.shape != (n,) or labeled.dtype != jnp.bool_:
        raise ValueError(
            f"labels, labeled: expected [n] ints and [n] bools, got {labels.dtype} "
            f"{labels.shape} and {labeled.dtype} {labeled.shape}"
        )
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        raise TypeError(f"labels: expected integer class ids, got dtype {labels.dtype}")
    num_classes = check_int("num_classes", num_classes)
    alpha = check_unit("alpha", alpha, lo_open=False)
    num_iters = check_int("num_iters", num_iters)
    if not any(is_traced(v) for v in raw):
        # NumPy on the values: they may be concrete arrays closed over by a traced function.
        got = np.asarray(raw[0])[np.asarray(raw[1])]
        if got.size and (got.min() < 0 or got.max() >= num_classes):
            raise ValueError(
                f"labels: expected labelled values in [0, num_classes = {num_classes}), got "
                f"[{got.min()}, {got.max()}]"
            )
    if not is_traced(edges):
        edges, _ = check_edges(edges, n)
    return _spread(jnp.asarray(edges), labels, labeled, num_classes, alpha, num_iters)


@functools.partial(jax.jit, static_argnums=(3, 4, 5))
def _spread(edges, labels, labeled, num_classes, alpha, num_iters):
    n = labels.shape[0]
    src = jnp.concatenate([edges[:, 0], edges[:, 1]])
    dst = jnp.concatenate([edges[:, 1], edges[:, 0]])
    ftype = jnp.result_type(float)
    deg = jax.ops.segment_sum(jnp.ones(src.shape[0], ftype), src, n)
    dinv = jnp.where(deg > 0, 1.0 / jnp.sqrt(jnp.maximum(deg, 1.0)), 0.0)
    w = dinv[src] * dinv[dst]
    y0 = jax.nn.one_hot(labels, num_classes, dtype=ftype) * labeled[:, None]

    def sweep(_, f):
        return alpha * jax.ops.segment_sum(w[:, None] * f[src], dst, n) + (1 - alpha) * y0

    f = jax.lax.fori_loop(0, num_iters, sweep, y0)
    return jnp.argmax(f, axis=1).astype(jnp.int32)
