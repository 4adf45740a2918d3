"""Data-parallel meshes shared by every training loop and chain runner.

jax 0.10's ``jax.make_mesh`` gives *Explicit* axes by default; with those, every intermediate
carries a sharding type and ``jax.lax.with_sharding_constraint`` inside a ``lax.scan`` is
rejected. hexad's loops shard only their batch (or chains) along one data axis and let XLA
propagate the rest, which is what *Auto* axes mean. These helpers build such a mesh, convert a
user's mesh to Auto axes on the same devices, and check a batch against it, so the packages do
not each carry their own workaround.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

__all__ = ["auto_axes", "batch_sharding", "check_divisible", "data_mesh"]


def data_mesh(devices: Sequence[jax.Device] | None = None, axis: str = "data") -> Mesh:
    """A one-axis data-parallel mesh with Auto axes.

    Args:
      devices: the devices to use, in order; all of ``jax.devices()`` by default (every
        process's devices in a ``jax.distributed`` job).
      axis: the name of the data axis.

    Returns:
      A ``Mesh`` of shape ``[len(devices)]`` named ``(axis,)`` with ``AxisType.Auto``.

    >>> dict(data_mesh(jax.devices()[:1]).shape)
    {'data': 1}
    """
    devs = list(jax.devices() if devices is None else devices)
    if not devs:
        raise ValueError("devices: expected at least one device, got an empty sequence")
    if not isinstance(axis, str) or not axis:
        raise ValueError(f"axis: expected a non-empty axis name, got {axis!r}")
    return Mesh(np.array(devs), (axis,), axis_types=(AxisType.Auto,))


def auto_axes(mesh: Mesh) -> Mesh:
    """The same devices and axis names as ``mesh``, with every axis ``AxisType.Auto``.

    A mesh that is already all-Auto is returned unchanged (same object).

    >>> m = jax.make_mesh((1,), ("data",), devices=jax.devices()[:1])
    >>> auto_axes(m).axis_types == (AxisType.Auto,)
    True
    """
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh: expected a jax.sharding.Mesh, got {type(mesh).__name__}")
    if all(t == AxisType.Auto for t in mesh.axis_types):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * mesh.devices.ndim)


def check_divisible(mesh: Mesh, axis: str, size: int, what: str) -> int:
    """Check that a leading dimension ``size`` splits evenly over ``mesh``'s ``axis``.

    Args:
      mesh: the mesh.
      axis: the data axis name; must be one of ``mesh.axis_names``.
      size: the leading (batch / chains) dimension.
      what: the argument name quoted in the error.

    Returns:
      The size of the mesh axis.

    >>> check_divisible(data_mesh(jax.devices()[:1]), "data", 8, "batch")
    1
    """
    if axis not in mesh.shape:
        raise ValueError(f"axis: {axis!r} is not one of the mesh axes {tuple(mesh.axis_names)}")
    n = mesh.shape[axis]
    if size % n:
        raise ValueError(
            f"{what}: leading dimension {size} must be divisible by the mesh axis {axis!r} "
            f"of size {n}"
        )
    return n


def batch_sharding(mesh: Mesh, axis: str = "data") -> NamedSharding:
    """A ``NamedSharding`` that splits the leading dimension over ``axis`` (Auto axes).

    >>> batch_sharding(data_mesh(jax.devices()[:1])).spec
    P('data',)
    """
    mesh = auto_axes(mesh)
    if axis not in mesh.shape:
        raise ValueError(f"axis: {axis!r} is not one of the mesh axes {tuple(mesh.axis_names)}")
    return NamedSharding(mesh, PartitionSpec(axis))
