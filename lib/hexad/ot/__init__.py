"""Optimal transport on manifolds through ott-jax: geodesic costs, entropic maps, divergences.

- :class:`SqGeodesic`: :math:`d_M(x, y)^2` as an ott-jax ``CostFn`` (vectorised ``all_pairs`` and a
  twist operator, so ``DualPotentials.transport`` is a Riemannian map).
- :class:`EntropicMap` / :func:`entropic_map`: the Riemannian entropic map for weighted, padded
  clouds, dense or memory-bounded (ott's online geometry), batched with ``jax.vmap``;
  ``epsilon`` absolute or relative to the largest cost (``scale_cost="max_cost"``).
- :func:`mccann_interpolation`: displacement interpolation and its velocity.
- :func:`sinkhorn_divergence`, :func:`sinkhorn_w2`: the debiased W2 estimate between clouds.
- :func:`chamfer`, :func:`entropic_emd`: the cloud distances of the RWEFM evaluation;
  :func:`greedy_matching`: a cloud-level plan rounded to a one-to-one assignment.
"""

from hexad.ot._clouds import chamfer, entropic_emd, greedy_matching
from hexad.ot._costs import SqGeodesic
from hexad.ot._entropic import (
    EntropicMap,
    EntropicMapOutput,
    barycentric_tangent,
    check_settings,
    entropic_map,
    max_real_cost,
    mccann_interpolation,
    sinkhorn_divergence,
    sinkhorn_w2,
)

__all__ = [
    "EntropicMap",
    "EntropicMapOutput",
    "SqGeodesic",
    "barycentric_tangent",
    "chamfer",
    "check_settings",
    "entropic_emd",
    "entropic_map",
    "greedy_matching",
    "max_real_cost",
    "mccann_interpolation",
    "sinkhorn_divergence",
    "sinkhorn_w2",
]
