"""Boundary checks: clear errors for clouds off the manifold, bad shapes, NaNs, bad weights.

These run on concrete arrays at the public boundary; under a trace (inside a user's ``jit``)
they check only static shapes, since values are not known there. A concrete array closed over
by a traced function (``jax.jit(lambda p: entropic_map(M, p, y))``, ``y`` fixed) is checked
by value, with NumPy on its value or with jnp forced to run eagerly: inside a trace a plain jnp
call on it would return a tracer, which NumPy cannot read.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from hexad._base import Manifold, is_traced

__all__ = ["check_points", "check_weights"]


def check_points(
    manifold: Manifold, x: Any, name: str, *, ndim: int | None = None, atol=1e-4
) -> None:
    """Raises a ValueError naming ``name`` unless ``x`` is finite points ``[..., dim]`` on M.

    Args:
      manifold: the manifold the points must lie on.
      x: the array to check.
      name: the argument's name, used in the message.
      ndim: the exact number of axes expected (``None``: any, at least 1).
      atol: largest accepted ``manifold.manifold_error``.

    >>> from hexad.geometry import Sphere
    >>> check_points(Sphere(3), np.array([[1.0, 0.0, 0.0]]), "x")
    """
    shape = tuple(getattr(x, "shape", np.shape(x)))
    if len(shape) < 1 or shape[-1] != manifold.dim:
        raise ValueError(
            f"{name}: expected points of shape [..., {manifold.dim}] for {manifold}, got shape "
            f"{tuple(shape)}"
        )
    if ndim is not None and len(shape) != ndim:
        raise ValueError(f"{name}: expected {ndim} axes, got shape {tuple(shape)}")
    if is_traced(x):
        return
    arr = np.asarray(x)
    if not np.issubdtype(arr.dtype, np.floating):
        raise TypeError(f"{name}: expected a floating dtype, got {arr.dtype}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(
            f"{name}: expected finite values, got {int(np.sum(~np.isfinite(arr)))} NaN/inf"
        )
    # ensure_compile_time_eval: the manifold's jnp code runs eagerly on the concrete array
    # even when called under an outer trace; a user manifold that still returns a tracer
    # leaves the value check out rather than fail.
    with jax.ensure_compile_time_eval():
        err = manifold.manifold_error(arr)
    if is_traced(err):
        return
    err = float(np.max(np.asarray(err), initial=0.0))
    if err > atol:
        raise ValueError(
            f"{name}: expected points on {manifold} (error <= {atol}), got points off it by "
            f"up to {err:.3g}"
        )


def check_weights(w: Any, name: str, shape: tuple[int, ...]) -> None:
    """Raises a ValueError naming ``name`` unless ``w`` is non-negative weights of ``shape``
    with a positive sum along the last axis.

    Args:
      w: the array to check.
      name: the argument's name, used in the message.
      shape: the exact shape expected.

    >>> check_weights(np.ones((2, 3)), "a", (2, 3))
    >>> check_weights(np.zeros(3), "a", (3,))
    Traceback (most recent call last):
    ...
    ValueError: a: expected a positive total weight per cloud, got all-zero weights
    """
    if tuple(getattr(w, "shape", np.shape(w))) != tuple(shape):
        raise ValueError(f"{name}: expected weights of shape {tuple(shape)}, got {np.shape(w)}")
    if is_traced(w):
        return
    arr = np.asarray(w)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: expected finite weights, got NaN/inf")
    if np.any(arr < 0):
        raise ValueError(f"{name}: expected non-negative weights, got min {float(arr.min()):.3g}")
    if np.any(arr.sum(axis=-1) <= 0):
        raise ValueError(
            f"{name}: expected a positive total weight per cloud, got all-zero weights"
        )
