"""The CacheX on-disk format and the T0 host-DRAM staging pool.

A saved step holds, per rank, one directory with ``data.bin`` (the raw little-endian bytes of
every addressable shard, back to back) and a ``manifest.json`` written last: the tree's key
paths, each leaf's global shape and dtype, each shard's index (``[start, stop)`` per
dimension), offset and byte count, and each data file's size and CRC-32. The manifest
carries the CRC-32 of its own canonical JSON, so a flipped bit in the manifest itself is
caught too. No pickle anywhere: a restore reads JSON and raw bytes only, checks every size and
checksum before any array is built, and refuses a step that is truncated, bit-flipped or
missing a file.

Each rank saves every distinct shard it can address (not only ``replica_id == 0``), so a rank
can restore from its own node-local copy without reading another node's files.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import queue
import threading
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from hexad.cachex import _fsio

__all__ = [
    "DATA_FILE",
    "MANIFEST_FILE",
    "CorruptCheckpointError",
    "LeafSpec",
    "ShardRecord",
    "Snapshot",
    "StagingPool",
    "assemble_tree",
    "read_manifest",
    "read_rank_dir",
    "snapshot_nbytes",
    "encode_rank",
    "write_encoded",
    "write_rank_dir",
]

FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
"""The name of a rank directory's manifest, JSON describing each leaf (shape, dtype, offset in the
data file) with CRC-32 checksums."""
DATA_FILE = "data.bin"
"""The name of a rank directory's data file, which holds the leaves' raw buffers."""
# A leaf's manifest entry holds this key only for a typed PRNG key array (its key data is
# stored as the leaf, under the key's shape plus the impl's trailing dimensions).
KEY_IMPL = "key_impl"


class CorruptCheckpointError(ValueError):
    """A checkpoint directory is truncated, bit-flipped, partial or otherwise unreadable."""


class LeafSpec(NamedTuple):
    """One leaf of the saved tree: key path, global shape and dtype name of the stored data.

    ``key_impl`` is the PRNG implementation's name (e.g. ``"threefry2x32"``) when the leaf
    is a typed PRNG key array (``jax.random.key``): its ``jax.random.key_data`` is stored and
    ``jax.random.wrap_key_data`` rebuilds the key on restore; None for any other leaf.
    """

    path: str
    shape: tuple[int, ...]
    dtype: str
    key_impl: str | None = None


class ShardRecord(NamedTuple):
    """One staged shard: the leaf it belongs to, its index and its host copy.

    Attributes:
      leaf: index of the leaf in the flattened tree.
      index: ``((start, stop), ...)`` per dimension of the global array.
      data: host array of shape ``[stop - start for each dimension]`` (a staging buffer).
    """

    leaf: int
    index: tuple[tuple[int, int], ...]
    data: np.ndarray


class Snapshot(NamedTuple):
    """A staged pytree: the leaf specs and the host copies of every distinct local shard."""

    leaves: tuple[LeafSpec, ...]
    shards: tuple[ShardRecord, ...]


def snapshot_nbytes(snap: Snapshot) -> int:
    """Returns the number of array bytes in ``snap``."""
    return int(sum(s.data.nbytes for s in snap.shards))


def _norm_index(index: tuple, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    out = []
    for sl, n in zip(index, shape, strict=True):
        start, stop, step = sl.indices(n)
        if step != 1:
            raise ValueError(f"shard index: expected unit-stride slices, got {sl}")
        out.append((int(start), int(stop)))
    return tuple(out)


def _is_key(x: Any) -> bool:
    """Whether ``x`` (an array or a ShapeDtypeStruct) holds typed PRNG keys."""
    import jax

    dtype = getattr(x, "dtype", None)
    try:
        return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)
    except TypeError:
        return False


def _leaf_entries(leaf: Any) -> tuple[tuple[int, ...], np.dtype, list[tuple[tuple, Any]]]:
    """Returns (global shape, dtype, [(index, array-like source)]) for one leaf."""
    import jax

    if isinstance(leaf, jax.Array):
        shape = tuple(int(d) for d in leaf.shape)
        seen: dict[tuple, Any] = {}
        for sh in leaf.addressable_shards:
            idx = _norm_index(sh.index, shape)
            if idx not in seen:
                seen[idx] = sh.data
        for data in seen.values():
            if hasattr(data, "copy_to_host_async"):
                data.copy_to_host_async()
        return shape, np.dtype(leaf.dtype), list(seen.items())
    if isinstance(leaf, (np.ndarray, np.generic, int, float, bool, complex)):
        arr = np.asarray(leaf)
        shape = tuple(int(d) for d in arr.shape)
        return shape, arr.dtype, [(tuple((0, n) for n in shape), arr)]
    raise TypeError(
        f"tree leaf: expected a jax.Array, numpy array or Python scalar, got {type(leaf).__name__}"
    )


class StagingPool:
    """T0: a reused pool of host buffers, ``n_slots`` deep (2 = double buffering).

    :meth:`stage` copies every distinct addressable shard of a pytree into the buffers of a free
    slot (an explicit ``np.copyto``: on CPU, ``np.asarray`` of a device buffer is zero-copy, and
    a snapshot that aliased device memory would change under a donating training step). Buffers
    are kept per slot and reused when the next save has the same shapes, so steady-state saves
    allocate nothing. When every slot is still being written out, :meth:`stage` blocks. Under
    :class:`hexad.cachex.CacheXManager` the lower tiers stall the training loop earlier than
    that: orbax keeps one save in flight, so ``save`` first waits for the previous commit
    (``stall ~ max(T0, T1 + T2 - interval)``), and a second slot is used only while a failed
    save's push is being cancelled.

    Args:
      n_slots: number of staging slots (static), at least 1.

    >>> pool = StagingPool(2)
    >>> slot, snap = pool.stage({"w": np.ones(3, np.float32)})
    >>> pool.release(slot)
    """

    def __init__(self, n_slots: int = 2):
        if not isinstance(n_slots, int) or n_slots < 1:
            raise ValueError(f"n_slots: expected an int >= 1, got {n_slots!r}")
        self.n_slots = n_slots
        self._buffers: list[dict[tuple[int, int], np.ndarray]] = [{} for _ in range(n_slots)]
        # LIFO: the most recently released slot has warm (already faulted-in) pages; a cold
        # slot's first use pays page faults that can cost 10x the copy itself.
        self._free: queue.LifoQueue[int] = queue.LifoQueue()
        for i in reversed(range(n_slots)):
            self._free.put(i)
        self._lock = threading.Lock()
        self.allocations = 0

    def stage(self, tree: Any, timeout: float | None = None) -> tuple[int, Snapshot]:
        """Copies ``tree`` into a free slot; returns ``(slot, Snapshot)``. Blocks if none free."""
        import jax

        flat, _ = jax.tree_util.tree_flatten_with_path(tree)
        entries = []
        for p, x in flat:
            impl = None
            if _is_key(x):  # numpy has no key dtype: the key's raw uint32 words are stored
                impl = str(jax.random.key_impl(x))
                x = jax.random.key_data(x)
            entries.append((jax.tree_util.keystr(p), impl, _leaf_entries(x)))
        try:
            slot = self._free.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"staging pool: no free slot within {timeout} s") from None
        bufs = self._buffers[slot]
        leaves, shards = [], []
        try:
            for li, (path, impl, (shape, dtype, parts)) in enumerate(entries):
                # The data file holds little-endian bytes: a big-endian leaf is byte-swapped
                # by the copy below (its dtype name does not record the byte order).
                dtype = _little_endian(dtype)
                leaves.append(LeafSpec(path, shape, dtype.name, impl))
                for k, (idx, src) in enumerate(parts):
                    bshape = tuple(b - a for a, b in idx)
                    buf = bufs.get((li, k))
                    if buf is None or buf.shape != bshape or buf.dtype != dtype:
                        buf = np.empty(bshape, dtype)
                        bufs[(li, k)] = buf
                        with self._lock:
                            self.allocations += 1
                    np.copyto(buf, np.asarray(src))
                    shards.append(ShardRecord(li, idx, buf))
        except BaseException:
            self._free.put(slot)
            raise
        return slot, Snapshot(tuple(leaves), tuple(shards))

    def release(self, slot: int) -> None:
        """Returns ``slot`` to the pool once its snapshot has been written out."""
        self._free.put(slot)


def _little_endian(dtype: np.dtype) -> np.dtype:
    return dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype


def _manifest_crc(body: Mapping[str, Any]) -> int:
    return _fsio.crc32_bytes(json.dumps(body, sort_keys=True).encode())


def _views(snap: Snapshot) -> list[memoryview]:
    out = []
    for s in snap.shards:
        data = np.ascontiguousarray(s.data)
        out.append(memoryview(data.reshape(-1).view(np.uint8)) if data.size else memoryview(b""))
    return out


def _leaf_json(v: LeafSpec) -> dict[str, Any]:
    out = {"path": v.path, "shape": list(v.shape), "dtype": v.dtype}
    if v.key_impl is not None:  # absent otherwise: other leaves' manifests stay as they were
        out[KEY_IMPL] = v.key_impl
    return out


def _manifest(snap: Snapshot, views: list[memoryview], meta: Mapping[str, Any]) -> bytes:
    """The manifest of ``snap`` whose data file is the concatenation of ``views`` (CRC-32 here)."""
    shards, crc, offset = [], 0, 0
    for s, view in zip(snap.shards, views, strict=True):
        crc = zlib.crc32(view, crc)
        shards.append(
            {
                "leaf": s.leaf,
                "index": [list(ab) for ab in s.index],
                "file": DATA_FILE,
                "offset": offset,
                "nbytes": len(view),
            }
        )
        offset += len(view)
    body = {
        "format": FORMAT_VERSION,
        "meta": dict(meta),
        "leaves": [_leaf_json(v) for v in snap.leaves],
        "files": [{"file": DATA_FILE, "nbytes": offset, "crc32": crc & 0xFFFFFFFF}],
        "shards": shards,
    }
    manifest = dict(body, manifest_crc32=_manifest_crc(body))
    return json.dumps(manifest, sort_keys=True).encode()


def encode_rank(snap: Snapshot, meta: Mapping[str, Any]) -> tuple[list[memoryview], bytes]:
    """Returns ``(data views, manifest bytes)`` of one rank's snapshot (CRC-32 computed here).

    ``data.bin`` is the concatenation of the views; the manifest records each shard's offset
    and the file's size and CRC-32, plus the CRC-32 of the manifest's own canonical JSON.
    """
    views = _views(snap)
    return views, _manifest(snap, views, meta)


# Below this much data the CRC-32 (about 1 ms per 3 MB here) costs less than handing the
# fsync to another thread on a busy host (measured: no gain at 4 MiB, 28% at 256 MiB).
_OVERLAP_MIN_BYTES = 16 << 20
_FSYNC_POOL: list[concurrent.futures.ThreadPoolExecutor] = []
_FSYNC_POOL_LOCK = threading.Lock()


def _fsync_pool() -> concurrent.futures.ThreadPoolExecutor:
    # Long-lived threads: a thread start per write would cost more than it saves on a busy
    # host.
    with _FSYNC_POOL_LOCK:
        if not _FSYNC_POOL:
            _FSYNC_POOL.append(
                concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="cachex-fsync")
            )
        return _FSYNC_POOL[0]


def write_encoded(
    directory: Path, views: list[memoryview], manifest: bytes | Callable[[], bytes]
) -> int:
    """T1: writes ``data.bin`` and ``fsync``s it, then the manifest, then the directory.

    ``manifest`` is the manifest's bytes, or a function that computes them (the CRC-32 of
    the data): for a large file it is then called while the data's ``fsync`` waits on the
    disk, so the checksum costs no time of its own. The manifest is written only after that
    ``fsync`` has returned either way.
    """
    directory = Path(directory)
    total = 0
    fd = os.open(directory / DATA_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        for view in views:
            done = 0
            while done < len(view):
                done += os.write(fd, view[done:])
            total += len(view)
        if callable(manifest) and total < _OVERLAP_MIN_BYTES:
            manifest = manifest()
        if callable(manifest):
            synced = _fsync_pool().submit(os.fsync, fd)
            try:
                manifest = manifest()
            finally:
                synced.result()  # the fd stays open until the fsync is done
        else:
            os.fsync(fd)
    finally:
        os.close(fd)
    _fsio.write_file_durable(directory / MANIFEST_FILE, manifest)
    _fsio.fsync_dir(directory)
    return total


def write_rank_dir(directory: Path, snap: Snapshot, meta: Mapping[str, Any]) -> int:
    """T1 write of one rank's snapshot into the existing empty ``directory``; returns bytes.

    ``data.bin`` (every shard back to back) is written and fsynced before the manifest, and
    the directory is fsynced last: a directory without a valid manifest is, by
    construction, an interrupted write. The data's CRC-32 is computed while its ``fsync``
    waits on the disk.

    >>> import tempfile
    >>> slot, snap = StagingPool(1).stage({"w": np.arange(3, dtype=np.float32)})
    >>> write_rank_dir(Path(tempfile.mkdtemp()), snap, {"step": 0, "rank": 0})
    12
    """
    views = _views(snap)
    return write_encoded(directory, views, lambda: _manifest(snap, views, meta))


def read_manifest(directory: Path) -> dict[str, Any]:
    """Reads and checks ``directory/manifest.json``; raises CorruptCheckpointError if bad."""
    path = Path(directory) / MANIFEST_FILE
    try:
        manifest = _fsio.read_json(path)
    except FileNotFoundError:
        raise CorruptCheckpointError(
            f"{directory}: no {MANIFEST_FILE} (interrupted write)"
        ) from None
    except ValueError as e:
        raise CorruptCheckpointError(f"{directory}: {e}") from None
    if not isinstance(manifest, dict) or "manifest_crc32" not in manifest:
        raise CorruptCheckpointError(f"{directory}: {MANIFEST_FILE} lacks its checksum")
    body = {k: v for k, v in manifest.items() if k != "manifest_crc32"}
    if _manifest_crc(body) != manifest["manifest_crc32"]:
        raise CorruptCheckpointError(f"{directory}: {MANIFEST_FILE} checksum mismatch (bit flip?)")
    if body.get("format") != FORMAT_VERSION:
        raise CorruptCheckpointError(
            f"{directory}: format {body.get('format')!r}, expected {FORMAT_VERSION}"
        )
    _check_structure(directory, body)
    return body


def _is_int(x: Any, lo: int = 0) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= lo


def _check_structure(directory: Path, body: Mapping[str, Any]) -> None:
    """Raises CorruptCheckpointError unless ``body`` has every key and type a restore reads.

    A manifest whose checksum matches can still be structurally wrong (written by another
    tool or a buggy writer, with its checksum recomputed): every later read indexes it
    without further checks, so a KeyError or TypeError there must become "this copy is
    corrupt", which lets a restore try the next copy instead of failing outright.
    """

    def bad(what: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"{directory}: {MANIFEST_FILE}: {what}")

    for key, kind in (("meta", dict), ("leaves", list), ("files", list), ("shards", list)):
        if not isinstance(body.get(key), kind):
            raise bad(f"expected {key!r} to be a {kind.__name__}, got {body.get(key)!r:.80}")
    leaves = body["leaves"]
    for i, leaf in enumerate(leaves):
        if not (
            isinstance(leaf, dict)
            and isinstance(leaf.get("path"), str)
            and isinstance(leaf.get("dtype"), str)
            and isinstance(leaf.get("shape"), list)
            and all(_is_int(n) for n in leaf["shape"])
            and isinstance(leaf.get(KEY_IMPL, ""), str)
        ):
            raise bad(f"leaves[{i}]: expected path, shape (ints >= 0) and dtype, got {leaf!r:.120}")
        try:
            dt = _np_dtype(leaf["dtype"])
        except (TypeError, AttributeError):
            dt = None
        if dt is None or dt.hasobject:  # raw bytes are numbers only, never Python objects
            raise bad(f"leaves[{i}]: unknown dtype {leaf['dtype']!r:.40}")
    names = set()
    for i, f in enumerate(body["files"]):
        if not (
            isinstance(f, dict)
            and isinstance(f.get("file"), str)
            and _is_int(f.get("nbytes"))
            and _is_int(f.get("crc32"))
        ):
            raise bad(f"files[{i}]: expected file, nbytes and crc32, got {f!r:.120}")
        try:
            _fsio.validate_file_name(f["file"])
        except ValueError as e:
            raise bad(f"files[{i}]: {e}") from None
        names.add(f["file"])
    for i, sh in enumerate(body["shards"]):
        if not (
            isinstance(sh, dict)
            and _is_int(sh.get("leaf"))
            and _is_int(sh.get("offset"))
            and _is_int(sh.get("nbytes"))
            and isinstance(sh.get("index"), list)
        ):
            raise bad(f"shards[{i}]: expected leaf, index, offset and nbytes, got {sh!r:.120}")
        if not isinstance(sh.get("file"), str) or sh["file"] not in names:
            raise bad(f"shards[{i}]: names unlisted file {sh.get('file')!r:.40}")
        if sh["leaf"] >= len(leaves):
            raise bad(f"shards[{i}]: leaf {sh['leaf']} of {len(leaves)}")
        shape = leaves[sh["leaf"]]["shape"]
        index = sh["index"]
        if len(index) != len(shape) or not all(
            isinstance(ab, list) and len(ab) == 2 and _is_int(ab[0]) and _is_int(ab[1])
            and ab[0] <= ab[1] <= n
            for ab, n in zip(index, shape, strict=False)
        ):  # fmt: skip
            raise bad(f"shards[{i}]: index {index!r:.80} does not fit shape {shape}")


def read_rank_dir(directory: Path) -> tuple[dict[str, Any], list[tuple[int, tuple, np.ndarray]]]:
    """Reads one rank's directory, verifying every file's size and CRC-32 before use.

    Returns:
      ``(manifest, [(leaf, index, array)])``.

    Raises:
      CorruptCheckpointError: a missing, truncated or bit-flipped file.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> _ = write_rank_dir(d, StagingPool(1).stage({"w": np.ones(2)})[1], {})
    >>> read_rank_dir(d)[1]
    [(0, ((0, 2),), array([1., 1.]))]
    >>> _ = (d / DATA_FILE).write_bytes(bytes(16))
    >>> read_rank_dir(d)
    Traceback (most recent call last):
    ...
    hexad.cachex._format.CorruptCheckpointError: ...: data.bin checksum mismatch (bit flip)
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    raws = {}
    for f in manifest["files"]:
        path = directory / f["file"]
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            raise CorruptCheckpointError(f"{directory}: missing {f['file']}") from None
        if size != f["nbytes"]:
            raise CorruptCheckpointError(
                f"{directory}: {f['file']} has {size} bytes, expected {f['nbytes']} (truncated)"
            )
        raw = bytearray(size)
        with open(path, "rb", buffering=0) as fh:
            got = fh.readinto(raw) if size else 0
        if got != size or _fsio.crc32_bytes(raw) != f["crc32"]:
            raise CorruptCheckpointError(f"{directory}: {f['file']} checksum mismatch (bit flip)")
        raws[f["file"]] = raw
    out = []
    for sh in manifest["shards"]:
        leaf = manifest["leaves"][sh["leaf"]]
        idx = tuple((int(a), int(b)) for a, b in sh["index"])
        dtype = _np_dtype(leaf["dtype"])
        shape = tuple(b - a for a, b in idx)
        if sh["nbytes"] != int(np.prod(shape)) * dtype.itemsize:
            raise CorruptCheckpointError(f"{directory}: shard size disagrees with its index")
        raw = raws[sh["file"]]
        if sh["offset"] < 0 or sh["offset"] + sh["nbytes"] > len(raw):
            raise CorruptCheckpointError(f"{directory}: shard lies outside {sh['file']}")
        arr = np.frombuffer(raw, dtype=dtype, count=int(np.prod(shape)), offset=sh["offset"])
        out.append((int(sh["leaf"]), idx, arr.reshape(shape)))
    return manifest, out


def _np_dtype(name: str) -> np.dtype:
    import ml_dtypes  # noqa: F401  (registers bfloat16, float8_* names with numpy)

    try:
        return np.dtype(name)
    except TypeError:
        return np.dtype(getattr(ml_dtypes, name))


def _target_spec(x: Any) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype of the data stored for a target leaf (a key's key data)."""
    import jax

    if _is_key(x):
        data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(x.shape, x.dtype))
        return tuple(int(d) for d in data.shape), np.dtype(data.dtype)
    if isinstance(x, (jax.Array, jax.ShapeDtypeStruct, np.ndarray, np.generic)):
        # compared with the saved (little-endian) dtype by kind, whatever the target's byte order
        return tuple(int(d) for d in x.shape), _little_endian(np.dtype(x.dtype))
    if isinstance(x, (int, float, bool, complex)):
        arr = np.asarray(x)
        return (), arr.dtype
    raise TypeError(
        "target leaf: expected a jax.Array, jax.ShapeDtypeStruct, numpy array or Python scalar, "
        f"got {type(x).__name__}"
    )


def _check_key_target(path: str, x: Any, impl: str | None, sshape: tuple, sdtype: np.dtype):
    """Raises ValueError unless a saved key leaf meets a key target of the same impl and shape
    (and a saved plain leaf a plain target)."""
    import jax

    if impl is None:
        if _is_key(x):
            raise ValueError(
                f"target{path}: expected a plain array as saved, got typed PRNG keys {x.dtype}"
            )
        return
    try:
        want = jax.eval_shape(
            lambda d: jax.random.wrap_key_data(d, impl=impl), jax.ShapeDtypeStruct(sshape, sdtype)
        )
    except (ValueError, TypeError, KeyError) as e:
        raise CorruptCheckpointError(
            f"target{path}: the saved PRNG key (impl {impl!r}, data {sshape} {sdtype.name}) "
            f"cannot be rebuilt here: {e}"
        ) from None
    got = (tuple(x.shape), x.dtype) if _is_key(x) else None
    if got != (tuple(want.shape), want.dtype):
        raise ValueError(
            f"target{path}: expected typed PRNG keys of shape {tuple(want.shape)} dtype "
            f"{want.dtype} as saved, got "
            + (f"shape {got[0]} dtype {got[1]}" if got else f"{type(x).__name__} {_describe(x)}")
        )


def _describe(x: Any) -> str:
    return f"dtype {getattr(x, 'dtype', type(x).__name__)} shape {getattr(x, 'shape', ())}"


def _key_data_sharding(x: Any) -> Any:
    """The sharding of a key target's key data, or None to restore it on the default device.

    A named or single-device sharding of the keys applies as is to their data (a partition
    spec shorter than the data's rank leaves the trailing dimensions unsharded); any other
    sharding is asked of the compiler.
    """
    import jax

    sharding = getattr(x, "sharding", None)
    if sharding is None:
        return None
    if isinstance(sharding, (jax.sharding.NamedSharding, jax.sharding.SingleDeviceSharding)):
        return sharding
    sds = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
    return jax.jit(jax.random.key_data).lower(sds).compile().output_shardings


def assemble_tree(target: Any, manifest: Mapping[str, Any], pieces: list) -> Any:
    """Builds a pytree shaped like ``target`` from verified shard ``pieces``.

    Args:
      target: the pytree to restore into; leaves are ``jax.Array`` (restored with the same
        sharding), ``jax.ShapeDtypeStruct`` (with its ``sharding`` if set), numpy arrays or
        Python scalars; a typed PRNG key leaf (array or ShapeDtypeStruct) restores a saved
        key of the same impl and shape.
      manifest: a manifest from :func:`read_rank_dir` (any rank: they share the tree).
      pieces: ``[(leaf, index, array)]`` from one or more ranks.

    Raises:
      ValueError: the tree structure, a shape or a dtype differs from the saved one, or the
        pieces do not cover a shard that the target needs.
    """
    import jax

    flat, treedef = jax.tree_util.tree_flatten_with_path(target)
    saved = manifest["leaves"]
    paths = [jax.tree_util.keystr(p) for p, _ in flat]
    saved_paths = [v["path"] for v in saved]
    if paths != saved_paths:
        diff = next(
            (i for i, (a, b) in enumerate(zip(paths, saved_paths, strict=False)) if a != b),
            min(len(paths), len(saved_paths)),
        )
        raise ValueError(
            f"target: tree structure differs from the checkpoint: {len(paths)} leaves vs "
            f"{len(saved_paths)} saved; first difference at leaf {diff}: "
            f"target {paths[diff] if diff < len(paths) else None!r}, "
            f"saved {saved_paths[diff] if diff < len(saved_paths) else None!r}"
        )
    by_leaf: dict[int, list[tuple[tuple, np.ndarray]]] = {}
    for li, idx, arr in pieces:
        by_leaf.setdefault(li, []).append((idx, arr))
    out = []
    for li, (path, x) in enumerate(zip(paths, (v for _, v in flat), strict=True)):
        shape, dtype = _target_spec(x)
        sshape = tuple(saved[li]["shape"])
        sdtype = _np_dtype(saved[li]["dtype"])
        impl = saved[li].get(KEY_IMPL)
        _check_key_target(path, x, impl, sshape, sdtype)
        if shape != sshape or dtype != sdtype:
            raise ValueError(
                f"target{path}: expected shape {sshape} dtype {sdtype.name} as saved, "
                f"got shape {shape} dtype {dtype.name}"
            )
        parts = by_leaf.get(li, [])

        def fetch(index, parts=parts, shape=shape, dtype=dtype, path=path):
            want = _norm_index(index, shape) if index is not None else tuple((0, n) for n in shape)
            for idx, arr in parts:
                if idx == want:
                    return arr
            buf = np.empty(tuple(b - a for a, b in want), dtype)
            covered = np.zeros(buf.shape, bool)
            for idx, arr in parts:
                lo = [max(a, c) for (a, _), (c, _) in zip(idx, want, strict=True)]
                hi = [min(b, d) for (_, b), (_, d) in zip(idx, want, strict=True)]
                if any(h <= l_ for l_, h in zip(lo, hi, strict=True)) and len(want):
                    continue
                src = tuple(slice(l_ - a, h - a) for l_, h, (a, _) in zip(lo, hi, idx, strict=True))
                dst = tuple(
                    slice(l_ - c, h - c) for l_, h, (c, _) in zip(lo, hi, want, strict=True)
                )
                buf[dst] = arr[src]
                covered[dst] = True
            if not covered.all():
                raise ValueError(
                    f"target{path}: the checkpoint's readable shards do not cover index {want}"
                )
            return buf

        if impl is not None:
            sharding = _key_data_sharding(x)
            if sharding is None:
                data = jax.device_put(fetch(None))
            else:
                data = jax.make_array_from_callback(shape, sharding, fetch)
            out.append(jax.random.wrap_key_data(data, impl=impl))
        elif isinstance(x, jax.Array) or (
            isinstance(x, jax.ShapeDtypeStruct) and getattr(x, "sharding", None) is not None
        ):
            out.append(jax.make_array_from_callback(shape, x.sharding, fetch))
        elif isinstance(x, jax.ShapeDtypeStruct):
            out.append(jax.device_put(fetch(None)))
        elif isinstance(x, (np.ndarray, np.generic)):
            out.append(np.array(fetch(None)))
        else:
            out.append(type(x)(np.asarray(fetch(None)).item()))
    return jax.tree_util.tree_unflatten(treedef, out)
