"""Fault injectors for CacheX: hooks for :class:`hexad.cachex.CacheXManager`'s
``fault_hooks`` seam, and faults of the tiers' storage and drainer.

A hook is ``hook(step)``, called at its point of every save (``CacheXManager.FAULT_POINTS``):
:func:`fail_at` makes the save of one step fail there as if that stage had failed (a full
disk by default), :func:`kill_at` SIGKILLs the process there (a node crash), and
:func:`quiet_failed_saves` keeps orbax's log of a save failed on purpose off the console.
Storage and drainer faults: :func:`wipe_local` (the node's local storage lost),
:func:`corrupt_file` (a truncated or bit-flipped file),
:func:`refuse_drains` (a PFS that refuses steps) with :func:`exhaust_drain_retries` (until
each refusal is final), :func:`kill_drainer_mid_drain` (a drainer SIGKILLed while it writes a
step). Jax-free, so a fault worker process starts quickly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from hexad.cachex import _format, _pfs

__all__ = [
    "corrupt_file",
    "disk_full",
    "exhaust_drain_retries",
    "fail_at",
    "io_error",
    "kill_at",
    "kill_drainer_mid_drain",
    "quiet_failed_saves",
    "refuse_drains",
    "wipe_local",
]


def _check_step(step, name: str = "step") -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"{name}: expected an int >= 0, got {step!r}")
    return step


def fail_at(step: int, error: Exception | None = None) -> Callable[[int], None]:
    """Returns a fault hook that raises ``error`` in the save of ``step`` (other steps pass).

    Args:
      step: the step whose save fails (>= 0).
      error: the exception raised; default ``OSError(ENOSPC)``, a full disk.

    >>> hook = fail_at(2)
    >>> hook(1)
    >>> hook(2)
    Traceback (most recent call last):
    ...
    OSError: [Errno 28] No space left on device (injected)
    """
    step = _check_step(step)
    if error is not None and not isinstance(error, Exception):
        raise TypeError(f"error: expected an Exception instance, got {error!r}")

    def hook(s: int) -> None:
        if s == step:
            raise error or OSError(errno.ENOSPC, "No space left on device (injected)")

    return hook


def kill_at(step: int) -> Callable[[int], None]:
    """Returns a fault hook that SIGKILLs this process in the save of ``step``: nothing after
    the hook's point runs, no ``finally`` block, no flush (a node crash at that point).

    >>> hook = kill_at(3)
    >>> hook(0)  # other steps pass
    """
    step = _check_step(step)

    def hook(s: int) -> None:
        if s == step:
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


@contextlib.contextmanager
def quiet_failed_saves() -> Iterator[None]:
    """Silences the ``absl`` logger (orbax's ``Save Finalize thread failed`` tracebacks) in
    its scope, for saves made to fail on purpose; its level is restored on exit. Other
    loggers are untouched.

    >>> with quiet_failed_saves():
    ...     logging.getLogger("absl").isEnabledFor(logging.CRITICAL)
    False
    """
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def disk_full(under: str | Path) -> Iterator[None]:
    """In its scope every ``os.write`` to a file under ``under`` fails with ``ENOSPC`` (a
    full disk or quota there), whatever thread writes; other writes pass (CacheX writes its
    files, records and PFS parts with ``os.write``). The file is
    already created when its write fails, as on a real full disk.

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> fd = os.open(root / "x", os.O_WRONLY | os.O_CREAT)
    >>> with disk_full(root):
    ...     os.write(fd, b"1")
    Traceback (most recent call last):
    ...
    OSError: [Errno 28] No space left on device (injected)
    >>> os.close(fd)
    """
    base = os.path.realpath(under)
    real = os.write

    def write(fd, data):
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            path = ""
        if path == base or path.startswith(base + os.sep):
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return real(fd, data)

    os.write = write
    try:
        yield
    finally:
        os.write = real


@contextlib.contextmanager
def io_error(path: str | Path, err: int = errno.EIO) -> Iterator[None]:
    """In its scope reading the JSON file ``path`` (a manifest, a record) or listing the
    folder ``path`` fails with ``OSError(err)``: ``errno.EIO`` for a bad sector,
    ``errno.ESTALE`` for an NFS/Lustre mount whose handle went stale. Everything else reads.

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> with io_error(root, errno.ESTALE):
    ...     os.listdir(root)
    Traceback (most recent call last):
    ...
    OSError: [Errno 116] Stale file handle (injected): ...
    """
    from hexad.cachex import _fsio

    target = os.path.abspath(path)
    real_read, real_scandir, real_listdir = _fsio.read_json, os.scandir, os.listdir

    def check(p):
        if isinstance(p, (str, os.PathLike)) and os.path.abspath(os.fspath(p)) == target:
            raise OSError(err, os.strerror(err) + " (injected)", os.fspath(p))

    def read_json(p, *args, **kwargs):
        check(p)
        return real_read(p, *args, **kwargs)

    def scandir(p="."):
        check(p)
        return real_scandir(p)

    def listdir(p="."):
        check(p)
        return real_listdir(p)

    _fsio.read_json, os.scandir, os.listdir = read_json, scandir, listdir
    try:
        yield
    finally:
        _fsio.read_json, os.scandir, os.listdir = real_read, real_scandir, real_listdir


def wipe_local(directory: str | Path) -> None:
    """Deletes every local step of the :class:`hexad.cachex.CacheXManager` rooted at
    ``directory`` (its ``steps/`` folder is left empty): the node's storage is lost.

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> (root / "steps" / "3").mkdir(parents=True)
    >>> wipe_local(root); list((root / "steps").iterdir())
    []
    """
    steps = Path(directory) / "steps"
    if not steps.is_dir():
        raise FileNotFoundError(f"directory: expected a CacheX local root with steps/, got {steps}")
    shutil.rmtree(steps)
    steps.mkdir()


def corrupt_file(path: str | Path, how: str) -> None:
    """Corrupts the file ``path`` in place: ``"truncated_file"`` drops its last 100 bytes,
    ``"bit_flip"`` flips bit 2 of its middle byte (both must be caught by CacheX's checks).

    >>> import tempfile
    >>> f = Path(tempfile.mkdtemp()) / "data.bin"
    >>> _ = f.write_bytes(bytes(8))
    >>> corrupt_file(f, "bit_flip"); f.read_bytes()[4]
    4
    """
    if how not in ("truncated_file", "bit_flip"):
        raise ValueError(f"how: expected 'truncated_file' or 'bit_flip', got {how!r}")
    path = Path(path)
    data = bytearray(path.read_bytes())
    if how == "truncated_file":
        del data[-100:]
    else:
        data[len(data) // 2] ^= 0x04
    path.write_bytes(bytes(data))


def refuse_drains(pfs_dir: str | Path, steps: Iterable[int]) -> None:
    """Makes the PFS at ``pfs_dir`` refuse every drain of ``steps``: each step's staging
    folder ``.tmp-<s>`` is taken by a plain file, so writing into it fails (a PFS down).

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> refuse_drains(root, [0, 1]); sorted(p.name for p in root.iterdir())
    ['.tmp-0', '.tmp-1']
    """
    pfs_dir = Path(pfs_dir)
    pfs_dir.mkdir(parents=True, exist_ok=True)
    for s in steps:
        (pfs_dir / f".tmp-{_check_step(s)}").write_bytes(b"")


def exhaust_drain_retries(config: _pfs.DrainerConfig, n_steps: int, now: float | None = None):
    """Drains as often as the retries of ``n_steps`` failing steps can take, each pass an hour
    after the last, so every backoff has passed: afterwards each step that keeps failing has
    its final ``pfs_error`` record (its drain failed ``retry_max_attempts`` times).

    >>> import tempfile, numpy as np
    >>> from hexad.cachex import CacheXManager
    >>> root = Path(tempfile.mkdtemp())
    >>> with CacheXManager(root / "local", pfs_dir=root / "pfs", drainer=False) as m:
    ...     refuse_drains(root / "pfs", [0])
    ...     _ = m.save(0, {"w": np.ones(4, np.float32)})
    ...     m.wait_until_finished()
    ...     exhaust_drain_retries(m.drainer_config, 1)
    ...     m.durability(0)["pfs_error"]["attempts"]
    5
    """
    n_steps = _check_step(n_steps, "n_steps")
    now = time.time() if now is None else now
    for k in range(config.retry_max_attempts * n_steps):
        _pfs.drain_once(config, now=now + 3600.0 * (k + 1))


def kill_drainer_mid_drain(config: _pfs.DrainerConfig, step: int, timeout_s: float = 60.0):
    """Starts a drainer for ``config`` whose PFS takes a minute per write, SIGKILLs it once its
    part of ``step`` is in the PFS staging folder (not yet renamed), and waits for it.

    Raises TimeoutError if the drainer has not written that part within ``timeout_s``.

    >>> import tempfile, numpy as np
    >>> from hexad.cachex import CacheXManager
    >>> root = Path(tempfile.mkdtemp())
    >>> with CacheXManager(root / "local", pfs_dir=root / "pfs", drainer=False) as m:
    ...     _ = m.save(0, {"w": np.ones(4, np.float32)})
    ...     m.wait_until_finished()
    ...     kill_drainer_mid_drain(m.drainer_config, 0)
    >>> (root / "pfs" / ".tmp-0").is_dir(), (root / "pfs" / "0").exists()
    (True, False)
    """
    step = _check_step(step)
    slow = dataclasses.asdict(_pfs.PFSModel(latency_s=60.0))
    marker = Path(config.pfs_dir) / f".tmp-{step}" / f"rank_{config.rank}" / _format.MANIFEST_FILE
    proc = _pfs.spawn_drainer(dataclasses.replace(config, pfs=slow))
    try:
        t_end = time.monotonic() + timeout_s
        while not marker.exists():
            if time.monotonic() > t_end:
                raise TimeoutError(
                    f"step {step}: not drained into {marker.parent} in {timeout_s} s"
                )
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
