"""Riemannian manifolds for OT and flow matching: Euclidean space, spheres, flat tori, products.

Manifolds are static ``flax.struct`` dataclasses with closed-form ``exp``, ``log``, distances,
tangent projections, samplers (uniform, wrapped normal, von Mises-Fisher) and vectorised
pairwise costs and weighted means. :class:`~hexad.base.Manifold` (the protocol of
:mod:`hexad.base`, re-exported here) lists what the rest of hexad asks of a manifold; annotate
with it.
"""

from hexad._base import Manifold
from hexad.geometry._checks import check_points, check_weights
from hexad.geometry._manifolds import Euclidean, Product, Sphere, Torus, wrap_angle

__all__ = [
    "Euclidean",
    "Manifold",
    "Product",
    "Sphere",
    "Torus",
    "check_points",
    "check_weights",
    "wrap_angle",
]
