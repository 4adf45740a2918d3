"""Distances between two weighted clouds on a manifold, and a plan rounded to a matching.

- :func:`chamfer`: the symmetric Chamfer cost for ``d_M^2``.
- :func:`entropic_emd`: the transport cost of ott-jax's entropic plan for the ground cost
  ``d_M`` (not squared), with ``epsilon`` relative to the largest cost, and whether Sinkhorn
  converged.
- :func:`greedy_matching`: a ``[B, B]`` plan rounded to a permutation, largest entries first.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from ott.geometry import geometry as ott_geometry
from ott.problems.linear import linear_problem
from ott.solvers.linear import sinkhorn

from hexad._base import check_finite
from hexad.geometry import Manifold, check_points, check_weights
from hexad.ot._entropic import check_settings, max_real_cost

__all__ = ["chamfer", "entropic_emd", "greedy_matching"]

Array = jax.Array


def _normalise(w: Array) -> Array:
    return w / jnp.sum(w)


def _check_pair(manifold: Manifold, x: Array, y: Array, a: Array, b: Array) -> None:
    # Concrete values only (a traced argument is checked for its shape alone): NaN points or
    # negative masses would otherwise come back as a NaN or infinite distance.
    check_points(manifold, x, "x", ndim=2)
    check_points(manifold, y, "y", ndim=2)
    check_weights(a, "a", tuple(jnp.shape(x)[:1]))
    check_weights(b, "b", tuple(jnp.shape(y)[:1]))


def chamfer(manifold: Manifold, x: Array, y: Array, a: Array, b: Array) -> Array:
    r"""Returns :math:`\sum_i a_i \min_j d(x_i, y_j)^2 + \sum_j b_j \min_i d(x_i, y_j)^2`.

    Masses are normalised; zero masses are padding (they neither count nor are nearest).

    Args:
      manifold: the manifold (static).
      x: ``[n, d]``, ``a``: ``[n]``; ``y``: ``[m, d]``, ``b``: ``[m]``.

    >>> from hexad.geometry import Euclidean
    >>> x, y = jnp.zeros((1, 1)), jnp.array([[1.0], [3.0]])
    >>> float(chamfer(Euclidean(1), x, y, jnp.ones(1), jnp.ones(2)))
    6.0
    """
    _check_pair(manifold, x, y, a, b)
    c = manifold.pairwise_sqdist(x, y)
    to_y = jnp.min(jnp.where(b[None, :] > 0, c, jnp.inf), axis=1)
    to_x = jnp.min(jnp.where(a[:, None] > 0, c, jnp.inf), axis=0)
    a, b = _normalise(a), _normalise(b)
    return jnp.sum(jnp.where(a > 0, a * to_y, 0.0)) + jnp.sum(jnp.where(b > 0, b * to_x, 0.0))


def entropic_emd(
    manifold: Manifold,
    x: Array,
    y: Array,
    a: Array,
    b: Array,
    *,
    epsilon: float = 0.05,
    max_iterations: int = 5000,
    threshold: float = 1e-3,
) -> tuple[Array, Array]:
    r"""Returns :math:`\sum_{ij} P_{ij} d(x_i, y_j)` and ``converged``, for ott-jax's entropic
    plan :math:`P`.

    The ground cost is the geodesic distance (not squared), ``epsilon`` is relative to its
    largest entry between real points (ott's ``scale_cost="max_cost"``), and Sinkhorn runs
    until its marginal error is below ``threshold`` or ``max_iterations``: ``converged`` says
    which.

    Args:
      manifold: the manifold (static).
      x: ``[n, d]``, ``a``: ``[n]``; ``y``: ``[m, d]``, ``b``: ``[m]`` (zeros: padding).
      epsilon, max_iterations, threshold: Sinkhorn settings (static).

    >>> from hexad.geometry import Torus
    >>> x = Torus(2).random_uniform(jax.random.key(0), (8,))
    >>> d, ok = jax.jit(entropic_emd, static_argnums=0)(Torus(2), x, x, jnp.ones(8), jnp.ones(8))
    >>> bool(ok), float(d) < 0.2
    (True, True)
    """
    check_settings(epsilon, "max_cost", max_iterations, threshold=threshold)
    _check_pair(manifold, x, y, a, b)
    a, b = _normalise(a), _normalise(b)
    c = manifold.dist(x[:, None, :], y[None, :, :])
    eps = epsilon * max_real_cost(c, a, b)
    geom = ott_geometry.Geometry(cost_matrix=c, epsilon=eps)
    solver = sinkhorn.Sinkhorn(threshold=threshold, max_iterations=max_iterations)
    with jax.numpy_rank_promotion("allow"):  # ott-jax relies on rank promotion internally
        out = solver(linear_problem.LinearProblem(geom, a=a, b=b))
    return jnp.sum(out.matrix * c), out.converged


def greedy_matching(plan: Array) -> Array:
    """Returns ``[B]`` indices ``idx`` with ``idx[j]`` the row matched to column ``j``.

    Rounds a ``[B, B]`` plan to a one-to-one assignment: repeatedly take the largest entry
    among unmatched rows and columns (the reference's greedy rounding of a cloud-level plan).
    A concrete plan must be finite (a ValueError names ``plan``); under a trace its values are
    not checked, and a NaN entry is taken as the largest.

    >>> greedy_matching(jnp.array([[0.1, 0.9], [0.8, 0.2]])).tolist()
    [1, 0]
    """
    shape = jnp.shape(plan)
    if len(shape) != 2 or shape[0] != shape[1]:
        raise ValueError(f"plan: expected a square [B, B] array, got shape {shape}")
    check_finite("plan", plan)
    plan = jnp.asarray(plan)
    n = shape[0]

    def body(_, carry):
        free_r, free_c, idx = carry
        masked = jnp.where(free_r[:, None] & free_c[None, :], plan, -jnp.inf)
        k = jnp.argmax(masked)
        i, j = k // n, k % n
        return free_r.at[i].set(False), free_c.at[j].set(False), idx.at[j].set(i)

    init = (jnp.ones(n, bool), jnp.ones(n, bool), jnp.zeros(n, jnp.int32))
    return jax.lax.fori_loop(0, n, body, init)[2]
