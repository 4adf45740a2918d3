"""Riemannian manifolds for OT and flow matching: Euclidean space, spheres, flat tori, products.

Manifolds are static ``flax.struct`` dataclasses with closed-form ``exp``, ``log``, distances,
tangent projections, samplers (uniform, wrapped normal, von Mises-Fisher) and vectorised
pairwise costs; see :class:`hexad.geometry.Manifold` for the method list.
"""

from hexad.geometry._checks import check_points, check_weights, is_traced
from hexad.geometry._manifolds import Euclidean, Manifold, Product, Sphere, Torus, wrap_angle

__all__ = [
    "Euclidean",
    "Manifold",
    "Product",
    "Sphere",
    "Torus",
    "check_points",
    "check_weights",
    "is_traced",
    "wrap_angle",
]
