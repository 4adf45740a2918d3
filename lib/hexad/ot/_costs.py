"""Squared geodesic distances of a manifold as ott-jax cost functions."""

from __future__ import annotations

import jax
import jax.tree_util as jtu
from ott.geometry import costs

from hexad.geometry import Manifold

__all__ = ["SqGeodesic"]


@jtu.register_pytree_node_class
class SqGeodesic(costs.CostFn):
    r"""The cost :math:`c(x, y) = d_M(x, y)^2` of a manifold :math:`M`, as an ott-jax ``CostFn``.

    ``all_pairs`` is the manifold's vectorised ``pairwise_sqdist`` (one matmul on the sphere,
    one ``[n, m]`` block per angle on the torus), so ott's ``PointCloud`` builds cost matrices
    (or, with ``batch_size``, row blocks of them) without an ``[n, m, dim]`` intermediate.

    The twist operator makes ott's ``DualPotentials.transport`` a Riemannian map: for
    :math:`c = d^2`, :math:`\nabla_x c(x, y) = -2 \log_x(y)`, so the inverse of
    :math:`y \mapsto \nabla_x c(x, y)` at :math:`z` is :math:`\exp_x(-z / 2)` after projecting
    :math:`z` onto :math:`T_x M` (ott differentiates the potential in ambient coordinates). This
    is the Gangbo-McCann map :math:`\exp_x(-\nabla f / 2)`
    (McCann 2001; for entropic potentials, arXiv:2109.12004, Pooladian & Niles-Weed).

    Args:
      manifold: a :mod:`hexad.geometry` manifold (static).

    >>> from hexad.geometry import Sphere
    >>> import jax.numpy as jnp
    >>> c = SqGeodesic(Sphere(3))
    >>> round(float(c(jnp.array([1.0, 0, 0]), jnp.array([0.0, 1, 0]))), 4)  # (pi/2)^2
    2.4674
    """

    def __init__(self, manifold: Manifold):
        if not isinstance(manifold, Manifold):
            raise TypeError(f"manifold: expected a manifold, got {type(manifold).__name__}")
        self.manifold = manifold

    def __call__(self, x: jax.Array, y: jax.Array) -> jax.Array:
        return self.manifold.sqdist(x, y)

    def all_pairs(self, x: jax.Array, y: jax.Array) -> jax.Array:
        """Returns ``[n, m]`` squared geodesic distances of ``x [n, d]`` and ``y [m, d]``."""
        return self.manifold.pairwise_sqdist(x, y)

    def twist_operator(self, vec: jax.Array, dual_vec: jax.Array, variable: bool) -> jax.Array:
        del variable  # the cost is symmetric
        m = self.manifold
        return m.exp(vec, -0.5 * m.proj_tangent(vec, dual_vec))

    def tree_flatten(self):  # noqa: D102
        return (), (self.manifold,)

    @classmethod
    def tree_unflatten(cls, aux_data, children):  # noqa: D102
        del children
        return cls(*aux_data)

    def __repr__(self) -> str:
        return f"SqGeodesic({self.manifold})"
