"""CacheX benchmarks: training-loop stall, time to durable, local-tier write bandwidth.

``python -m kernels cachex [--quick]``. A float32 pytree of 4 leaves (32 MiB; 4 MiB with
``--quick``) on the default device; the full run adds the stall and local-write rows for a
256 MiB tree (``cachex/stall 256MiB``, ``cachex/local write 256MiB``).

Rows (peers timed in the same run, on the same disk):

- ``cachex/stall``: the blocking part of one save, i.e. what the training loop waits for.
  Each timed call saves on its own manager, warmed by one earlier completed save, so no call
  waits for a previous commit (orbax keeps one save in flight per manager), and the harness
  lets every earlier save commit before it (untimed, both sides, whose calls it interleaves),
  so no timed save runs beside another manager's commit. Ours: CacheX T0
  staging into the reused double-buffered pool, replica server on loopback. Peer: orbax's
  async ``CheckpointManager.save`` with ``StandardSave`` (on CPU its blocking part does not
  copy the arrays: about 5 ms at 256 MiB against a 14 ms copy, so there no copying save can
  reach 0.2 of it). Goal:
  ratio <= 0.2. Bound: the copy itself, a device-to-host copy of the same leaves into
  preallocated host buffers, timed in the same run once every save in flight has committed
  (the T0 stall cannot be shorter).
- ``cachex/durable``: one save until committed (ours: local + neighbour replica; orbax: its
  local commit). Informational; no goal. Bound: the raw fsync'd write of the same bytes
  (the local commit alone must do it; the replica push overlaps it).
- ``cachex/local write``: the T1 write of a staged snapshot (one ``data.bin`` of every shard
  back to back and a manifest, CRC-32, file and directory fsync) against a raw write of the
  same bytes to one file with ``fsync`` and a directory ``fsync``. Goal: >= 90% of the raw
  bandwidth, i.e. ratio <= 1.11. Bound: the raw write (the peer): the disk's fsync'd bandwidth.
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from hexad import cachex
from kernels._harness import Case

_TMP = Path(tempfile.mkdtemp(prefix="cachex-bench-"))
atexit.register(shutil.rmtree, _TMP, True)
_SERVER: tuple | None = None
_TOKEN = "cachex-kernel-bench-token"


def _tree(mib: int) -> dict:
    n = mib * 2**20 // 4 // 4
    keys = jax.random.split(jax.random.key(0), 4)
    return {f"w{i}": jax.random.normal(k, (n,), jnp.float32) for i, k in enumerate(keys)}


def _server_address() -> tuple[str, int]:
    # The neighbour is another process (another node), so its work does not share our GIL.
    global _SERVER
    if _SERVER is None:
        _SERVER = cachex.spawn_replica_server(_TMP / "neighbour", _TOKEN, max_lifetime_s=1800)
        atexit.register(_SERVER[0].terminate)
    return _SERVER[1]


def _cachex_manager(name: str, rank: int) -> cachex.CacheXManager:
    # Distinct ranks keep the managers' replicas apart on the shared neighbour server.
    client = cachex.ReplicaClient(_server_address(), _TOKEN)
    m = cachex.CacheXManager(_TMP / name, neighbour=client, rank=rank, n_ranks=1 << 16)
    _OPEN.append(m)
    return m


_OPEN: list = []


def _wait_all() -> None:
    """Every open manager's save in flight committed (both sides of every row)."""
    for m in _OPEN:
        m.wait_until_finished()


def _close_all() -> None:
    _wait_all()  # let the timed saves' background commits finish before exit
    for m in _OPEN:
        m.close()


atexit.register(_close_all)


def _orbax_manager(name: str) -> ocp.CheckpointManager:
    m = ocp.CheckpointManager(
        _TMP / name,
        options=ocp.CheckpointManagerOptions(enable_async_checkpointing=True, max_to_keep=2),
    )
    _OPEN.append(m)
    return m


class _OneShotSaves:
    """Each call saves step 1 on a fresh manager whose step 0 was saved and committed.

    The managers are made (and their step 0 saved and committed) in the first call, which
    the harness runs untimed (``warmup=1``), so a row that is not selected costs nothing.
    """

    def __init__(self, make, save, calls: int):
        self._make, self._save, self._calls = make, save, calls
        self._managers: list = []
        self._it = None
        self.__name__ = "save"

    def __call__(self, tree):
        if self._it is None:
            for i in range(self._calls):
                m = self._make(i)
                self._save(m, 0, tree)
                m.wait_until_finished()
                self._managers.append(m)
            self._it = iter(self._managers)
        self._save(next(self._it), 1, tree)

    def settle(self) -> None:
        """The harness's untimed per-call setup: every save in flight committed (this row's,
        and the other side's, whose calls the harness interleaves with these), so a timed save
        never runs beside another manager's commit (in a real job each rank is its own process
        and saves every few minutes, long after its last commit)."""
        _wait_all()


def _save_ours(m, step, tree):
    m.save(step, tree)


def _save_orbax(m, step, tree):
    m.save(step, args=ocp.args.StandardSave(tree))


class _SaveAndWait:
    def __init__(self, m, save):
        self.m, self._save, self._steps = m, save, itertools.count(1)
        self.__name__ = "save+wait"

    def __call__(self, tree):
        self._save(self.m, next(self._steps), tree)
        self.m.wait_until_finished()


class _HostCopy:
    """The T0 copy alone: every leaf copied into a preallocated host buffer.

    Its first (untimed, warm-up) call waits for every manager's save in flight, so the copy
    is timed on a quiet host, not beside the commits the stall rows left running.
    """

    def __init__(self, tree):
        self.bufs = [np.empty(x.shape, x.dtype) for x in tree.values()]
        self._quiet = False
        self.__name__ = "device-to-host copy"

    def __call__(self, tree):
        if not self._quiet:
            _wait_all()
            self._quiet = True
        for buf, x in zip(self.bufs, tree.values(), strict=True):
            np.copyto(buf, np.asarray(x))


class _LocalWrite:
    def __init__(self, snap):
        self.snap, self._n = snap, itertools.count()
        self.__name__ = "cachex T1 write"

    def __call__(self):
        d = _TMP / f"t1-{id(self)}" / str(next(self._n))
        d.mkdir(parents=True)
        cachex.write_rank_dir(d, self.snap, {"step": 0, "rank": 0})


class _RawWrite:
    def __init__(self, snap):
        self.snap, self._n = snap, itertools.count()
        self.__name__ = "raw fsync'd write"

    def __call__(self):
        d = _TMP / f"raw-{id(self)}"
        d.mkdir(exist_ok=True)
        path = d / f"{next(self._n)}.bin"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            for s in self.snap.shards:
                view = memoryview(s.data.reshape(-1).view(np.uint8))
                off = 0
                while off < len(view):
                    off += os.write(fd, view[off:])
            os.fsync(fd)
        finally:
            os.close(fd)
        cachex.fsync_dir(d)


def _stall_case(tree, tag: str, name: str) -> Case:
    nbytes = float(sum(x.nbytes for x in tree.values()))
    calls = 8  # warmup 1 + repeats 7
    ours = _OneShotSaves(
        lambda i: _cachex_manager(f"stall-ours-{tag}-{i}", rank=i), _save_ours, calls
    )
    peer = _OneShotSaves(lambda i: _orbax_manager(f"stall-orbax-{tag}-{i}"), _save_orbax, calls)
    return Case(
        name=name,
        fn=ours,
        setup=ours.settle,
        args=(tree,),
        shapes=_shapes(tree),
        jit=False,
        bytes=nbytes,
        items=nbytes,
        unit="B",
        peer=peer,
        peer_setup=peer.settle,
        peer_name="orbax async CheckpointManager.save",
        peer_jit=False,
        goal="ratio <= 0.2, within 2 ms of the copy",
        repeats=calls - 1,
        warmup=1,
        bound_fn=_HostCopy(tree),
        bound_jit=False,
        bound_note="the device-to-host copy of the same leaves into preallocated buffers",
    )


def _local_write_case(snap, raw, shapes: str, nbytes: float, name: str) -> Case:
    return Case(
        name=name,
        fn=_LocalWrite(snap),
        shapes=shapes,
        jit=False,
        items=nbytes,
        unit="B",
        peer=raw,
        peer_name="raw write + fsync + dir fsync",
        peer_jit=False,
        goal="bandwidth >= 90% of raw: ratio <= 1.11",
        repeats=7,
        warmup=1,
        bound_fn=raw,
        bound_note="the peer: this disk's fsync'd bandwidth",
    )


def _shapes(tree) -> str:
    return f"4 x [{next(iter(tree.values())).shape[0]}]"


def cases(quick: bool) -> list[Case]:
    mib = 4 if quick else 32
    tree = _tree(mib)
    nbytes = float(sum(x.nbytes for x in tree.values()))
    shapes = _shapes(tree)
    pool = cachex.StagingPool(1)
    slot, snap = pool.stage(tree)
    raw = _RawWrite(snap)
    out = [
        _stall_case(tree, str(mib), "cachex/stall"),
        Case(
            name="cachex/durable",
            fn=_SaveAndWait(_cachex_manager("durable-ours", rank=100), _save_ours),
            args=(tree,),
            shapes=shapes,
            jit=False,
            items=nbytes,
            unit="B",
            peer=_SaveAndWait(_orbax_manager("durable-orbax"), _save_orbax),
            peer_name="orbax async save + wait (local commit)",
            peer_jit=False,
            goal="informational (ours includes the replica push)",
            repeats=5,
            warmup=1,
            bound_fn=raw,
            bound_args=(),
            bound_jit=False,
            bound_note="the raw fsync'd write of the same bytes",
        ),
        _local_write_case(snap, raw, shapes, nbytes, "cachex/local write"),
    ]
    if not quick:  # the large tree: the copy dominates T0, the disk T1
        big = _tree(256)
        big_snap = cachex.StagingPool(1).stage(big)[1]
        nbig = float(sum(x.nbytes for x in big.values()))
        out += [
            _stall_case(big, "256", "cachex/stall 256MiB"),
            _local_write_case(
                big_snap, _RawWrite(big_snap), _shapes(big), nbig, "cachex/local write 256MiB"
            ),  # fmt: skip
        ]
    return out
