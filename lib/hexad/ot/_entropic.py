"""The Riemannian entropic map, McCann interpolation and the Riemannian Sinkhorn divergence.

Sinkhorn is ott-jax's (``ott.solvers.linear.sinkhorn.Sinkhorn``) on a ``PointCloud`` whose cost
is :class:`hexad.ot.SqGeodesic`; nothing here iterates Sinkhorn by hand.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from ott.geometry import geometry as ott_geometry
from ott.problems.linear import linear_problem
from ott.solvers.linear import sinkhorn
from ott.tools import sinkhorn_divergence as ott_sd

from hexad._base import check_int, check_positive, is_traced
from hexad.geometry import Manifold, check_points, check_weights
from hexad.ot._costs import SqGeodesic
from hexad.ot._online import BlockedPointCloud

__all__ = [
    "EntropicMap",
    "EntropicMapOutput",
    "barycentric_tangent",
    "check_settings",
    "entropic_map",
    "max_real_cost",
    "mccann_interpolation",
    "sinkhorn_divergence",
    "sinkhorn_w2",
]

Array = jax.Array


class EntropicMapOutput(NamedTuple):
    r"""What :class:`EntropicMap` returns for one pair of clouds (add a leading axis under vmap).

    Attributes:
      mapped: ``[n, d]`` :math:`T(x_i) = \exp_{x_i}(\mathrm{tangent}_i)`, on the manifold.
      tangent: ``[n, d]`` :math:`\sum_j (P_{ij} / \sum_k P_{ik}) \log_{x_i}(y_j)` in
        :math:`T_{x_i} M`.
      g: ``[m]`` ott-jax's target dual potential (``-inf``/garbage where ``b_j = 0``: unused).
      converged: ``[]`` bool, whether Sinkhorn met its threshold.
      n_iters: ``[]`` int, Sinkhorn iterations run.
      reg_ot_cost: ``[]`` ott-jax's regularised OT cost.
      errors: ``[max_iterations // inner_iterations]`` marginal error history (``-1`` unused).
      epsilon: ``[]`` the absolute regularisation used (``epsilon * max cost`` with
        ``scale_cost="max_cost"``).
    """

    mapped: Array
    tangent: Array
    g: Array
    converged: Array
    n_iters: Array
    reg_ot_cost: Array
    errors: Array
    epsilon: Array


SCALE_COSTS = (None, "max_cost")


def max_real_cost(cost: Array, a: Array, b: Array) -> Array:
    """Returns the largest entry of ``cost [n, m]`` between real points (``a_i > 0``, ``b_j > 0``).

    The scale of ``scale_cost="max_cost"`` (ott-jax's name): padded rows and columns do not
    count. A NaN weight or cost propagates (NaN), it is not read as padding.

    >>> max_real_cost(jnp.array([[1.0, 5.0], [2.0, 3.0]]), jnp.ones(2), jnp.array([1.0, 0.0]))
    Array(2., dtype=float32)
    """
    real = (a[:, None] > 0) & (b[None, :] > 0)
    nan = jnp.isnan(a)[:, None] | jnp.isnan(b)[None, :]
    return jnp.max(jnp.where(nan, jnp.nan, jnp.where(real, cost, -jnp.inf)))


def barycentric_tangent(
    manifold: Manifold,
    x: Array,
    y: Array,
    b: Array,
    g: Array,
    epsilon: float,
    batch_size: int | None = None,
    cost: Array | None = None,
) -> Array:
    r"""Returns ``[n, d]`` :math:`\sum_j w_{ij} \log_{x_i}(y_j)` with the entropic map's weights.

    :math:`w_{ij} = \exp((g_j - d(x_i, y_j)^2) / \varepsilon) / Z_i` is row :math:`i` of the
    entropic plan normalised to sum to one (:math:`P_{ij} / \sum_k P_{ik}`), with :math:`g`
    ott-jax's log-domain potential
    (which already includes ``eps log b_j``); it is defined for any ``x``, so this also maps
    points out of sample. Padded targets (``b_j = 0``) get zero weight.

    Args:
      manifold: the manifold (static).
      x: ``[n, d]`` points to map.
      y: ``[m, d]`` target points.
      b: ``[m]`` target weights (only ``b_j > 0`` is used: padding mask).
      g: ``[m]`` target dual potential from ott-jax's Sinkhorn (log domain).
      epsilon: the entropic regularisation the potential was computed with.
      batch_size: if set (static), rows are processed ``batch_size`` at a time, so memory is
        ``O(batch_size * m)`` instead of ``O(n * m)``.
      cost: optional ``[n, m]`` precomputed ``pairwise_sqdist(x, y)`` (dense path only).

    >>> from hexad.geometry import Euclidean
    >>> x, y = jnp.zeros((1, 2)), jnp.array([[1.0, 0.0], [3.0, 0.0]])
    >>> barycentric_tangent(Euclidean(2), x, y, jnp.ones(2), jnp.zeros(2), 1e3).round(2)
    Array([[2., 0.]], dtype=float32)
    """
    # ott-jax's log-domain potentials absorb the marginals (P_ij = exp((f_i + g_j - C_ij)/eps)),
    # so g already carries eps * log(b_j); padded targets are masked explicitly. A NaN weight
    # is not padding (NaN > 0 is False): it gives a NaN bias, hence NaN rows, not a silent mask.
    bias = jnp.where(b > 0.0, g / epsilon, jnp.where(jnp.isnan(b), jnp.nan, -jnp.inf))

    def rows(xb: Array, cb: Array | None = None) -> Array:
        cb = manifold.pairwise_sqdist(xb, y) if cb is None else cb
        w = jax.nn.softmax(bias[None, :] - cb / epsilon, axis=-1)
        return manifold.weighted_log(xb, w, y, sqdist=cb)

    if batch_size is None or batch_size >= x.shape[0]:
        return rows(x, cost)
    return jax.lax.map(lambda xi: rows(xi[None])[0], x, batch_size=batch_size)


@struct.dataclass
class EntropicMap:
    r"""Solver for the Riemannian entropic map between two weighted point clouds on :math:`M`.

    .. math::

       T(x_i) = \exp_{x_i}\Big( \sum_j \frac{P_{ij}}{\sum_k P_{ik}} \log_{x_i}(y_j) \Big)

    where :math:`P` is the entropic OT plan for the cost :math:`d_M(x, y)^2` (RWEFM; on
    :math:`\mathbb{R}^d` this is the entropic map of Pooladian & Niles-Weed, arXiv:2109.12004, eq.
    3.4). Sinkhorn is ott-jax's, in log domain; no gradients are taken through the map in this
    library, and ``jax.grad`` through it does not work yet: ott's implicit differentiation reports
    its linear system as singular (lineax raises; seen on the sphere, the torus and
    :math:`\mathbb{R}^d`). :func:`sinkhorn_divergence` does differentiate (tested under
    ``jax.grad``).

    Padding: give padded points zero weight in ``a``/``b``; their rows of ``mapped`` are still
    finite (they are mapped like out-of-sample points). Many cloud pairs: ``jax.vmap(solver)``.

    Attributes:
      manifold: the manifold (static).
      epsilon: entropic regularisation, ``> 0`` (static): in units of squared distance, or,
        with ``scale_cost="max_cost"``, relative to the largest cost between real points of the
        pair (ott-jax's ``scale_cost="max_cost"``; the RWEFM reference uses 0.002).
      scale_cost: ``None`` (absolute ``epsilon``) or ``"max_cost"`` (static).
      threshold: Sinkhorn's marginal-error tolerance (static).
      max_iterations: Sinkhorn's iteration bound (static).
      inner_iterations: iterations between error checks (static).
      batch_size: ``None`` for dense cost matrices; an int for ott's online geometry and a
        row-blocked map, with memory ``O(batch_size * (n + m))`` (static).

    >>> from hexad.geometry import Sphere
    >>> s = Sphere(3)
    >>> x = s.random_uniform(jax.random.key(0), (16,))
    >>> out = jax.jit(EntropicMap(s, epsilon=0.05))(x, x)
    >>> bool(out.converged), out.mapped.shape
    (True, (16, 3))
    """

    manifold: Manifold = struct.field(pytree_node=False)
    epsilon: float = struct.field(pytree_node=False, default=0.05)
    scale_cost: str | None = struct.field(pytree_node=False, default=None)
    threshold: float = struct.field(pytree_node=False, default=1e-3)
    max_iterations: int = struct.field(pytree_node=False, default=500)
    inner_iterations: int = struct.field(pytree_node=False, default=10)
    batch_size: int | None = struct.field(pytree_node=False, default=None)

    def __post_init__(self) -> None:
        # All fields are static (jax rebuilds the solver with the same Python values), so a
        # bad setting is named here, at construction, not deep inside ott-jax or XLA.
        if not isinstance(self.manifold, Manifold):
            raise TypeError(f"manifold: expected a manifold, got {type(self.manifold).__name__}")
        check_settings(
            self.epsilon,
            self.scale_cost,
            self.max_iterations,
            threshold=self.threshold,
            inner_iterations=self.inner_iterations,
            batch_size=self.batch_size,
        )

    def __call__(
        self, x: Array, y: Array, a: Array | None = None, b: Array | None = None
    ) -> EntropicMapOutput:
        """Maps the source cloud ``x`` toward the target cloud ``y``.

        Args:
          x: ``[n, d]`` source points on the manifold.
          y: ``[m, d]`` target points on the manifold.
          a: ``[n]`` source weights (default uniform); zeros mark padding.
          b: ``[m]`` target weights (default uniform); zeros mark padding.

        Returns:
          An :class:`EntropicMapOutput`.
        """
        _validate_pair(self.manifold, x, y, a, b)
        n, m = x.shape[0], y.shape[0]
        dtype = jnp.result_type(x, y)
        a = jnp.full((n,), 1.0 / n, dtype) if a is None else a / jnp.sum(a)
        b = jnp.full((m,), 1.0 / m, dtype) if b is None else b / jnp.sum(b)
        cost = None
        if self.batch_size is None:
            # Dense: the geodesic cost (arccos / wrapped differences) is computed once, for
            # Sinkhorn and the map, not in every iteration as a custom-cost PointCloud would.
            cost = self.manifold.pairwise_sqdist(x, y)
            scale = max_real_cost(cost, a, b) if self.scale_cost == "max_cost" else None
        elif self.scale_cost == "max_cost":
            # row by row, so the memory stays O(batch_size * m)
            per_row = jax.lax.map(
                lambda xi: max_real_cost(
                    self.manifold.pairwise_sqdist(xi[None], y), jnp.ones(1, dtype), b
                ),
                x,
                batch_size=self.batch_size,
            )
            scale = max_real_cost(per_row[:, None], a, jnp.ones(1, dtype))
        else:
            scale = None
        # The plan of ott's scale_cost="max_cost" with the potentials kept in cost units, so
        # the barycentric weights below use the same epsilon.
        eps = jnp.asarray(self.epsilon, dtype) if scale is None else self.epsilon * scale
        if self.batch_size is None:
            geom = ott_geometry.Geometry(cost_matrix=cost, epsilon=eps)
        else:
            geom = BlockedPointCloud(
                x,
                y,
                cost_fn=SqGeodesic(self.manifold),
                epsilon=eps,
                batch_size=self.batch_size,
            )
        solver = sinkhorn.Sinkhorn(
            threshold=self.threshold,
            max_iterations=self.max_iterations,
            inner_iterations=self.inner_iterations,
        )
        # ott-jax itself relies on rank promotion (its marginal error broadcasts [n] with
        # [1, 1]); allow it for ott's code only, ours stays strict.
        with jax.numpy_rank_promotion("allow"):
            out = solver(linear_problem.LinearProblem(geom, a=a, b=b))
        tangent = barycentric_tangent(
            self.manifold, x, y, b, out.g, eps, batch_size=self.batch_size, cost=cost
        )
        return EntropicMapOutput(
            mapped=self.manifold.exp(x, tangent),
            tangent=tangent,
            g=out.g,
            converged=out.converged,
            n_iters=out.n_iters,
            reg_ot_cost=out.reg_ot_cost,
            errors=out.errors,
            epsilon=eps,
        )


def check_settings(
    epsilon: Any,
    scale_cost: Any,
    max_iterations: Any,
    *,
    threshold: Any = None,
    inner_iterations: Any = None,
    batch_size: Any = None,
) -> None:
    """Raises a ValueError naming the setting unless ``epsilon > 0``, ``scale_cost`` is one of
    ``None``/``"max_cost"`` and ``max_iterations >= 1``; and, where given, ``threshold >= 0``,
    ``inner_iterations >= 1`` and ``batch_size >= 1``. A traced ``epsilon`` passes unchecked.

    >>> check_settings(0.0, None, 10)
    Traceback (most recent call last):
    ...
    ValueError: epsilon: expected a finite number > 0, got 0.0
    """
    check_positive("epsilon", epsilon)
    if scale_cost not in SCALE_COSTS:
        raise ValueError(f"scale_cost: expected one of {SCALE_COSTS}, got {scale_cost!r}")
    check_int("max_iterations", max_iterations)
    if threshold is not None:
        check_positive("threshold", threshold, allow_zero=True)
    if inner_iterations is not None:
        check_int("inner_iterations", inner_iterations)
    if batch_size is not None:
        check_int("batch_size", batch_size)


def entropic_map(
    manifold: Manifold,
    x: Array,
    y: Array,
    a: Array | None = None,
    b: Array | None = None,
    *,
    epsilon: float = 0.05,
    scale_cost: str | None = None,
    max_iterations: int = 500,
    threshold: float = 1e-3,
    batch_size: int | None = None,
) -> EntropicMapOutput:
    r"""Returns the Riemannian entropic map of ``x [n, d]`` onto ``y [m, d]``.

    A one-call form of :class:`EntropicMap` (whose page has the settings in full):

    .. math::

       T(x_i) = \exp_{x_i}\Big( \sum_j \frac{P_{ij}}{\sum_k P_{ik}} \log_{x_i}(y_j) \Big),

    with :math:`P` the entropic OT plan of the weights ``a`` and ``b`` for the cost
    :math:`d_M(x, y)^2`, solved by ott-jax's Sinkhorn.

    Args:
      manifold: the manifold :math:`M` the points lie on (a :class:`hexad.base.Manifold`).
      x: ``[n, d]`` source points, mapped.
      y: ``[m, d]`` target points.
      a: ``[n]`` source weights, ``>= 0`` (uniform if ``None``; 0 marks padding).
      b: ``[m]`` target weights, ``>= 0`` (uniform if ``None``; 0 marks padding).
      epsilon: the entropic regularisation, ``> 0``, in units of squared distance (relative
        to the largest cost with ``scale_cost="max_cost"``).
      scale_cost: ``None`` or ``"max_cost"``.
      max_iterations: Sinkhorn's iteration bound.
      threshold: Sinkhorn's marginal-error tolerance.
      batch_size: ``None`` for dense costs, or a row block for ott's online geometry.

    Returns:
      An :class:`EntropicMapOutput`: ``mapped [n, d]`` (the points :math:`T(x_i)`), the
      tangent vectors :math:`\log_{x_i} T(x_i)`, and whether Sinkhorn converged.

    >>> from hexad.geometry import Torus
    >>> t = Torus(2)
    >>> x = t.random_uniform(jax.random.key(0), (8,))
    >>> jax.jit(lambda x: entropic_map(t, x, x, epsilon=0.01))(x).mapped.shape
    (8, 2)
    """
    solver = EntropicMap(
        manifold,
        epsilon=epsilon,
        scale_cost=scale_cost,
        threshold=threshold,
        max_iterations=max_iterations,
        batch_size=batch_size,
    )
    return solver(x, y, a, b)


def mccann_interpolation(
    manifold: Manifold, x: Array, tangent: Array, t: Array
) -> tuple[Array, Array]:
    r"""Returns McCann's displacement interpolation and its velocity at time ``t``.

    :math:`x_i(t) = \exp_{x_i}(t v_i)` with :math:`v_i = \log_{x_i} T(x_i)` (the map's
    ``tangent``), and :math:`\frac{d}{dt} x_i(t)`, the geodesic's velocity, in
    :math:`T_{x_i(t)} M`: the RWEFM regression target. At :math:`t = 0` it is :math:`x`; at
    :math:`t = 1` it is :math:`T(x)`.

    Args:
      manifold: the manifold (static).
      x: ``[..., n, d]`` source points.
      tangent: ``[..., n, d]`` tangent vectors ``log_x T(x)``.
      t: time(s): a scalar; a vector over ``x``'s leading axis (``[B]``, one time per cloud
        of ``x [B, n, d]``, or ``[n]``, one per point of ``x [n, d]``); or an array of two
        or more axes broadcastable against ``[..., n, 1]`` by NumPy's rules without
        enlarging it (e.g. ``[B, 1, 1]``, or ``[n, 1]`` per point for every batch).

    Returns:
      ``(x_t, v_t)``, both ``[..., n, d]``.

    >>> from hexad.geometry import Euclidean
    >>> xt, vt = mccann_interpolation(Euclidean(1), jnp.zeros((1, 1)), jnp.ones((1, 1)), 0.25)
    >>> float(xt[0, 0]), float(vt[0, 0])
    (0.25, 1.0)
    """
    # Shapes are static: checked under jit too.
    shape = jnp.shape(x)
    if jnp.shape(tangent) != shape:
        raise ValueError(f"tangent: expected the shape of x {shape}, got {jnp.shape(tangent)}")
    t = jnp.asarray(t, jnp.result_type(x))
    target = shape[:-1] + (1,)
    leading = t.ndim == 1 and len(shape) > 1  # a vector over x's leading axis
    if leading:
        ok = t.shape[0] in (1, shape[0])
    else:  # NumPy's rules, right-aligned
        ok = t.ndim <= len(target) and all(
            a in (1, b) for a, b in zip(t.shape[::-1], target[::-1], strict=False)
        )
    if not ok:
        raise ValueError(
            f"t: expected a scalar, a vector over x's leading axis {shape[:1]} or a shape "
            f"broadcastable against {target} without enlarging it, got {t.shape}"
        )
    if not is_traced(t):
        tv = np.asarray(t)
        if not np.all(np.isfinite(tv)) or np.any(tv < 0) or np.any(tv > 1):
            raise ValueError(f"t: expected times in [0, 1], got values in [{tv.min()}, {tv.max()}]")
    if leading:
        t = jnp.reshape(t, t.shape + (1,) * (len(shape) - 1))
    else:  # pad on the left to x's rank (implicit rank promotion may be an error)
        t = jnp.reshape(t, (1,) * (len(shape) - t.ndim) + t.shape)
    return manifold.geodesic(x, tangent, t)


def sinkhorn_divergence(
    manifold: Manifold,
    x: Array,
    y: Array,
    a: Array | None = None,
    b: Array | None = None,
    *,
    epsilon: float = 0.01,
    max_iterations: int = 500,
    threshold: float = 1e-3,
    batch_size: int | None = None,
) -> Array:
    r"""Returns the debiased Sinkhorn divergence :math:`S_\varepsilon(a, b)` for the cost
    :math:`d_M^2`.

    .. math::

       S_\varepsilon(a, b) = \mathrm{OT}_\varepsilon(a, b)
         - \tfrac{1}{2} \big( \mathrm{OT}_\varepsilon(a, a) + \mathrm{OT}_\varepsilon(b, b) \big)

    (Feydy et al., arXiv:1810.08278), computed by ott-jax's ``sinkhorn_divergence`` on the
    three geodesic cost matrices (or, with ``batch_size``, on row-blocked point clouds with the
    :class:`SqGeodesic` cost). It tends to :math:`W_2^2` on :math:`M` as
    :math:`\varepsilon \to 0`.

    Args:
      manifold: the manifold (static).
      x: ``[n, d]`` and ``y``: ``[m, d]`` clouds; ``a``: ``[n]``, ``b``: ``[m]`` weights
        (default uniform; zeros mark padding).
      epsilon: entropic regularisation, ``> 0`` (absolute, static).
      max_iterations, threshold: Sinkhorn settings (static; ``>= 1`` and ``>= 0``).
      batch_size: ott's online (memory-bounded) geometry if set (static, ``>= 1``).

    >>> from hexad.geometry import Sphere
    >>> x = Sphere(3).random_uniform(jax.random.key(0), (32,))
    >>> abs(float(jax.jit(sinkhorn_divergence, static_argnums=0)(Sphere(3), x, x))) < 1e-4
    True
    """
    _validate_pair(manifold, x, y, a, b)
    # as EntropicMap does: a negative epsilon would otherwise give a plausible number
    check_settings(epsilon, None, max_iterations, threshold=threshold, batch_size=batch_size)
    n, m = x.shape[0], y.shape[0]
    dtype = jnp.result_type(x, y)
    a = jnp.full((n,), 1.0 / n, dtype) if a is None else a / jnp.sum(a)
    b = jnp.full((m,), 1.0 / m, dtype) if b is None else b / jnp.sum(b)
    with jax.numpy_rank_promotion("allow"):  # ott-jax relies on rank promotion internally
        kw = {"max_iterations": max_iterations, "threshold": threshold}
        if batch_size is None:
            pc = manifold.pairwise_sqdist
            div, _ = ott_sd.sinkhorn_divergence(
                ott_geometry.Geometry,
                pc(x, y),
                pc(x, x),
                pc(y, y),
                a=a,
                b=b,
                epsilon=epsilon,
                solve_kwargs=kw,
            )
        else:
            div, _ = ott_sd.sinkhorn_divergence(
                BlockedPointCloud,
                x,
                y,
                a=a,
                b=b,
                cost_fn=SqGeodesic(manifold),
                epsilon=epsilon,
                batch_size=batch_size,
                solve_kwargs=kw,
            )
    return div


def sinkhorn_w2(manifold: Manifold, x: Array, y: Array, a=None, b=None, **kwargs: Any) -> Array:
    r"""Returns :math:`\sqrt{\max(S_\varepsilon, 0)}`, the Sinkhorn-divergence estimate of
    :math:`W_2` on :math:`M`.

    Same arguments as :func:`sinkhorn_divergence`.

    >>> from hexad.geometry import Torus
    >>> x = Torus(2).random_uniform(jax.random.key(0), (32,))
    >>> float(jax.jit(sinkhorn_w2, static_argnums=0)(Torus(2), x, x)) < 1e-2
    True
    """
    div = sinkhorn_divergence(manifold, x, y, a, b, **kwargs)
    # ``div <= 0``, not ``~(div > 0)``: a NaN divergence must stay NaN, not read as W2 = 0.
    zero = div <= 0.0
    return jnp.where(zero, 0.0, jnp.sqrt(jnp.where(zero, 1.0, div)))


def _validate_pair(manifold: Manifold, x: Any, y: Any, a: Any, b: Any) -> None:
    check_points(manifold, x, "x", ndim=2)
    check_points(manifold, y, "y", ndim=2)
    if a is not None:
        check_weights(a, "a", (x.shape[0],))
    if b is not None:
        check_weights(b, "b", (y.shape[0],))
