"""CacheX reliability: no silent stops, PFS-committed semantics, push/slot safety, the stall
training sees, one drainer per rank, restore error handling, the PFS sweep, bad input."""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from hexad import cachex
from hexad.cachex import _pfs

TOKEN = "reliability-test-token"


@pytest.fixture
def server(tmp_path):
    srv = cachex.ReplicaServer(tmp_path / "neighbour", token=TOKEN).start()
    yield srv
    srv.stop()


def _client(server, **kw):
    return cachex.ReplicaClient(server.address, TOKEN, timeout_s=20, **kw)


def _x(s: int) -> dict:
    return {"x": np.full(16, s, np.float32)}


def _wait(cond, timeout_s: float = 30.0) -> bool:
    t_end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > t_end:
            return False
        time.sleep(0.02)
    return True


# -- B1: no lifetime limit, restarts, health, the pinned cap ----------------------------------


def test_helpers_have_no_lifetime_limit_by_default(tmp_path):
    assert _pfs.DrainerConfig("", "", "", "").max_lifetime_s is None
    srv = cachex.ReplicaServer(tmp_path, token=TOKEN)
    assert srv.max_lifetime_s is None
    srv.start()
    assert srv._timer is None
    srv.stop()


def test_manager_restarts_a_dead_drainer_and_reports_it(tmp_path):
    m = cachex.CacheXManager(tmp_path / "local", pfs_dir=tmp_path / "pfs")
    old = m._drainer
    os.kill(old.pid, signal.SIGKILL)
    old.wait(timeout=30)
    assert m.health()["drainer_alive"] is False
    m.save(0, _x(0))  # the save notices the dead drainer and starts a new one
    m.wait_until_finished()
    h = m.health()
    assert h["drainer_alive"] and h["drainer_restarts"] == 1
    assert [e["event"] for e in m.events] == ["drainer_restart"]
    assert m.wait_for_pfs(0, timeout_s=60)  # and the new drainer drains
    m.close()


def test_health_reports_liveness_and_durability_lag(tmp_path, server):
    m = cachex.CacheXManager(
        tmp_path / "local", neighbour=_client(server), pfs_dir=tmp_path / "pfs", drainer=False
    )
    h = m.health()
    assert (h["newest_step"], h["newest_pfs_step"], h["durability_lag_steps"]) == (-1, -1, 0)
    assert h["neighbour_alive"] is True and h["drainer_alive"] is None
    for s in range(3):
        m.save(s, _x(s))
        m.wait_until_finished()
        if s == 0:
            assert _pfs.drain_once(m.drainer_config) == [0]
    h = m.health()
    assert (h["newest_step"], h["newest_pfs_step"], h["durability_lag_steps"]) == (2, 0, 2)
    assert h["pinned_steps"] == 2 and h["pinned_bytes"] > 2 * 64
    assert h["durability_lag_s"] >= 0.0
    server.stop()
    assert m.health()["neighbour_alive"] is False
    m.close()


def test_pinned_cap_fails_loudly(tmp_path):
    m = cachex.CacheXManager(
        tmp_path / "local", pfs_dir=tmp_path / "pfs", drainer=False, max_pinned_steps=2
    )
    for s in (0, 1):
        m.save(s, _x(s))
        m.wait_until_finished()
    with pytest.raises(cachex.PinnedLimitError, match="max_pinned_steps"):
        m.save(2, _x(2))
    assert _pfs.drain_once(m.drainer_config) == [1]  # the drain catches up: saving resumes
    assert m.save(2, _x(2))
    m.wait_until_finished()
    m.close()
    m = cachex.CacheXManager(
        tmp_path / "b", pfs_dir=tmp_path / "pfs_b", drainer=False, max_pinned_bytes=1
    )
    m.save(0, _x(0))
    m.wait_until_finished()
    with pytest.raises(cachex.PinnedLimitError, match="max_pinned_bytes"):
        m.save(1, _x(1))
    m.close()


# -- B2: "PFS-durable" means committed ---------------------------------------------------------


def test_pfs_durable_only_once_every_rank_committed(tmp_path):
    pfs = tmp_path / "pfs"
    mgrs = [
        cachex.CacheXManager(
            tmp_path / f"node{r}", pfs_dir=pfs, rank=r, n_ranks=2, drainer=False, max_to_keep=1
        )
        for r in range(2)
    ]
    for s in range(3):
        for r, m in enumerate(mgrs):
            m.save(s, {"x": np.full(8, 10 * s + r, np.int32)})
            m.wait_until_finished()
    assert _pfs.drain_once(mgrs[0].drainer_config) == [2]  # rank 0's part only
    assert (pfs / ".tmp-2").is_dir() and not (pfs / "2").exists()
    m0 = mgrs[0]
    assert not m0.tier_done(2, "pfs") and not m0.wait_for_pfs(2, timeout_s=0.2)
    assert m0.tier_done(2, "pfs_part") and m0.newest_pfs_step() == -1
    m0.save(3, {"x": np.zeros(8, np.int32)})
    m0.wait_until_finished()
    assert m0.all_steps() == [0, 1, 2, 3]  # nothing committed on the PFS: nothing deleted
    assert _pfs.drain_once(mgrs[0].drainer_config) == [3]  # the scheduler skips the parted step
    assert _pfs.drain_once(mgrs[1].drainer_config) == [2]  # finishes the started step: commit
    assert (pfs / "2").is_dir() and mgrs[1].tier_done(2, "pfs")
    _pfs.drain_once(mgrs[0].drainer_config)  # rank 0 sees the commit
    assert "pfs" in m0.durability(2) and m0.wait_for_pfs(2, timeout_s=1)
    for m in mgrs:
        m.close()


# -- B3: the slot is freed only after the push thread is joined ------------------------------


def test_failed_local_write_cancels_the_push_and_frees_the_slot_after_it(tmp_path, server):
    server.delay_s = 0.3  # every chunk takes 0.3 s: the push is still running when T1 fails
    m = cachex.CacheXManager(
        tmp_path / "local",
        neighbour=_client(server),
        fault_hooks={"local_write": cachex.fail_at(0)},
    )
    with cachex.quiet_failed_saves():
        m.save(0, _x(0))
        with pytest.raises(OSError, match="No space"):
            m.wait_until_finished()
    assert not any(t.name == "cachex-replica-push" and t.is_alive() for t in threading.enumerate())
    assert m.pool._free.qsize() == m.pool.n_slots
    server.delay_s = 0.0
    assert _client(server).list_steps(0) == []  # the neighbour never committed the failed step
    m.close()


# -- B4: stall_seconds is the time save() blocked --------------------------------------------


def test_stall_seconds_is_the_time_save_blocked(tmp_path, server):
    server.delay_s = 0.25  # a push takes >= 0.5 s (two messages), far above the T0 copy
    m = cachex.CacheXManager(tmp_path / "local", neighbour=_client(server))
    m.save(0, _x(0))
    t0 = time.perf_counter()
    m.save(1, _x(1))  # orbax waits for step 0's commit first
    wall = time.perf_counter() - t0
    m.wait_until_finished()
    # The lower bound is a sleep inside the neighbour, not a speed: step 0's push needs
    # >= 0.5 s after save(0) started, and save(1) is called right after save(0) returned.
    assert m.stall_seconds(1) >= 0.25
    assert m.stage_seconds(1) <= m.stall_seconds(1) <= wall
    m.close()


# -- B5: one drainer per rank -----------------------------------------------------------------


def test_second_drainer_waits_for_the_rank_lock(tmp_path):
    m = cachex.CacheXManager(tmp_path / "local", pfs_dir=tmp_path / "pfs", drainer=False)
    m.save(0, _x(0))
    m.wait_until_finished()
    cfg = m.drainer_config
    with open(_pfs.drainer_lock_path(cfg), "ab") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # "an older drainer is still running"
        proc = _pfs.spawn_drainer(cfg)
        time.sleep(1.5)
        assert proc.poll() is None and not (tmp_path / "pfs" / "0").exists()
        fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
    assert _wait(lambda: (tmp_path / "pfs" / "0").exists())
    proc.terminate()
    proc.wait(timeout=30)
    m.close()


# -- B6: every per-rank exception is caught before the restore's agreement -------------------


def test_restore_survives_an_unexpected_error_on_one_tier(tmp_path, monkeypatch):
    m = cachex.CacheXManager(tmp_path / "local", pfs_dir=tmp_path / "pfs", drainer=False)
    m.save(0, _x(0))
    m.wait_until_finished()
    assert _pfs.drain_once(m.drainer_config) == [0]
    load = m._load

    def flaky(tier, step, target):
        if tier == "local":
            raise RuntimeError("injected: unexpected error reading the local tier")
        return load(tier, step, target)

    monkeypatch.setattr(m, "_load", flaky)
    r = m.restore(_x(9))
    assert (r.step, r.tier) == (0, "pfs") and np.array_equal(r.state["x"], _x(0)["x"])
    monkeypatch.setattr(m, "_load", load)
    with pytest.raises(ValueError, match="shape"):  # a wrong target is an error, not "no step"
        m.restore({"x": np.zeros(3, np.float32)})
    m.close()


# -- B8: the PFS sweep ------------------------------------------------------------------------


def test_sweep_renames_complete_tmp_and_removes_stale_ones(tmp_path):
    pfs = tmp_path / "pfs"
    mgrs = [
        cachex.CacheXManager(tmp_path / f"node{r}", pfs_dir=pfs, rank=r, n_ranks=2, drainer=False)
        for r in range(2)
    ]
    for s in (1, 3):
        for r, m in enumerate(mgrs):
            m.save(s, {"x": np.full(8, 10 * s + r, np.int32)})
            m.wait_until_finished()
    cfg0, cfg1 = (m.drainer_config for m in mgrs)
    assert _pfs.drain_once(cfg0) == [3]
    # Rank 1 writes its part and marker but dies before the rename (n_ranks=3 skips it).
    assert _pfs.drain_once(_pfs.dataclasses.replace(cfg1, n_ranks=3)) == [3]
    assert (pfs / ".tmp-3" / "done_1").exists() and not (pfs / "3").exists()
    (pfs / ".tmp-1" / "rank_0").mkdir(parents=True)  # an older drain abandoned half-way
    assert _pfs.sweep_pfs(pfs, 2, stale_tmp_s=0.0) == {"renamed": [3], "removed": [1]}
    assert sorted(p.name for p in pfs.iterdir()) == ["3"]
    _pfs.drain_once(cfg0)
    assert mgrs[0].wait_for_pfs(3, timeout_s=1)
    for m in mgrs:
        m.close()


def test_a_retry_after_the_done_marker_commits_the_part_as_written(tmp_path, monkeypatch):
    # A drain that fails after its done marker (here the rename) left a complete part. The
    # retry must not rewrite it (another rank may be renaming the folder meanwhile), so even a
    # local copy corrupted since then does not stop the commit nor touch the part on the PFS.
    pfs = tmp_path / "pfs"
    mgrs = [
        cachex.CacheXManager(tmp_path / f"node{r}", pfs_dir=pfs, rank=r, n_ranks=2, drainer=False)
        for r in range(2)
    ]
    for r, m in enumerate(mgrs):
        m.save(1, {"x": np.arange(8, dtype=np.int32) + r})
        m.wait_until_finished()
    cfg0, cfg1 = (m.drainer_config for m in mgrs)
    assert _pfs.drain_once(_pfs.dataclasses.replace(cfg1, n_ranks=3)) == [1]  # marker, no rename
    real = os.rename

    def failing(src, dst, *a, **k):
        if os.path.basename(src).startswith(".tmp-"):
            raise OSError(5, "injected I/O error")
        return real(src, dst, *a, **k)

    monkeypatch.setattr(os, "rename", failing)
    assert _pfs.drain_once(cfg0) == []  # rank 0's part and marker written, its rename failed
    monkeypatch.setattr(os, "rename", real)
    assert (pfs / ".tmp-1" / "done_0").exists() and not (pfs / "1").exists()
    data = mgrs[0].steps_dir / "1" / "state" / "data.bin"
    data.write_bytes(bytes([data.read_bytes()[0] ^ 1]) + data.read_bytes()[1:])
    assert _pfs.drain_once(cfg0, now=time.time() + 3600) == [1]
    assert mgrs[0].wait_for_pfs(1, timeout_s=1)
    meta, shards = cachex._format.read_rank_dir(pfs / "1" / "rank_0")  # CRC-checked
    assert np.array_equal(np.concatenate([a.ravel() for *_, a in shards]), np.arange(8))
    for m in mgrs:
        m.close()


def _two_ranks_saved(tmp_path, step=1):
    pfs = tmp_path / "pfs"
    mgrs = [
        cachex.CacheXManager(tmp_path / f"node{r}", pfs_dir=pfs, rank=r, n_ranks=2, drainer=False)
        for r in range(2)
    ]
    for r, m in enumerate(mgrs):
        m.save(step, {"x": np.arange(8, dtype=np.int32) + r})
        m.wait_until_finished()
    return pfs, mgrs


@pytest.mark.parametrize("then", ["nothing", "eio"])
def test_a_rename_by_the_other_rank_right_after_this_ranks_marker_is_pfs_durable(
    tmp_path, monkeypatch, then
):
    # Rank 1's part and marker are on the PFS; rank 1 renames the folder the moment rank 0's
    # marker lands, before rank 0's next step. Rank 0 must then record the step PFS-durable:
    # at once ("nothing" more goes wrong), or, if its own drain fails after the rename ("eio"),
    # at its next pass (the step is committed, so no drain of it is due again).
    pfs, mgrs = _two_ranks_saved(tmp_path)
    cfg0, cfg1 = (m.drainer_config for m in mgrs)
    assert _pfs.drain_once(cfg1) == [1] and not (pfs / "1").exists()
    real_write, real_fsync = _pfs._fsio.write_file_durable, _pfs._fsio.fsync_dir

    def write_then_rank1_commits(path, data, *a, **k):
        n = real_write(path, data, *a, **k)
        if Path(path).name == "done_0":
            assert _pfs.sweep_pfs(pfs, 2) == {"renamed": [1], "removed": []}
        return n

    def fsync_eio(path):
        if Path(path) == pfs / ".tmp-1":
            raise OSError(5, "injected I/O error")
        return real_fsync(path)

    monkeypatch.setattr(_pfs._fsio, "write_file_durable", write_then_rank1_commits)
    if then == "eio":
        monkeypatch.setattr(_pfs._fsio, "fsync_dir", fsync_eio)
    first = _pfs.drain_once(cfg0)
    monkeypatch.undo()
    assert (pfs / "1").is_dir() and not (pfs / ".tmp-1").exists()
    assert first == ([1] if then == "nothing" else [])
    assert ("pfs" in mgrs[0].durability(1)) == (then == "nothing")
    assert _pfs.drain_once(cfg0) == []  # nothing left to drain; the pass records the commit
    assert mgrs[0].wait_for_pfs(1, timeout_s=1)
    assert _pfs.drain_once(cfg1) == [] and mgrs[1].wait_for_pfs(1, timeout_s=1)
    for m in mgrs:
        m.close()


# -- the replica for a cluster: authentication, MACs, owner binding, quota, caps -------------


def test_token_never_travels_and_every_message_is_authenticated(server, monkeypatch):
    from hexad.cachex import _replica

    sent: list[bytes] = []
    real = _replica.send_msg

    def spy(sock, header, payload=b"", chan=None):
        sent.append(repr(header).encode() + bytes(memoryview(payload).cast("B")))
        return real(sock, header, payload, chan)

    monkeypatch.setattr(_replica, "send_msg", spy)
    client = _client(server)
    assert client.list_steps(0) == [] and client.ping()
    assert sent and not any(TOKEN.encode() in m for m in sent)
    # A tampered, replayed or unauthenticated message closes the connection.
    sock, chan = client._connect(0)
    try:
        hdr = chan.seal({"op": "list", "owner": 0}, b"")
        hdr["op"] = "retain"  # altered after sealing
        _replica.send_msg(sock, hdr)
        with pytest.raises(ConnectionError):
            _replica.recv_msg(sock, 1 << 16, 1 << 16)
    finally:
        sock.close()
    sock, chan = client._connect(0)
    try:
        hdr = chan.seal({"op": "list", "owner": 0}, b"")
        _replica.send_msg(sock, hdr)
        _replica.recv_msg(sock, 1 << 16, 1 << 16)
        _replica.send_msg(sock, hdr)  # the same message again: a replay
        with pytest.raises(ConnectionError):
            _replica.recv_msg(sock, 1 << 16, 1 << 16)
    finally:
        sock.close()


def test_connection_is_bound_to_its_owner(server, tmp_path):
    m = cachex.CacheXManager(tmp_path / "local", neighbour=_client(server), rank=1, n_ranks=2)
    m.save(0, _x(0))
    m.wait_until_finished()
    m.close()
    intruder = _client(server)
    conn = intruder._connect(owner=0)  # authenticated as rank 0 ...
    try:
        with pytest.raises(cachex.ReplicaError, match="bound to owner 0"):
            intruder._call(conn, {"op": "retain", "owner": 1, "steps": []})  # ... acting as 1
    finally:
        conn[0].close()
    assert _client(server).list_steps(1) == [0]


def _rank_dir(path, nbytes: int):
    from hexad.cachex import _format

    path.mkdir(parents=True)
    snap = _format.StagingPool(1).stage({"x": np.zeros(nbytes, np.uint8)})[1]
    _format.write_rank_dir(path, snap, {})
    return path


def test_quota_and_connection_cap(tmp_path):
    srv = cachex.ReplicaServer(tmp_path / "n", token=TOKEN, quota_bytes=3000).start()
    try:
        client = cachex.ReplicaClient(srv.address, TOKEN, timeout_s=10)
        client.push_dir(0, 0, _rank_dir(tmp_path / "a", 2000))
        with pytest.raises(cachex.ReplicaError, match="quota"):
            client.push_dir(0, 1, _rank_dir(tmp_path / "b", 2000))
        client.push_dir(1, 1, _rank_dir(tmp_path / "c", 2000))  # the quota is per owner
    finally:
        srv.stop()
    srv = cachex.ReplicaServer(tmp_path / "m", token=TOKEN, max_connections=1).start()
    try:
        client = cachex.ReplicaClient(srv.address, TOKEN, timeout_s=10)
        held = []

        def hold() -> bool:  # the server frees a slot once it sees the previous close
            try:
                held.append(client._connect(0))
                return True
            except cachex.ReplicaError:
                return False

        assert _wait(hold, 10)
        conn = held[0]  # holds the one connection slot
        try:
            with pytest.raises(cachex.ReplicaError, match="too many connections"):
                client.list_steps(0)
        finally:
            conn[0].close()
        # Freed once the server sees the close (a ping racing it may be refused too).
        assert _wait(client.ping, 10) and srv.refused >= 1
    finally:
        srv.stop()


class _CancelAfter:
    """A ``threading.Event`` stand-in that reads as set from its ``k+1``-th check on."""

    def __init__(self, k: int):
        self.k = k

    def is_set(self) -> bool:
        self.k -= 1
        return self.k < 0


def test_retain_removes_abandoned_pushes_so_the_quota_frees(tmp_path):
    srv = cachex.ReplicaServer(tmp_path / "n", token=TOKEN, quota_bytes=5000).start()
    try:
        client = cachex.ReplicaClient(srv.address, TOKEN, timeout_s=10, chunk_bytes=1000)
        data = os.urandom(2000)
        files = [("data.bin", [data], zlib.crc32(data)), ("manifest.json", [b"{}"], 0)]
        for step in (1, 2, 3):  # each cancelled after its first 1000-byte chunk
            with pytest.raises(cachex.ReplicaError, match="cancelled"):
                client.push_files(0, step, files, cancel=_CancelAfter(1))
        # an unfinished push of a kept step may still be under way: it stays
        assert client.retain(0, [3]) == []
        base = tmp_path / "n" / "rank_0"
        assert sorted(p.name for p in base.iterdir()) == [".tmp-3"]
        (base / ".old-3-123").mkdir()  # a replaced replica a crash left half-deleted
        (base / ".old-3-123" / "data.bin").write_bytes(data)
        client.retain(0, [])
        assert not list(base.iterdir()) and srv.usage(0) == 0
        client.push_dir(0, 4, _rank_dir(tmp_path / "a", 4000))  # fits the quota again
        assert client.list_steps(0) == [4]
    finally:
        srv.stop()


def test_a_retain_cut_short_leaves_no_half_deleted_step(tmp_path, monkeypatch):
    # The neighbour dies while retain removes step 1: the step must not stay listed (and
    # readable-looking) with part of its files; the leftover goes at the next retain.
    from hexad.cachex import _replica

    srv = cachex.ReplicaServer(tmp_path / "n", token=TOKEN).start()
    try:
        client = cachex.ReplicaClient(srv.address, TOKEN, timeout_s=10)
        for step in (1, 2):
            client.push_dir(0, step, _rank_dir(tmp_path / f"a{step}", 2000))
        real = _replica.shutil.rmtree

        def cut_short(path, ignore_errors=False):  # removes one file, then "dies"
            next(p for p in Path(path).iterdir() if p.is_file()).unlink()

        monkeypatch.setattr(_replica.shutil, "rmtree", cut_short)
        assert client.retain(0, [2]) == [1]
        assert client.list_steps(0) == [2]
        monkeypatch.setattr(_replica.shutil, "rmtree", real)
        client.retain(0, [2])
        assert sorted(p.name for p in (tmp_path / "n" / "rank_0").iterdir()) == ["2"]
    finally:
        srv.stop()


def _fake_server(*replies: dict):
    """A peer that answers each of one client's messages with the next of ``replies``
    (no authentication); returns its address and an event set once the client closes."""
    from hexad.cachex import _replica

    ls = socket.create_server(("127.0.0.1", 0))
    closed = threading.Event()

    def serve():
        with ls, ls.accept()[0] as conn:
            conn.settimeout(10)
            for reply in replies:
                _replica.recv_msg(conn, 1 << 16, 0)
                _replica.send_msg(conn, reply)
            if conn.recv(1) == b"":
                closed.set()

    threading.Thread(target=serve, daemon=True).start()
    return ls.getsockname(), closed


def test_client_refuses_a_malformed_handshake_and_closes_its_socket():
    addr, closed = _fake_server({"ok": True})  # no server_nonce
    assert cachex.ReplicaClient(addr, TOKEN, timeout_s=5).ping() is False
    assert closed.wait(5)
    addr, closed = _fake_server({"ok": True, "server_nonce": 7})
    with pytest.raises(cachex.ReplicaError, match="server_nonce"):
        cachex.ReplicaClient(addr, TOKEN, timeout_s=5).list_steps(0)
    assert closed.wait(5)
    # a non-ASCII proof from the server is a failed proof, not a TypeError
    addr, closed = _fake_server(
        {"ok": True, "server_nonce": "0" * 64}, {"ok": True, "proof": "\u00e9" * 64}
    )
    with pytest.raises(cachex.ReplicaError, match="failed to prove"):
        cachex.ReplicaClient(addr, TOKEN, timeout_s=5).list_steps(0)
    assert closed.wait(5)


def test_server_rejects_a_non_ascii_proof_or_mac(server):
    from hexad.cachex import _replica

    with socket.create_connection(server.address, timeout=5) as s:
        _replica.send_msg(s, {"op": "hello", "owner": 0, "client_nonce": "0" * 64})
        assert _replica.recv_msg(s, 1 << 16, 0)[0]["ok"]
        _replica.send_msg(s, {"op": "auth", "proof": "\u00e9" * 64})
        reply, _ = _replica.recv_msg(s, 1 << 16, 0)
    assert reply == {"ok": False, "error": "authentication failed", "nbytes": 0}
    assert server.rejected == 1
    chan = _replica._Channel(bytes(32), b"c2s", b"s2c")
    with pytest.raises(ValueError, match="message authentication failed"):
        chan.check({"op": "list", "nbytes": 0, "mac": "\u00e9" * 64}, b"")


def test_stop_before_start_closes_the_socket(tmp_path):
    srv = cachex.ReplicaServer(tmp_path, token=TOKEN)
    srv.stop()
    with pytest.raises(OSError):
        socket.create_connection(srv.address, timeout=2).close()
    srv.stop()  # idempotent


def test_client_refuses_an_oversized_reply(server, tmp_path):
    _client(server).push_dir(0, 3, _rank_dir(tmp_path / "a", 4096))
    with pytest.raises(cachex.ReplicaError, match="max_file_bytes"):
        _client(server, max_file_bytes=1024).fetch_dir(0, 3, tmp_path / "fetched")
    tiny = _client(server, max_message_bytes=1024)
    conn = tiny._connect(0)
    try:
        with pytest.raises(cachex.ReplicaError, match="max_message_bytes"):
            tiny._call(conn, {"op": "get", "owner": 0, "step": "3", "file": "data.bin"})
    finally:
        conn[0].close()


def test_push_is_retried_then_degraded_durability_is_recorded(tmp_path):
    srv = cachex.ReplicaServer(tmp_path / "n", token=TOKEN).start()
    addr = srv.address
    srv.stop()  # the neighbour is down for the first save
    m = cachex.CacheXManager(
        tmp_path / "local",
        neighbour=cachex.ReplicaClient(addr, TOKEN, timeout_s=5),
        require_replica=False,
        replica_retries=2,
        replica_backoff_s=0.01,
    )
    m.save(0, _x(0))
    m.wait_until_finished()
    kinds = [e["event"] for e in m.events]
    assert kinds == ["replica_retry", "replica_retry", "degraded_durability"]
    assert m.health()["degraded"] == 1 and 0 in m.all_steps()
    m.save(1, _x(1))  # the next save checks the neighbour and reports it down
    m.wait_until_finished()
    assert "neighbour_down" in [e["event"] for e in m.events]
    m.close()


def test_partner_is_on_another_host():
    from hexad.cachex import _replica

    hosts = ["a", "a", "b", "b", "c"]
    partners = [_replica.choose_partner(r, hosts) for r in range(5)]
    assert all(hosts[p] != hosts[r] for r, p in enumerate(partners))
    with pytest.raises(ValueError, match="hosts: every rank"):
        _replica.choose_partner(0, ["a", "a"])


# -- bad input --------------------------------------------------------------------------------


def test_bad_input_names_the_argument(tmp_path):
    with pytest.raises(ValueError, match="host"):
        cachex.ReplicaServer(tmp_path, token=TOKEN, host="not an address!")
    with pytest.raises(ValueError, match="address host"):
        cachex.ReplicaClient(("no such host..invalid", 1), TOKEN)
    with pytest.raises(ValueError, match="token: expected a shared secret of >= 16 bytes"):
        cachex.ReplicaServer(tmp_path, token="short")
    with pytest.raises(ValueError, match="token"):
        cachex.ReplicaClient(("127.0.0.1", 1), "short")
    with pytest.raises(ValueError, match="quota_bytes"):
        cachex.ReplicaServer(tmp_path, token=TOKEN, quota_bytes=0)
    with pytest.raises(ValueError, match="max_connections"):
        cachex.ReplicaServer(tmp_path, token=TOKEN, max_connections=0)
    with pytest.raises(ValueError, match="max_pinned_steps"):
        cachex.CacheXManager(tmp_path / "a", max_pinned_steps=0)
    with pytest.raises(ValueError, match="max_pinned_bytes"):
        cachex.CacheXManager(tmp_path / "b", max_pinned_bytes=0)
    with pytest.raises(ValueError, match="neighbour_rank"):
        cachex.CacheXManager(tmp_path / "c", rank=1, n_ranks=2, neighbour_rank=1)
    with pytest.raises(ValueError, match="replica_retries"):
        cachex.CacheXManager(tmp_path / "d", replica_retries=-1)
