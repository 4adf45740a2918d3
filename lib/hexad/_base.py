"""The shapes every hexad package shares: states, algorithms, the mesh convention, checks.

This module plays the part ``blackjax/base.py`` and ``optax/_src/base.py`` play in those
libraries: a method package builds on these names instead of defining its own.

- :class:`TrainState` ``(params, opt_state, step)``: the state of every gradient trainer.
- :class:`Algorithm` ``(init, step)``: what a trainer factory returns, with one contract,
  ``init(key, example_batch) -> State`` and ``step(key, state, batch) -> (State, Info)``.
- The mesh convention: a function that can shard takes ``mesh: Mesh | None = None`` and
  ``axis: str = DATA_AXIS``; it splits the leading dimension of its batch (or chains) along
  ``axis`` and lets XLA propagate the rest (see :mod:`hexad.sharding`).
- The boundary checks :func:`check_int`, :func:`check_positive`, :func:`check_unit` and
  :func:`is_traced`: one wording of "expected ..., got ..." across the packages.
- The mixed-precision convention: a network module takes ``dtype`` (flax's compute dtype;
  ``None`` computes in the parameters' dtype) while its parameters stay float32; its head and
  its outputs are computed in :func:`head_dtype` of it, so ``jnp.bfloat16`` blocks feed a
  float32 head, loss and optimiser.
- :class:`Manifold`: the protocol the manifolds of :mod:`hexad.geometry` satisfy, used in
  signatures instead of ``Any``.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "DATA_AXIS",
    "Algorithm",
    "Manifold",
    "TrainState",
    "check_finite",
    "check_int",
    "check_positive",
    "check_unit",
    "head_dtype",
    "is_traced",
]

DATA_AXIS = "data"
"""The default name of the mesh axis that splits a batch or a set of chains."""


class TrainState(NamedTuple):
    """The state of a gradient trainer.

    Attributes:
      params: the trained parameters (a pytree).
      opt_state: the optax state of ``params``.
      step: ``[]`` int32, the number of updates taken.
    """

    params: Any
    opt_state: Any
    step: Any


class Algorithm(NamedTuple):
    """A trainer or sampler: two pure functions closed over static settings.

    A factory takes everything that decides shapes or control flow (sizes, flags, networks,
    optimisers, numbers of steps) and returns this pair. Neither function keeps state of its
    own, so the user decides how to run ``step``: jit it, vmap it over seeds, scan it over
    minibatches.

    Attributes:
      init: ``init(key, example_batch) -> State``; the batch gives shapes only.
      step: ``step(key, state, batch) -> (State, Info)``; states and infos are pytrees
        (in hexad, ``typing.NamedTuple`` instances).

    A least-squares trainer in this shape, with a :class:`TrainState`:

    >>> import jax.numpy as jnp, optax
    >>> def least_squares(lr):
    ...     opt = optax.sgd(lr)
    ...     def init(key, batch):
    ...         w = jnp.zeros(batch[0].shape[-1])
    ...         return TrainState(w, opt.init(w), jnp.zeros((), jnp.int32))
    ...     def step(key, state, batch):
    ...         x, y = batch
    ...         loss, g = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(state.params)
    ...         updates, opt_state = opt.update(g, state.opt_state)
    ...         w = optax.apply_updates(state.params, updates)
    ...         return TrainState(w, opt_state, state.step + 1), {"loss": loss}
    ...     return Algorithm(init, step)
    >>> algo = least_squares(0.5)
    >>> batch = (jnp.eye(2), jnp.array([1.0, -1.0]))
    >>> state = algo.init(jax.random.key(0), batch)
    >>> step = jax.jit(algo.step)
    >>> for i in range(40):
    ...     state, info = step(jax.random.key(i), state, batch)
    >>> int(state.step), state.params.round(3).tolist()
    (40, [1.0, -1.0])
    """

    init: Callable[..., Any]
    step: Callable[..., tuple[Any, Any]]


def is_traced(x: Any) -> bool:
    """Returns whether ``x`` is a JAX tracer (its value is unknown at this point).

    >>> is_traced(1.0), jax.jit(lambda v: is_traced(v) + 0)(1.0).item()
    (False, 1)
    """
    return isinstance(x, jax.core.Tracer)


def check_finite(name: str, x: Any, what: str = "values") -> None:
    """Raises a ValueError naming ``name`` if the concrete array ``x`` holds NaN or inf.

    A traced ``x`` is not checked (its values are unknown). NumPy reads the value, so ``x``
    may be a concrete array closed over by a traced function, where a jnp reduction would be
    traced. Integer arrays are always finite.

    >>> check_finite("u", np.ones(2))
    >>> check_finite("u", np.array([1.0, np.nan]))
    Traceback (most recent call last):
    ...
    ValueError: u: expected finite values, got NaN or inf
    """
    if is_traced(x):
        return
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        # a jax.distributed job's global array: reduced where its shards are (every process
        # gets the same answer), as no process can read the whole of it
        bad = jnp.issubdtype(x.dtype, jnp.inexact) and not bool(_all_finite(x))
    else:
        values = np.asarray(x)
        bad = np.issubdtype(values.dtype, np.inexact) and not np.all(np.isfinite(values))
    if bad:
        raise ValueError(f"{name}: expected finite {what}, got NaN or inf")


@jax.jit
def _all_finite(x: jax.Array) -> jax.Array:
    return jnp.all(jnp.isfinite(x))


def head_dtype(dtype: Any) -> Any:
    """Returns the dtype a network's head and outputs compute in for compute dtype ``dtype``.

    ``None`` stays ``None`` (the parameters' dtype); a narrower float is widened to float32.

    >>> import jax.numpy as jnp
    >>> head_dtype(None), head_dtype(jnp.bfloat16).__name__, head_dtype(jnp.float32).__name__
    (None, 'float32', 'float32')
    """
    if dtype is None:
        return None
    return np.promote_types(dtype, np.float32).type


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def check_int(name: str, value: Any, lo: int = 1, hi: int | None = None) -> int:
    """Returns ``int(value)`` or raises a ValueError naming ``name``.

    Accepts Python and NumPy integers (not ``bool``, not floats) in ``[lo, hi]``.

    >>> check_int("n_steps", 3)
    3
    >>> check_int("n_steps", 0)
    Traceback (most recent call last):
    ...
    ValueError: n_steps: expected an int >= 1, got 0
    """
    if hi is None:
        expected = f"an int >= {lo}"
    else:
        expected = f"an int in [{lo}, {hi}]"
    if not _is_int(value) or value < lo or (hi is not None and value > hi):
        raise ValueError(f"{name}: expected {expected}, got {value!r}")
    return int(value)


def _as_real(name: str, value: Any, expected: str) -> float:
    # Python and NumPy reals, and concrete 0-d arrays of a real dtype (NumPy or JAX).
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name}: expected {expected}, got {value!r}")
    if isinstance(value, numbers.Real):
        return float(value)
    dtype = getattr(value, "dtype", None)
    if np.ndim(value) == 0 and dtype is not None and np.issubdtype(dtype, np.number):
        if not np.issubdtype(dtype, np.complexfloating):
            return float(value)
    raise ValueError(f"{name}: expected {expected}, got {value!r}")


def check_positive(name: str, value: Any, *, allow_zero: bool = False) -> float:
    """Returns ``float(value)`` or raises a ValueError naming ``name``.

    Accepts a finite real number ``> 0`` (``>= 0`` with ``allow_zero``): a Python or NumPy
    scalar or a 0-d array. A traced value (inside a user's ``jit``) is returned unchecked.

    >>> check_positive("lr", 1e-3)
    0.001
    >>> check_positive("lr", float("nan"))
    Traceback (most recent call last):
    ...
    ValueError: lr: expected a finite number > 0, got nan
    """
    if is_traced(value):
        return value
    expected = f"a finite number {'>=' if allow_zero else '>'} 0"
    v = _as_real(name, value, expected)
    if not np.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise ValueError(f"{name}: expected {expected}, got {value!r}")
    return v


def check_unit(name: str, value: Any, *, lo_open: bool = True, hi_open: bool = True) -> float:
    """Returns ``float(value)`` or raises a ValueError naming ``name``.

    Accepts a real number in the unit interval, open at the ends marked open (by default
    ``(0, 1)``; ``lo_open=False, hi_open=False`` gives ``[0, 1]``). A traced value is returned
    unchecked.

    >>> check_unit("tau", 1.0, hi_open=False)
    1.0
    >>> check_unit("expectile", 1.0)
    Traceback (most recent call last):
    ...
    ValueError: expectile: expected a value in (0, 1), got 1.0
    """
    if is_traced(value):
        return value
    interval = f"{'(' if lo_open else '['}0, 1{')' if hi_open else ']'}"
    expected = f"a value in {interval}"
    v = _as_real(name, value, expected)
    ok_lo = v > 0 if lo_open else v >= 0
    ok_hi = v < 1 if hi_open else v <= 1
    if not (ok_lo and ok_hi):
        raise ValueError(f"{name}: expected {expected}, got {value!r}")
    return v


@runtime_checkable
class Manifold(Protocol):
    r"""What hexad's code asks of a manifold :math:`M`: the members below, nothing else.

    The manifolds of :mod:`hexad.geometry` (``Euclidean``, ``Sphere``, ``Torus``, ``Product``)
    satisfy it structurally, and so does a user's own class with these members;
    ``isinstance(m, Manifold)`` checks that they are present (not their signatures). Points
    ``x, y`` are ``[..., dim]`` arrays in the manifold's coordinates, ``u, v`` tangent vectors
    at ``x`` of the same shape; point-wise members broadcast over the leading axes. hexad's
    manifolds are static pytrees (``flax.struct`` dataclasses whose fields are all static), so
    one can be closed over by, or passed to, a jitted function. Compact manifolds also have
    ``random_uniform(key, shape=()) -> [*shape, dim]``; :math:`\mathbb{R}^d` has none.

    Attributes:
      dim: the number of coordinates of a point (static).

    >>> from hexad.geometry import Sphere, Torus
    >>> isinstance(Sphere(3), Manifold), isinstance(Torus(2), Manifold), isinstance(3, Manifold)
    (True, True, False)
    """

    dim: int

    @property
    def intrinsic_dim(self) -> int:
        """The manifold's dimension (``dim - 1`` for the sphere in ``dim`` coordinates)."""

    def exp(self, x, v):
        r"""Returns the exponential map :math:`\exp_x(v)`, ``[..., dim]``: the point reached
        at time 1 by the geodesic from ``x`` with velocity ``v``."""

    def log(self, x, y):
        r"""Returns the logarithm map :math:`\log_x(y) \in T_x M`, ``[..., dim]``: the
        inverse of :meth:`exp` (zero at ``y = x``; one of the minimisers where it is not
        unique, such as antipodes)."""

    def dist(self, x, y):
        r"""Returns the geodesic distance :math:`d_M(x, y)`, ``[...]``."""

    def sqdist(self, x, y):
        r"""Returns :math:`d_M(x, y)^2`, ``[...]`` (differentiable at ``x = y``)."""

    def proj(self, x):
        """Returns the nearest point of M to the coordinates ``x``, ``[..., dim]``."""

    def proj_tangent(self, x, v):
        r"""Returns the projection of ``v`` onto the tangent space :math:`T_x M`,
        ``[..., dim]``."""

    def inner(self, x, u, v):
        r"""Returns the metric :math:`\langle u, v \rangle_x`, ``[...]``."""

    def geodesic(self, x, v, t):
        r"""Returns the point and velocity of :math:`s \mapsto \exp_x(s v)` at :math:`s = t`,
        two ``[..., dim]`` arrays."""

    def pairwise_sqdist(self, x, y):
        r"""Returns all squared distances :math:`d_M(x_i, y_j)^2`, ``[n, m]``, of
        ``x [n, dim]`` and ``y [m, dim]``."""

    def weighted_log(self, x, w, y, sqdist=None):
        r"""Returns :math:`\sum_j w_{ij} \log_{x_i}(y_j)`, ``[n, dim]``, for ``x [n, dim]``,
        ``w [n, m]`` and ``y [m, dim]``; ``sqdist`` is ``pairwise_sqdist(x, y)`` if the caller
        already has it."""

    def manifold_error(self, x):
        """Returns how far the coordinates ``x`` are from M, ``[...]`` (0 on it)."""

    def features(self, x):
        r"""Returns a network's input features of points, ``[..., k]``: the coordinates, or
        :math:`(\cos x, \sin x)` on the torus."""

    def mean(self, x, w):
        """Returns a weighted (extrinsic) mean on M, ``[dim]``, of ``x [n, dim]`` with weights
        ``w [n] >= 0`` (normalised inside)."""

    def random_normal(self, key, mean, scale, shape=()):
        """Returns (wrapped) normal samples around ``mean`` with scale ``scale``,
        ``[*shape, dim]``."""
