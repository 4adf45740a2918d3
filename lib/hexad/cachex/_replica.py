"""T2: the neighbour replica server and its client (TCP; loopback unless a host is given).

Wire format: every message is a 4-byte big-endian header length, a JSON header (at most
``max_header_bytes``), then ``header["nbytes"]`` payload bytes (at most ``max_message_bytes``
on the server, ``max_message_bytes`` of the client on the way back). Nothing is ever unpickled.

Authentication (challenge-response, stdlib ``hmac`` with SHA-256; the token never travels):
the client opens with ``{"op": "hello", "owner": r, "client_nonce": ...}``; the server answers
with its own random nonce; the client proves it holds the token with
``HMAC(token, "client" | nonces | owner)`` and the server proves it back with
``HMAC(token, "server" | nonces | owner)``. Both derive a per-connection key from the token and
the two nonces, and every later message carries ``HMAC(key, direction | sequence number |
header | payload)``, checked in constant time: a recorded connection cannot be replayed (fresh
nonces), nor a message replayed, reordered or altered within one. The owner is bound to the
connection: a client that said hello as rank ``r`` can only put, list, get and retain rank
``r``'s replicas. The server caps concurrent connections (``max_connections``) and each
owner's stored bytes (``quota_bytes``).

Files arrive in bounded chunks into ``<root>/rank_<owner>/.tmp-<step>/``; each file is
``fsync``ed and its CRC-32 checked when its last chunk arrives; ``commit`` checks that the
manifest and every file it names are present with the right sizes, ``fsync``s the directory,
renames it to ``<root>/rank_<owner>/<step>``, ``fsync``s the parent and only then acknowledges.

:func:`choose_partner` picks each rank's neighbour on another host (another failure domain).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import ipaddress
import json
import os
import select
import shutil
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Any

from hexad.cachex import _format, _fsio

__all__ = [
    "ReplicaClient",
    "ReplicaError",
    "ReplicaServer",
    "check_host",
    "check_token",
    "choose_partner",
    "spawn_replica_server",
]

_LEN = struct.Struct(">I")
_SEQ = struct.Struct(">Q")
MIN_TOKEN_BYTES = 16


def check_token(token: Any, name: str = "token") -> bytes:
    """Returns ``token`` (a str of at least 16 bytes in UTF-8) as bytes, else raises."""
    if not isinstance(token, str):
        raise ValueError(f"{name}: expected a str of >= {MIN_TOKEN_BYTES} bytes, got {token!r}")
    raw = token.encode()
    if len(raw) < MIN_TOKEN_BYTES:
        raise ValueError(
            f"{name}: expected a shared secret of >= {MIN_TOKEN_BYTES} bytes, got {len(raw)}"
        )
    return raw


def check_host(host: Any, name: str = "host") -> str:
    """Returns ``host`` if it is an IP address or a name that resolves, else raises.

    >>> check_host("127.0.0.1")
    '127.0.0.1'
    """
    if not isinstance(host, str) or not host:
        raise ValueError(f"{name}: expected an IP address or host name, got {host!r}")
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    try:
        socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError):
        raise ValueError(
            f"{name}: expected an IP address or a resolvable host name, got {host!r}"
        ) from None
    return host


def _check_count(name: str, v: Any, lo: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"{name}: expected an int >= {lo}, got {v!r}")
    return v


def choose_partner(rank: int, hosts: list[str]) -> int:
    """The rank whose replica server holds ``rank``'s replicas: the next rank (cyclically)
    on another host, so one node's loss never takes both copies (SCR's partner scheme).

    Args:
      rank: this rank (``0 <= rank < len(hosts)``).
      hosts: the host (failure domain) of every rank.

    >>> choose_partner(0, ["a", "a", "b", "b"]), choose_partner(2, ["a", "a", "b", "b"])
    (2, 0)
    """
    n = len(hosts)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < n:
        raise ValueError(f"rank: expected an int in [0, {n}), got {rank!r}")
    for k in range(1, n):
        r = (rank + k) % n
        if hosts[r] != hosts[rank]:
            return r
    raise ValueError(
        f"hosts: every rank is on {hosts[rank]!r}: no partner in another failure domain "
        "(the neighbour would be this node itself)"
    )


def _mac(key: bytes, direction: bytes, seq: int, raw_header: bytes, payload: Any) -> str:
    h = hmac.new(key, direction + _SEQ.pack(seq) + _LEN.pack(len(raw_header)), hashlib.sha256)
    h.update(raw_header)
    h.update(payload)
    return h.hexdigest()


class _Channel:
    """One authenticated connection's MAC state (key and per-direction sequence numbers)."""

    def __init__(self, key: bytes, send_dir: bytes, recv_dir: bytes):
        self.key, self.send_dir, self.recv_dir = key, send_dir, recv_dir
        self.sent = self.received = 0

    def seal(self, header: dict, payload: Any) -> dict:
        view = memoryview(payload).cast("B")
        header = dict(header, nbytes=len(view))
        raw = json.dumps(header, sort_keys=True).encode()
        header["mac"] = _mac(self.key, self.send_dir, self.sent, raw, view)
        self.sent += 1
        return header

    def check(self, header: dict, payload: Any) -> None:
        mac = header.pop("mac", None)
        raw = json.dumps(header, sort_keys=True).encode()
        want = _mac(self.key, self.recv_dir, self.received, raw, memoryview(payload))
        # compare_digest takes ASCII-only strs (a peer's other str would raise TypeError)
        if not isinstance(mac, str) or not mac.isascii() or not hmac.compare_digest(mac, want):
            raise ValueError("message authentication failed (bad MAC, replay or reorder)")
        self.received += 1


def _proof(token: bytes, role: bytes, cn: str, sn: str, owner: int) -> str:
    msg = b"|".join([role, cn.encode(), sn.encode(), str(owner).encode()])
    return hmac.new(token, msg, hashlib.sha256).hexdigest()


class ReplicaError(RuntimeError):
    """The replica server refused a request, or could not be reached in time."""


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("peer closed the connection")
        got += k
    return buf


def send_msg(
    sock: socket.socket, header: dict[str, Any], payload: Any = b"", chan: _Channel | None = None
) -> None:
    """Sends one framed message (JSON header + raw payload; MAC'd when ``chan`` is given)."""
    view = memoryview(payload).cast("B")
    header = chan.seal(header, view) if chan is not None else dict(header, nbytes=len(view))
    raw = json.dumps(header).encode()
    sock.sendall(_LEN.pack(len(raw)) + raw)
    if len(view):
        sock.sendall(view)


def recv_msg(
    sock: socket.socket, max_header_bytes: int, max_message_bytes: int, chan: _Channel | None = None
) -> tuple[dict[str, Any], bytearray]:
    """Receives one framed message; raises ValueError if a size bound is exceeded or (with
    ``chan``) its MAC does not verify."""
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if n > max_header_bytes:
        raise ValueError(f"header of {n} bytes exceeds max_header_bytes={max_header_bytes}")
    try:
        header = json.loads(_recv_exact(sock, n))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError("header is not valid JSON") from None
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    nbytes = header.get("nbytes", 0)
    if not isinstance(nbytes, int) or nbytes < 0 or nbytes > max_message_bytes:
        raise ValueError(f"payload of {nbytes!r} bytes exceeds max_message_bytes")
    payload = _recv_exact(sock, nbytes) if nbytes else bytearray()
    if chan is not None:
        chan.check(header, payload)
    return header, payload


def _owner(header: dict[str, Any]) -> str:
    owner = header.get("owner")
    if not isinstance(owner, int) or isinstance(owner, bool) or not 0 <= owner < 1 << 20:
        raise ValueError(f"owner: expected a rank int in [0, 2**20), got {owner!r}")
    return f"rank_{owner}"


class ReplicaServer:
    """A neighbour's replica store served over TCP (binds 127.0.0.1 by default).

    Args:
      root: directory of the replicas this node holds for its peers.
      token: the shared secret its peers prove they hold (a str of >= 16 bytes).
      host: interface to bind (an IP address or a resolvable name); loopback unless a
        caller deliberately passes another, e.g. the cluster network's address.
      port: TCP port (0 picks a free one; see :attr:`address`).
      max_message_bytes: bound on one message's payload (chunk size of a pushed file).
      max_header_bytes: bound on one message's JSON header.
      max_lifetime_s: the server stops itself after this many seconds; None (the default)
        serves until :meth:`stop` (a bound is for tests).
      delay_s: injected delay before storing each received chunk (a slow neighbour).
      conn_timeout_s: socket timeout of one connection.
      quota_bytes: bytes one owner may store (committed and in flight; >= 1), or None.
      max_connections: concurrent connections served (>= 1); more are refused.

    >>> import tempfile
    >>> srv = ReplicaServer(tempfile.mkdtemp(), token="a-shared-secret-of-16+-bytes").start()
    >>> srv.stop()
    """

    def __init__(
        self,
        root: str | Path,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        max_message_bytes: int = 16 << 20,
        max_header_bytes: int = 64 << 10,
        max_lifetime_s: float | None = None,
        delay_s: float = 0.0,
        conn_timeout_s: float = 60.0,
        quota_bytes: int | None = None,
        max_connections: int = 64,
    ):
        self._token = check_token(token)
        host = check_host(host)
        if quota_bytes is not None:
            _check_count("quota_bytes", quota_bytes)
        self.quota_bytes = quota_bytes
        self.max_connections = _check_count("max_connections", max_connections)
        self._slots = threading.BoundedSemaphore(self.max_connections)

        if max_message_bytes < 1 or max_header_bytes < 64:
            raise ValueError(
                f"max_message_bytes/max_header_bytes: expected >= 1 / >= 64, got "
                f"{max_message_bytes}/{max_header_bytes}"
            )
        if max_lifetime_s is not None and not max_lifetime_s > 0:
            raise ValueError(f"max_lifetime_s: expected None or > 0, got {max_lifetime_s}")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_message_bytes = int(max_message_bytes)
        self.max_header_bytes = int(max_header_bytes)
        self.max_lifetime_s = None if max_lifetime_s is None else float(max_lifetime_s)
        self.delay_s = float(delay_s)
        self.conn_timeout_s = float(conn_timeout_s)
        self.rejected = 0
        self.refused = 0
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                outer._serve_connection(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server((host, port), Handler)
        self._thread: threading.Thread | None = None
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` the server listens on."""
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def running(self) -> bool:
        """Whether the server is serving (False after :meth:`stop` or its lifetime)."""
        return self._thread is not None

    def start(self) -> ReplicaServer:
        """Starts serving in a daemon thread; returns ``self``."""
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        if self.max_lifetime_s is not None:
            self._timer = threading.Timer(self.max_lifetime_s, self.stop)
            self._timer.daemon = True
            self._timer.start()
        return self

    def stop(self) -> None:
        """Stops the server and closes its socket (idempotent)."""
        with self._lock:
            if self._thread is None:  # never started (or stopped already): nothing to shut down
                self._server.server_close()
                return
            self._server.shutdown()
            self._server.server_close()
            self._thread = None
            if self._timer is not None:
                self._timer.cancel()

    # -- one connection ------------------------------------------------------------------------

    def _serve_connection(self, sock: socket.socket) -> None:
        sock.settimeout(self.conn_timeout_s)
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            try:
                send_msg(sock, {"ok": False, "error": "too many connections"})
            except OSError:
                pass
            return
        open_files: dict[tuple[str, str, str], list] = {}
        owner = None
        try:
            header, _ = recv_msg(sock, self.max_header_bytes, 0)
            owner = header.get("owner")
            cn = header.get("client_nonce")
            if header.get("op") != "hello" or not isinstance(cn, str) or len(cn) != 64:
                raise ValueError("expected hello with owner and a 32-byte client_nonce")
            _owner({"owner": owner})
            sn = os.urandom(32).hex()
            send_msg(sock, {"ok": True, "server_nonce": sn})
            header, _ = recv_msg(sock, self.max_header_bytes, 0)
            proof = header.get("proof")
            want = _proof(self._token, b"client", cn, sn, owner)
            if (
                not isinstance(proof, str)
                or not proof.isascii()
                or not hmac.compare_digest(proof, want)
            ):
                self.rejected += 1
                send_msg(sock, {"ok": False, "error": "authentication failed"})
                return
            mac_key = bytes.fromhex(_proof(self._token, b"channel-key", cn, sn, owner))
            chan = _Channel(mac_key, b"s2c", b"c2s")
            send_msg(sock, {"ok": True, "proof": _proof(self._token, b"server", cn, sn, owner)})
            while True:
                try:
                    header, payload = recv_msg(
                        sock, self.max_header_bytes, self.max_message_bytes, chan
                    )
                except ConnectionError:
                    return
                try:
                    if header.get("owner", owner) != owner:
                        raise ValueError(f"owner: this connection is bound to owner {owner}")
                    header["owner"] = owner
                    reply, data = self._dispatch(header, payload, open_files)
                except (ValueError, OSError, _format.CorruptCheckpointError) as e:
                    reply, data = {"ok": False, "error": str(e)}, b""
                send_msg(sock, reply, data, chan)
        except (ConnectionError, TimeoutError, ValueError, OSError):
            return
        finally:
            for fd, *_ in open_files.values():
                os.close(fd)
            self._slots.release()

    def usage(self, owner: int) -> int:
        """Bytes stored for ``owner`` (committed replicas and files in flight)."""
        base = self.root / _owner({"owner": owner})
        total = 0
        if base.exists():
            for p in base.rglob("*"):
                if p.is_file():
                    try:
                        total += p.stat().st_size
                    except FileNotFoundError:
                        continue
        return total

    def _dispatch(self, h: dict[str, Any], payload: bytearray, open_files: dict) -> tuple:
        op = h.get("op")
        if op == "ping":
            return {"ok": True}, b""
        if op == "list":
            d = self.root / _owner(h)
            steps = (
                sorted(int(p.name) for p in d.iterdir() if p.is_dir() and p.name.isdigit())
                if d.exists()
                else []
            )
            return {"ok": True, "steps": steps}, b""
        if op == "put":
            if self.delay_s:
                time.sleep(self.delay_s)
            owner = _owner(h)
            step = _fsio.validate_step_name(h.get("step"))
            name = _fsio.validate_file_name(h.get("file"))
            tmp = self.root / owner / f".tmp-{step}"
            key = (owner, step, name)
            if key not in open_files:
                if h.get("offset") != 0:
                    raise ValueError(f"put {name}: first chunk must have offset 0")
                tmp.mkdir(parents=True, exist_ok=True)
                path = tmp / name
                if path.exists():
                    path.unlink()
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                open_files[key] = [fd, 0, 0]
            entry = open_files[key]
            if h.get("offset") != entry[2]:
                raise ValueError(f"put {name}: offset {h.get('offset')} != {entry[2]}")
            if self.quota_bytes is not None and entry[2] == 0:
                # The whole file counts against the quota from its first chunk on (old
                # replicas of this owner are removed by its retain after each commit).
                size = h.get("size")
                if not isinstance(size, int) or size < 0:
                    raise ValueError(f"put {name}: expected the file's size, got {size!r}")
                used = self.usage(int(owner[5:]))
                if used + size > self.quota_bytes:
                    os.close(open_files.pop(key)[0])
                    (tmp / name).unlink()
                    raise ValueError(
                        f"quota: owner {owner} would store {used + size} bytes, over "
                        f"quota_bytes={self.quota_bytes}"
                    )
            view = memoryview(payload)
            off = 0
            while off < len(view):
                off += os.write(entry[0], view[off:])
            entry[1] = zlib.crc32(view, entry[1])
            entry[2] += len(view)
            if h.get("last"):
                fd, crc, size = open_files.pop(key)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                if (crc & 0xFFFFFFFF) != h.get("crc32") or size != h.get("size"):
                    (tmp / name).unlink()
                    raise ValueError(f"put {name}: checksum or size mismatch")
            return {"ok": True}, b""
        if op == "commit":
            owner = _owner(h)
            step = _fsio.validate_step_name(h.get("step"))
            base = self.root / owner
            tmp = base / f".tmp-{step}"
            manifest = _format.read_manifest(tmp)
            for f in manifest["files"]:
                p = tmp / f["file"]
                if not p.exists() or p.stat().st_size != f["nbytes"]:
                    raise ValueError(f"commit {step}: {f['file']} missing or wrong size")
            _fsio.fsync_dir(tmp)
            final = base / step
            if final.exists():
                trash = base / f".old-{step}-{time.monotonic_ns()}"
                os.rename(final, trash)
                shutil.rmtree(trash, ignore_errors=True)
            os.rename(tmp, final)
            _fsio.fsync_dir(base)
            _fsio.fsync_dir(self.root)  # rank_<owner> itself may be new
            return {"ok": True}, b""
        if op == "get":
            owner = _owner(h)
            step = _fsio.validate_step_name(h.get("step"))
            name = _fsio.validate_file_name(h.get("file"))
            path = _fsio.safe_join(self.root / owner, step, name)
            size = path.stat().st_size
            offset = h.get("offset", 0)
            if not isinstance(offset, int) or offset < 0:
                raise ValueError(f"get {name}: bad offset {offset!r}")
            n = min(self.max_message_bytes, max(0, size - offset))
            with open(path, "rb") as fh:
                fh.seek(offset)
                data = fh.read(n)
            return {"ok": True, "size": size}, data
        if op == "retain":
            owner = _owner(h)
            keep = {_fsio.validate_step_name(s) for s in h.get("steps", [])}
            base = self.root / owner
            removed = []
            if base.exists():
                for p in base.iterdir():
                    if p.is_dir() and p.name.isdigit() and p.name not in keep:
                        # renamed first, as in commit: a removal cut short leaves a .old-
                        # folder (removed by the next retain), never a half-deleted step
                        trash = base / f".old-{p.name}-{time.monotonic_ns()}"
                        os.rename(p, trash)
                        shutil.rmtree(trash, ignore_errors=True)
                        removed.append(int(p.name))
                    elif _leftover(p.name, keep):
                        shutil.rmtree(p, ignore_errors=True)
                _fsio.fsync_dir(base)
            return {"ok": True, "removed": sorted(removed)}, b""
        raise ValueError(f"op: unknown operation {op!r}")


def _leftover(name: str, keep: set[str]) -> bool:
    """Whether ``name`` under ``rank_<owner>/`` is a dead push or commit's folder: a
    ``.tmp-<step>`` of a step not in ``keep`` (a cancelled or abandoned push; the owner keeps
    the step it is pushing), or the ``.old-<step>-<ns>`` of a replaced replica."""
    if name.startswith(".tmp-"):
        return name[5:].isdigit() and name[5:] not in keep
    return name.startswith(".old-")


class ReplicaClient:
    """Talks to one neighbour's :class:`ReplicaServer` on behalf of one owner (rank).

    Args:
      address: ``(host, port)`` of the neighbour's server (host: an IP address or name).
      token: the shared secret (a str of >= 16 bytes; it never leaves this process).
      timeout_s: socket timeout of each operation.
      chunk_bytes: payload size of one pushed chunk (must not exceed the server's bound).
      max_message_bytes: the largest reply payload this client accepts (>= 1): a server
        cannot make it allocate more.
      max_file_bytes: the largest file :meth:`fetch_dir` downloads (>= 1).

    >>> import tempfile
    >>> token = "a-shared-secret-of-16+-bytes"
    >>> srv = ReplicaServer(tempfile.mkdtemp(), token=token).start()
    >>> ReplicaClient(srv.address, token=token).list_steps(owner=0)
    []
    >>> srv.stop()
    """

    def __init__(
        self,
        address: tuple[str, int],
        token: str,
        timeout_s: float = 60.0,
        chunk_bytes: int = 8 << 20,
        max_message_bytes: int = 64 << 20,
        max_file_bytes: int = 1 << 40,
    ):
        self._token = check_token(token)
        try:
            host, port = address
        except (TypeError, ValueError):
            raise ValueError(f"address: expected (host, port), got {address!r}") from None
        self.address = (check_host(str(host), "address host"), int(port))
        self.timeout_s = float(timeout_s)
        self.chunk_bytes = _check_count("chunk_bytes", chunk_bytes)
        self.max_message_bytes = _check_count("max_message_bytes", max_message_bytes)
        self.max_file_bytes = _check_count("max_file_bytes", max_file_bytes)

    def _connect(self, owner: int = 0) -> tuple[socket.socket, _Channel]:
        try:
            sock = socket.create_connection(self.address, timeout=self.timeout_s)
        except OSError as e:
            raise ReplicaError(f"replica server {self.address}: cannot connect ({e})") from None
        sock.settimeout(self.timeout_s)
        try:
            cn = os.urandom(32).hex()
            send_msg(sock, {"op": "hello", "owner": owner, "client_nonce": cn})
            h, _ = recv_msg(sock, 1 << 16, 0)
            sn = h.get("server_nonce")
            if h.get("ok"):
                if not isinstance(sn, str) or not sn:
                    raise ValueError(f"hello reply: expected a str server_nonce, got {sn!r}")
                proof = _proof(self._token, b"client", cn, sn, owner)
                send_msg(sock, {"op": "auth", "proof": proof})
                h, _ = recv_msg(sock, 1 << 16, 0)
                want = _proof(self._token, b"server", cn, sn, owner)
                got = h.get("proof")
                if h.get("ok") and not (
                    isinstance(got, str) and got.isascii() and hmac.compare_digest(got, want)
                ):
                    h = {"ok": False, "error": "the server failed to prove it holds the token"}
        except (OSError, ValueError, ConnectionError) as e:
            sock.close()
            raise ReplicaError(f"replica server {self.address}: handshake failed ({e})") from None
        if not h.get("ok"):
            sock.close()
            raise ReplicaError(f"replica server {self.address}: {h.get('error')}")
        mac_key = bytes.fromhex(_proof(self._token, b"channel-key", cn, sn, owner))
        return sock, _Channel(mac_key, b"c2s", b"s2c")

    def _call(self, conn, header, payload=b"") -> tuple[dict, bytearray]:
        sock, chan = conn
        try:
            send_msg(sock, header, payload, chan)
            h, data = recv_msg(sock, 1 << 20, self.max_message_bytes, chan)
        except (OSError, ValueError, ConnectionError) as e:
            raise ReplicaError(
                f"replica server {self.address}: {header['op']} failed ({e})"
            ) from None
        if not h.get("ok"):
            raise ReplicaError(f"replica server {self.address}: {h.get('error')}")
        return h, data

    def push_files(
        self,
        owner: int,
        step: int,
        files: list[tuple[str, list, int]],
        cancel: threading.Event | None = None,
    ) -> None:
        """Pushes files ``[(name, [bytes-like pieces], crc32)]`` (manifest last) and commits.

        Waits for the server's acknowledgement, sent only after it has ``fsync``ed every file,
        checked every checksum, renamed the step into place and ``fsync``ed the parent. If
        ``cancel`` is set before the commit, the push stops (the server never commits the
        step) and raises :class:`ReplicaError`.
        """
        step_name = _fsio.validate_step_name(step)
        conn = self._connect(owner)
        try:
            for name, pieces, crc in files:
                _fsio.validate_file_name(name)
                size = sum(len(memoryview(p).cast("B")) for p in pieces)
                chunks = []
                for piece in pieces:
                    view = memoryview(piece).cast("B")
                    chunks += [
                        view[i : i + self.chunk_bytes]
                        for i in range(0, len(view), self.chunk_bytes)
                    ]
                chunks = chunks or [memoryview(b"")]
                off = 0
                for i, chunk in enumerate(chunks):
                    hdr = {
                        "op": "put",
                        "owner": owner,
                        "step": step_name,
                        "file": name,
                        "offset": off,
                        "last": i == len(chunks) - 1,
                        "crc32": crc,
                        "size": size,
                    }
                    if cancel is not None and cancel.is_set():
                        raise ReplicaError(f"push of step {step_name}: cancelled")
                    self._call(conn, hdr, chunk)
                    off += len(chunk)
            if cancel is not None and cancel.is_set():
                raise ReplicaError(f"push of step {step_name}: cancelled")
            self._call(conn, {"op": "commit", "owner": owner, "step": step_name})
        finally:
            conn[0].close()

    def push_dir(self, owner: int, step: int, directory: Path) -> None:
        """Pushes one rank directory from disk (see :meth:`push_files`)."""
        manifest = _format.read_manifest(directory)
        files = []
        for f in manifest["files"]:
            files.append((f["file"], [(Path(directory) / f["file"]).read_bytes()], f["crc32"]))
        raw = (Path(directory) / _format.MANIFEST_FILE).read_bytes()
        files.append((_format.MANIFEST_FILE, [raw], _fsio.crc32_bytes(raw)))
        self.push_files(owner, step, files)

    def ping(self) -> bool:
        """Whether the server answers (connects, authenticates and replies) in time."""
        try:
            conn = self._connect()
        except ReplicaError:
            return False
        try:
            self._call(conn, {"op": "ping"})
            return True
        except ReplicaError:
            return False
        finally:
            conn[0].close()

    def list_steps(self, owner: int) -> list[int]:
        """Returns the committed replica steps the server holds for ``owner``."""
        conn = self._connect(owner)
        try:
            h, _ = self._call(conn, {"op": "list", "owner": owner})
        finally:
            conn[0].close()
        return [int(s) for s in h["steps"]]

    def fetch_dir(self, owner: int, step: int, dest: Path) -> Path:
        """Downloads ``owner``'s replica of ``step`` into the new directory ``dest``."""
        step_name = _fsio.validate_step_name(step)
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=False)
        conn = self._connect(owner)
        try:

            def get(name: str) -> bytearray:
                out = bytearray()
                while True:
                    h, data = self._call(
                        conn,
                        {
                            "op": "get",
                            "owner": owner,
                            "step": step_name,
                            "file": name,
                            "offset": len(out),
                        },
                    )
                    size = h.get("size")
                    if not isinstance(size, int) or not 0 <= size <= self.max_file_bytes:
                        raise ReplicaError(
                            f"get {name}: size {size!r} exceeds max_file_bytes="
                            f"{self.max_file_bytes}"
                        )
                    out += data
                    if len(out) > size:
                        raise ReplicaError(f"get {name}: server sent more than {size} bytes")
                    if len(out) == size or not data:
                        return out

            raw = get(_format.MANIFEST_FILE)
            (dest / _format.MANIFEST_FILE).write_bytes(raw)
            manifest = _format.read_manifest(dest)
            for f in manifest["files"]:
                (dest / f["file"]).write_bytes(get(f["file"]))
        finally:
            conn[0].close()
        return dest

    def retain(self, owner: int, steps: list[int]) -> list[int]:
        """Deletes ``owner``'s replicas except ``steps``, and what unfinished pushes of other
        steps left behind; returns the removed (committed) steps."""
        conn = self._connect(owner)
        try:
            h, _ = self._call(conn, {"op": "retain", "owner": owner, "steps": list(steps)})
        finally:
            conn[0].close()
        return h["removed"]


def spawn_replica_server(
    root: str | Path,
    token: str,
    port: int = 0,
    host: str = "127.0.0.1",
    max_lifetime_s: float | None = None,
    delay_s: float = 0.0,
    timeout_s: float = 60.0,
) -> tuple[subprocess.Popen, tuple[str, int]]:
    """Starts a :class:`ReplicaServer` on ``host`` (loopback by default) in its own process.

    The token travels in the child's environment, not its command line. The server runs until
    ``proc.terminate()`` (or for ``max_lifetime_s`` seconds if that is set, for tests).

    Returns:
      ``(process, (host, port))``.

    >>> import shutil, tempfile
    >>> import numpy as np
    >>> root = Path(tempfile.mkdtemp())
    >>> token = "a-shared-secret-of-16+-bytes"
    >>> proc, addr = spawn_replica_server(root / "neighbour", token, max_lifetime_s=60)
    >>> snap = _format.Snapshot(
    ...     (_format.LeafSpec("w", (3,), "float32"),),
    ...     (_format.ShardRecord(0, ((0, 3),), np.arange(3, dtype=np.float32)),),
    ... )
    >>> (root / "step3").mkdir()
    >>> _ = _format.write_rank_dir(root / "step3", snap, {})  # one rank's T1 files
    >>> client = ReplicaClient(addr, token)
    >>> client.push_dir(owner=0, step=3, directory=root / "step3")  # acknowledged when durable
    >>> client.list_steps(owner=0)
    [3]
    >>> proc.terminate()
    >>> proc.wait(timeout=30)
    0
    >>> proc.stdout.close()
    >>> shutil.rmtree(root)
    """
    check_token(token)
    host = check_host(host)
    env = dict(os.environ, HEXAD_CACHEX_TOKEN=token, JAX_PLATFORMS="cpu")
    cmd = [
        sys.executable,
        "-c",
        "import sys; from hexad.cachex._replica import main; sys.exit(main(sys.argv[1:]))",
        str(root),
        "--host",
        host,
        "--port",
        str(port),
        *(["--max-lifetime-s", str(max_lifetime_s)] if max_lifetime_s is not None else []),
        "--delay-s",
        str(delay_s),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    line = proc.stdout.readline().split() if ready else []
    if len(line) != 2 or line[0] != "PORT":
        proc.kill()
        raise ReplicaError(f"replica server process did not start (got {line!r})")
    return proc, (host, int(line[1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hexad.cachex._replica")
    p.add_argument("root", type=Path)
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default loopback)")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--max-lifetime-s", type=float, default=None)
    p.add_argument("--delay-s", type=float, default=0.0)
    args = p.parse_args(argv)
    token = os.environ.get("HEXAD_CACHEX_TOKEN", "")
    srv = ReplicaServer(
        args.root,
        token,
        host=args.host,
        port=args.port,
        max_lifetime_s=args.max_lifetime_s,
        delay_s=args.delay_s,
    ).start()
    print(f"PORT {srv.address[1]}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: srv.stop())
    while srv.running:
        time.sleep(0.2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
