"""Manifolds as static pytrees: Euclidean space, the sphere, the flat torus and products.

Every manifold is a ``flax.struct.dataclass`` whose fields are static, so it can be closed over
by a jitted function or passed through ``jit``/``vmap`` without becoming a traced value. Points
are arrays ``[..., dim]`` in the manifold's coordinates (ambient coordinates for the sphere,
angles in ``[-pi, pi)`` for the torus); all point-wise methods broadcast over leading axes.
Each class satisfies :class:`hexad._base.Manifold` structurally (it does not inherit from the
protocol, so a missing member fails ``isinstance`` instead of inheriting a stub).

The numerics follow the known traps: the sphere's distance uses ``2 atan2(|x-y|, |x+y|)``
(accurate at small angles and near antipodes), the sphere's ``log`` divides by ``|y - <x,y>x|``
through a safe ratio (zero at ``y = x`` and at an exact antipode, where the direction is not
unique), and torus differences are wrapped into ``[-pi, pi)`` before anything else.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import struct

from hexad._base import Manifold, check_int, is_traced

__all__ = [
    "Euclidean",
    "Product",
    "Sphere",
    "Torus",
    "wrap_angle",
]

Array = jax.Array


def wrap_angle(a: Array) -> Array:
    r"""Returns ``a`` wrapped into :math:`[-\pi, \pi)`.

    >>> float(wrap_angle(jnp.float32(3 * math.pi / 2)))  # doctest: +ELLIPSIS
    -1.57...
    """
    return jnp.mod(a + math.pi, 2.0 * math.pi) - math.pi


def _safe_sqrt(sq: Array) -> Array:
    """``sqrt(max(sq, 0))`` with a finite gradient (zero) at ``sq <= 0`` (double-where trick).

    The guard tests ``sq <= 0`` rather than ``sq > 0`` so that a NaN takes the ``sqrt``
    branch and propagates: a NaN compares False, and ``where(sq > 0, ..., 0)`` would turn it
    into a valid-looking zero.
    """
    zero = sq <= 0.0
    return jnp.where(zero, 0.0, jnp.sqrt(jnp.where(zero, 1.0, sq)))


def _safe_norm(v: Array, axis: int = -1, keepdims: bool = False) -> Array:
    """Euclidean norm with a finite gradient (zero) at ``v = 0``; NaN and inf propagate."""
    return _safe_sqrt(jnp.sum(v * v, axis=axis, keepdims=keepdims))


def _sinc(x: Array) -> Array:
    """``sin(x) / x`` with its Taylor series near 0 (finite value and gradient)."""
    small = jnp.abs(x) < 1e-3
    xs = jnp.where(small, 1.0, x)
    return jnp.where(small, 1.0 - x * x / 6.0, jnp.sin(xs) / xs)


def _asin_core(z: Array, r: Array) -> Array:
    """``asin(r)`` for ``0 <= r <= 1/2``, ``z = r^2``: Cephes' float32 minimax polynomial."""
    p = 4.2163199048e-2
    for coef in (2.4181311049e-2, 4.5470025998e-2, 7.4953002686e-2, 1.6666752422e-1):
        p = p * z + coef
    return r + r * z * p


def fast_arccos(c: Array) -> Array:
    """``arccos(c)`` for ``c`` in ``[-1, 1]`` from sqrt and a polynomial (no atan2).

    XLA's CPU ``acos`` goes through ``atan2``, which is not vectorised: on a ``[1024, 1024]``
    block it costs about ten ``exp`` passes and was most of the sphere's cost-matrix time.
    This is the Cephes ``asinf`` reduction (``|c| <= 1/2`` directly, else
    ``arccos(c) = 2 asin(sqrt((1 - |c|) / 2))`` reflected for ``c < 0``), accurate to a few
    float32 ulps and exact in its small-angle branch (no ``1 - cos`` cancellation beyond the
    input's own).

    >>> round(float(fast_arccos(jnp.float32(0.5))), 6)
    1.047198
    """
    a = jnp.abs(c)
    half = jnp.asarray(0.5, c.dtype)
    z_big = half * (1.0 - a)
    s = jnp.sqrt(z_big)
    big = 2.0 * _asin_core(z_big, s)  # arccos(|c|) for |c| > 1/2
    big = jnp.where(c < 0, jnp.pi - big, big)
    small = 0.5 * jnp.pi - _asin_core(c * c, c)  # |c| <= 1/2
    return jnp.where(a > half, big, small)


def _dot(x: Array, y: Array) -> Array:
    return jnp.sum(x * y, axis=-1, keepdims=True)


def _check_mean_args(m: Manifold, x: Array, w: Array) -> None:
    """Raises a ValueError naming the argument unless ``x`` is ``[n, m.dim]`` and ``w`` ``[n]``
    (static shapes only, so it also runs under a trace)."""
    if jnp.ndim(x) != 2 or jnp.shape(x)[-1] != m.dim:
        raise ValueError(f"x: expected points of shape [n, {m.dim}], got shape {jnp.shape(x)}")
    if jnp.shape(w) != jnp.shape(x)[:1]:
        raise ValueError(f"w: expected weights of shape {jnp.shape(x)[:1]}, got {jnp.shape(w)}")


def _normalise(w: Array) -> Array:
    return w / jnp.sum(w)


def _check_dim(m, lo: int) -> None:
    """Raises a ValueError unless ``m.dim`` is an int ``>= lo`` (stores it as a Python int).

    Runs in ``__post_init__``, also when jax rebuilds the manifold from its (static) tree
    structure; ``dim`` is never a leaf, so it is a Python value there too. A tracer (only a
    misuse could put one there) is left for jax to reject.
    """
    if is_traced(m.dim):
        return
    # frozen dataclass: a NumPy int is stored as int so that equal manifolds hash equally
    object.__setattr__(m, "dim", check_int("dim", m.dim, lo))


# --------------------------------------------------------------------------------------------
# Euclidean space
# --------------------------------------------------------------------------------------------


@struct.dataclass
class Euclidean:
    r"""Euclidean space :math:`\mathbb{R}^{\mathrm{dim}}`.

    Attributes:
      dim: the dimension (static), an int ``>= 1``.

    >>> m = Euclidean(2)
    >>> m.exp(jnp.zeros(2), jnp.ones(2)).tolist()
    [1.0, 1.0]
    """

    dim: int = struct.field(pytree_node=False)

    def __post_init__(self) -> None:
        _check_dim(self, 1)

    @property
    def intrinsic_dim(self) -> int:
        return self.dim

    def exp(self, x: Array, v: Array) -> Array:
        return x + v

    def log(self, x: Array, y: Array) -> Array:
        return y - x

    def sqdist(self, x: Array, y: Array) -> Array:
        d = y - x
        return jnp.sum(d * d, axis=-1)

    def dist(self, x: Array, y: Array) -> Array:
        return _safe_norm(y - x)

    def inner(self, x: Array, u: Array, v: Array) -> Array:
        del x
        return jnp.sum(u * v, axis=-1)

    def proj_tangent(self, x: Array, v: Array) -> Array:
        del x
        return v

    def proj(self, x: Array) -> Array:
        return x

    def manifold_error(self, x: Array) -> Array:
        return jnp.zeros(x.shape[:-1], x.dtype)

    def features(self, x: Array) -> Array:
        """Returns the coordinates ``x`` (a network's input features)."""
        return x

    def geodesic(self, x: Array, v: Array, t: Array) -> tuple[Array, Array]:
        return x + t * v, v

    def pairwise_sqdist(self, x: Array, y: Array) -> Array:
        nx = jnp.sum(x * x, axis=-1)[:, None]
        ny = jnp.sum(y * y, axis=-1)[None, :]
        return jnp.maximum(nx + ny - 2.0 * (x @ y.T), 0.0)

    def weighted_log(self, x: Array, w: Array, y: Array, sqdist: Array | None = None) -> Array:
        del sqdist
        return w @ y - jnp.sum(w, axis=-1, keepdims=True) * x

    def mean(self, x: Array, w: Array) -> Array:
        """Returns the weighted mean ``[dim]`` of ``x [n, dim]`` (weights ``w [n] >= 0``,
        normalised here).

        >>> Euclidean(1).mean(jnp.array([[0.0], [3.0]]), jnp.array([2.0, 1.0])).tolist()
        [1.0]
        """
        _check_mean_args(self, x, w)
        return self.proj(_normalise(w) @ x)

    def random_normal(
        self, key: Array, mean: Array, scale: Array | float, shape: tuple[int, ...] = ()
    ) -> Array:
        r"""Returns samples :math:`\text{mean} + \text{scale} \cdot \mathcal{N}(0, I)`,
        ``[*shape, dim]``."""
        z = jax.random.normal(key, (*shape, self.dim), jnp.result_type(mean, jnp.float32))
        return jnp.broadcast_to(mean, z.shape) + scale * z


# --------------------------------------------------------------------------------------------
# Sphere
# --------------------------------------------------------------------------------------------


@struct.dataclass
class Sphere:
    r"""The unit sphere :math:`S^{\mathrm{dim}-1}` in :math:`\mathbb{R}^{\mathrm{dim}}` with its
    round metric.

    Attributes:
      dim: the ambient dimension (static), an int ``>= 2``; ``Sphere(3)`` is :math:`S^2`.

    >>> s = Sphere(3)
    >>> x, y = jnp.array([1.0, 0, 0]), jnp.array([0.0, 1, 0])
    >>> round(float(s.dist(x, y)), 4)  # pi / 2
    1.5708
    """

    dim: int = struct.field(pytree_node=False)

    def __post_init__(self) -> None:
        _check_dim(self, 2)

    @property
    def intrinsic_dim(self) -> int:
        return self.dim - 1

    def proj(self, x: Array) -> Array:
        r"""Returns :math:`x / \|x\|` (the nearest point on the sphere)."""
        return x / jnp.maximum(_safe_norm(x, keepdims=True), 1e-30)

    def proj_tangent(self, x: Array, v: Array) -> Array:
        return v - _dot(x, v) * x

    def inner(self, x: Array, u: Array, v: Array) -> Array:
        del x
        return jnp.sum(u * v, axis=-1)

    def manifold_error(self, x: Array) -> Array:
        return jnp.abs(_safe_norm(x) - 1.0)

    def features(self, x: Array) -> Array:
        """Returns the coordinates ``x`` (a network's input features)."""
        return x

    def exp(self, x: Array, v: Array) -> Array:
        r"""Returns :math:`\cos\|v\|\, x + \sin\|v\|\, v / \|v\|`, renormalised so points
        stay on the sphere."""
        nv = _safe_norm(v, keepdims=True)
        return self.proj(jnp.cos(nv) * x + _sinc(nv) * v)

    def log(self, x: Array, y: Array) -> Array:
        r"""Returns :math:`\theta\, u / \|u\|` with :math:`u = y - \langle x, y \rangle x` and
        :math:`\theta` the angle between :math:`x` and :math:`y`; zero at :math:`y = x` and at
        an antipode."""
        c = _dot(x, y)
        u = y - c * x
        nu = _safe_norm(u, keepdims=True)
        theta = jnp.arctan2(nu, c)
        zero = nu == 0.0  # not ``~(nu > 0)``: a NaN must take the division and propagate
        return jnp.where(zero, 0.0, theta / jnp.where(zero, 1.0, nu)) * u

    def dist(self, x: Array, y: Array) -> Array:
        a, b = _safe_norm(x - y), _safe_norm(x + y)
        # atan2(inf, inf) = pi/4: an infinite coordinate would give a plausible pi/2.
        return jnp.where(jnp.isinf(a) | jnp.isinf(b), jnp.nan, 2.0 * jnp.arctan2(a, b))

    def sqdist(self, x: Array, y: Array) -> Array:
        return jnp.square(self.dist(x, y))

    def geodesic(self, x: Array, v: Array, t: Array) -> tuple[Array, Array]:
        r"""Point and velocity of :math:`s \mapsto \exp_x(s v)` at :math:`s = t`."""
        nv = _safe_norm(v, keepdims=True)
        a = t * nv
        xt = self.proj(jnp.cos(a) * x + t * _sinc(a) * v)
        vt = jnp.cos(a) * v - nv * jnp.sin(a) * x
        return xt, self.proj_tangent(xt, vt)

    def _cos_theta(self, x: Array, y: Array) -> tuple[Array, Array]:
        # Clipping one float32 ulp inside [-1, 1] keeps arccos's gradient finite where points
        # coincide (ott-jax differentiates the cost for DualPotentials.transport).
        c = _clip_cos(x @ y.T)
        return c, fast_arccos(c)

    def pairwise_sqdist(self, x: Array, y: Array) -> Array:
        return jnp.square(self._cos_theta(x, y)[1])

    def weighted_log(self, x: Array, w: Array, y: Array, sqdist: Array | None = None) -> Array:
        # log_x(y) = s (y - c x) with s = theta / sin(theta): two matmuls, no [n, m, dim].
        # ``sqdist`` (this manifold's pairwise_sqdist(x, y), e.g. the OT cost already computed)
        # saves the arccos pass.
        if sqdist is None:
            c, theta = self._cos_theta(x, y)
        else:
            c = _clip_cos(x @ y.T)
            theta = jnp.sqrt(sqdist)
        s = theta / jnp.sqrt(1.0 - c * c)
        ws = w * s
        out = ws @ y - jnp.sum(ws * c, axis=-1, keepdims=True) * x
        return self.proj_tangent(x, out)

    def mean(self, x: Array, w: Array) -> Array:
        """Returns the extrinsic mean ``[dim]``: the weighted average of ``x [n, dim]`` (weights
        ``w [n] >= 0``, normalised here) projected onto the sphere.

        Where the average is the origin (e.g. two antipodes of equal weight) no point is
        nearest and the result is the zero vector, off the sphere.

        >>> x = jnp.array([[0.6, 0.0, 0.8], [-0.6, 0.0, 0.8]])
        >>> Sphere(3).mean(x, jnp.ones(2)).round(4).tolist()
        [0.0, 0.0, 1.0]
        """
        _check_mean_args(self, x, w)
        return self.proj(_normalise(w) @ x)

    def random_uniform(self, key: Array, shape: tuple[int, ...] = ()) -> Array:
        """Uniform samples ``[*shape, dim]`` (normalised Gaussians)."""
        return self.proj(jax.random.normal(key, (*shape, self.dim)))

    def random_normal(
        self, key: Array, mean: Array, scale: Array | float, shape: tuple[int, ...] = ()
    ) -> Array:
        r"""Wrapped normal samples
        :math:`\exp_{\text{mean}}(P_{\text{mean}}(\text{scale} \cdot \mathcal{N}(0, I)))`,
        ``[*shape, dim]``, with :math:`P` the tangent projection."""
        z = scale * jax.random.normal(key, (*shape, self.dim), jnp.result_type(mean, jnp.float32))
        mean = jnp.broadcast_to(mean, z.shape)
        return self.exp(mean, self.proj_tangent(mean, z))

    def random_vmf(
        self, key: Array, mu: Array, kappa: Array | float, shape: tuple[int, ...] = ()
    ) -> Array:
        """Von Mises-Fisher samples ``[*shape, dim]`` with mean direction ``mu`` ``[dim]``.

        Wood's (1994) method: the cosine ``w`` to ``mu`` is drawn exactly (inverse CDF on
        :math:`S^2`, rejection sampling with a ``lax.while_loop`` otherwise), the direction
        orthogonal to ``mu`` uniformly.

        Args:
          key: PRNG key.
          mu: ``[dim]`` unit mean direction.
          kappa: concentration ``>= 0`` (scalar).
          shape: leading shape of the samples (static).
        """
        kw, kv = jax.random.split(key)
        n = math.prod(shape)
        kappa = jnp.asarray(kappa, jnp.float32)
        if self.dim == 3:
            u = jax.random.uniform(kw, (n,), minval=1e-12, maxval=1.0)
            # w = 1 + log(u + (1-u) e^{-2k}) / k, written with log1p/expm1 for large kappa.
            kap = jnp.maximum(kappa, 1e-6)
            w = 1.0 + jnp.logaddexp(jnp.log(u), jnp.log1p(-u) - 2.0 * kap) / kap
            w = jnp.where(kappa < 1e-6, 2.0 * u - 1.0, w)
        else:
            w = jax.vmap(lambda k: _wood_w(k, kappa, self.dim))(jax.random.split(kw, n))
        w = jnp.clip(w, -1.0, 1.0)
        v = jax.random.normal(kv, (n, self.dim))
        mu = jnp.broadcast_to(mu, v.shape)
        v = self.proj(self.proj_tangent(mu, v))
        x = w[:, None] * mu + jnp.sqrt(jnp.maximum(1.0 - w * w, 0.0))[:, None] * v
        return self.proj(x).reshape(*shape, self.dim)


def _clip_cos(c: Array) -> Array:
    """Cosines clipped one ulp inside ``[-1, 1]``; NaN stays NaN and +-inf becomes NaN.

    ``clip`` alone would map an infinite inner product (an infinite coordinate) to ``1 - eps``,
    a plausible near-zero distance.
    """
    eps = jnp.finfo(c.dtype).eps
    return jnp.where(jnp.isinf(c), jnp.nan, jnp.clip(c, -1.0 + eps, 1.0 - eps))


def _wood_w(key: Array, kappa: Array, dim: int) -> Array:
    """Wood's rejection sampler for the vMF cosine on ``S^{dim-1}``."""
    m1 = dim - 1.0
    b = m1 / (2.0 * kappa + jnp.sqrt(4.0 * kappa**2 + m1**2))
    x0 = (1.0 - b) / (1.0 + b)
    c = kappa * x0 + m1 * jnp.log(1.0 - x0 * x0)

    def cond(state):
        return ~state[2]

    def body(state):
        k, _, _ = state
        k, kb, ku = jax.random.split(k, 3)
        z = jax.random.beta(kb, m1 / 2.0, m1 / 2.0)
        u = jax.random.uniform(ku)
        w = (1.0 - (1.0 + b) * z) / (1.0 - (1.0 - b) * z)
        # ``~(lhs < log u)``, not ``lhs >= log u``: a NaN (NaN kappa) must end the loop, with
        # a NaN ``w``, instead of being rejected forever.
        ok = ~(kappa * w + m1 * jnp.log(1.0 - x0 * w) - c < jnp.log(u))
        return k, w, ok

    return jax.lax.while_loop(cond, body, (key, jnp.float32(0.0), jnp.bool_(False)))[1]


# --------------------------------------------------------------------------------------------
# Flat torus
# --------------------------------------------------------------------------------------------


@struct.dataclass
class Torus:
    r"""The flat torus of dimension ``dim``: points are angles, one per axis, in
    :math:`[-\pi, \pi)`.

    :math:`T^{\mathrm{dim}} = (\mathbb{R} / 2 \pi \mathbb{Z})^{\mathrm{dim}}`.

    Attributes:
      dim: number of angles (static), an int ``>= 1``; ``Torus(2)`` holds Ramachandran
        (phi, psi) pairs.

    >>> t = Torus(1)
    >>> round(float(t.log(jnp.array([3.0]), jnp.array([-3.0]))[0]), 4)  # across the seam
    0.2832
    """

    dim: int = struct.field(pytree_node=False)

    def __post_init__(self) -> None:
        _check_dim(self, 1)

    @property
    def intrinsic_dim(self) -> int:
        return self.dim

    def proj(self, x: Array) -> Array:
        return wrap_angle(x)

    def proj_tangent(self, x: Array, v: Array) -> Array:
        del x
        return v

    def inner(self, x: Array, u: Array, v: Array) -> Array:
        del x
        return jnp.sum(u * v, axis=-1)

    def manifold_error(self, x: Array) -> Array:
        over = jnp.maximum(jnp.abs(x + 0.0) - math.pi, 0.0)
        return jnp.max(over, axis=-1)

    def features(self, x: Array) -> Array:
        r"""Returns ``[..., 2 dim]`` :math:`(\cos x, \sin x)`: smooth, periodic coordinates."""
        return jnp.concatenate([jnp.cos(x), jnp.sin(x)], axis=-1)

    def exp(self, x: Array, v: Array) -> Array:
        return wrap_angle(x + v)

    def log(self, x: Array, y: Array) -> Array:
        return wrap_angle(y - x)

    def sqdist(self, x: Array, y: Array) -> Array:
        d = wrap_angle(y - x)
        return jnp.sum(d * d, axis=-1)

    def dist(self, x: Array, y: Array) -> Array:
        return _safe_norm(wrap_angle(y - x))

    def geodesic(self, x: Array, v: Array, t: Array) -> tuple[Array, Array]:
        return wrap_angle(x + t * v), v

    def pairwise_sqdist(self, x: Array, y: Array) -> Array:
        # One [n, m] block per angle keeps memory at n*m instead of n*m*dim.
        out = 0.0
        for k in range(self.dim):
            d = wrap_angle(y[None, :, k] - x[:, k, None])
            out = out + d * d
        return out

    def weighted_log(self, x: Array, w: Array, y: Array, sqdist: Array | None = None) -> Array:
        del sqdist
        cols = [
            jnp.sum(w * wrap_angle(y[None, :, k] - x[:, k, None]), axis=-1) for k in range(self.dim)
        ]
        return jnp.stack(cols, axis=-1)

    def mean(self, x: Array, w: Array) -> Array:
        r"""Returns the circular mean ``[dim]`` of angles ``x [n, dim]``, per angle:
        :math:`\operatorname{atan2}(\sum_i w_i \sin x_i, \sum_i w_i \cos x_i)` (weights
        ``w [n] >= 0``, normalised here), in :math:`[-\pi, \pi]`.

        It is the extrinsic mean on the circle, unaffected by the seam at ``+-pi``; where the
        weighted unit vectors cancel (e.g. uniform angles) it is 0.

        >>> x = jnp.array([[3.0], [-3.0]])  # both near the seam
        >>> round(abs(float(Torus(1).mean(x, jnp.ones(2))[0])), 4)  # pi, not 0
        3.1416
        """
        _check_mean_args(self, x, w)
        w = _normalise(w)
        return jnp.arctan2(w @ jnp.sin(x), w @ jnp.cos(x))

    def random_uniform(self, key: Array, shape: tuple[int, ...] = ()) -> Array:
        r"""Uniform angles ``[*shape, dim]`` in :math:`[-\pi, \pi)`."""
        return jax.random.uniform(key, (*shape, self.dim), minval=-math.pi, maxval=math.pi)

    def random_normal(
        self, key: Array, mean: Array, scale: Array | float, shape: tuple[int, ...] = ()
    ) -> Array:
        r"""Wrapped normal samples
        :math:`\operatorname{wrap}(\text{mean} + \text{scale} \cdot \mathcal{N}(0, I))`,
        ``[*shape, dim]``."""
        z = jax.random.normal(key, (*shape, self.dim), jnp.result_type(mean, jnp.float32))
        return wrap_angle(jnp.broadcast_to(mean, z.shape) + scale * z)


# --------------------------------------------------------------------------------------------
# Products
# --------------------------------------------------------------------------------------------


@struct.dataclass
class Product:
    r"""The product :math:`M_1 \times \dots \times M_k`; a point concatenates the factors'
    coordinates.

    Attributes:
      factors: a non-empty tuple of manifolds (static; a list is stored as a tuple).

    >>> p = Product((Sphere(3), Torus(2)))
    >>> p.dim, p.intrinsic_dim
    (5, 4)
    """

    factors: tuple[Manifold, ...] = struct.field(pytree_node=False)

    def __post_init__(self) -> None:
        factors = self.factors
        if isinstance(factors, list):  # a static field must hash: store a tuple
            factors = tuple(factors)
            object.__setattr__(self, "factors", factors)
        if not isinstance(factors, tuple) or not factors:
            raise ValueError(f"factors: expected a non-empty tuple of manifolds, got {factors!r}")
        for i, f in enumerate(factors):
            if not isinstance(f, Manifold):
                raise TypeError(f"factors[{i}]: expected a manifold, got {type(f).__name__}")

    @property
    def dim(self) -> int:
        return sum(f.dim for f in self.factors)

    @property
    def intrinsic_dim(self) -> int:
        return sum(f.intrinsic_dim for f in self.factors)

    def _split(self, x: Array) -> list[Array]:
        out, start = [], 0
        for f in self.factors:
            out.append(x[..., start : start + f.dim])
            start += f.dim
        return out

    def _map(self, name: str, *arrays: Array) -> Array:
        parts = zip(*(self._split(a) for a in arrays), strict=True)
        return jnp.concatenate(
            [getattr(f, name)(*p) for f, p in zip(self.factors, parts, strict=True)], axis=-1
        )

    def _sum(self, name: str, *arrays: Array) -> Array:
        parts = zip(*(self._split(a) for a in arrays), strict=True)
        return sum(getattr(f, name)(*p) for f, p in zip(self.factors, parts, strict=True))

    def exp(self, x: Array, v: Array) -> Array:
        return self._map("exp", x, v)

    def log(self, x: Array, y: Array) -> Array:
        return self._map("log", x, y)

    def proj(self, x: Array) -> Array:
        return self._map("proj", x)

    def proj_tangent(self, x: Array, v: Array) -> Array:
        return self._map("proj_tangent", x, v)

    def sqdist(self, x: Array, y: Array) -> Array:
        return self._sum("sqdist", x, y)

    def dist(self, x: Array, y: Array) -> Array:
        return _safe_sqrt(self.sqdist(x, y))

    def inner(self, x: Array, u: Array, v: Array) -> Array:
        return self._sum("inner", x, u, v)

    def manifold_error(self, x: Array) -> Array:
        errs = [f.manifold_error(p) for f, p in zip(self.factors, self._split(x), strict=True)]
        return jnp.max(jnp.stack(errs, axis=-1), axis=-1)

    def features(self, x: Array) -> Array:
        """Returns the factors' features, concatenated."""
        parts = zip(self.factors, self._split(x), strict=True)
        return jnp.concatenate([f.features(p) for f, p in parts], axis=-1)

    def geodesic(self, x: Array, v: Array, t: Array) -> tuple[Array, Array]:
        pts, vels = [], []
        for f, xp, vp in zip(self.factors, self._split(x), self._split(v), strict=True):
            a, b = f.geodesic(xp, vp, t)
            pts.append(a)
            vels.append(b)
        return jnp.concatenate(pts, axis=-1), jnp.concatenate(vels, axis=-1)

    def pairwise_sqdist(self, x: Array, y: Array) -> Array:
        return self._sum("pairwise_sqdist", x, y)

    def weighted_log(self, x: Array, w: Array, y: Array, sqdist: Array | None = None) -> Array:
        del sqdist  # the factors recompute their own costs
        parts = [
            f.weighted_log(xp, w, yp)
            for f, xp, yp in zip(self.factors, self._split(x), self._split(y), strict=True)
        ]
        return jnp.concatenate(parts, axis=-1)

    def mean(self, x: Array, w: Array) -> Array:
        """Returns the factor-wise mean ``[dim]`` of ``x [n, dim]``: each factor's own ``mean``
        of its coordinates with the same weights ``w [n] >= 0``.

        >>> p = Product((Euclidean(1), Torus(1)))
        >>> m = p.mean(jnp.array([[1.0, 3.0], [3.0, -3.0]]), jnp.ones(2))
        >>> [round(float(v), 4) for v in m]
        [2.0, 3.1416]
        """
        _check_mean_args(self, x, w)
        return jnp.concatenate(
            [f.mean(xp, w) for f, xp in zip(self.factors, self._split(x), strict=True)], axis=-1
        )

    def random_uniform(self, key: Array, shape: tuple[int, ...] = ()) -> Array:
        keys = jax.random.split(key, len(self.factors))
        return jnp.concatenate(
            [f.random_uniform(k, shape) for f, k in zip(self.factors, keys, strict=True)],
            axis=-1,
        )

    def random_normal(
        self, key: Array, mean: Array, scale: Array | float, shape: tuple[int, ...] = ()
    ) -> Array:
        keys = jax.random.split(key, len(self.factors))
        return jnp.concatenate(
            [
                f.random_normal(k, m, scale, shape)
                for f, k, m in zip(self.factors, keys, self._split(mean), strict=True)
            ],
            axis=-1,
        )
