"""Host-side graph construction and validation (edge lists, k-NN Gaussian weights).

These run once, before a solve, on NumPy arrays: they decide the (static) number of edges, so
they cannot be traced. Everything they return is a plain array that a problem pytree holds.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial import cKDTree

__all__ = ["adjacency_from_edges", "check_adjacency", "check_edges", "knn_gaussian_weights"]


def knn_gaussian_weights(x, k: int = 10, phi: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Returns the symmetric k-NN edge list and Gaussian weights of Chi & Lange (2015).

    An undirected edge ``(i, j)`` with ``i < j`` is kept when ``j`` is among the ``k`` nearest
    neighbours of ``i`` or ``i`` among those of ``j``; its weight is
    ``exp(-phi * ||x_i - x_j||^2)`` (Chi & Lange 2015, arXiv:1304.0499, Sec. 6). The default
    ``phi`` is ``1 / median(squared k-NN distance)``, so that a typical weight is ``exp(-1)``.

    Args:
      x: ``[n, d]`` points.
      k: neighbours per point (static), ``1 <= k < n``.
      phi: Gaussian bandwidth parameter, ``> 0``; ``None`` for the median rule.

    Returns:
      ``edges`` ``[E, 2]`` int32 with ``edges[:, 0] < edges[:, 1]``, ``weights`` ``[E]``
      float32, both sorted lexicographically.

    >>> edges, w = knn_gaussian_weights(np.random.default_rng(0).normal(size=(50, 2)), k=5)
    >>> edges.shape[1], bool((w > 0).all())
    (2, True)
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"x: expected a [n, d] array, got shape {x.shape}")
    n = x.shape[0]
    if not isinstance(k, int | np.integer) or not 1 <= k < n:
        raise ValueError(f"k: expected an int in [1, {n - 1}], got {k!r}")
    if not np.isfinite(x).all():
        raise ValueError("x: expected finite values, got NaN or inf")
    dist, idx = cKDTree(x).query(x, k=k + 1)
    rows = np.repeat(np.arange(n), k)
    cols = idx[:, 1:].reshape(-1)
    d2 = dist[:, 1:].reshape(-1) ** 2
    lo, hi = np.minimum(rows, cols), np.maximum(rows, cols)
    keep = lo != hi  # duplicate points may list themselves
    key = lo[keep].astype(np.int64) * n + hi[keep]
    key, first = np.unique(key, return_index=True)
    d2 = d2[keep][first]
    if phi is None:
        med = float(np.median(d2))
        phi = 1.0 / med if med > 0 else 1.0
    if not phi > 0:
        raise ValueError(f"phi: expected a positive float, got {phi!r}")
    edges = np.stack([key // n, key % n], axis=1).astype(np.int32)
    return edges, np.exp(-phi * d2).astype(np.float32)


def check_edges(edges, n: int, weights=None) -> tuple[np.ndarray, np.ndarray | None]:
    """Validates an undirected edge list on ``n`` nodes; returns it as int32 (and weights).

    Raises ValueError for a wrong shape, ids out of ``[0, n)``, self loops, or negative /
    non-finite weights. Duplicated edges are allowed (their weights add up in the penalty).
    """
    e = np.asarray(edges)
    if e.ndim != 2 or e.shape[1] != 2 or e.shape[0] == 0:
        raise ValueError(f"edges: expected a non-empty [E, 2] int array, got shape {e.shape}")
    if not np.issubdtype(e.dtype, np.integer):
        raise TypeError(f"edges: expected integer node ids, got dtype {e.dtype}")
    if e.min() < 0 or e.max() >= n:
        raise ValueError(f"edges: node ids must lie in [0, {n}), got [{e.min()}, {e.max()}]")
    if (e[:, 0] == e[:, 1]).any():
        raise ValueError(
            f"edges: self loops are not allowed, got {int((e[:, 0] == e[:, 1]).sum())}"
        )
    w = None
    if weights is not None:
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != (e.shape[0],):
            raise ValueError(f"weights: expected shape ({e.shape[0]},), got {w.shape}")
        if not np.isfinite(w).all() or (w < 0).any():
            raise ValueError(f"weights: expected finite values >= 0, got min {np.min(w)}")
    return e.astype(np.int32), w


def adjacency_from_edges(edges, n: int) -> np.ndarray:
    """Returns the dense symmetric 0/1 adjacency ``[n, n]`` (float32, zero diagonal).

    >>> adjacency_from_edges(np.array([[0, 1]]), 3)[1, 0]
    np.float32(1.0)
    """
    e, _ = check_edges(edges, n)
    a = np.zeros((n, n), np.float32)
    a[e[:, 0], e[:, 1]] = 1.0
    a[e[:, 1], e[:, 0]] = 1.0
    return a


def check_adjacency(a, name: str = "adjacency") -> np.ndarray:
    """Validates a binary symmetric ``[n, n]`` adjacency; returns it as float32 (zero diagonal).

    Raises ValueError naming ``name`` for a non-square, asymmetric or non-binary matrix. The
    diagonal is ignored (set to 0); isolated nodes are allowed.
    """
    a = np.asarray(a)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"{name}: expected a square [n, n] matrix, got shape {a.shape}")
    if not np.isin(a, (0, 1)).all():
        bad = a[~np.isin(a, (0, 1))].reshape(-1)[0]
        raise ValueError(f"{name}: expected binary entries 0/1, got e.g. {bad!r}")
    if not (a == a.T).all():
        raise ValueError(f"{name}: expected a symmetric matrix, got an asymmetric one")
    a = a.astype(np.float32)
    np.fill_diagonal(a, 0.0)
    return a
