"""Host-side graph construction and validation (edge lists, k-NN Gaussian weights, weights,
and the contextual stochastic block model the recovery studies draw from).

These run once, before a solve, on NumPy arrays: they decide the (static) number of edges, so
they cannot be traced. Everything they return is a plain array that a problem pytree holds.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.spatial import cKDTree

from hexad._base import check_int, check_positive, check_unit

__all__ = [
    "ContextualSBM",
    "adjacency_from_edges",
    "balanced_weights",
    "check_adjacency",
    "check_edges",
    "contextual_sbm",
    "knn_gaussian_weights",
]


def knn_gaussian_weights(x, k: int = 10, phi: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    r"""Returns the symmetric k-NN edge list and Gaussian weights of Chi & Lange (2015).

    An undirected edge ``(i, j)`` with ``i < j`` is kept when ``j`` is among the ``k`` nearest
    neighbours of ``i`` or ``i`` among those of ``j``; its weight is
    :math:`\exp(-\phi \|x_i - x_j\|^2)` (Chi & Lange 2015, arXiv:1304.0499, Sec. 6). The default
    :math:`\phi` is 1 / the median squared k-NN distance, so that a typical weight is
    :math:`e^{-1}`.

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
    k = check_int("k", k, 1, n - 1)
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
    phi = check_positive("phi", phi)
    edges = np.stack([key // n, key % n], axis=1).astype(np.int32)
    return edges, np.exp(-phi * d2).astype(np.float32)


def check_edges(edges, n: int, weights=None) -> tuple[np.ndarray, np.ndarray | None]:
    """Validates an undirected edge list on ``n`` nodes; returns it as int32 (and weights).

    Raises ValueError for a wrong shape, ids out of ``[0, n)``, self loops, or negative /
    non-finite weights. Duplicated edges are allowed (their weights add up in the penalty).
    """
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 2:
        raise ValueError(f"n: expected the number of nodes, an int >= 2, got {n!r}")
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


def balanced_weights(adjacency) -> tuple[float, float]:
    r"""Returns ``(edge_weight, nonedge_weight)`` :math:`= (1 - t, t)`, :math:`t` the graph's edge
    density.

    Chen, Sanghavi & Xu's balancing (arXiv:1210.3335): with :math:`c_A = 1 - t` on edges and
    :math:`c_{A^c} = t` on non-edges, the edges and the non-edges weigh the same in total
    (:math:`(1 - t)\, t\, n (n - 1)` each), however sparse the graph. For :func:`graph_problem` and
    :func:`joint_problem`.

    Args:
      adjacency: ``[n, n]`` binary symmetric adjacency, ``n >= 2`` (diagonal ignored).

    >>> c_a, c_ac = balanced_weights(np.array([[0, 1, 0], [1, 0, 0], [0, 0, 0]]))
    >>> round(c_a, 4), round(c_ac, 4)
    (0.6667, 0.3333)
    """
    a = check_adjacency(adjacency)
    n = a.shape[0]
    if n < 2:
        raise ValueError(f"adjacency: expected at least 2 nodes, got shape {a.shape}")
    t = a.sum() / (n * (n - 1))  # float32, as check_adjacency returns
    return float(1 - t), float(t)


class ContextualSBM(NamedTuple):
    """A draw of :func:`contextual_sbm` (NumPy arrays).

    Attributes:
      adjacency: ``[n, n]`` float64 symmetric 0/1 adjacency, zero diagonal.
      features: ``[n, dim]`` node features.
      labels: ``[n]`` int observed labels (noisy; meaningful on ``labeled`` nodes).
      labeled: ``[n]`` bool, which nodes carry a label.
      truth: ``[n]`` int true communities (in blocks of ``n / K`` nodes: class 0 first).
    """

    adjacency: np.ndarray
    features: np.ndarray
    labels: np.ndarray
    labeled: np.ndarray
    truth: np.ndarray


def contextual_sbm(
    rng: np.random.Generator,
    n: int,
    p: float,
    q: float,
    sep: float,
    dim: int,
    n_labeled: int,
    label_noise: float,
    num_classes: int = 2,
) -> ContextualSBM:
    """Draws ``K`` balanced communities with a graph, node features and a few noisy labels.

    The graph is an SBM: each pair is an edge with probability ``p`` inside a community and
    ``q`` across. Features are ``x_v = (sep / 2) m_{y_v} + N(0, I_dim)`` with unit class
    means: for ``K = 2`` ``m = -+e_1`` (``+`` for class 1); for ``K >= 3`` and
    ``dim >= K - 1`` the vertices of a regular simplex centred at 0 in the first ``K - 1``
    coordinates, and for ``dim < K - 1`` ``K`` points evenly spaced on ``[-1, 1]`` along
    ``e_1``. ``n_labeled`` nodes, spread over the classes as evenly as possible (the first
    classes get the remainder; for ``K = 2`` half, rounded down, in class 0), carry their
    label, each flipped with probability ``label_noise`` (to the other class; for ``K >= 3`` to
    a uniformly drawn other class). If the flips leave a class without a label: for ``K = 2``
    the first labelled node is set to 0 and the last to 1; for ``K >= 3`` the first labelled
    node of a missing class gets its true label back, until every class has one.

    Args:
      rng: a NumPy generator (consumed in a fixed order: pairs, features, labelled nodes,
        flips).
      n: number of nodes, even, ``>= 4``.
      p, q: within- and across-community edge probabilities in ``[0, 1]``.
      sep: feature separation ``>= 0``.
      dim: feature dimension ``>= 1``.
      n_labeled: labelled nodes, in ``[2, n]``.
      label_noise: flip probability in ``[0, 1]``.
      num_classes: ``K >= 2``, with ``n`` a multiple of ``K`` and ``n_labeled >= K``.

    >>> g = contextual_sbm(np.random.default_rng(0), 8, 0.9, 0.1, 4.0, 1, 2, 0.0)
    >>> g.adjacency.shape, g.labels[g.labeled].tolist()
    ((8, 8), [0, 1])
    """
    n = check_int("n", n, lo=4)
    k = check_int("num_classes", num_classes, 2, n // 2)
    if n % k:
        if k == 2:
            raise ValueError(f"n: expected an even int (two balanced communities), got {n}")
        raise ValueError(f"n: expected a multiple of num_classes={k}, got {n}")
    p = check_unit("p", p, lo_open=False, hi_open=False)
    q = check_unit("q", q, lo_open=False, hi_open=False)
    sep = check_positive("sep", sep, allow_zero=True)
    dim = check_int("dim", dim)
    n_labeled = check_int("n_labeled", n_labeled, k, n)
    label_noise = check_unit("label_noise", label_noise, lo_open=False, hi_open=False)
    if k > 2:
        return _contextual_sbm_k(rng, n, k, p, q, sep, dim, n_labeled, label_noise)
    y = np.repeat([0, 1], n // 2)
    prob = np.where(y[:, None] == y[None, :], p, q)
    a = np.triu(rng.random((n, n)) < prob, 1).astype(np.float64)
    mean = np.zeros(dim)
    mean[0] = sep / 2
    x = (2 * y[:, None] - 1) * mean + rng.normal(size=(n, dim))
    half = n_labeled // 2
    labeled = np.zeros(n, bool)
    labeled[rng.choice(n // 2, half, replace=False)] = True
    labeled[n // 2 + rng.choice(n // 2, n_labeled - half, replace=False)] = True
    noisy = np.where(rng.random(n) < label_noise, 1 - y, y)
    if len(set(noisy[labeled])) < 2:
        noisy[np.flatnonzero(labeled)[0]] = 0
        noisy[np.flatnonzero(labeled)[-1]] = 1
    return ContextualSBM(a + a.T, x, noisy, labeled, y)


def _class_means(k: int, dim: int) -> np.ndarray:
    if dim >= k - 1:
        c = np.eye(k) - 1.0 / k  # a regular simplex in R^k, centred; then rotate into R^(k-1)
        basis = np.linalg.svd(c)[2][: k - 1]
        v = c @ basis.T
        v = v / np.linalg.norm(v, axis=1, keepdims=True)
        out = np.zeros((k, dim))
        out[:, : k - 1] = v
        return out
    out = np.zeros((k, dim))
    out[:, 0] = np.linspace(-1.0, 1.0, k)
    return out


def _contextual_sbm_k(rng, n, k, p, q, sep, dim, n_labeled, label_noise) -> ContextualSBM:
    size = n // k
    y = np.repeat(np.arange(k), size)
    prob = np.where(y[:, None] == y[None, :], p, q)
    a = np.triu(rng.random((n, n)) < prob, 1).astype(np.float64)
    x = (sep / 2) * _class_means(k, dim)[y] + rng.normal(size=(n, dim))
    per = [n_labeled // k + (c < n_labeled % k) for c in range(k)]
    labeled = np.zeros(n, bool)
    for c in range(k):
        labeled[c * size + rng.choice(size, per[c], replace=False)] = True
    flip = rng.random(n) < label_noise
    noisy = np.where(flip, (y + rng.integers(1, k, n)) % k, y)
    missing = sorted(set(range(k)) - set(noisy[labeled].tolist()))
    while missing:  # restoring a true label can only leave fewer flipped labels
        c = missing[0]
        noisy[np.flatnonzero(labeled & (y == c))[0]] = c
        missing = sorted(set(range(k)) - set(noisy[labeled].tolist()))
    return ContextualSBM(a + a.T, x, noisy, labeled, y)
