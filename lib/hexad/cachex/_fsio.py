"""File-system primitives of CacheX: name validation, durable writes, atomic JSON records.

Every write that CacheX counts as durable goes through :func:`write_file_durable` (write,
``fsync`` the file) and :func:`fsync_dir` (``fsync`` the directory, so the new directory entry
itself survives a power loss), and every publication is a ``rename`` of a fully written
temporary path followed by an ``fsync`` of the parent directory.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import zlib
from pathlib import Path
from typing import Any

__all__ = [
    "crc32_bytes",
    "fsync_dir",
    "read_json",
    "safe_join",
    "step_entries",
    "validate_file_name",
    "validate_step_name",
    "write_file_durable",
    "write_json_atomic",
]

_STEP_RE = re.compile(r"^[0-9]{1,18}$")
_FILE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def validate_step_name(step: Any) -> str:
    """Returns the canonical name of ``step`` (a non-negative int) or raises.

    Step names are decimal integers only, so a step name can never contain a path separator,
    ``..`` or a leading dot (no path traversal through a step name).

    Args:
      step: an ``int >= 0`` or a string of decimal digits.

    Returns:
      The decimal string, e.g. ``"12"``.

    >>> validate_step_name(12)
    '12'
    """
    if isinstance(step, bool):
        raise TypeError(f"step: expected a non-negative int, got bool {step!r}")
    if isinstance(step, int):
        if step < 0:
            raise ValueError(f"step: expected a non-negative int, got {step}")
        return str(step)
    if isinstance(step, str) and _STEP_RE.fullmatch(step):
        return str(int(step))
    raise ValueError(f"step: expected a non-negative int or a string of digits, got {step!r}")


def step_entries(root: Path) -> tuple[dict[int, Path], list[str]]:
    """Lists the step folders directly under ``root``.

    An entry counts as a step when its name is a canonical step name (``"12"``, not ``"012"``
    nor other Unicode digits) and it is a directory (or its type cannot be read: the caller's
    read of it then fails with the reason); an entry named like a step that is not a directory
    (a stray file ``7``) is returned among the strays rather than raising, so one bad entry
    never hides the others.

    Args:
      root: the folder to list; a missing one holds no steps.

    Returns:
      ``({step: path}, [stray notes])``, each note naming the entry and why it was skipped.

    Raises:
      OSError: ``root`` exists but cannot be listed (EIO, ESTALE, not a directory, ...).

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> (root / "3").mkdir(); _ = (root / "7").write_bytes(b""); (root / "x").mkdir()
    >>> steps, strays = step_entries(root)
    >>> sorted(steps), [s.split(": ", 1)[1] for s in strays]
    ([3], ['not a directory'])
    """
    root = Path(root)
    try:
        it = os.scandir(root)
    except FileNotFoundError:
        return {}, []
    steps: dict[int, Path] = {}
    strays: list[str] = []
    with it:
        for e in it:
            if not (_STEP_RE.fullmatch(e.name) and str(int(e.name)) == e.name):
                continue
            try:
                is_dir = e.is_dir()
            except OSError:
                is_dir = True  # its type is unknown: reading it will say what is wrong
            if is_dir:
                steps[int(e.name)] = Path(e.path)
            else:
                strays.append(f"{e.path}: not a directory")
    return steps, strays


def validate_file_name(name: Any) -> str:
    """Returns ``name`` if it is a plain file name (``[A-Za-z0-9][A-Za-z0-9_.-]*``), else raises.

    >>> validate_file_name("r0_l3_s0.bin")
    'r0_l3_s0.bin'
    """
    if not isinstance(name, str):
        raise TypeError(f"file name: expected a str, got {type(name).__name__}")
    if not _FILE_RE.fullmatch(name) or ".." in name:
        raise ValueError(
            f"file name: expected a plain name matching {_FILE_RE.pattern} without '..', "
            f"got {name!r}"
        )
    return name


def safe_join(root: Path, *parts: str) -> Path:
    """Joins validated plain names under ``root`` and checks the result stays inside ``root``.

    >>> str(safe_join(Path("/ckpt"), "12", "rank_0.json"))
    '/ckpt/12/rank_0.json'
    """
    root = Path(root)
    for p in parts:
        validate_file_name(p)
    out = root.joinpath(*parts)
    if os.path.commonpath([os.path.abspath(root), os.path.abspath(out)]) != os.path.abspath(root):
        raise ValueError(f"path: {out} escapes its root {root}")
    return out


def crc32_bytes(data: Any) -> int:
    """Returns the CRC-32 of a bytes-like object (zlib; releases the GIL on large buffers).

    >>> crc32_bytes(b"abc")
    891568578
    """
    return zlib.crc32(memoryview(data).cast("B")) & 0xFFFFFFFF


def fsync_dir(path: Path) -> None:
    """``fsync``s the directory ``path`` so entries created or renamed in it are durable.

    >>> import tempfile
    >>> fsync_dir(Path(tempfile.mkdtemp()))
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_durable(path: Path, data: Any, chunk: int = 64 << 20) -> int:
    """Writes ``data`` (bytes-like) to a new file ``path``, ``fsync``s it; returns bytes written.

    The file is created exclusively (``O_EXCL``): CacheX never overwrites a file in place.
    """
    view = memoryview(data).cast("B")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        off = 0
        n = len(view)
        while off < n:
            off += os.write(fd, view[off : off + chunk])
        os.fsync(fd)
    finally:
        os.close(fd)
    return len(view)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Writes ``obj`` as JSON to ``path`` atomically: tmp file, fsync, rename, parent fsync.

    The temporary name is this call's own (process id and a random token), so writers of the
    same ``path`` in other threads or processes never remove or rename each other's file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(8)}")
    write_file_durable(tmp, json.dumps(obj, sort_keys=True).encode())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_json(path: Path, max_bytes: int = 16 << 20) -> Any:
    """Reads a JSON file of at most ``max_bytes`` bytes; raises ValueError if larger/invalid."""
    path = Path(path)
    size = path.stat().st_size
    if size > max_bytes:
        raise ValueError(f"{path.name}: expected at most {max_bytes} bytes of JSON, got {size}")
    try:
        return json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path.name}: not valid JSON ({e})") from None
