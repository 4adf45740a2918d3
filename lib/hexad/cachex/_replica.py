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
``r``'s replicas.

Limits (all settable from :class:`ReplicaServer`, :func:`spawn_replica_server` and the CLI):
a connection must finish the whole hello/proof exchange within ``handshake_timeout_s``; at most
``max_preauth_connections`` unauthenticated connections are held (a new one drops the oldest,
so idle or trickling sockets without the token cannot lock peers out); ``max_connections``
slots are taken only once a peer has proved it holds the token; every later message must
arrive whole within ``conn_timeout_s`` of the server starting to wait for it (a deadline, not
a per-``recv`` timeout); each owner's stored bytes, counted as written, stay within
``quota_bytes``.

Files arrive in bounded chunks into ``<root>/rank_<owner>/.tmp-<step>/``; each file is
``fsync``ed and its CRC-32 checked when its last chunk arrives; ``commit`` checks that the
manifest and every file it names are present with the right sizes, ``fsync``s the directory,
renames it to ``<root>/rank_<owner>/<step>``, ``fsync``s the parent and only then acknowledges.

A step pushed again is swapped in by renaming the old copy aside to ``.old-<step>-<ns>`` first
and removing it only after the new one is in place; a ``.old-`` copy whose step is missing (the
server died between the renames) is renamed back when the server starts and by the next
``list`` or ``retain``.

A malformed request gets an error reply; a frame that cannot be parsed (or a failed
handshake) closes the connection. Neither prints anything: a peer cannot flood the log.

:func:`choose_partner` picks each rank's neighbour on another host (another failure domain).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import ipaddress
import json
import os
import re
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
# A replaced replica moved aside by commit (restorable while its step is missing).
_ASIDE_RE = re.compile(r"\.old-(0|[1-9][0-9]*)-([0-9]+)")


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


def _recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        if deadline is not None:
            # A timeout per recv would restart with every byte a trickling peer sends.
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("message deadline passed")
            sock.settimeout(left)
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
    sock: socket.socket,
    max_header_bytes: int,
    max_message_bytes: int,
    chan: _Channel | None = None,
    deadline: float | None = None,
) -> tuple[dict[str, Any], bytearray]:
    """Receives one framed message; raises ValueError if a size bound is exceeded or (with
    ``chan``) its MAC does not verify, TimeoutError if it is not whole by ``deadline`` (a
    ``time.monotonic()`` value; None: the socket's own timeout per ``recv``)."""
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size, deadline))
    if n > max_header_bytes:
        raise ValueError(f"header of {n} bytes exceeds max_header_bytes={max_header_bytes}")
    raw = _recv_exact(sock, n, deadline)
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        # RecursionError: a deeply nested header that still fits max_header_bytes
        raise ValueError("header is not valid JSON") from None
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    nbytes = header.get("nbytes", 0)
    if (
        isinstance(nbytes, bool)
        or not isinstance(nbytes, int)
        or not 0 <= nbytes <= max_message_bytes
    ):
        raise ValueError(f"payload of {nbytes!r} bytes exceeds max_message_bytes")
    payload = _recv_exact(sock, nbytes, deadline) if nbytes else bytearray()
    if chan is not None:
        chan.check(header, payload)
    return header, payload


def _owner(header: dict[str, Any]) -> str:
    owner = header.get("owner")
    if not isinstance(owner, int) or isinstance(owner, bool) or not 0 <= owner < 1 << 20:
        raise ValueError(f"owner: expected a rank int in [0, 2**20), got {owner!r}")
    return f"rank_{owner}"


def _check_limits(
    quota_bytes: int | None,
    max_connections: int,
    max_preauth_connections: int,
    conn_timeout_s: float,
    handshake_timeout_s: float,
    max_message_bytes: int,
    max_header_bytes: int,
) -> None:
    """Raises ValueError naming the first server limit out of range."""
    if quota_bytes is not None:
        _check_count("quota_bytes", quota_bytes)
    _check_count("max_connections", max_connections)
    _check_count("max_preauth_connections", max_preauth_connections)
    _check_count("max_message_bytes", max_message_bytes)
    _check_count("max_header_bytes", max_header_bytes, lo=64)
    for name, v in (
        ("conn_timeout_s", conn_timeout_s),
        ("handshake_timeout_s", handshake_timeout_s),
    ):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
            raise ValueError(f"{name}: expected a finite number of seconds > 0, got {v!r}")


class _Refused(Exception):
    """Ends a connection after its error reply was sent (an expected refusal, not a fault)."""


class ReplicaServer:
    """A neighbour's replica store served over TCP (binds 127.0.0.1 by default).

    Args:
      root: directory of the replicas this node holds for its peers.
      token: the shared secret its peers prove they hold (a str of >= 16 bytes).
      host: interface to bind (an IP address or a resolvable name); loopback unless a
        caller deliberately passes another, e.g. the cluster network's address.
      port: TCP port (0 picks a free one; see :attr:`address`).
      max_message_bytes: bound on one message's payload (chunk size of a pushed file).
      max_header_bytes: bound on one message's JSON header (>= 64).
      max_lifetime_s: the server stops itself after this many seconds; None (the default)
        serves until :meth:`stop` (a bound is for tests).
      delay_s: injected delay before storing each received chunk (a slow neighbour).
      conn_timeout_s: deadline for each message of an authenticated connection, counted from
        when the server starts waiting for it until its last byte.
      quota_bytes: bytes one owner may store (committed and in flight, counted as written;
        >= 1), or None.
      max_connections: concurrent authenticated connections served (>= 1); more are refused.
      max_preauth_connections: unauthenticated connections held at once (>= 1); when full, a
        new one drops the oldest.
      handshake_timeout_s: deadline for the whole hello/proof exchange of a connection.

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
        max_preauth_connections: int = 16,
        handshake_timeout_s: float = 5.0,
    ):
        self._token = check_token(token)
        host = check_host(host)
        _check_limits(
            quota_bytes,
            max_connections,
            max_preauth_connections,
            conn_timeout_s,
            handshake_timeout_s,
            max_message_bytes,
            max_header_bytes,
        )
        if max_lifetime_s is not None and not max_lifetime_s > 0:
            raise ValueError(f"max_lifetime_s: expected None or > 0, got {max_lifetime_s}")
        self.quota_bytes = quota_bytes
        self.max_connections = max_connections
        self.max_preauth_connections = max_preauth_connections
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_message_bytes = int(max_message_bytes)
        self.max_header_bytes = int(max_header_bytes)
        self.max_lifetime_s = None if max_lifetime_s is None else float(max_lifetime_s)
        self.delay_s = float(delay_s)
        self.conn_timeout_s = float(conn_timeout_s)
        self.handshake_timeout_s = float(handshake_timeout_s)
        self.rejected = 0  # failed proofs
        self.refused = 0  # authenticated connections over max_connections
        self.evicted = 0  # unauthenticated connections dropped to admit a newer one
        self.timed_out = 0  # connections closed by the handshake or a message deadline
        self.errors = 0  # connections ended by a malformed message or an unexpected error
        self._preauth: dict[int, socket.socket] = {}  # insertion order: oldest first
        self._preauth_lock = threading.Lock()
        self._owner_locks: dict[str, threading.Lock] = {}
        self._owner_locks_guard = threading.Lock()
        for base in self.root.glob("rank_*"):
            if base.is_dir():
                self._recover(base)
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                outer._serve_connection(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True
            request_queue_size = 128

            def handle_error(self, request, client_address):
                # Last resort only (_serve_connection catches everything): a peer must not
                # be able to flood the log with tracebacks.
                outer.errors += 1

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

    def _admit(self, sock: socket.socket) -> None:
        with self._preauth_lock:
            while len(self._preauth) >= self.max_preauth_connections:
                # Dropping the oldest (not refusing the newest) keeps a flood of idle sockets
                # from locking out a peer whose handshake takes one round trip.
                old = self._preauth.pop(next(iter(self._preauth)))
                self.evicted += 1
                try:
                    old.shutdown(socket.SHUT_RDWR)  # wakes its handler's blocked recv
                except OSError:
                    pass
            self._preauth[id(sock)] = sock

    def _leave_preauth(self, sock: socket.socket) -> bool:
        """Removes ``sock`` from the unauthenticated set; False if it was evicted."""
        with self._preauth_lock:
            return self._preauth.pop(id(sock), None) is not None

    def _send(self, sock: socket.socket, deadline: float, header: dict, payload=b"", chan=None):
        # sendall's timeout bounds the whole call: a peer that stops reading cannot hold
        # the connection past the deadline.
        sock.settimeout(max(deadline - time.monotonic(), 1e-3))
        send_msg(sock, header, payload, chan)

    def _serve_connection(self, sock: socket.socket) -> None:
        self._admit(sock)
        slot = False
        open_files: dict[tuple[str, str, str], list] = {}
        try:
            try:
                owner, chan, server_proof = self._handshake(sock)
            finally:
                admitted = self._leave_preauth(sock)
            if not admitted:
                return
            slot = self._slots.acquire(blocking=False)
            if not slot:
                self.refused += 1
                deadline = time.monotonic() + self.handshake_timeout_s
                self._send(sock, deadline, {"ok": False, "error": "too many connections"})
                return
            deadline = time.monotonic() + self.handshake_timeout_s
            self._send(sock, deadline, {"ok": True, "proof": server_proof})
            while True:
                deadline = time.monotonic() + self.conn_timeout_s
                header, payload = recv_msg(
                    sock, self.max_header_bytes, self.max_message_bytes, chan, deadline
                )
                try:
                    if header.get("owner", owner) != owner:
                        raise ValueError(f"owner: this connection is bound to owner {owner}")
                    header["owner"] = owner
                    reply, data = self._dispatch(header, payload, open_files)
                except Exception as e:  # noqa: BLE001 - a peer's bad request gets an error reply
                    if isinstance(e, (ValueError, OSError, _format.CorruptCheckpointError)):
                        reply = {"ok": False, "error": str(e)}
                    else:
                        reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
                    data = b""
                self._send(sock, time.monotonic() + self.conn_timeout_s, reply, data, chan)
        except TimeoutError:
            self.timed_out += 1
        except (ConnectionError, _Refused):
            pass
        except Exception:  # noqa: BLE001 - malformed input closes the connection, quietly
            self.errors += 1
        finally:
            for fd, *_ in open_files.values():
                os.close(fd)
            if slot:
                self._slots.release()

    def _handshake(self, sock: socket.socket) -> tuple[int, _Channel, str]:
        """The hello/proof exchange, all within ``handshake_timeout_s``; returns the owner,
        the channel and the server's proof (sent once a connection slot is taken)."""
        deadline = time.monotonic() + self.handshake_timeout_s
        header, _ = recv_msg(sock, self.max_header_bytes, 0, deadline=deadline)
        owner = header.get("owner")
        cn = header.get("client_nonce")
        if header.get("op") != "hello" or not isinstance(cn, str) or len(cn) != 64:
            self._send(sock, deadline, {"ok": False, "error": "expected hello"})
            raise _Refused
        try:
            _owner({"owner": owner})
        except ValueError as e:
            self._send(sock, deadline, {"ok": False, "error": str(e)})
            raise _Refused from None
        sn = os.urandom(32).hex()
        self._send(sock, deadline, {"ok": True, "server_nonce": sn})
        header, _ = recv_msg(sock, self.max_header_bytes, 0, deadline=deadline)
        proof = header.get("proof")
        want = _proof(self._token, b"client", cn, sn, owner)
        if (
            not isinstance(proof, str)
            or not proof.isascii()
            or not hmac.compare_digest(proof, want)
        ):
            self.rejected += 1
            self._send(sock, deadline, {"ok": False, "error": "authentication failed"})
            raise _Refused
        mac_key = bytes.fromhex(_proof(self._token, b"channel-key", cn, sn, owner))
        chan = _Channel(mac_key, b"s2c", b"c2s")
        return owner, chan, _proof(self._token, b"server", cn, sn, owner)

    def _owner_lock(self, owner: str) -> threading.Lock:
        with self._owner_locks_guard:
            return self._owner_locks.setdefault(owner, threading.Lock())

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

    def _recover(self, base: Path) -> list[int]:
        """Renames back the newest complete ``.old-<s>-<ns>`` copy of each missing step
        ``<s>`` under ``base`` (a commit cut short between its two renames); returns them."""
        aside: dict[str, list[tuple[int, Path]]] = {}
        try:
            entries = list(base.iterdir())
        except FileNotFoundError:
            return []
        for p in entries:
            m = _ASIDE_RE.fullmatch(p.name)
            if m and p.is_dir():
                aside.setdefault(m[1], []).append((int(m[2]), p))
        restored = []
        for step, copies in aside.items():
            if (base / step).exists():
                continue
            for _, p in sorted(copies, reverse=True):
                if _complete(p):
                    os.rename(p, base / step)
                    restored.append(int(step))
                    break
        if restored:
            _fsio.fsync_dir(base)
        return sorted(restored)

    def _abort_file(self, open_files: dict, key: tuple, path: Path) -> None:
        os.close(open_files.pop(key)[0])
        path.unlink(missing_ok=True)

    def _dispatch(self, h: dict[str, Any], payload: bytearray, open_files: dict) -> tuple:
        op = h.get("op")
        if op == "ping":
            return {"ok": True}, b""
        if op == "list":
            owner = _owner(h)
            d = self.root / owner
            with self._owner_lock(owner):
                self._recover(d)
                steps = (
                    sorted(int(p.name) for p in d.iterdir() if p.is_dir() and p.name.isdigit())
                    if d.exists()
                    else []
                )
            return {"ok": True, "steps": steps}, b""
        if op == "put":
            return self._put(h, payload, open_files)
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
            with self._owner_lock(owner):
                aside = None
                if final.exists():
                    # Aside, in, then remove: a crash at any point leaves a complete copy
                    # that list/retain find (the .old- one is renamed back by _recover).
                    aside = base / f".old-{step}-{time.time_ns()}"
                    os.rename(final, aside)
                os.rename(tmp, final)
                _fsio.fsync_dir(base)
                _fsio.fsync_dir(self.root)  # rank_<owner> itself may be new
                if aside is not None:
                    shutil.rmtree(aside, ignore_errors=True)
            return {"ok": True}, b""
        if op == "get":
            owner = _owner(h)
            step = _fsio.validate_step_name(h.get("step"))
            name = _fsio.validate_file_name(h.get("file"))
            path = _fsio.safe_join(self.root / owner, step, name)
            size = path.stat().st_size
            offset = h.get("offset", 0)
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise ValueError(f"get {name}: bad offset {offset!r}")
            n = min(self.max_message_bytes, max(0, size - offset))
            with open(path, "rb") as fh:
                fh.seek(offset)
                data = fh.read(n)
            return {"ok": True, "size": size}, data
        if op == "retain":
            owner = _owner(h)
            steps = h.get("steps", [])
            if not isinstance(steps, list):  # a str would be kept character by character
                raise ValueError(f"retain: steps: expected a list of steps, got {steps!r:.60}")
            keep = {_fsio.validate_step_name(s) for s in steps}
            base = self.root / owner
            removed = []
            with self._owner_lock(owner):
                if base.exists():
                    self._recover(base)
                    for p in base.iterdir():
                        if p.is_dir() and p.name.isdigit() and p.name not in keep:
                            # renamed first: a removal cut short leaves a .del- folder
                            # (removed by the next retain), never a half-deleted step
                            trash = base / f".del-{p.name}-{time.time_ns()}"
                            os.rename(p, trash)
                            shutil.rmtree(trash, ignore_errors=True)
                            removed.append(int(p.name))
                        elif _leftover(p.name, keep):
                            shutil.rmtree(p, ignore_errors=True)
                    _fsio.fsync_dir(base)
            return {"ok": True, "removed": sorted(removed)}, b""
        raise ValueError(f"op: unknown operation {op!r:.60}")

    def _put(self, h: dict[str, Any], payload: bytearray, open_files: dict) -> tuple:
        if self.delay_s:
            time.sleep(self.delay_s)
        owner = _owner(h)
        step = _fsio.validate_step_name(h.get("step"))
        name = _fsio.validate_file_name(h.get("file"))
        size, offset = h.get("size"), h.get("offset")
        for field, v in (("size", size), ("offset", offset)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"put {name}: {field}: expected an int >= 0, got {v!r:.60}")
        tmp = self.root / owner / f".tmp-{step}"
        path = tmp / name
        key = (owner, step, name)
        with self._owner_lock(owner):
            if key not in open_files:
                if offset != 0:
                    raise ValueError(f"put {name}: first chunk must have offset 0")
                if self.quota_bytes is not None:
                    used = self.usage(int(owner[5:]))
                    if used + size > self.quota_bytes:
                        raise ValueError(
                            f"quota: owner {owner} would store {used + size} bytes, over "
                            f"quota_bytes={self.quota_bytes}"
                        )
                tmp.mkdir(parents=True, exist_ok=True)
                if path.exists():
                    path.unlink()
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                open_files[key] = [fd, 0, 0, size]
            entry = open_files[key]
            # The declared size is fixed by the first chunk and the bytes written never pass
            # it; the quota is checked on the bytes on disk at every chunk (the declared size
            # alone is a peer's claim), so a file that never sends `last` counts too.
            if size != entry[3]:
                self._abort_file(open_files, key, path)
                raise ValueError(f"put {name}: size changed from {entry[3]} to {size}")
            if offset != entry[2]:
                raise ValueError(f"put {name}: offset {offset} != {entry[2]}")
            if entry[2] + len(payload) > size:
                self._abort_file(open_files, key, path)
                raise ValueError(f"put {name}: more than the declared {size} bytes")
            if self.quota_bytes is not None:
                used = self.usage(int(owner[5:]))
                if used + len(payload) > self.quota_bytes:
                    self._abort_file(open_files, key, path)
                    raise ValueError(
                        f"quota: owner {owner} would store {used + len(payload)} bytes, over "
                        f"quota_bytes={self.quota_bytes}"
                    )
            view = memoryview(payload)
            off = 0
            while off < len(view):
                off += os.write(entry[0], view[off:])
            entry[1] = zlib.crc32(view, entry[1])
            entry[2] += len(view)
        if h.get("last"):
            fd, crc, written, _ = open_files.pop(key)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            if (crc & 0xFFFFFFFF) != h.get("crc32") or written != size:
                path.unlink(missing_ok=True)
                raise ValueError(f"put {name}: checksum or size mismatch")
        return {"ok": True}, b""


def _complete(directory: Path) -> bool:
    """Whether ``directory`` holds a checksummed manifest and every file it names, with the
    named sizes (what commit checked before the step was first renamed into place)."""
    try:
        manifest = _format.read_manifest(directory)
        return all((directory / f["file"]).stat().st_size == f["nbytes"] for f in manifest["files"])
    except Exception:  # noqa: BLE001 - any unreadable or malformed copy is not restorable
        return False


def _leftover(name: str, keep: set[str]) -> bool:
    """Whether ``name`` under ``rank_<owner>/`` is a dead push, commit or retain's folder: a
    ``.tmp-<step>`` of a step not in ``keep`` (a cancelled or abandoned push; the owner keeps
    the step it is pushing), a ``.del-<step>-<ns>`` of a removal cut short, or a
    ``.old-<step>-<ns>`` that :meth:`ReplicaServer._recover` did not need (its step is
    present) or could not use (incomplete)."""
    if name.startswith(".tmp-"):
        return name[5:].isdigit() and name[5:] not in keep
    return name.startswith((".old-", ".del-"))


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
    *,
    quota_bytes: int | None = None,
    max_connections: int = 64,
    max_preauth_connections: int = 16,
    conn_timeout_s: float = 60.0,
    handshake_timeout_s: float = 5.0,
    max_message_bytes: int = 16 << 20,
    max_header_bytes: int = 64 << 10,
    stderr: Any = None,
) -> tuple[subprocess.Popen, tuple[str, int]]:
    """Starts a :class:`ReplicaServer` on ``host`` (loopback by default) in its own process.

    The token travels in the child's environment, not its command line. The server runs until
    ``proc.terminate()`` (or for ``max_lifetime_s`` seconds if that is set, for tests).
    ``timeout_s`` bounds the wait for the child to listen; the keyword-only limits are the
    server's (see :class:`ReplicaServer`); ``stderr`` is passed to ``subprocess.Popen``.

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
    _check_limits(
        quota_bytes,
        max_connections,
        max_preauth_connections,
        conn_timeout_s,
        handshake_timeout_s,
        max_message_bytes,
        max_header_bytes,
    )
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
        *(["--quota-bytes", str(quota_bytes)] if quota_bytes is not None else []),
        *("--max-connections", str(max_connections)),
        *("--max-preauth-connections", str(max_preauth_connections)),
        *("--conn-timeout-s", repr(float(conn_timeout_s))),
        *("--handshake-timeout-s", repr(float(handshake_timeout_s))),
        *("--max-message-bytes", str(max_message_bytes)),
        *("--max-header-bytes", str(max_header_bytes)),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
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
    p.add_argument("--quota-bytes", type=int, default=None, help="bytes one owner may store")
    p.add_argument("--max-connections", type=int, default=64, help="authenticated connections")
    p.add_argument(
        "--max-preauth-connections", type=int, default=16, help="unauthenticated connections"
    )
    p.add_argument("--conn-timeout-s", type=float, default=60.0, help="deadline per message")
    p.add_argument("--handshake-timeout-s", type=float, default=5.0, help="deadline of hello")
    p.add_argument("--max-message-bytes", type=int, default=16 << 20)
    p.add_argument("--max-header-bytes", type=int, default=64 << 10)
    args = p.parse_args(argv)
    token = os.environ.get("HEXAD_CACHEX_TOKEN", "")
    try:
        srv = ReplicaServer(
            args.root,
            token,
            host=args.host,
            port=args.port,
            max_lifetime_s=args.max_lifetime_s,
            delay_s=args.delay_s,
            quota_bytes=args.quota_bytes,
            max_connections=args.max_connections,
            max_preauth_connections=args.max_preauth_connections,
            conn_timeout_s=args.conn_timeout_s,
            handshake_timeout_s=args.handshake_timeout_s,
            max_message_bytes=args.max_message_bytes,
            max_header_bytes=args.max_header_bytes,
        ).start()
    except ValueError as e:  # a bad limit or token: one line, not a traceback
        p.error(str(e))
    print(f"PORT {srv.address[1]}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: srv.stop())
    while srv.running:
        time.sleep(0.2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
