"""Data-parallel meshes shared by every training loop and chain runner.

jax 0.10's ``jax.make_mesh`` gives *Explicit* axes by default; with those, every intermediate
carries a sharding type and ``jax.lax.with_sharding_constraint`` inside a ``lax.scan`` is
rejected. hexad's loops shard only their batch (or chains) along one data axis and let XLA
propagate the rest, which is what *Auto* axes mean. These helpers build such a mesh, convert a
user's mesh to Auto axes on the same devices, and check a batch against it, so the packages do
not each carry their own workaround.

In a ``jax.distributed`` job the mesh spans every process's devices, and each process loads
only the rows of a batch its own devices hold: :func:`process_rows` says which, and
:func:`from_process_rows` assembles the global batch from each process's rows (no process
holds a full copy). On one process both are the identity on the whole batch.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

__all__ = [
    "auto_axes",
    "batch_sharding",
    "check_divisible",
    "data_mesh",
    "from_process_rows",
    "process_rows",
    "put",
    "row_placement",
]


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


def process_rows(mesh: Mesh, n: int, axis: str = "data") -> slice:
    """The rows of an ``n``-row batch split over ``axis`` that this process's devices hold.

    With the devices of each process contiguous along ``axis`` (as :func:`data_mesh` lays out
    ``jax.devices()``), they are one slice; a mesh that interleaves processes along ``axis``
    is a ``ValueError``.

    >>> process_rows(data_mesh(jax.devices()[:1]), 8)
    slice(0, 8, None)
    """
    placement = batch_sharding(mesh, axis)
    check_divisible(placement.mesh, axis, n, "n")
    # (start, stop) of each of this process's shards, once each (other axes replicate them)
    spans = sorted(
        {idx[0].indices(n)[:2] for idx in placement.addressable_devices_indices_map((n,)).values()}
    )
    if any(a[1] != b[0] for a, b in itertools.pairwise(spans)):
        raise ValueError(
            f"mesh: this process's devices hold rows that are not one contiguous slice of "
            f"axis {axis!r}; order the mesh's devices by process (data_mesh does)"
        )
    return slice(spans[0][0], spans[-1][1])


def from_process_rows(mesh: Mesh, local, n: int, axis: str = "data"):
    """The global ``n``-row batch (a pytree of arrays) split over ``axis``, from this process's
    rows ``local`` (the leaves' rows :func:`process_rows` names; other dimensions whole).

    Each process passes only its own rows (``jax.make_array_from_process_local_data``); a
    leaf with the wrong number of rows is a ``ValueError`` naming its shape.

    >>> x = from_process_rows(data_mesh(jax.devices()[:1]), np.ones((4, 2)), 4)
    >>> x.shape, x.sharding.spec
    ((4, 2), P('data',))
    """
    placement = batch_sharding(mesh, axis)
    rows = process_rows(mesh, n, axis)
    want = rows.stop - rows.start

    def one(leaf):
        leaf = np.asarray(leaf)
        if leaf.ndim == 0 or leaf.shape[0] != want:
            raise ValueError(
                f"local: expected {want} rows (rows {rows.start}:{rows.stop} of {n}) in every "
                f"leaf, got shape {leaf.shape}"
            )
        return jax.make_array_from_process_local_data(placement, leaf, (n, *leaf.shape[1:]))

    return jax.tree.map(one, local)


def put(tree, placement: NamedSharding):
    """``tree``'s leaves placed with ``placement``, also when it spans other processes' devices.

    ``jax.device_put`` places on this process's devices only; in a ``jax.distributed`` job a
    leaf every process holds whole (the same value: a key, a host array, a replicated result)
    is resharded by a jitted identity instead, each process keeping only its shards.

    >>> put(np.zeros(4), batch_sharding(data_mesh(jax.devices()[:1]))).sharding.spec
    P('data',)
    """
    if placement.is_fully_addressable:
        return jax.device_put(tree, placement)
    return _reshard(placement)(tree)


def row_placement(tree) -> NamedSharding | None:
    """The placement of the rows of ``tree`` (a pytree whose leaves share a leading axis): its
    first leaf's leading-axis ``NamedSharding`` (Auto axes) when that leaf lies on a mesh with
    its rows split (e.g. from :func:`from_process_rows` or :func:`put`), ``None`` when they are
    not (a host or one-device array, or one replicated over a mesh). A loop that draws
    minibatches from ``tree`` places each the same way, so the computation follows the data.

    >>> row_placement(np.zeros(4)) is None
    True
    >>> row_placement(put(np.zeros(4), batch_sharding(data_mesh(jax.devices()[:1])))).spec
    P('data',)
    """
    s = getattr(jax.tree.leaves(tree)[0], "sharding", None)
    if not isinstance(s, NamedSharding) or not s.spec or s.spec[0] is None:
        return None
    return NamedSharding(auto_axes(s.mesh), PartitionSpec(s.spec[0]))


@functools.lru_cache(maxsize=64)
def _reshard(placement: NamedSharding):
    """One jitted identity per placement, so a loop that places every chunk compiles once."""
    return jax.jit(lambda t: t, out_shardings=placement)
