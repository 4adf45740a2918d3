"""CacheX replica server under hostile or broken peers: the pre-authentication budget (S1),
the quota on bytes written (S2), limits from the CLI, malformed messages (S3) and an atomic
re-commit (D5). Deadlines are short and configurable; nothing waits on a long sleep."""

from __future__ import annotations

import json
import os
import select
import socket
import struct
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from hexad import cachex
from hexad.cachex import _format, _replica

TOKEN = "replica-server-test-token"


def _wait(cond, timeout_s: float = 10.0) -> bool:
    t_end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > t_end:
            return False
        time.sleep(0.01)
    return True


def _connect_once_released(client, timeout_s: float = 10.0):
    """A held, authenticated connection, once the server has released the slot of the
    connection before it: a server thread frees its slot after the client has seen the reply
    and closed, so on a loaded machine the next connection can still find the slot taken."""
    t_end = time.monotonic() + timeout_s
    while True:
        try:
            return client._connect(0)
        except cachex.ReplicaError as e:
            if "too many connections" not in str(e) or time.monotonic() > t_end:
                raise
        time.sleep(0.01)


def _rank_dir(path: Path, nbytes: int, fill: int = 0) -> Path:
    path.mkdir(parents=True)
    snap = _format.StagingPool(1).stage({"x": np.full(nbytes, fill, np.uint8)})[1]
    _format.write_rank_dir(path, snap, {})
    return path


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


@pytest.fixture
def make_server(tmp_path):
    servers = []

    def make(**kw):
        srv = cachex.ReplicaServer(tmp_path / f"n{len(servers)}", token=TOKEN, **kw).start()
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.stop()


def _closed_within(sock: socket.socket, timeout_s: float, trickle_s: float | None = None) -> bool:
    """Whether the server closes ``sock`` within ``timeout_s`` (sending one byte every
    ``trickle_s`` seconds meanwhile, if given)."""
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end:
        if trickle_s is not None:
            try:
                sock.send(b"0")
            except OSError:  # EPIPE / ECONNRESET: the server closed it
                return True
        ready, _, _ = select.select([sock], [], [], trickle_s or 0.05)
        if ready:
            try:
                if sock.recv(1 << 16) == b"":
                    return True
            except OSError:
                return True
    return False


# -- S1: the pre-authentication budget ---------------------------------------------------------


def test_an_unauthenticated_flood_does_not_lock_out_a_token_holder(make_server, tmp_path):
    # Old code: each idle socket took one of the max_connections slots before the hello, so
    # 8 sockets against 2 slots made every push fail with "too many connections".
    srv = make_server(
        max_connections=2, max_preauth_connections=2, handshake_timeout_s=30, conn_timeout_s=30
    )
    flood = []
    for i in range(8):
        s = socket.create_connection(srv.address, timeout=5)
        if i % 2:  # half get as far as the server's nonce, then stall before the proof
            _replica.send_msg(s, {"op": "hello", "owner": 0, "client_nonce": "0" * 64})
        flood.append(s)
    try:
        # every flood socket admitted (the 6 oldest dropped) before the token holder comes
        assert _wait(lambda: srv.evicted >= 6)
        client = cachex.ReplicaClient(srv.address, TOKEN, timeout_s=10)
        assert client.ping()
        client.push_dir(0, 1, _rank_dir(tmp_path / "a", 1000))
        assert client.list_steps(0) == [1]
        assert srv.refused == 0
    finally:
        for s in flood:
            s.close()


def test_authenticated_slots_are_capped_apart_from_the_preauth_ones(make_server):
    srv = make_server(max_connections=1, max_preauth_connections=4)
    client = cachex.ReplicaClient(srv.address, TOKEN, timeout_s=10)
    held = client._connect(0)  # the one authenticated slot
    try:
        with pytest.raises(cachex.ReplicaError, match="too many connections"):
            client.list_steps(0)
        assert srv.refused == 1
    finally:
        held[0].close()
    assert _wait(client.ping)


def test_a_trickling_handshake_is_closed_at_its_deadline(make_server):
    # One byte every 0.1 s: the old per-recv timeout (0.5 s here) restarted at every byte, so
    # the socket held its slot for ever; the handshake deadline closes it after 0.5 s.
    srv = make_server(handshake_timeout_s=0.5, conn_timeout_s=0.5)
    with socket.create_connection(srv.address, timeout=5) as s:
        s.sendall(struct.pack(">I", 1000))  # a header that is never finished
        t0 = time.monotonic()
        assert _closed_within(s, 5.0, trickle_s=0.1)
        assert time.monotonic() - t0 < 3.0
    assert _wait(lambda: srv.timed_out >= 1)
    assert cachex.ReplicaClient(srv.address, TOKEN, timeout_s=10).ping()


def test_an_idle_unauthenticated_socket_is_closed_at_the_handshake_deadline(make_server):
    srv = make_server(handshake_timeout_s=0.3, conn_timeout_s=30)
    with socket.create_connection(srv.address, timeout=5) as s:
        assert _closed_within(s, 5.0)


def test_an_authenticated_message_has_a_deadline_not_a_per_recv_timeout(make_server):
    srv = make_server(handshake_timeout_s=5, conn_timeout_s=0.5)
    sock, _ = cachex.ReplicaClient(srv.address, TOKEN, timeout_s=10)._connect(0)
    with sock:
        sock.sendall(struct.pack(">I", 1000))
        t0 = time.monotonic()
        assert _closed_within(sock, 5.0, trickle_s=0.1)
        assert time.monotonic() - t0 < 3.0


# -- S2: the quota on bytes actually written ---------------------------------------------------


def _put(client, conn, name: str, offset: int, data: bytes, size: int, last: bool = False):
    hdr = {"op": "put", "owner": 0, "step": "1", "file": name, "offset": offset}
    hdr.update(last=last, crc32=zlib.crc32(data), size=size)
    return client._call(conn, hdr, data)


def test_a_declared_size_of_one_cannot_stream_past_the_quota(make_server):
    # Old code: the quota was checked once, against the first chunk's declared size (1), and
    # a file that never sent `last` was never checked again: 10 KiB went into a 5000-byte quota.
    srv = make_server(quota_bytes=5000)
    client = cachex.ReplicaClient(srv.address, TOKEN, timeout_s=10)
    conn = client._connect(0)
    try:
        with pytest.raises(cachex.ReplicaError, match="declared"):
            for i in range(10):
                _put(client, conn, "data.bin", i * 1000, os.urandom(1000), size=1)
    finally:
        conn[0].close()
    assert srv.usage(0) <= 5000


def test_the_quota_counts_every_unfinished_file_as_written(make_server):
    # Two files, each declared within the quota at its first chunk, written in turns: the old
    # first-chunk check let both finish (6000 bytes on disk for a 5000-byte quota).
    srv = make_server(quota_bytes=5000)
    client = cachex.ReplicaClient(srv.address, TOKEN, timeout_s=10)
    conn = client._connect(0)
    try:
        with pytest.raises(cachex.ReplicaError, match="quota"):
            for i in range(3):
                for name in ("a.bin", "b.bin"):
                    _put(client, conn, name, i * 1000, os.urandom(1000), size=3000)
    finally:
        conn[0].close()
    assert srv.usage(0) <= 5000


def test_a_size_changed_between_chunks_is_rejected(make_server):
    srv = make_server(quota_bytes=1 << 20)
    client = cachex.ReplicaClient(srv.address, TOKEN, timeout_s=10)
    conn = client._connect(0)
    try:
        _put(client, conn, "data.bin", 0, b"x" * 100, size=200)
        with pytest.raises(cachex.ReplicaError, match="size changed"):
            _put(client, conn, "data.bin", 100, b"x" * 100, size=1 << 19)
    finally:
        conn[0].close()
    assert srv.usage(0) == 0  # the rejected file is gone


# -- the limits from spawn_replica_server and the CLI ------------------------------------------


def test_spawned_server_takes_its_limits_from_the_cli(tmp_path):
    proc, addr = cachex.spawn_replica_server(
        tmp_path / "n",
        TOKEN,
        max_lifetime_s=120,
        quota_bytes=3000,
        max_connections=1,
        max_preauth_connections=1,
        handshake_timeout_s=2.0,
        conn_timeout_s=30,
    )
    try:
        client = cachex.ReplicaClient(addr, TOKEN, timeout_s=10)
        with pytest.raises(cachex.ReplicaError, match="quota"):
            client.push_dir(0, 1, _rank_dir(tmp_path / "big", 4000))
        held = _connect_once_released(client)
        try:
            with pytest.raises(cachex.ReplicaError, match="too many connections"):
                client.list_steps(0)
        finally:
            held[0].close()
        # max_preauth_connections=1: the next peer drops an idle socket at once, long before
        # the handshake deadline (2 s) would
        with socket.create_connection(addr, timeout=5) as idle:
            time.sleep(0.1)
            assert _wait(client.ping)
            assert _closed_within(idle, 1.0)
        with socket.create_connection(addr, timeout=5) as idle:  # alone: the deadline closes it
            assert _closed_within(idle, 5.0)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stdout.close()
    with pytest.raises(ValueError, match="max_preauth_connections"):
        cachex.spawn_replica_server(tmp_path / "m", TOKEN, max_preauth_connections=0)
    with pytest.raises(ValueError, match="handshake_timeout_s"):
        cachex.ReplicaServer(tmp_path / "m", TOKEN, handshake_timeout_s=0)


# -- S3: malformed messages --------------------------------------------------------------------


def _raw_header(sock: socket.socket, raw: bytes) -> None:
    sock.sendall(struct.pack(">I", len(raw)) + raw)


def test_malformed_messages_get_an_error_and_print_no_traceback(tmp_path):
    err_path = tmp_path / "server.err"
    with open(err_path, "w") as err:
        proc, addr = cachex.spawn_replica_server(
            tmp_path / "n", TOKEN, max_lifetime_s=120, stderr=err
        )
    try:
        client = cachex.ReplicaClient(addr, TOKEN, timeout_s=10)
        for step in (4, 41):
            client.push_dir(0, step, _rank_dir(tmp_path / f"s{step}", 100))
        nested = b"[" * 30000 + b"]" * 30000  # fits 64 KiB; RecursionError in json.loads
        with socket.create_connection(addr, timeout=5) as s:  # before authentication
            _raw_header(s, nested)
            assert _closed_within(s, 5.0)
        sock, chan = client._connect(0)
        with sock:  # after authentication
            _raw_header(sock, nested)
            assert _closed_within(sock, 5.0)
        bad = [
            {"op": "retain", "steps": "41"},  # old: kept steps "4" and "1", deleted 41
            {"op": "retain", "steps": 41},
            {"op": "retain", "steps": [True]},
            {"op": "put", "step": True, "file": "data.bin", "offset": 0, "size": 1},
            {"op": "put", "step": "1", "file": 7, "offset": 0, "size": 1},
            {"op": "put", "step": "1", "file": "data.bin", "offset": 0, "size": "1"},
            {"op": "put", "step": "1", "file": "data.bin", "offset": [], "size": 1},
            {"op": "get", "step": {}, "file": "data.bin"},
            {"op": "commit", "step": None},
            {"op": ["list"]},
        ]
        conn = client._connect(0)
        try:
            for hdr in bad:
                with pytest.raises(cachex.ReplicaError):
                    client._call(conn, dict(hdr, owner=0), b"x")
            assert client._call(conn, {"op": "ping"})[0]["ok"]  # the same connection lives on
        finally:
            conn[0].close()
        assert client.ping()
        assert client.list_steps(0) == [4, 41]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stdout.close()
    assert "Traceback" not in err_path.read_text()


def test_recv_msg_maps_a_nested_header_to_value_error():
    a, b = socket.socketpair()
    with a, b:
        raw = json.dumps({"k": json.loads("[" * 50 + "]" * 50)}).encode()
        _raw_header(a, b"[" * 20000 + b"]" * 20000)
        with pytest.raises(ValueError, match="not valid JSON"):
            _replica.recv_msg(b, 1 << 16, 0)
        _raw_header(a, raw)  # moderate nesting is still a header (just not an object here)
        assert _replica.recv_msg(b, 1 << 16, 0)[0]["k"]


# -- D5: an atomic re-commit ------------------------------------------------------------------


def test_a_recommit_killed_between_its_renames_keeps_the_old_copy(
    make_server, tmp_path, monkeypatch
):
    # Old code: final -> .old, rmtree(.old), then .tmp -> final: dying at the last rename left
    # no listed step, and the next retain deleted what remained.
    srv = make_server()
    client = cachex.ReplicaClient(srv.address, TOKEN, timeout_s=10)
    old = _rank_dir(tmp_path / "old", 1000, fill=1)
    client.push_dir(0, 5, old)
    real = _replica.os.rename

    def die_at_rename_in(src, dst, *a, **kw):
        if Path(src).name.startswith(".tmp-"):
            raise OSError("server killed")
        return real(src, dst, *a, **kw)

    monkeypatch.setattr(_replica.os, "rename", die_at_rename_in)
    with pytest.raises(cachex.ReplicaError, match="server killed"):
        client.push_dir(0, 5, _rank_dir(tmp_path / "new", 1000, fill=2))
    monkeypatch.setattr(_replica.os, "rename", real)
    base = srv.root / "rank_0"
    assert sorted(p.name.split("-")[0] + "-" for p in base.iterdir()) == [".old-", ".tmp-"]
    assert client.list_steps(0) == [5]  # restored from the .old- copy
    assert client.retain(0, [5, 6]) == []
    assert client.list_steps(0) == [5]
    assert _files(client.fetch_dir(0, 5, tmp_path / "got")) == _files(old)


def test_retain_restores_a_crafted_aside_copy_and_removes_broken_ones(make_server, tmp_path):
    srv = make_server()
    client = cachex.ReplicaClient(srv.address, TOKEN, timeout_s=10)
    src = _rank_dir(tmp_path / "s", 1000, fill=3)
    client.push_dir(0, 5, src)
    client.push_dir(0, 7, _rank_dir(tmp_path / "t", 1000, fill=4))
    base = srv.root / "rank_0"
    os.rename(base / "5", base / ".old-5-100")  # a commit of 5 cut short between its renames
    (base / ".tmp-5").mkdir()
    (base / ".tmp-5" / "data.bin").write_bytes(b"partial")
    os.rename(base / "7", base / ".old-7-200")  # newer but incomplete: not restorable
    (base / ".old-7-200" / cachex.DATA_FILE).unlink()
    assert client.retain(0, [5, 6]) == []
    assert client.list_steps(0) == [5]
    assert sorted(p.name for p in base.iterdir()) == [".tmp-5", "5"]
    assert _files(client.fetch_dir(0, 5, tmp_path / "got")) == _files(src)


def test_a_restarted_server_restores_an_aside_copy(tmp_path):
    root = tmp_path / "n"
    srv = cachex.ReplicaServer(root, TOKEN).start()
    client = cachex.ReplicaClient(srv.address, TOKEN, timeout_s=10)
    client.push_dir(0, 5, _rank_dir(tmp_path / "s", 1000))
    srv.stop()
    os.rename(root / "rank_0" / "5", root / "rank_0" / ".old-5-100")
    srv = cachex.ReplicaServer(root, TOKEN)  # recovers before it serves
    try:
        assert (root / "rank_0" / "5").is_dir()
        assert not list((root / "rank_0").glob(".old-*"))
    finally:
        srv.stop()


def test_the_cli_refuses_a_bad_limit_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HEXAD_CACHEX_TOKEN", TOKEN)
    with pytest.raises(SystemExit) as exc:
        _replica.main([str(tmp_path / "n"), "--max-connections", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "max_connections" in err and "Traceback" not in err


# -- S4: no fixed token in the studies ---------------------------------------------------------


def test_study_token_is_fresh_per_run_or_from_the_environment(monkeypatch):
    import dataclasses

    from experiments import _cachex, cachex_bench, cachex_durability

    for cfg in (_cachex.PFSConfig, cachex_bench.Config, cachex_durability.Config):
        assert "token" not in {f.name for f in dataclasses.fields(cfg)}
    monkeypatch.delenv("HEXAD_CACHEX_TOKEN", raising=False)
    a, b = _cachex.study_token(), _cachex.study_token()
    assert a != b and len(a) == 32
    monkeypatch.setenv("HEXAD_CACHEX_TOKEN", "x" * 20)
    assert _cachex.study_token() == "x" * 20
    monkeypatch.setenv("HEXAD_CACHEX_TOKEN", "short")
    with pytest.raises(ValueError, match="HEXAD_CACHEX_TOKEN"):
        _cachex.study_token()
