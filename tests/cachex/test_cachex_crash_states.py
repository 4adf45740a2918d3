"""Crash states that keep only what was fsynced (the ALICE approach, in Python).

One save (T0-T2 through orbax, the neighbour's replica server in this process) and one PFS
drain of it run under a recorder that sees every ``fsync``, ``rename``/``replace``, ``mkdir``
and ``unlink``/``rmdir`` under the test's folder. The persistence model is the pessimistic
one POSIX allows: a file's bytes survive a crash only as of its last ``fsync``, a directory's
entries only as of the last ``fsync`` of that directory (a new file whose folder was not
fsynced is gone; an entry whose file was never fsynced is there but empty; a rename not
followed by an ``fsync`` of the folders is undone). For every boundary (after each fsync,
rename and mkdir) the crash state is built from that and a fresh manager restores from it:
with all three tiers, with the node's local tier lost, with the local tier only (neighbour
and PFS lost), and with only the PFS left. Every state
must restore step 0 (the previous, fully durable step) or step 1 (the new one), bit-exact;
once ``wait_until_finished`` has returned (orbax committed the step and the manager fsynced
orbax's renames) the local tier alone must give step 1, and once the drain recorded the step
PFS-committed, the PFS alone must give it.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import numpy as np
import pytest

from hexad import cachex
from hexad.cachex import _pfs

TOKEN = "crash-state-test-token"


def _state(step: int) -> dict:
    rng = np.random.default_rng(step)
    return {"w": rng.standard_normal((8, 4)).astype(np.float32), "n": np.int64(step)}


class Recorder:
    """Records what a crash would keep, per the pessimistic model of the module doc.

    Objects are keyed ``(inode, generation)``: an inode freed by ``unlink``/``rmdir`` and
    reused later is a new object. ``log`` holds the persistence events in order
    (``("data", key, bytes)`` at a file's fsync, ``("dir", key, entries)`` at a folder's);
    ``boundaries`` the log length at each fsync/rename/mkdir, with the operation's name.
    """

    def __init__(self, root: Path):
        self.root = Path(root)
        self.gen: dict[int, int] = {}
        self.log: list[tuple] = []
        self.boundaries: list[tuple[int, str]] = []
        self.lock = threading.RLock()
        self.base_dirs: dict[tuple, dict] = {}
        self.base_data: dict[tuple, bytes] = {}
        self._walk_baseline(self.root)
        self.root_key = self._key(os.lstat(self.root).st_ino)

    def _key(self, ino: int) -> tuple[int, int]:
        return ino, self.gen.get(ino, 0)

    def _entries(self, path) -> dict[str, tuple]:
        out = {}
        with os.scandir(path) as it:
            for e in it:
                st = e.stat(follow_symlinks=False)
                out[e.name] = (self._key(st.st_ino), stat.S_ISDIR(st.st_mode))
        return out

    def _walk_baseline(self, path: Path) -> None:
        entries = self._entries(path)
        self.base_dirs[self._key(os.lstat(path).st_ino)] = entries
        for name, (key, is_dir) in entries.items():
            if is_dir:
                self._walk_baseline(path / name)
            else:
                self.base_data[key] = (path / name).read_bytes()

    def _inside(self, path) -> bool:
        try:
            return os.path.abspath(path).startswith(str(self.root))
        except TypeError:
            return False

    def boundary(self, what: str) -> None:
        self.boundaries.append((len(self.log), what))

    # -- the patched operations ----------------------------------------------------------------

    def install(self, mp: pytest.MonkeyPatch) -> None:
        real = {n: getattr(os, n) for n in ("fsync", "rename", "replace", "mkdir", "unlink",
                                            "remove", "rmdir")}  # fmt: skip

        def fsync(fd):
            real["fsync"](fd)
            path = os.readlink(f"/proc/self/fd/{fd}")
            if not self._inside(path):
                return
            with self.lock:
                st = os.fstat(fd)
                key = self._key(st.st_ino)
                if stat.S_ISDIR(st.st_mode):
                    self.log.append(("dir", key, self._entries(path)))
                else:
                    with open(f"/proc/self/fd/{fd}", "rb") as fh:
                        self.log.append(("data", key, fh.read()))
                self.boundary(f"fsync {os.path.relpath(path, self.root)}")

        def rename_like(name):
            def op(src, dst, *a, **kw):
                real[name](src, dst, *a, **kw)
                if self._inside(dst):
                    with self.lock:
                        self.boundary(f"{name} {os.path.relpath(dst, self.root)}")

            return op

        def mkdir(path, *a, **kw):
            real["mkdir"](path, *a, **kw)
            if "dir_fd" not in kw and self._inside(path):
                with self.lock:
                    self.boundary(f"mkdir {os.path.relpath(path, self.root)}")

        def removal(name):
            def op(path, *a, dir_fd=None, **kw):
                try:
                    st = os.lstat(path, dir_fd=dir_fd)
                except OSError:
                    st = None
                real[name](path, *a, dir_fd=dir_fd, **kw)
                if st is not None and (stat.S_ISDIR(st.st_mode) or st.st_nlink <= 1):
                    with self.lock:
                        self.gen[st.st_ino] = self.gen.get(st.st_ino, 0) + 1

            return op

        mp.setattr(os, "fsync", fsync)
        mp.setattr(os, "rename", rename_like("rename"))
        mp.setattr(os, "replace", rename_like("replace"))
        mp.setattr(os, "mkdir", mkdir)
        for name in ("unlink", "remove", "rmdir"):
            mp.setattr(os, name, removal(name))

    # -- crash states --------------------------------------------------------------------------

    def materialise(self, upto: int, dest: Path) -> None:
        """Builds the crash state after ``log[:upto]`` under the new folder ``dest``."""
        dirs, data = dict(self.base_dirs), dict(self.base_data)
        for kind, key, value in self.log[:upto]:
            (dirs if kind == "dir" else data)[key] = value

        def build(key, path: Path, depth: int = 0):
            path.mkdir()
            for name, (child, is_dir) in dirs.get(key, {}).items():
                if is_dir and depth < 32:
                    build(child, path / name, depth + 1)
                elif not is_dir:
                    (path / name).write_bytes(data.get(child, b""))

        build(self.root_key, dest)


def _restore(root: Path, local: str, with_replica: bool, with_pfs: bool):
    srv = cachex.ReplicaServer(root / "neighbour", token=TOKEN).start() if with_replica else None
    try:
        client = cachex.ReplicaClient(srv.address, TOKEN, timeout_s=10) if srv else None
        m = cachex.CacheXManager(
            root / local,
            neighbour=client,
            pfs_dir=(root / "pfs") if with_pfs else None,
            drainer=False,
            require_replica=False,
        )
        try:
            r = m.restore(_state(0))
        except FileNotFoundError:
            r = None
        m.close()
    finally:
        if srv is not None:
            srv.stop()
    return r


def test_every_fsync_and_rename_boundary_of_a_save_restores_a_committed_step(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    srv = cachex.ReplicaServer(work / "neighbour", token=TOKEN).start()
    client = cachex.ReplicaClient(srv.address, TOKEN, timeout_s=10)
    m = cachex.CacheXManager(work / "local", neighbour=client, pfs_dir=work / "pfs", drainer=False)
    m.save(0, _state(0))  # the previous step: durable everywhere before the crash window
    m.wait_until_finished()
    assert _pfs.drain_once(m.drainer_config) == [0]
    os.sync()

    rec = Recorder(work)
    with monkeypatch.context() as mp:
        rec.install(mp)
        m.save(1, _state(1))
        m.wait_until_finished()
        committed_local = len(rec.log)
        rec.boundary("save returned")
        assert _pfs.drain_once(m.drainer_config) == [1]
        committed_pfs = len(rec.log)
    srv.stop()
    m.close()

    kinds = [what.split()[0] for _, what in rec.boundaries]
    # Every tier's fsyncs and renames were seen: local T1, the replica server, the PFS drain.
    for needle in ("fsync local/steps", "fsync neighbour/rank_0", "rename neighbour/rank_0/1",
                   "rename local/steps/1", "fsync pfs/.tmp-1", "rename pfs/1"):  # fmt: skip
        assert any(what.startswith(needle) for _, what in rec.boundaries), needle
    assert kinds.count("fsync") >= 10 and kinds.count("rename") + kinds.count("replace") >= 4

    variants = (
        ("all tiers", "local", True, True),
        ("local lost", "gone", True, True),
        ("local only", "local", False, False),
        ("PFS only", "gone", False, True),
    )
    checked: set[tuple[str, int]] = set()
    for upto, what in rec.boundaries + [(len(rec.log), "end")]:
        for name, local, with_replica, with_pfs in variants:
            if (name, upto) in checked:
                continue
            checked.add((name, upto))
            dest = tmp_path / f"crash_{len(checked)}"
            rec.materialise(upto, dest)
            r = _restore(dest, local, with_replica, with_pfs)
            where = f"crash after {what!r} (log {upto}), {name}"
            assert r is not None and r.step in (0, 1), where
            for k, v in _state(r.step).items():
                assert np.asarray(r.state[k]).tobytes() == np.asarray(v).tobytes(), where
            if upto >= committed_local and name in ("all tiers", "local only", "local lost"):
                assert r.step == 1, f"{where}: a committed step must survive"
            if upto >= committed_pfs and name == "PFS only":
                assert r.step == 1, f"{where}: a PFS-committed step must survive"
    assert len(checked) >= 30
