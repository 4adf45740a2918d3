"""The CacheX orbax handler and manager: T0 staging, T1 local, T2 replica, T3 PFS drain.

``CacheXHandler`` is an orbax ``AsyncCheckpointHandler``. Its ``async_save`` runs in the
training loop and does T0 (copy into the staging pool); the returned commit future does
T1 (write + fsync files + fsync directory) and T2 (push to the neighbour's replica server and
wait for its fsync + rename ack). orbax finalizes (atomically renames) the step only after the
commit future returns, so an orbax-committed CacheX step is replica-durable; the manager then
``fsync``s orbax's renames (the step folder and ``steps/``), so the local copy is durable too.
T3 (PFS) runs outside orbax's commit, in the drainer process (:mod:`hexad.cachex._pfs`).

What blocks training. orbax keeps at most one save in flight: a save first waits for the
previous save's commit (T1 + T2 + finalize). So a ``save`` call blocks for
``stall ~ max(T0, T1 + T2 - interval)`` (``interval``: the time since the previous ``save``
returned), and :meth:`CacheXManager.stall_seconds` reports exactly that measured blocking
time; the T0 copy alone is :meth:`CacheXManager.stage_seconds`. A second staging slot is
therefore only used while a save fails over. Besides T0, the blocking part holds only CacheX's
checks: ``save`` stages the arrays itself and hands orbax's ``CheckpointManager.save`` (its
bookkeeping: an event loop, its threads, the finalize thread) to one long-lived thread per
manager, so orbax's Python runs after the training loop has its arrays back. The step folders
are made by the commit (:class:`_TemporaryPath`), the commits run on a second long-lived thread
(:class:`_SerialWorker`) that starts writing once orbax's save call has returned, and the
previous step's ``fsync``s run there too. An error of orbax's save call is raised by the next
``save``, ``wait_until_finished`` or ``close``, as a failed commit's is.

``CacheXManager`` wraps ``orbax.checkpoint.CheckpointManager`` with that handler, a
preservation policy that never deletes the newest PFS-durable step nor any newer step still
waiting for the drain, durability records, and a restore that falls back local -> neighbour
replica -> PFS, with all processes agreeing on the newest step every one of them can read.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import queue
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_args

from hexad._base import check_int
from hexad.cachex import _format, _fsio, _pfs, _replica

__all__ = [
    "CacheXHandler",
    "CacheXManager",
    "CacheXRestore",
    "CacheXSave",
    "PinnedLimitError",
    "RestoreCheck",
    "Restored",
    "UnreadableCheckpointError",
    "check_restore",
    "resume",
    "verified_steps",
]

ITEM = "state"
# A commit waits this long at most for its save call to return (a bound, never reached when
# the save goes through CacheXManager, which opens the gate as orbax's save returns).
_GATE_TIMEOUT_S = 5.0
TIERS = ("local", "replica", "pfs")
FAULT_POINTS = ("staging", "local_write", "local_written", "replica_acked", "commit")


class PinnedLimitError(RuntimeError):
    """A save would pin more undrained steps or bytes than the manager's cap allows."""


class UnreadableCheckpointError(FileNotFoundError):
    """A restore found no readable step, but some step or tier could not be read or listed.

    Unlike a plain ``FileNotFoundError`` (an empty checkpoint directory) this says that
    checkpointed state may exist: :func:`resume` raises it rather than start over at step 0.
    The message names every skipped entry (also in the manager's ``restore_skipped`` event).
    """


def _check_fault_hooks(hooks: Mapping[str, Callable[[int], None]] | None) -> dict:
    if hooks is None:
        return {}
    if not isinstance(hooks, Mapping):
        raise TypeError(
            f"fault_hooks: expected a mapping from point names to callables, got "
            f"{type(hooks).__name__}"
        )
    unknown = sorted(set(hooks) - set(FAULT_POINTS))
    if unknown:
        raise ValueError(f"fault_hooks: expected point names from {FAULT_POINTS}, got {unknown}")
    for point, hook in hooks.items():
        if not callable(hook):
            raise TypeError(f"fault_hooks[{point!r}]: expected a callable, got {hook!r}")
    return dict(hooks)


class _Node:
    """What one process's handler shares with its manager (static, host-side)."""

    def __init__(self, rank, steps_dir, records_dir, pool, neighbour, require_replica, hooks=None):
        self.rank = rank
        self.steps_dir = Path(steps_dir)
        self.records_dir = Path(records_dir)
        self.pool = pool
        self.neighbour = neighbour
        self.require_replica = require_replica
        self.stalls: dict[int, float] = {}
        self.stages: dict[int, float] = {}
        self.errors: dict[int, str] = {}
        self.hooks: dict[str, Callable[[int], None]] = hooks or {}
        self.events: list[dict] = []
        self.replica_retries = 0
        self.replica_backoff_s = 0.0
        self.worker = _SerialWorker(f"cachex-commit-rank{rank}")
        # orbax's save calls (CacheXManager.save), off the training loop's thread
        self.caller = _SerialWorker(f"cachex-orbax-rank{rank}")
        # step -> (slot, snapshot, t0): staged by CacheXManager.save for the handler
        self.staged: dict[int, tuple[int, Any, float]] = {}
        # Set once orbax's save call of a step has returned (see CacheXHandler._commit).
        self.gate = threading.Event()
        self.gate.set()
        self.after_commit: Callable[[], None] | None = None
        self.pending_dirs: list[tuple] = []  # recorded by _TemporaryPath.create

    def event(self, kind: str, step: int | None = None, **info: Any) -> None:
        """Appends an event (a drainer restart, degraded durability, ...) to the node's log."""
        ev = {"time": time.time(), "event": kind, "step": step, **info}
        self.events.append(ev)
        try:
            with open(self.records_dir / "events.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps(ev, sort_keys=True) + "\n")
        except OSError:
            pass

    def fault(self, point: str, step: int) -> None:
        """Calls the fault hook registered at ``point`` (a test seam; see CacheXManager)."""
        hook = self.hooks.get(point)
        if hook is not None:
            hook(int(step))


def _await_dir(path: Path, timeout_s: float = 300.0) -> None:
    """Waits until orbax has created ``path`` (its step directory) before writing into it."""
    t_end = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > t_end:
            raise TimeoutError(f"{path}: not created by orbax within {timeout_s} s")
        time.sleep(0.002)


class _CommitFuture:
    """An orbax commit future: ``result`` waits for one job of the node's commit worker.

    Unlike orbax's ``CommitFutureAwaitingContractedSignals`` it waits on no signal from the
    jax.distributed key-value store: CacheX managers create their step directories
    synchronously (``create_directories_asynchronously=False``), and orbax 0.12 keys its
    signal contract by operation id only, so independent per-process managers in one
    jax.distributed job could wait on each other's keys.
    """

    def __init__(self, name: str):
        self.name = name
        self._done = threading.Event()
        self._error: list[BaseException] = []

    def result(self, timeout: float | None = None):
        if not self._done.wait(timeout):
            raise TimeoutError(f"{self.name}: commit still running after {timeout} s")
        if self._error:
            raise self._error[0]

    def cancel(self):
        return False


class _SerialWorker:
    """One long-lived thread that runs a node's jobs in order: its commits (T1 + T2), or its
    orbax save calls.

    orbax keeps one save in flight, so one thread is enough; starting a thread per save
    would cost the training loop a thread start (the caller waits until the new thread runs,
    a scheduling delay on a loaded host) on every save. The thread starts with the first
    save and exits on :meth:`stop` (the manager's ``close``); a save after that starts it
    again.
    """

    def __init__(self, name: str):
        self._name = name
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue | None = None  # the running thread's own queue

    def submit(self, job: Callable[[], None]) -> _CommitFuture:
        fut = _CommitFuture(self._name)
        with self._lock:
            if self._jobs is None:
                self._jobs = queue.SimpleQueue()
                threading.Thread(
                    target=self._run, args=(self._jobs,), name=self._name, daemon=True
                ).start()
            self._jobs.put((job, fut))
        return fut

    @staticmethod
    def _run(jobs: queue.SimpleQueue) -> None:
        while True:
            item = jobs.get()
            if item is None:
                return
            job, fut = item
            try:
                job()
            except BaseException as e:  # noqa: BLE001 - re-raised by fut.result()
                fut._error.append(e)
            finally:
                fut._done.set()

    def stop(self) -> None:
        """Lets the thread exit once the jobs already submitted are done."""
        with self._lock:
            if self._jobs is not None:
                self._jobs.put(None)
                self._jobs = None


class _TemporaryPath(ocp.path.atomicity.AtomicRenameTemporaryPath):
    """orbax's atomic-rename temporary path, its folder made by the CacheX commit.

    orbax (with synchronous directory creation) calls ``create`` for the step folder and
    the item folder in the blocking part of a save, and its own ``create`` runs every check,
    removal and ``mkdir`` through ``asyncio.to_thread`` on a fresh event loop: a thread
    start each, and an ``mkdir`` that can wait on the file system's journal while other
    writers ``fsync``. Here ``create`` only records the folder; the save's commit job makes
    it first, on the node's commit worker, with what orbax's ``create`` does (remove an
    unfinalized leftover, ``mkdir``, write the step metadata). Nothing in the blocking part
    of an orbax save touches the folder, and orbax renames it only after the commit future
    (which made it) has returned; unlike orbax's asynchronous directory creation this needs
    no signal through the jax.distributed key-value store (see :class:`_CommitFuture`).

    :class:`CacheXManager` gives orbax a subclass bound to its node (``_node``).
    """

    _node: _Node | None = None

    async def create(self):
        node = self._node
        if node is None or self._snapshot is not None:
            return await super().create()
        node.pending_dirs.append(
            (
                self.get(),
                self._path_permission_mode,
                self._checkpoint_metadata_store,
                time.time_ns(),
            )  # fmt: skip
        )
        return self.get()


# The step metadata orbax writes into a new step folder (orbax 0.12's
# ``step_metadata_serialization.serialize(StepMetadata(init_timestamp_nsecs=...))``; neither is
# public API). orbax's finalize adds the commit time to it; ``ocp.metadata.get_step_metadata``
# reads it back (tests/cachex/test_cachex_leaves.py checks that it does).
_STEP_METADATA_FILE = "_CHECKPOINT_METADATA"


def _step_metadata(init_ns: int) -> dict[str, Any]:
    return {
        "item_handlers": None,
        "metrics": {},
        "performance_metrics": {},
        "init_timestamp_nsecs": int(init_ns),
        "commit_timestamp_nsecs": None,
        "custom_metadata": {},
    }


def _make_dirs(pending) -> None:
    """Makes the folders :meth:`_TemporaryPath.create` recorded, in order (orbax's steps)."""
    for path, mode, store, init_ns in pending:
        if os.path.lexists(path):  # an unfinalized leftover (orbax removes it too)
            shutil.rmtree(path)
        os.makedirs(path, **({} if mode is None else {"mode": mode}))
        if store is not None:
            store.write(file_path=path / _STEP_METADATA_FILE, metadata=_step_metadata(init_ns))


def _run_sync(coro) -> Any:
    """Runs ``coro`` to completion from synchronous code, also when an event loop is running
    in this thread (then on a fresh loop in a helper thread, as ``asyncio.run`` refuses)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    result: list[Any] = []
    error: list[BaseException] = []

    def target():
        try:
            result.append(asyncio.run(coro))
        except BaseException as e:  # noqa: BLE001 - re-raised below, on the caller's thread
            error.append(e)

    t = threading.Thread(target=target, name="cachex-run-sync")
    t.start()
    t.join()
    if error:
        raise error[0]
    return result[0]


class CacheXHandler(ocp.AsyncCheckpointHandler):
    """orbax async handler: T0 staging in ``async_save``, T1 + T2 in the commit future.

    Build it through :class:`CacheXManager`; it is registered with :class:`CacheXSave` and
    :class:`CacheXRestore`.
    """

    def __init__(self, node: _Node | None = None):
        self._node = node

    async def async_save(self, directory, args: CacheXSave | None = None, **kwargs):
        if args is None or self._node is None:
            raise ValueError(
                "CacheXHandler.async_save: expected args=CacheXSave(...) via a manager"
            )
        node = self._node
        staged = node.staged.pop(args.step, None)
        if staged is not None:  # CacheXManager.save staged it before calling orbax
            slot, snap, t0 = staged
        else:
            t0 = time.perf_counter()
            node.fault("staging", args.step)
            slot, snap = node.pool.stage(args.state)
            node.stages[args.step] = time.perf_counter() - t0
        node.gate.clear()
        step, dirs, extra = args.step, list(node.pending_dirs), dict(args.meta or {})
        node.pending_dirs.clear()
        return [
            node.worker.submit(lambda: self._commit(directory, slot, snap, step, t0, dirs, extra))
        ]

    def _commit(self, directory, slot, snap, step, t0, dirs=(), extra=None):
        # T1 (local write + fsyncs) and T2 (push of the same staged bytes to the neighbour)
        # run concurrently; the step is committed when both are done.
        node = self._node
        cancel = threading.Event()
        pusher = None
        t_replica: list[float] = []
        try:
            # The previous step's orbax renames are fsynced here, and nothing is written
            # until the training loop's save call has returned (the gate): the background
            # work never competes with the blocking part of the save.
            node.gate.wait(_GATE_TIMEOUT_S)
            if node.after_commit is not None:
                node.after_commit()
            _make_dirs(dirs)  # the step and item folders orbax asked for (_TemporaryPath)
            d = Path(directory)
            _await_dir(d)  # made just above (a _TemporaryPath); never write before it exists
            meta = {**(extra or {}), "step": int(step), "rank": node.rank}
            if node.neighbour is not None:  # both tiers need the CRC-32: computed once, first
                views, manifest = _format.encode_rank(snap, meta)
            replica_err: list[BaseException] = []

            def push():
                try:
                    crc = json.loads(manifest)["files"][0]["crc32"]
                    files = [
                        (_format.DATA_FILE, views, crc),
                        (_format.MANIFEST_FILE, [manifest], _fsio.crc32_bytes(manifest)),
                    ]
                    for attempt in range(node.replica_retries + 1):
                        try:
                            node.neighbour.push_files(node.rank, step, files, cancel=cancel)
                            break
                        except _replica.ReplicaError as e:
                            if attempt == node.replica_retries or cancel.is_set():
                                raise
                            node.event("replica_retry", step, attempt=attempt + 1, error=str(e))
                            if cancel.wait(node.replica_backoff_s * 2.0**attempt):
                                raise

                    t_replica.append(time.perf_counter() - t0)
                    node.fault("replica_acked", step)
                except BaseException as e:  # noqa: BLE001 - re-raised below, on this thread
                    replica_err.append(e)

            if node.neighbour is not None:
                pusher = threading.Thread(target=push, name="cachex-replica-push", daemon=True)
                pusher.start()
            node.fault("local_write", step)
            if node.neighbour is not None:
                nbytes = _format.write_encoded(d, views, manifest)
            else:  # the CRC-32 is computed while the data's fsync waits on the disk
                nbytes = _format.write_rank_dir(d, snap, meta)
            node.fault("local_written", step)
            t_local = time.perf_counter() - t0
            _pfs.record_tier(node.records_dir, step, "staged", seconds=node.stages.get(step))
            _pfs.record_tier(node.records_dir, step, "local", seconds=t_local, nbytes=nbytes)
            if pusher is not None:
                pusher.join()
                if replica_err:
                    e = replica_err[0]
                    node.errors[step] = str(e)
                    _pfs.record_tier(node.records_dir, step, "replica_error", error=str(e))
                    if node.require_replica or not isinstance(e, _replica.ReplicaError):
                        raise e
                    node.event("degraded_durability", step, error=str(e))
                else:
                    _pfs.record_tier(node.records_dir, step, "replica", seconds=t_replica[0])
                    # Replica GC follows local GC (off the training loop's path).
                    keep = sorted(_fsio.step_entries(node.steps_dir)[0])
                    try:
                        node.neighbour.retain(node.rank, [*keep, int(step)])
                    except _replica.ReplicaError:
                        pass
            node.fault("commit", step)
        except BaseException:
            cancel.set()  # the save failed: the neighbour must not commit it
            # orbax never finalizes a failed step, and would reuse its temporary folder only
            # when the same step is saved again: until then it holds the disk a full disk
            # needs back. A SIGKILL skips this; orbax's next save of the step removes those.
            for path, _mode, store, _ns in dirs:
                if store is not None:  # its write of the step metadata may still be queued
                    with contextlib.suppress(Exception):
                        store.wait_until_finished()
                shutil.rmtree(path, ignore_errors=True)
            if pusher is not None:
                pusher.join()
                if t_replica:  # the push had already committed: drop that replica again
                    keep = sorted(_fsio.step_entries(node.steps_dir)[0])
                    try:
                        node.neighbour.retain(node.rank, [s for s in keep if s != int(step)])
                    except _replica.ReplicaError:
                        pass
            raise
        finally:
            if pusher is not None:
                pusher.join()  # never free the slot while the push still reads its buffers
            node.pool.release(slot)

    def save(self, directory, args: CacheXSave | None = None, **kwargs):
        async def run():
            futures = await self.async_save(directory, args=args) or []
            self._node.gate.set()
            for f in futures:
                f.result()

        _run_sync(run())

    def restore(self, directory, args: CacheXRestore | None = None, **kwargs):
        manifest, pieces = _format.read_rank_dir(Path(directory))
        if args is None or args.target is None:
            raise ValueError("CacheXHandler.restore: expected args=CacheXRestore(target=...)")
        return _format.assemble_tree(args.target, manifest, pieces)

    def metadata(self, directory):
        return _format.read_manifest(Path(directory))

    def finalize(self, directory):
        pass

    def close(self):
        pass


@checkpoint_args.register_with_handler(CacheXHandler, for_save=True)
@dataclasses.dataclass
class CacheXSave(checkpoint_args.CheckpointArgs):
    """Save args: the pytree ``state``, its ``step`` and ``meta``, extra manifest fields (the
    save's identity: ``save_id`` and ``timeline``, see :meth:`CacheXManager.restore`)."""

    state: Any
    step: int = 0
    meta: dict | None = None


@checkpoint_args.register_with_handler(CacheXHandler, for_restore=True)
@dataclasses.dataclass
class CacheXRestore(checkpoint_args.CheckpointArgs):
    """Restore args: ``target``, the pytree to restore into (arrays or ShapeDtypeStructs)."""

    target: Any = None


@dataclasses.dataclass
class _Preserve:
    """orbax preservation policy: latest ``n`` + newest PFS-durable + every newer step.

    PFS-durable means committed on the PFS with this rank's part the very save this run made
    (:meth:`CacheXManager.newest_pfs_step`), not only this rank's part written, nor a folder
    of that number holding another save. A step newer than the newest PFS-durable one is
    pinned until the drainer persists it (the drainer reads it from the node-local tier).
    That includes a step whose drain failed, while it waits for a retry and after its
    retries are exhausted: it stays pinned (locally, and on the neighbour's replica, whose GC
    follows the local one) until it or a newer step is PFS-durable. Without a PFS, the
    latest ``n`` are kept: the newest orbax-committed step is then the newest durable one and
    is always among them.
    """

    manager: CacheXManager
    n: int

    def should_preserve(self, checkpoints, *, context=None):
        steps = [c.step for c in checkpoints]
        keep = [i >= len(steps) - self.n for i in range(len(steps))]
        if self.manager.pfs_dir is not None:
            newest = self.manager.newest_pfs_step()
            keep = [k or s >= newest for k, s in zip(keep, steps, strict=True)]
        return keep


@dataclasses.dataclass(frozen=True)
class Restored:
    """What :meth:`CacheXManager.restore` returns: the step, the tree and the tier read."""

    step: int
    state: Any
    tier: str


class CacheXManager:
    """Checkpoints pytrees through orbax with DRAM staging, neighbour replica and PFS drain.

    Args:
      directory: this node's local root; holds ``steps/`` (orbax) and ``durability/``.
      neighbour: a :class:`ReplicaClient` for the neighbour's replica server (T2), or None.
      pfs_dir: the PFS root shared by all ranks (T3), or None for no drain.
      pfs_model: a :class:`PFSModel` the drainer imposes on its writes, or None.
      max_to_keep: local steps kept besides the pinned ones (static), >= 1.
      staging_slots: depth of the staging pool (2 = double buffering).
      require_replica: if True a failed replica push fails the save (orbax then never commits
        it); if False the step commits local-only and records ``replica_error`` and a
        ``degraded_durability`` event.
      replica_retries: further attempts of a failed push (>= 0), each after a backoff of
        ``replica_backoff_s * 2**attempt`` seconds and recorded as a ``replica_retry`` event,
        before the push counts as failed.
      neighbour_rank: the rank whose server ``neighbour`` talks to, if known: it must not be
        this rank (:func:`hexad.cachex.choose_partner` picks one on another host).
      rank, n_ranks: this process and the number of processes (default: ``jax``'s).
      seed: seeds the PFS model's latency draws.
      drainer: start the drainer process (when ``pfs_dir`` is set).
      pfs_max_to_keep: committed PFS steps kept by the drainers' GC (>= 1; the newest is never
        deleted, nor a step still draining), or None to keep every PFS step.
      drain_max_attempts: attempts to drain one step before its failure is final (>= 1).
      drain_backoff_s: wait before the first retry of a failed drain; it doubles after each
        further failure, capped at ``drain_backoff_max_s``. Attempts, errors and the next try
        are in the step's ``pfs_retry`` record, a final failure in ``pfs_error``.
      max_pinned_steps, max_pinned_bytes: a cap (>= 1, or None for none) on the local steps
        newer than the newest PFS-durable one (pinned until drained) and on their bytes:
        ``save`` raises :class:`PinnedLimitError` instead of filling the disk when a PFS
        outage has pinned this many.
      fault_hooks: a seam for fault injection (tests, the durability study), or None:
        ``{point: hook}``, each ``hook(step)`` called at that point of every save, free to
        raise (the save then fails as if that stage had failed) or to kill the process.
        Points, in the order a save reaches them (``CacheXManager.FAULT_POINTS``):
        ``"staging"`` (in ``save``, before the T0 copy); ``"local_write"`` (commit thread,
        before the T1 files are written); ``"local_written"`` (after they and their directory
        are fsynced, before the ``local`` record); ``"replica_acked"`` (push thread, after the
        neighbour acknowledged the replica; concurrent with the T1 points); ``"commit"``
        (after T1 and T2, before orbax finalizes the step). An unknown point is an error.

    >>> import tempfile, numpy as np
    >>> m = CacheXManager(tempfile.mkdtemp())
    >>> m.save(0, {"w": np.ones(3, np.float32)})
    True
    >>> m.wait_until_finished(); m.restore({"w": np.zeros(3, np.float32)}).step
    0
    >>> m.close()
    """

    FAULT_POINTS = FAULT_POINTS

    def __init__(
        self,
        directory: str | Path,
        *,
        neighbour: _replica.ReplicaClient | None = None,
        pfs_dir: str | Path | None = None,
        pfs_model: _pfs.PFSModel | None = None,
        max_to_keep: int = 2,
        staging_slots: int = 2,
        require_replica: bool = True,
        rank: int | None = None,
        n_ranks: int | None = None,
        seed: int = 0,
        drainer: bool = True,
        pfs_max_to_keep: int | None = None,
        drain_max_attempts: int = 5,
        drain_backoff_s: float = 0.5,
        drain_backoff_max_s: float = 30.0,
        fault_hooks: Mapping[str, Callable[[int], None]] | None = None,
        max_pinned_steps: int | None = None,
        max_pinned_bytes: int | None = None,
        neighbour_rank: int | None = None,
        replica_retries: int = 2,
        replica_backoff_s: float = 0.2,
    ):
        if not isinstance(max_to_keep, int) or max_to_keep < 1:
            raise ValueError(f"max_to_keep: expected an int >= 1, got {max_to_keep!r}")
        for name, v in (("max_pinned_steps", max_pinned_steps),
                        ("max_pinned_bytes", max_pinned_bytes)):  # fmt: skip
            if v is not None:
                check_int(name, v, lo=1)
        self.max_pinned_steps = max_pinned_steps
        self.max_pinned_bytes = max_pinned_bytes
        replica_retries = check_int("replica_retries", replica_retries, lo=0)
        if not (isinstance(replica_backoff_s, (int, float)) and replica_backoff_s >= 0):
            raise ValueError(f"replica_backoff_s: expected a float >= 0, got {replica_backoff_s!r}")
        if neighbour is not None and not isinstance(neighbour, _replica.ReplicaClient):
            raise TypeError(f"neighbour: expected a ReplicaClient, got {type(neighbour).__name__}")
        hooks = _check_fault_hooks(fault_hooks)
        retry = dict(
            pfs_max_to_keep=pfs_max_to_keep,
            retry_max_attempts=drain_max_attempts,
            retry_backoff_s=drain_backoff_s,
            retry_backoff_max_s=drain_backoff_max_s,
        )
        try:  # validate before anything is created or started
            _pfs.DrainerConfig("", "", "", "", **retry)
        except ValueError as e:  # name the manager's argument, not the drainer's field
            for ours, theirs in (("drain_max_attempts", "retry_max_attempts"),
                                 ("drain_backoff_max_s", "retry_backoff_max_s"),
                                 ("drain_backoff_s", "retry_backoff_s")):  # fmt: skip
                if str(e).startswith(theirs + ":"):
                    raise ValueError(ours + str(e)[len(theirs) :]) from None
            raise
        self.directory = Path(directory).absolute()
        self.steps_dir = self.directory / "steps"
        self.records_dir = self.directory / "durability"
        self.records_dir.mkdir(parents=True, exist_ok=True)
        self.steps_dir.mkdir(parents=True, exist_ok=True)
        self.pfs_dir = Path(pfs_dir).absolute() if pfs_dir is not None else None
        self.rank = jax.process_index() if rank is None else int(rank)
        self.n_ranks = jax.process_count() if n_ranks is None else int(n_ranks)
        if not 0 <= self.rank < self.n_ranks:
            raise ValueError(f"rank: expected 0 <= rank < n_ranks={self.n_ranks}, got {self.rank}")
        if neighbour_rank is not None and int(neighbour_rank) == self.rank:
            raise ValueError(
                f"neighbour_rank: the neighbour must be another rank (another node), got this "
                f"rank {self.rank} (see hexad.cachex.choose_partner)"
            )
        self.neighbour = neighbour
        self.pool = _format.StagingPool(staging_slots)
        self._node = _Node(
            self.rank,
            self.steps_dir,
            self.records_dir,
            self.pool,
            neighbour,
            require_replica,
            hooks,
        )
        self._node.replica_retries = replica_retries
        self._node.replica_backoff_s = float(replica_backoff_s)
        self.handler = CacheXHandler(self._node)
        # orbax's blocking part of a save is kept to its bookkeeping and the handler's T0: the
        # step and item folders are made by the commit (_TemporaryPath), and the destination's
        # existence check is skipped (skip_sync_file_validations): ``save`` has already
        # refused a step orbax lists, and the final rename fails rather than replace a folder
        # that exists (orbax's default removes such a folder first).
        options = ocp.CheckpointManagerOptions(
            enable_async_checkpointing=True,
            async_options=ocp.AsyncOptions(create_directories_asynchronously=False),
            file_options=ocp.options.FileOptions(skip_sync_file_validations=True),
            temporary_path_class=type("_TemporaryPath", (_TemporaryPath,), {"_node": self._node}),
            create=False,
            preservation_policy=_Preserve(self, max_to_keep),
            multiprocessing_options=ocp.options.MultiprocessingOptions(
                primary_host=None,
                active_processes={jax.process_index()},
                barrier_sync_key_prefix=f"cachex_rank{self.rank}",
            ),
        )
        self._mngr = ocp.CheckpointManager(
            self.steps_dir, item_handlers={ITEM: self.handler}, options=options
        )
        self._pending: _CommitFuture | None = None  # orbax's save call on the orbax thread
        self._drainer = None
        self._drainer_restarts = 0
        self._neighbour_down = False
        self._fsynced: set[int] = set()
        self._fsync_lock = threading.Lock()
        self._strays_reported: set[tuple[str, str]] = set()
        self._pruned_cache: tuple[int, dict[int, dict]] = (0, {})
        self._lineage: dict[str, str] | None = None  # see _current_lineage
        self.listing_skipped: list[str] = []
        self._node.after_commit = self._fsync_committed
        if self.pfs_dir is not None:
            self.pfs_dir.mkdir(parents=True, exist_ok=True)
            stop = self.records_dir / "drainer.stop"
            if stop.exists():
                stop.unlink()
            self.drainer_config = _pfs.DrainerConfig(
                steps_dir=str(self.steps_dir),
                item=ITEM,
                records_dir=str(self.records_dir),
                pfs_dir=str(self.pfs_dir),
                rank=self.rank,
                n_ranks=self.n_ranks,
                pfs=dataclasses.asdict(pfs_model) if pfs_model is not None else None,
                seed=seed,
                parent_pid=os.getpid(),
                **retry,
            )
            if drainer:
                self._drainer = _pfs.spawn_drainer(self.drainer_config, self.drainer_log)

    @property
    def drainer_log(self) -> Path:
        """The file the drainer's output goes to (appended; a dead drainer's traceback)."""
        return self.records_dir / f"drainer_rank{self.rank}.log"

    # -- saving ----------------------------------------------------------------------------------

    def save(self, step: int, state: Any, force: bool = False) -> bool:
        """Starts saving ``state`` as ``step``; returns True (the save is under way).

        Blocks for the T0 copy and, before it, for the previous save's commit (orbax keeps one
        save in flight): ``stall ~ max(T0, T1 + T2 - interval)``, measured by
        :meth:`stall_seconds`. Checks the drainer first (restarts it if it has exited) and
        the pinned-steps cap (raises :class:`PinnedLimitError`). orbax's own save call runs
        after this returns, on the manager's orbax thread; its error, like a failed commit's,
        is raised by the next ``save``, :meth:`wait_until_finished` or :meth:`close`.

        Durability records left under ``step``'s number by a step no longer on the local disk
        (a failed save, an abandoned timeline) are removed first, so they never vouch for
        the new step.

        Raises:
          ValueError: ``step`` is not newer than the latest local step (orbax would skip
            the save, while records of that number may still claim it durable); unless
            ``force``.
          PinnedLimitError: the pinned-steps cap is reached.
        """
        _fsio.validate_step_name(step)
        t0 = time.perf_counter()
        self._check_services()
        self._check_pinned()
        self._orbax_save(int(step), state, force, fresh=not force, t0=t0)
        self._node.stalls[int(step)] = time.perf_counter() - t0
        return True

    def _orbax_save(
        self,
        step: int,
        state: Any,
        force: bool,
        fresh: bool = False,
        meta: dict | None = None,
        t0: float | None = None,
    ) -> None:
        """Waits for the previous save, stages ``state`` (T0) and hands orbax's save call to
        the orbax thread. The commit starts writing once that call has returned
        (CacheXHandler._commit); it also fsyncs the previous step's orbax renames."""
        t0 = time.perf_counter() if t0 is None else t0
        self._wait_orbax()
        if fresh:
            latest = self._mngr.latest_step()
            if latest is not None and step <= latest:
                raise ValueError(
                    f"step: expected a step newer than the latest saved step {latest}, got "
                    f"{step} (orbax would not save it); after a rollback or a fallback restore, "
                    f"save under a step number above {latest}"
                )
            self._drop_stale_records(step)
        if meta is None:
            meta = {"save_id": secrets.token_hex(8), **self._current_lineage()}
        node = self._node
        node.fault("staging", step)
        t_stage = time.perf_counter()
        slot, snap = node.pool.stage(state)
        node.stages[step] = time.perf_counter() - t_stage
        node.staged[step] = (slot, snap, t0)
        self._pending = node.caller.submit(lambda: self._orbax_call(step, force, meta))

    def _orbax_call(self, step: int, force: bool, meta: dict) -> None:
        """orbax's save of the staged ``step`` (on the orbax thread)."""
        node = self._node
        try:
            # orbax raises a failed finalize once per calling thread: the caller's thread has
            # raised it already (_wait_orbax, before this job was submitted), so here it is
            # consumed rather than raised again by the save below.
            with contextlib.suppress(Exception):
                self._mngr.wait_until_finished()
            item = CacheXSave(None, step, meta)
            if not self._mngr.save(step, args=ocp.args.Composite(**{ITEM: item}), force=force):
                raise RuntimeError(f"step {step}: orbax declined to save it")
        except BaseException:
            self._relist()
            raise
        finally:
            staged = node.staged.pop(step, None)
            if staged is not None:  # orbax never reached the handler: free the slot
                node.pool.release(staged[0])
            node.pending_dirs.clear()  # folders no handler claimed (a failed save)
            node.gate.set()

    def _current_lineage(self) -> dict[str, str]:
        """The ``timeline`` (and ``branched_from``) new saves carry: what a restore set, else
        the newest readable local step's (a restarted process continues it), else a fresh
        timeline."""
        if self._lineage is None:
            for s in reversed(self.all_steps()):
                try:
                    meta = _format.read_manifest(self.steps_dir / str(s) / ITEM)["meta"]
                except (OSError, ValueError):
                    continue
                self._lineage = _lineage_of(meta)
                break
            if not self._lineage:
                self._lineage = {"timeline": secrets.token_hex(8)}
        return dict(self._lineage)

    def _drop_stale_records(self, step: int) -> None:
        """Removes ``step``'s records, if any, before ``step`` is saved anew (none of them is
        about the new step); an event names what was removed."""
        d = self.records_dir / str(step)
        logged = self._pruned(step)
        if logged:
            self._append_pruned([{"step": step, "records": None}])  # the log forgets them too
        if not os.path.lexists(d):
            if logged:
                self._node.event("stale_records_removed", step, tiers=sorted(logged))
            return
        stale = sorted(p.stem for p in d.glob("*.json")) if d.is_dir() else []
        aside = self.records_dir / f".stale-{step}-{time.monotonic_ns()}"
        os.rename(d, aside)  # the claims vanish at once, not file by file
        _fsio.fsync_dir(self.records_dir)
        if aside.is_dir():
            shutil.rmtree(aside, ignore_errors=True)
        else:
            aside.unlink(missing_ok=True)
        self._node.event("stale_records_removed", step, tiers=stale)

    def _wait_orbax(self) -> None:
        """Waits for orbax's save call (the orbax thread) and orbax's ``wait_until_finished``;
        after a failed save, orbax relists the disk."""
        pending, self._pending = self._pending, None
        try:
            if pending is not None:
                pending.result()
            self._mngr.wait_until_finished()
        except BaseException:
            self._relist()
            raise

    def discard_after(self, step: int) -> list[int]:
        """Removes the local steps newer than ``step`` (and their durability records), so
        that saving continues from ``step + 1``; returns them. :func:`resume` calls it when
        the ranks agreed on an older step than this rank's newest (a rank that committed a
        step the others never did): those steps belong to no timeline the job can continue.
        Each is renamed aside before it is removed, so a kill midway never leaves a
        half-deleted step listed; a ``discarded_steps`` event names them."""
        self._wait_orbax()
        newer = [s for s in self.all_steps() if s > int(step)]
        for s in newer:
            trash = self.directory / f".discarded-{s}-{time.monotonic_ns()}"
            os.rename(self.steps_dir / str(s), trash)
            _fsio.fsync_dir(self.steps_dir)
            shutil.rmtree(trash, ignore_errors=True)
            self._drop_stale_records(s)
        if newer:
            self._mngr.reload()
            self._node.event("discarded_steps", int(step), steps=newer)
        return newer

    def _relist(self) -> None:
        """Makes orbax's list of steps the disk's again after a failed save.

        orbax drops the steps its GC will remove from its list when a save starts, but
        deletes them only once that save has committed: after a failure they stay on disk
        (and on the neighbour, whose GC follows the local listing) yet orbax would never
        consider them again. Relisting lets the next successful save's GC remove them, and
        drops the failed step orbax had listed as in flight.
        """
        try:
            self._mngr.reload()
        except Exception as e:  # noqa: BLE001 - the save's own error is the one to raise
            self._node.event("relist_failed", error=f"{type(e).__name__}: {e}")

    def _check_services(self) -> None:
        """Restarts an exited drainer (recording a ``drainer_restart`` event); after a save
        whose push failed, pings the neighbour and records ``neighbour_down`` /
        ``neighbour_up`` when its state changes."""
        if self.neighbour is not None and (self._node.errors or self._neighbour_down):
            alive = self.neighbour.ping()
            if alive == self._neighbour_down:
                self._neighbour_down = not alive
                self._node.event("neighbour_up" if alive else "neighbour_down")
            self._node.errors.clear()
        if self._drainer is None or self._drainer.poll() is None:
            return
        code = self._drainer.returncode
        self._drainer = _pfs.spawn_drainer(self.drainer_config, self.drainer_log)
        self._drainer_restarts += 1
        self._node.event("drainer_restart", exit_code=code)

    def _pinned(self) -> list[int]:
        if self.pfs_dir is None:
            return []
        newest = self.newest_pfs_step()
        return [s for s in self.all_steps() if s > newest]

    def _pinned_bytes(self, steps: Sequence[int]) -> int:
        total = 0
        for s in steps:
            d = self.steps_dir / str(s) / ITEM
            try:
                total += sum(p.stat().st_size for p in d.iterdir())
            except OSError:
                continue
        return total

    def _check_pinned(self) -> None:
        if self.max_pinned_steps is None and self.max_pinned_bytes is None:
            return
        pinned = self._pinned()
        if self.max_pinned_steps is not None and len(pinned) >= self.max_pinned_steps:
            raise PinnedLimitError(
                f"max_pinned_steps: {len(pinned)} local steps {pinned[:8]} wait for the PFS "
                f"drain (newest PFS-durable step {self.newest_pfs_step()}); refusing to pin "
                f"more than {self.max_pinned_steps} (is the PFS or the drainer down? see health())"
            )
        if self.max_pinned_bytes is not None:
            nbytes = self._pinned_bytes(pinned)
            if nbytes >= self.max_pinned_bytes:
                raise PinnedLimitError(
                    f"max_pinned_bytes: {nbytes} bytes in {len(pinned)} undrained local steps; "
                    f"refusing to pin more than {self.max_pinned_bytes} (see health())"
                )

    def _fsync_committed(self) -> None:
        """``fsync``s orbax's unsynced files and renames of every newly committed step."""
        with self._fsync_lock:
            self._fsync_committed_locked()

    def _fsync_committed_locked(self) -> None:
        steps = [s for s in self.all_steps() if s not in self._fsynced]
        if not steps:
            return
        for s in steps:
            d = self.steps_dir / str(s)
            try:
                for p in d.iterdir():
                    if p.is_file():
                        fd = os.open(p, os.O_RDONLY)
                        try:
                            os.fsync(fd)
                        finally:
                            os.close(fd)
                _fsio.fsync_dir(d)
            except (FileNotFoundError, NotADirectoryError):  # removed or replaced meanwhile
                continue
        _fsio.fsync_dir(self.steps_dir)
        local = self.all_steps()
        self._fsynced = set(steps) | (self._fsynced & set(local))
        self._prune_records(local)

    def _prune_records(self, local: Sequence[int]) -> None:
        """Moves the records of steps that orbax's GC has removed into ``pruned.jsonl``.

        Pruned: the records of every step older than the oldest local step, except the
        newest PFS-committed one (the durability lag is measured from it). The folders a save
        scans (:meth:`newest_pfs_step`, the drainer's candidates) then stay as few as the
        steps kept; :meth:`durability` still answers for a pruned step from the log.
        """
        if not local:  # a wiped node: nothing tells which records are stale
            return
        oldest = min(local)
        keep = self.newest_pfs_step()
        try:
            recs, _ = _fsio.step_entries(self.records_dir)
        except OSError:
            return
        old = sorted(s for s in recs if s < oldest and s != keep)
        if not old:
            return
        lines = [{"step": s, "records": self._records_in(recs[s])} for s in old]
        self._append_pruned(lines)  # before the folders go: a crash loses no record
        for s in old:
            aside = self.records_dir / f".pruned-{s}-{time.monotonic_ns()}"
            try:
                os.rename(recs[s], aside)
            except OSError:
                continue
            shutil.rmtree(aside, ignore_errors=True)

    @property
    def _pruned_log(self) -> Path:
        return self.records_dir / "pruned.jsonl"

    def _append_pruned(self, lines: Sequence[dict]) -> None:
        with open(self._pruned_log, "a", encoding="utf-8") as fh:
            fh.write("".join(json.dumps(x, sort_keys=True) + "\n" for x in lines))
            fh.flush()
            os.fsync(fh.fileno())

    def _pruned(self, step: int) -> dict[str, dict]:
        """The records :meth:`_prune_records` logged for ``step`` ({} if none or reused)."""
        try:
            size = self._pruned_log.stat().st_size
        except OSError:
            return {}
        offset, table = self._pruned_cache
        if size < offset:  # a new log: read it from the start
            offset, table = 0, {}
        if size > offset:  # only what was appended since the last read is parsed
            with open(self._pruned_log, "rb") as fh:
                fh.seek(offset)
                chunk = fh.read(size - offset)
            complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits
            for line in complete.splitlines():
                try:
                    x = json.loads(line)
                    table[int(x["step"])] = x["records"] or {}
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut short by a crash
            self._pruned_cache = (offset + len(complete), table)
        return dict(table.get(int(step), {}))

    @staticmethod
    def _records_in(d: Path) -> dict[str, dict]:
        out = {}
        for p in d.glob("*.json"):
            try:
                out[p.stem] = _fsio.read_json(p)
            except (ValueError, OSError):
                continue
        return out

    def wait_until_finished(self) -> None:
        """Blocks until the in-flight save is committed (replica-durable, local copy fsynced)."""
        self._wait_orbax()
        self._fsync_committed()

    def stall_seconds(self, step: int) -> float | None:
        """The seconds the ``save`` call of ``step`` blocked the caller (the wait for the
        previous save's commit, the service checks and the T0 copy)."""
        return self._node.stalls.get(int(step))

    def stage_seconds(self, step: int) -> float | None:
        """The T0 staging copy of ``step`` alone (part of :meth:`stall_seconds`)."""
        return self._node.stages.get(int(step))

    @property
    def events(self) -> list[dict]:
        """The events of this manager, each ``{"time", "event", "step", ...}`` with ``event``
        one of ``drainer_restart``, ``replica_retry``, ``degraded_durability``,
        ``neighbour_down``, ``neighbour_up``, ``restore_rewrite_failed``."""
        return list(self._node.events)

    def newest_pfs_step(self) -> int:
        """The newest step this run saved that is PFS-committed, -1 if none.

        Proven by content, not by a folder's name: a step recorded ``pfs`` (records of a
        reused step number are removed when it is saved again), or a local step whose part
        of this rank on the PFS is the same save (the same manifest).
        A PFS folder of an abandoned timeline (the same number saved before a rollback) or
        one this run never saved does not count, so newer steps stay pinned until drained.
        """
        if self.pfs_dir is None:
            return -1
        recs = self.records_dir.iterdir() if self.records_dir.is_dir() else ()
        recorded = [int(p.name) for p in recs if p.name.isdigit() and (p / "pfs.json").exists()]
        proven = _pfs.durable_local_steps(self.drainer_config)
        return max([*recorded, *proven], default=-1)

    def health(self, ping_neighbour: bool = True) -> dict[str, Any]:
        """Liveness of the helpers and the rollback exposure, for a training loop to log.

        Returns a dict: ``drainer_alive`` (None without a drainer), ``drainer_restarts``,
        ``neighbour_alive`` (a ping of the replica server; None without a neighbour or with
        ``ping_neighbour=False``), ``newest_step`` (newest committed local step, -1 if none),
        ``newest_pfs_step`` (newest PFS-committed step, -1 if none), ``durability_lag_steps``
        (committed local steps newer than it: what a loss of this node and its neighbour
        would roll back; None without a PFS), ``durability_lag_s`` (seconds since the newest
        PFS-committed step was saved, or since the oldest pinned one if none is on the PFS;
        0 when nothing is pinned; None without a PFS), ``pinned_steps``, ``pinned_bytes``,
        ``events`` (the number of :attr:`events`) and ``degraded`` (saves committed without
        their replica).
        """
        steps = self.all_steps()
        out: dict[str, Any] = {
            "drainer_alive": None if self._drainer is None else self._drainer.poll() is None,
            "drainer_restarts": self._drainer_restarts,
            "neighbour_alive": None,
            "newest_step": max(steps, default=-1),
            "newest_pfs_step": self.newest_pfs_step(),
            "durability_lag_steps": None,
            "durability_lag_s": None,
            "pinned_steps": 0,
            "pinned_bytes": 0,
            "events": len(self._node.events),
            "degraded": sum(e["event"] == "degraded_durability" for e in self._node.events),
        }
        if self.neighbour is not None and ping_neighbour:
            out["neighbour_alive"] = self.neighbour.ping()
        if self.pfs_dir is not None:
            pinned = self._pinned()
            out["pinned_steps"] = len(pinned)
            out["pinned_bytes"] = self._pinned_bytes(pinned)
            out["durability_lag_steps"] = len(pinned)
            lag = 0.0
            if pinned:
                newest = out["newest_pfs_step"]
                ref = self.durability(newest).get("local") if newest >= 0 else None
                if ref is None:
                    ref = self.durability(pinned[0]).get("local")
                lag = time.time() - ref["time"] if ref else float("nan")
            out["durability_lag_s"] = lag
        return out

    def durability(self, step: int) -> dict[str, dict]:
        """Returns the durability records of ``step``: ``{tier: {"time": ..., ...}}``.

        The records of a step removed by the local GC are kept in ``pruned.jsonl`` and
        returned from there."""
        d = self.records_dir / _fsio.validate_step_name(step)
        if d.exists():
            return self._records_in(d)
        return self._pruned(step)

    def tier_done(self, step: int, tier: str) -> bool:
        """Whether ``step`` has reached ``tier`` (``staged``/``local``/``replica``/
        ``pfs_part``/``pfs``). ``pfs`` means committed on the PFS (every rank's part there)
        with this rank's part the very save this run made (the same manifest), ``pfs_part``
        only this rank's part written."""
        d = self.records_dir / _fsio.validate_step_name(step)
        if (d / f"{tier}.json").exists() or (not d.exists() and tier in self._pruned(step)):
            return True
        # Not yet recorded (another rank may have committed it): the PFS step counts only if
        # this rank's part there is this run's local step (a reused number's old folder not).
        if tier != "pfs" or self.pfs_dir is None:
            return False
        return bool(_pfs.part_matches(self.drainer_config, step))

    def wait_for_pfs(self, step: int, timeout_s: float = 60.0) -> bool:
        """Polls until ``step`` is PFS-committed (or its drain failed for good); returns which."""
        t_end = time.monotonic() + timeout_s
        rec = self.records_dir / _fsio.validate_step_name(step) / "pfs.json"
        while time.monotonic() < t_end:
            if rec.exists():  # written by the drainer once it sees the step committed
                return True
            if not rec.parent.exists() and "pfs" in self._pruned(step):
                return True
            if self.tier_done(step, "pfs_error"):
                return False
            time.sleep(0.01)
        return False

    def all_steps(self) -> list[int]:
        """Committed (orbax-finalized, hence replica-durable) local steps, oldest first.

        orbax's own ``all_steps`` also lists a step whose save is still in flight; this does not.
        An entry of ``steps/`` named like a step that is not a folder (a stray file ``3``) is
        no step: it is skipped and reported once as a ``stray_entry`` event.
        """
        steps, strays = _fsio.step_entries(self.steps_dir)
        self._report_strays("local", strays)
        return sorted(steps)

    def _report_strays(self, tier: str, strays: Sequence[str]) -> None:
        for note in strays:
            if (tier, note) not in self._strays_reported:
                self._strays_reported.add((tier, note))
                self._node.event("stray_entry", tier=tier, entry=note)

    # -- restoring -------------------------------------------------------------------------------

    def readable_steps(self) -> dict[str, list[int]]:
        """Steps this rank can read per tier (manifests checked, data not yet verified).

        Listing is per tier and per entry: an entry that cannot be read (an I/O error, a
        corrupt or structurally invalid manifest) is skipped, and a tier whose root cannot be
        listed (the PFS mount gone stale, the neighbour down) contributes no step; neither
        hides the other entries or tiers. What was skipped is in ``listing_skipped`` (a list of
        messages, one per entry or tier) until the next listing. A stray file named like a step
        is no step: it is ignored and reported once as a ``stray_entry`` event.
        """
        out, skipped = self._list_tiers()
        self.listing_skipped = skipped
        return out

    def _drop_abandoned(self, tiers: dict[str, list[int]], metas: dict) -> dict[str, list[int]]:
        """Leaves out the PFS steps of an abandoned timeline (the rule of :meth:`restore`)."""
        local, pfs = metas.get("local", {}), metas.get("pfs", {})
        if not local or not tiers.get("pfs"):
            return tiers
        newest = max(local)
        abandoned = local[newest]["meta"].get("branched_from")
        gone = []
        for s in tiers["pfs"]:
            m = pfs.get(s)
            if m is None:
                continue
            if s in local and m != local[s]:
                gone.append(s)  # the same number saved again here: the local one is current
            elif s > newest and abandoned and m["meta"].get("timeline") == abandoned:
                gone.append(s)  # newer, of the timeline this one branched off (abandoned)
        if gone:
            self._node.event("abandoned_pfs_steps", steps=gone[:64], timeline=abandoned)
        return {**tiers, "pfs": [s for s in tiers["pfs"] if s not in gone]}

    def _list_tiers(self) -> tuple[dict[str, list[int]], list[str]]:
        out: dict[str, list[int]] = {t: [] for t in TIERS}
        metas: dict[str, dict[int, dict]] = {"local": {}, "pfs": {}}
        skipped: list[str] = []
        roots = {"local": (self.steps_dir, ITEM)}
        if self.pfs_dir is not None:
            roots["pfs"] = (self.pfs_dir, f"rank_{self.rank}")
        for tier, (root, sub) in roots.items():
            try:
                steps, strays = _fsio.step_entries(root)
            except OSError as e:
                skipped.append(f"{tier}: cannot list {root}: {type(e).__name__}: {e}")
                continue
            self._report_strays(tier, strays)  # not a step: reported, not counted as skipped
            for step, path in steps.items():
                try:
                    metas[tier][step] = _format.read_manifest(path / sub)
                except (OSError, ValueError) as e:  # CorruptCheckpointError is a ValueError
                    skipped.append(f"{tier}: step {step}: {type(e).__name__}: {e}")
                    continue
                out[tier].append(step)
        if self.neighbour is not None:
            try:
                out["replica"] = [int(s) for s in self.neighbour.list_steps(self.rank)]
            except (_replica.ReplicaError, OSError, ValueError, KeyError, TypeError) as e:
                skipped.append(f"replica: cannot list: {type(e).__name__}: {e}")
        out = self._drop_abandoned({k: sorted(v) for k, v in out.items()}, metas)
        return out, skipped

    def _load(self, tier: str, step: int, target: Any) -> tuple[Any, dict]:
        """The tree of ``step`` read from ``tier``, and its manifest's ``meta``."""
        if tier == "local":
            d = self.steps_dir / str(step) / ITEM
        elif tier == "pfs":
            d = self.pfs_dir / str(step) / f"rank_{self.rank}"
        else:
            d = self.directory / f".restore-{step}-{time.monotonic_ns()}"
            try:
                self.neighbour.fetch_dir(self.rank, step, d)
                manifest, pieces = _format.read_rank_dir(d)
            finally:
                shutil.rmtree(d, ignore_errors=True)
            return _format.assemble_tree(target, manifest, pieces), dict(manifest["meta"])
        manifest, pieces = _format.read_rank_dir(d)
        return _format.assemble_tree(target, manifest, pieces), dict(manifest["meta"])

    def restore(self, target: Any, step: int | None = None) -> Restored:
        """Restores the newest step every rank can read, into the structure of ``target``.

        Each rank lists the steps it can read (local, the neighbour's replica, the PFS); the
        ranks agree on the newest common one (``jax.distributed`` process all-gather when
        multi-process); each rank reads it from its first tier whose files all verify. If any
        rank fails on a missing or corrupt copy, the step is dropped everywhere and the next
        newest is tried; any other error on one rank stops every rank. A step read from the
        replica or the PFS is saved locally again (replication and drain resume).

        Timelines. Every save carries a ``save_id`` and a ``timeline`` id in its manifest.
        Restoring the newest listed step continues its timeline; restoring an older one (a
        rollback with ``step``, or a fallback because newer steps failed) starts a new one
        that records the timeline it ``branched_from``, and the restored step is saved
        locally under it. Step numbers saved again after it are told apart from the
        abandoned ones, which the PFS can still hold until the drainer retires them (a drain
        retires the abandoned timeline's steps newer than the newest local step). So whenever
        this rank's local tier holds a readable step, a PFS step is not offered if its local
        copy of the same number is another save, or if it is newer than the newest local step
        and of the timeline that step branched from (an ``abandoned_pfs_steps`` event names
        them). With no local step the PFS cannot be checked against anything and its newest
        step is restored. The replica is not filtered: it holds only what this node pushed,
        and its GC follows the local tier.

        Args:
          target: pytree of ``jax.Array`` / ``jax.ShapeDtypeStruct`` / numpy leaves.
          step: restore exactly this step instead of the newest.

        Raises:
          UnreadableCheckpointError: no step is readable by every rank, and some step or tier
            could not be read or listed (on any rank): state may exist; the message names
            what was skipped.
          FileNotFoundError: no step is readable by every rank, and nothing was skipped.
          ValueError: ``target``'s structure, a shape or a dtype differs from the checkpoint.
        """
        self._wait_orbax()
        try:
            self._fsync_committed()
        except OSError as e:  # a local tier that cannot be listed: the others may still serve
            self._node.event("fsync_failed", error=f"{type(e).__name__}: {e}")
        try:
            tiers = self.readable_steps()
            skipped = list(self.listing_skipped)
        except Exception as e:  # noqa: BLE001 - every rank must reach the agreement below
            tiers = {t: [] for t in TIERS}
            skipped = [f"listing: {type(e).__name__}: {e}"]
        if skipped:
            self._node.event("restore_skipped", skipped=skipped[:64], n_skipped=len(skipped))
        n_listing = len(skipped)
        mine = sorted(set().union(*tiers.values()))
        newest_listed = max(mine, default=-1)
        if step is not None:
            mine = [s for s in mine if s == int(step)]
        while True:
            common = _agree_newest(mine)
            if common is None:
                if skipped[n_listing:]:
                    self._node.event("restore_skipped", skipped=skipped[n_listing:][:64])
                # Every rank reaches this point together; they agree whether anything was
                # skipped anywhere, so all raise the same error type.
                clean = _all_ok(not skipped)
                msg = f"restore: no checkpoint step readable by all ranks under {self.directory}"
                if clean:
                    raise FileNotFoundError(msg)
                shown = skipped[:4] + (["..."] if len(skipped) > 8 else []) + skipped[4:][-4:]
                raise UnreadableCheckpointError(
                    msg
                    + f"; skipped unreadable ({len(skipped)}): {'; '.join(shown)}"
                    + ("" if skipped else " (on another rank)")
                )
            result, errors, fatal, meta = None, [], None, {}
            for tier in TIERS:
                if common not in tiers[tier]:
                    continue
                try:
                    tree, meta = self._load(tier, common, target)
                    result = Restored(common, tree, tier)
                    break
                except (_format.CorruptCheckpointError, _replica.ReplicaError, OSError) as e:
                    errors.append(f"{tier}: {e}")
                except Exception as e:  # noqa: BLE001 - caught so no rank skips the agreement
                    errors.append(f"{tier}: {type(e).__name__}: {e}")
                    fatal = fatal or e
            if _all_ok(result is not None):
                ident = {k: v for k, v in meta.items() if k not in ("step", "rank")}
                rollback = common < newest_listed
                if rollback:  # numbers above ``common`` will be saved again: a new timeline
                    self._lineage = {"timeline": secrets.token_hex(8)}
                    if ident.get("timeline"):
                        self._lineage["branched_from"] = str(ident["timeline"])
                    ident = {"save_id": secrets.token_hex(8), **self._lineage}
                else:
                    self._lineage = _lineage_of(ident) or self._current_lineage()
                if result.tier != "local":
                    self._rewrite_local(result, ident, rollback)
                return result
            # A rank hit something other than a missing or corrupt copy (e.g. a target that
            # does not match the checkpoint): every rank stops here instead of trying older
            # steps, the ranks that did not hit it with a RuntimeError naming the step.
            if not _all_ok(fatal is None):
                if fatal is not None:
                    raise fatal
                raise RuntimeError(f"restore: step {common} failed on another rank")
            skipped.append(f"step {common}: " + (" | ".join(errors) or "failed on another rank"))
            mine = [s for s in mine if s != common]

    def _rewrite_local(self, result: Restored, ident: dict, rollback: bool) -> None:
        """Saves a step restored from the replica or the PFS into the local tier again, so
        replication and the drain resume from it (a failure is an event, not an error).

        It keeps the step's identity ``ident`` (the same manifest: the PFS and replica copies
        stay proof of durability), or after a rollback carries the new timeline's (its PFS
        copy is then drained again, and its old records no longer vouch for it)."""
        try:
            if rollback:
                self._drop_stale_records(result.step)
            bad = self.steps_dir / str(result.step)
            if bad.exists():  # a local copy that failed to verify: replace it
                trash = self.directory / f".bad-{result.step}-{time.monotonic_ns()}"
                os.rename(bad, trash)
                shutil.rmtree(trash, ignore_errors=True)
                self._mngr.reload()
            self._orbax_save(result.step, result.state, force=True, meta=ident)
            self.wait_until_finished()
        except Exception as e:  # noqa: BLE001 - the restore itself succeeded
            self._node.event("restore_rewrite_failed", result.step, error=f"{e}")

    def __enter__(self) -> CacheXManager:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self, wait_for_drain: bool = False, timeout_s: float = 60.0) -> None:
        """Waits for the in-flight save, closes orbax, and lets the drainer exit when idle.

        ``with CacheXManager(...) as mngr:`` calls this on leaving the block, also on an error.
        """
        self._wait_orbax()
        self._mngr.close()
        self._fsync_committed()
        self._node.caller.stop()
        self._node.worker.stop()
        if self.pfs_dir is not None:
            (self.records_dir / "drainer.stop").write_bytes(b"")
        if self._drainer is not None and wait_for_drain:
            try:
                self._drainer.wait(timeout=timeout_s)
            except Exception:  # noqa: BLE001 - a slow drainer keeps running on its own
                pass


def _lineage_of(meta: Mapping[str, Any]) -> dict[str, str]:
    """The ``timeline`` and ``branched_from`` of a manifest's meta ({} for a save from before
    timelines were recorded)."""
    if not meta.get("timeline"):
        return {}
    return {k: str(meta[k]) for k in ("timeline", "branched_from") if meta.get(k)}


def _agree_newest(mine: Sequence[int]) -> int | None:
    """Newest step present in every process's list (process all-gather when multi-process)."""
    if jax.process_count() == 1:
        return max(mine) if mine else None
    from jax.experimental import multihost_utils

    k = 256
    buf = np.full((k,), -1, np.int64)
    newest = sorted(mine)[-k:]
    buf[: len(newest)] = newest
    rows = np.asarray(multihost_utils.process_allgather(buf))
    common = set(rows[0].tolist())
    for row in rows[1:]:
        common &= set(row.tolist())
    common.discard(-1)
    return max(common) if common else None


def _all_ok(ok: bool) -> bool:
    if jax.process_count() == 1:
        return ok
    from jax.experimental import multihost_utils

    flags = np.asarray(multihost_utils.process_allgather(np.array([int(ok)], np.int32)))
    return bool(flags.min() == 1)


def verified_steps(
    directory: str | Path,
    *,
    pfs_dir: str | Path | None = None,
    replica_dir: str | Path | None = None,
    rank: int = 0,
) -> dict[str, list[int]]:
    """Audits the tiers' folders offline: per tier, the committed steps of ``rank`` whose every
    file reads back and verifies (sizes and CRC-32s), oldest first.

    Unlike :meth:`CacheXManager.readable_steps` (manifests only, the replica asked over the
    network) this reads every byte straight from disk, so it can check a manager's restore.
    An entry that cannot be read, and every step of a tier whose root cannot be listed, is
    left out, as a restore would leave it.

    Args:
      directory: a :class:`CacheXManager`'s local root (its ``steps/<s>/state`` folders).
      pfs_dir: the PFS root (``<s>/rank_<rank>``), or None to skip the tier.
      replica_dir: the root of the neighbour's :class:`ReplicaServer`
        (``rank_<rank>/<s>``), or None (e.g. the neighbour's disk is unreachable).
      rank: whose copies to audit (>= 0).

    >>> import tempfile, numpy as np
    >>> root = tempfile.mkdtemp()
    >>> with CacheXManager(root) as m:
    ...     m.save(3, {"w": np.ones(2)})
    True
    >>> verified_steps(root)
    {'local': [3], 'replica': [], 'pfs': []}
    """
    rank = check_int("rank", rank, lo=0)
    roots = {
        "local": (Path(directory) / "steps", ITEM),
        "replica": (Path(replica_dir) / f"rank_{rank}" if replica_dir is not None else None, ""),
        "pfs": (Path(pfs_dir) if pfs_dir is not None else None, f"rank_{rank}"),
    }
    out: dict[str, list[int]] = {}
    for tier, (root, sub) in roots.items():
        out[tier] = []
        if root is None:
            continue
        try:
            steps, _ = _fsio.step_entries(root)
        except OSError:  # a tier that cannot be listed verifies nothing (as for a restore)
            continue
        for step, p in steps.items():
            try:
                _format.read_rank_dir(p / sub)
            except (OSError, ValueError):  # CorruptCheckpointError is a ValueError
                continue
            out[tier].append(step)
        out[tier].sort()
    return out


def resume(manager: CacheXManager, init_state: Any, enabled: bool = True) -> tuple[int, Any]:
    """``--resume`` semantics: ``(next_step, state)`` from the newest durable step, else init.

    Args:
      manager: the study's :class:`CacheXManager`.
      init_state: the freshly initialised state (also the restore target's structure).
      enabled: the study's ``ctx.resume``; when False, returns ``(0, init_state)``.

    Returns ``(0, init_state)`` only when no step exists (nothing readable and nothing
    skipped). In a multi-process job every rank restores the newest step all of them can read;
    a rank's newer local steps are then discarded (:meth:`CacheXManager.discard_after`), so
    every rank saves again from ``next_step``.

    Raises:
      UnreadableCheckpointError: steps or tiers exist that could not be read or listed, and
        no step could be restored: restarting at 0 would lose the run's progress.

    >>> import tempfile, numpy as np
    >>> m = CacheXManager(tempfile.mkdtemp())
    >>> resume(m, {"w": np.zeros(2)})[0]
    0
    >>> m.close()
    """
    if not enabled:
        return 0, init_state
    try:
        r = manager.restore(init_state)
    except UnreadableCheckpointError as e:
        # Starting over would silently overwrite the run's progress with step 0's.
        raise UnreadableCheckpointError(
            f"resume: refusing to restart at step 0: {e}; repair or move the unreadable "
            f"entries, or resume without --resume / with a new checkpoint directory"
        ) from e
    except FileNotFoundError:
        return 0, init_state
    # The ranks agreed on the newest step all of them hold: a rank that had committed newer
    # ones (the others died first) continues from the agreed step too.
    manager.discard_after(r.step)
    return r.step + 1, r.state


class RestoreCheck(NamedTuple):
    """The verdict of :func:`check_restore`.

    Attributes:
      restored: the step the manager restored, -1 if it found none.
      expected: the step it should have restored (the newest one verified anywhere), or -1.
      exact: it restored ``expected``, bit for bit (or correctly found none).
      corrupt: it restored bytes that are no saved step's state (the one unforgivable result).
    """

    restored: int
    expected: int
    exact: bool
    corrupt: bool


def _bit_equal(a: Any, b: Any) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    if jax.tree.structure(a) != jax.tree.structure(b):
        return False
    for x, y in zip(la, lb, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
            return False
    return True


def check_restore(
    manager: CacheXManager, like: Any, expected: int, reference: Callable[[int], Any], steps
) -> RestoreCheck:
    """Restores through ``manager`` and judges the result against the saved states.

    The check of a fault test: after a fault, ``manager`` (a fresh one) must restore the
    newest step any reachable tier still holds intact (``expected``, e.g. the largest step of
    :func:`verified_steps` over the reachable tiers) bit-exact, and never bytes that were not
    saved.

    Args:
      manager: the :class:`CacheXManager` to restore with.
      like: the tree structure to restore into (:meth:`CacheXManager.restore`).
      expected: the step it should restore, -1 if none.
      reference: ``reference(step)`` is the state that was saved at ``step``.
      steps: every step that was saved (the candidates a restored tree may equal).

    >>> import tempfile, numpy as np
    >>> ref = lambda s: {"w": np.full(3, s, np.float32)}
    >>> with CacheXManager(tempfile.mkdtemp()) as m:
    ...     _ = m.save(4, ref(4))
    ...     m.wait_until_finished()
    ...     check_restore(m, ref(0), 4, ref, [4])
    RestoreCheck(restored=4, expected=4, exact=True, corrupt=False)
    """
    try:
        r = manager.restore(like)
        got, data = r.step, r.state
    except FileNotFoundError:
        got, data = -1, None
    exact = got == expected and (got == -1 or _bit_equal(data, reference(got)))
    corrupt = data is not None and not any(_bit_equal(data, reference(s)) for s in steps)
    return RestoreCheck(got, expected, bool(exact), bool(corrupt))
