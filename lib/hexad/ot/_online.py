"""A memory-bounded ott-jax ``PointCloud`` whose online mode blocks rows with ``lax.map``.

ott-jax 0.6.0's own online mode (``PointCloud(batch_size=...)``) calls
``jax.interpreters.batching.is_vmappable``, which jax 0.10 removed, so it fails at trace time.
This subclass keeps ott's geometry, problem and Sinkhorn solver and re-implements only the
three kernel applications Sinkhorn needs in online mode, with ``jax.lax.map(...,
batch_size=...)``: memory ``O(batch_size * max(n, m))``, the cost never materialised.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from ott.geometry import pointcloud
from ott.math import utils as mu

__all__ = ["BlockedPointCloud"]


@jtu.register_pytree_node_class
class BlockedPointCloud(pointcloud.PointCloud):
    """ott-jax ``PointCloud`` with a working online (row-blocked) mode; see module docstring.

    Same arguments as ``ott.geometry.pointcloud.PointCloud``; with ``batch_size=None`` it is
    exactly ott's dense ``PointCloud``.

    >>> x = jnp.zeros((4, 2))
    >>> BlockedPointCloud(x, x, batch_size=2).shape
    (4, 4)
    """

    def _rows(self, axis: int):
        # axis=0 reduces over x for each y_j; axis=1 reduces over y for each x_i.
        return (self.y, self.x) if axis == 0 else (self.x, self.y)

    def _cost_line(self, z: jax.Array, other: jax.Array, axis: int) -> jax.Array:
        c = (
            self.cost_fn.all_pairs(other, z[None])[:, 0]
            if axis == 0
            else self.cost_fn.all_pairs(z[None], other)[0]
        )
        return c * self.inv_scale_cost

    def apply_lse_kernel(  # noqa: D102
        self,
        f: jax.Array,
        g: jax.Array,
        eps: float,
        vec: jax.Array | None = None,
        axis: int = 0,
    ) -> tuple[jax.Array, jax.Array]:
        if not self.is_online:
            return super().apply_lse_kernel(f, g, eps, vec, axis)
        pts, other = self._rows(axis)
        own, opp = (g, f) if axis == 0 else (f, g)

        def line(args: Any) -> tuple[jax.Array, jax.Array]:
            z, h = args
            cost = self._cost_line(z, other, axis)
            res, sgn = mu.logsumexp((opp + h - cost) / eps, b=vec, return_sign=True)
            return eps * res, sgn

        res, sgn = jax.lax.map(line, (pts, own), batch_size=self.batch_size)
        return res - jnp.where(jnp.isfinite(own), own, 0.0), sgn

    def apply_kernel(  # noqa: D102
        self, vec: jax.Array, eps: float | None = None, axis: int = 0
    ) -> jax.Array:
        if eps is None:
            eps = self.epsilon
        if not self.is_online:
            return super().apply_kernel(vec, eps, axis)
        pts, other = self._rows(axis)

        def line(z: jax.Array) -> jax.Array:
            return jnp.dot(jnp.exp(-self._cost_line(z, other, axis) / eps), vec)

        return jax.lax.map(line, pts, batch_size=self.batch_size)

    def _apply_cost_to_vec(  # noqa: D102
        self,
        vec: jax.Array,
        axis: int = 0,
        fn=None,
        is_linear: bool = False,
        scale_cost: float | None = None,
    ) -> jax.Array:
        if not self.is_online or self.is_squared_euclidean:
            return super()._apply_cost_to_vec(vec, axis, fn, is_linear, scale_cost)
        scale = self.inv_scale_cost if scale_cost is None else scale_cost
        pts, other = self._rows(axis)

        def line(z: jax.Array) -> jax.Array:
            c = self._cost_line(z, other, axis) / self.inv_scale_cost * scale
            return jnp.dot(c if fn is None else fn(c), vec)

        return jax.lax.map(line, pts, batch_size=self.batch_size)
