"""Optimal transport on manifolds through ott-jax: geodesic costs, entropic maps, divergences.

- :class:`SqGeodesic`: ``d_M(x, y)^2`` as an ott-jax ``CostFn`` (vectorised ``all_pairs`` and a
  twist operator, so ``DualPotentials.transport`` is a Riemannian map).
- :class:`EntropicMap` / :func:`entropic_map`: the Riemannian entropic map for weighted, padded
  clouds, dense or memory-bounded (ott's online geometry), batched with ``jax.vmap``.
- :func:`mccann_interpolation`: displacement interpolation and its velocity.
- :func:`sinkhorn_divergence`, :func:`sinkhorn_w2`: the evaluation distance between clouds.
"""

from hexad.ot._costs import SqGeodesic
from hexad.ot._entropic import (
    EntropicMap,
    EntropicMapOutput,
    barycentric_tangent,
    entropic_map,
    mccann_interpolation,
    sinkhorn_divergence,
    sinkhorn_w2,
)

__all__ = [
    "EntropicMap",
    "EntropicMapOutput",
    "SqGeodesic",
    "barycentric_tangent",
    "entropic_map",
    "mccann_interpolation",
    "sinkhorn_divergence",
    "sinkhorn_w2",
]
