"""T2: the neighbour replica server and its client (TCP, loopback by default).

Wire format: every message is a 4-byte big-endian header length, a JSON header (at most
``max_header_bytes``), then ``header["nbytes"]`` payload bytes (at most ``max_message_bytes``).
Nothing is ever unpickled. A connection must open with ``{"op": "hello", "token": ...}``; the
token is compared in constant time (``hmac.compare_digest``) and a wrong one closes the
connection. Files arrive in bounded chunks into ``<root>/rank_<owner>/.tmp-<step>/``; each file
is ``fsync``ed and its CRC-32 checked when its last chunk arrives; ``commit`` checks that the
manifest and every file it names are present with the right sizes, ``fsync``s the directory,
renames it to ``<root>/rank_<owner>/<step>``, ``fsync``s the parent and only then acknowledges.
"""

from __future__ import annotations

import argparse
import hmac
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

__all__ = ["ReplicaClient", "ReplicaError", "ReplicaServer", "spawn_replica_server"]

_LEN = struct.Struct(">I")


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


def send_msg(sock: socket.socket, header: dict[str, Any], payload: Any = b"") -> None:
    """Sends one framed message (JSON header + raw payload)."""
    view = memoryview(payload).cast("B")
    header = dict(header, nbytes=len(view))
    raw = json.dumps(header).encode()
    sock.sendall(_LEN.pack(len(raw)) + raw)
    if len(view):
        sock.sendall(view)


def recv_msg(
    sock: socket.socket, max_header_bytes: int, max_message_bytes: int
) -> tuple[dict[str, Any], bytearray]:
    """Receives one framed message; raises ValueError if a size bound is exceeded."""
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
      token: the shared secret its peers present (a non-empty str).
      host: interface to bind; loopback unless a caller deliberately passes another.
      port: TCP port (0 picks a free one; see :attr:`address`).
      max_message_bytes: bound on one message's payload (chunk size of a pushed file).
      max_header_bytes: bound on one message's JSON header.
      max_lifetime_s: the server stops itself after this many seconds.
      delay_s: injected delay before storing each received chunk (a slow neighbour).
      conn_timeout_s: socket timeout of one connection.

    >>> import tempfile
    >>> srv = ReplicaServer(tempfile.mkdtemp(), token="t", max_lifetime_s=5).start()
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
        max_lifetime_s: float = 3600.0,
        delay_s: float = 0.0,
        conn_timeout_s: float = 60.0,
    ):
        if not isinstance(token, str) or not token:
            raise ValueError(f"token: expected a non-empty str, got {token!r}")
        if max_message_bytes < 1 or max_header_bytes < 64:
            raise ValueError(
                f"max_message_bytes/max_header_bytes: expected >= 1 / >= 64, got "
                f"{max_message_bytes}/{max_header_bytes}"
            )
        if not max_lifetime_s > 0:
            raise ValueError(f"max_lifetime_s: expected > 0, got {max_lifetime_s}")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._token = token.encode()
        self.max_message_bytes = int(max_message_bytes)
        self.max_header_bytes = int(max_header_bytes)
        self.max_lifetime_s = float(max_lifetime_s)
        self.delay_s = float(delay_s)
        self.conn_timeout_s = float(conn_timeout_s)
        self.rejected = 0
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
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self._timer = threading.Timer(self.max_lifetime_s, self.stop)
        self._timer.daemon = True
        self._timer.start()
        return self

    def stop(self) -> None:
        """Stops the server and closes its socket (idempotent)."""
        with self._lock:
            if self._thread is None:
                return
            self._server.shutdown()
            self._server.server_close()
            self._thread = None
            if self._timer is not None:
                self._timer.cancel()

    # -- one connection ------------------------------------------------------------------------

    def _serve_connection(self, sock: socket.socket) -> None:
        sock.settimeout(self.conn_timeout_s)
        open_files: dict[tuple[str, str, str], list] = {}
        try:
            header, _ = recv_msg(sock, self.max_header_bytes, 0)
            token = header.get("token")
            if (
                header.get("op") != "hello"
                or not isinstance(token, str)
                or not hmac.compare_digest(token.encode(), self._token)
            ):
                self.rejected += 1
                send_msg(sock, {"ok": False, "error": "authentication failed"})
                return
            send_msg(sock, {"ok": True})
            while True:
                try:
                    header, payload = recv_msg(sock, self.max_header_bytes, self.max_message_bytes)
                except ConnectionError:
                    return
                try:
                    reply, data = self._dispatch(header, payload, open_files)
                except (ValueError, OSError, _format.CorruptCheckpointError) as e:
                    reply, data = {"ok": False, "error": str(e)}, b""
                send_msg(sock, reply, data)
        except (ConnectionError, TimeoutError, ValueError, OSError):
            return
        finally:
            for fd, *_ in open_files.values():
                os.close(fd)

    def _dispatch(self, h: dict[str, Any], payload: bytearray, open_files: dict) -> tuple:
        op = h.get("op")
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
                        shutil.rmtree(p, ignore_errors=True)
                        removed.append(int(p.name))
                _fsio.fsync_dir(base)
            return {"ok": True, "removed": sorted(removed)}, b""
        raise ValueError(f"op: unknown operation {op!r}")


class ReplicaClient:
    """Talks to one neighbour's :class:`ReplicaServer`.

    Args:
      address: ``(host, port)`` of the neighbour's server.
      token: the shared secret.
      timeout_s: socket timeout of each operation.
      chunk_bytes: payload size of one pushed chunk (must not exceed the server's bound).

    >>> import tempfile
    >>> srv = ReplicaServer(tempfile.mkdtemp(), token="t", max_lifetime_s=5).start()
    >>> ReplicaClient(srv.address, token="t").list_steps(owner=0)
    []
    >>> srv.stop()
    """

    def __init__(
        self,
        address: tuple[str, int],
        token: str,
        timeout_s: float = 60.0,
        chunk_bytes: int = 8 << 20,
    ):
        if not isinstance(token, str) or not token:
            raise ValueError(f"token: expected a non-empty str, got {token!r}")
        host, port = address
        self.address = (str(host), int(port))
        self._token = token
        self.timeout_s = float(timeout_s)
        self.chunk_bytes = int(chunk_bytes)

    def _connect(self) -> socket.socket:
        try:
            sock = socket.create_connection(self.address, timeout=self.timeout_s)
        except OSError as e:
            raise ReplicaError(f"replica server {self.address}: cannot connect ({e})") from None
        sock.settimeout(self.timeout_s)
        try:
            send_msg(sock, {"op": "hello", "token": self._token})
            h, _ = recv_msg(sock, 1 << 16, 0)
        except (OSError, ValueError, ConnectionError) as e:
            sock.close()
            raise ReplicaError(f"replica server {self.address}: handshake failed ({e})") from None
        if not h.get("ok"):
            sock.close()
            raise ReplicaError(f"replica server {self.address}: {h.get('error')}")
        return sock

    def _call(self, sock, header, payload=b"") -> tuple[dict, bytearray]:
        try:
            send_msg(sock, header, payload)
            h, data = recv_msg(sock, 1 << 20, 1 << 31)
        except (OSError, ValueError, ConnectionError) as e:
            raise ReplicaError(
                f"replica server {self.address}: {header['op']} failed ({e})"
            ) from None
        if not h.get("ok"):
            raise ReplicaError(f"replica server {self.address}: {h.get('error')}")
        return h, data

    def push_files(self, owner: int, step: int, files: list[tuple[str, list, int]]) -> None:
        """Pushes files ``[(name, [bytes-like pieces], crc32)]`` (manifest last) and commits.

        Waits for the server's acknowledgement, sent only after it has ``fsync``ed every file,
        checked every checksum, renamed the step into place and ``fsync``ed the parent.
        """
        step_name = _fsio.validate_step_name(step)
        sock = self._connect()
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
                    self._call(sock, hdr, chunk)
                    off += len(chunk)
            self._call(sock, {"op": "commit", "owner": owner, "step": step_name})
        finally:
            sock.close()

    def push_dir(self, owner: int, step: int, directory: Path) -> None:
        """Pushes one rank directory from disk (see :meth:`push_files`)."""
        manifest = _format.read_manifest(directory)
        files = []
        for f in manifest["files"]:
            files.append((f["file"], [(Path(directory) / f["file"]).read_bytes()], f["crc32"]))
        raw = (Path(directory) / _format.MANIFEST_FILE).read_bytes()
        files.append((_format.MANIFEST_FILE, [raw], _fsio.crc32_bytes(raw)))
        self.push_files(owner, step, files)

    def list_steps(self, owner: int) -> list[int]:
        """Returns the committed replica steps the server holds for ``owner``."""
        sock = self._connect()
        try:
            h, _ = self._call(sock, {"op": "list", "owner": owner})
        finally:
            sock.close()
        return [int(s) for s in h["steps"]]

    def fetch_dir(self, owner: int, step: int, dest: Path) -> Path:
        """Downloads ``owner``'s replica of ``step`` into the new directory ``dest``."""
        step_name = _fsio.validate_step_name(step)
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=False)
        sock = self._connect()
        try:

            def get(name: str) -> bytearray:
                out = bytearray()
                while True:
                    h, data = self._call(
                        sock,
                        {
                            "op": "get",
                            "owner": owner,
                            "step": step_name,
                            "file": name,
                            "offset": len(out),
                        },
                    )
                    out += data
                    if len(out) >= h["size"] or not data:
                        return out

            raw = get(_format.MANIFEST_FILE)
            (dest / _format.MANIFEST_FILE).write_bytes(raw)
            manifest = _format.read_manifest(dest)
            for f in manifest["files"]:
                (dest / f["file"]).write_bytes(get(f["file"]))
        finally:
            sock.close()
        return dest

    def retain(self, owner: int, steps: list[int]) -> list[int]:
        """Deletes ``owner``'s replicas except ``steps``; returns the removed steps."""
        sock = self._connect()
        try:
            h, _ = self._call(sock, {"op": "retain", "owner": owner, "steps": list(steps)})
        finally:
            sock.close()
        return h["removed"]


def spawn_replica_server(
    root: str | Path,
    token: str,
    port: int = 0,
    max_lifetime_s: float = 600.0,
    delay_s: float = 0.0,
    timeout_s: float = 60.0,
) -> tuple[subprocess.Popen, tuple[str, int]]:
    """Starts a :class:`ReplicaServer` on 127.0.0.1 in its own process (a "neighbour node").

    The token travels in the child's environment, not its command line. The server stops
    itself after ``max_lifetime_s``; stop it earlier with ``proc.terminate()``.

    Returns:
      ``(process, (host, port))``.

    >>> import shutil, tempfile
    >>> import numpy as np
    >>> root = Path(tempfile.mkdtemp())
    >>> proc, addr = spawn_replica_server(root / "neighbour", "token", max_lifetime_s=60)
    >>> snap = _format.Snapshot(
    ...     (_format.LeafSpec("w", (3,), "float32"),),
    ...     (_format.ShardRecord(0, ((0, 3),), np.arange(3, dtype=np.float32)),),
    ... )
    >>> (root / "step3").mkdir()
    >>> _ = _format.write_rank_dir(root / "step3", snap, {})  # one rank's T1 files
    >>> client = ReplicaClient(addr, "token")
    >>> client.push_dir(owner=0, step=3, directory=root / "step3")  # acknowledged when durable
    >>> client.list_steps(owner=0)
    [3]
    >>> proc.terminate()
    >>> proc.wait(timeout=30)
    0
    >>> proc.stdout.close()
    >>> shutil.rmtree(root)
    """
    if not isinstance(token, str) or not token:
        raise ValueError(f"token: expected a non-empty str, got {token!r}")
    env = dict(os.environ, HEXAD_CACHEX_TOKEN=token, JAX_PLATFORMS="cpu")
    cmd = [
        sys.executable,
        "-c",
        "import sys; from hexad.cachex._replica import main; sys.exit(main(sys.argv[1:]))",
        str(root),
        "--port",
        str(port),
        "--max-lifetime-s",
        str(max_lifetime_s),
        "--delay-s",
        str(delay_s),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    line = proc.stdout.readline().split() if ready else []
    if len(line) != 2 or line[0] != "PORT":
        proc.kill()
        raise ReplicaError(f"replica server process did not start (got {line!r})")
    return proc, ("127.0.0.1", int(line[1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hexad.cachex._replica")
    p.add_argument("root", type=Path)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--max-lifetime-s", type=float, default=600.0)
    p.add_argument("--delay-s", type=float, default=0.0)
    args = p.parse_args(argv)
    token = os.environ.get("HEXAD_CACHEX_TOKEN", "")
    srv = ReplicaServer(
        args.root,
        token,
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
