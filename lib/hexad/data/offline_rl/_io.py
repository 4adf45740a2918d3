"""Offline-RL data sets on disk: uncompressed npz with D4RL field names, never pickled."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from hexad.data._bundled import cache_dir, load_npz

__all__ = [
    "CACHE_FOLDER",
    "D4RL_FIELDS",
    "load_offline_rl",
    "offline_rl_path",
    "save_offline_rl",
    "spec_tag",
    "validate_offline_rl",
]

D4RL_FIELDS = (
    "observations",
    "actions",
    "rewards",
    "next_observations",
    "terminals",
    "timeouts",
)
"""The fields every offline-RL data set has, with D4RL's names."""

CACHE_FOLDER = "offline_rl"
"""The sub-folder of :func:`hexad.data.cache_dir` that holds the generated sets."""


def spec_tag(spec: dict) -> str:
    """Returns the 12 hex digits that name a cached file: sha1 of ``spec`` as sorted JSON.

    >>> spec_tag({"n": 1, "seed": 0})
    '86ad8d7ae8a1'
    """
    return hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def offline_rl_path(prefix: str, spec: dict, suffix: str = ".npz") -> Path:
    """Returns ``cache_dir("offline_rl") / f"{prefix}_{spec_tag(spec)}{suffix}"``, not created.

    >>> offline_rl_path("pointmaze_umaze", {"n": 1, "seed": 0}).name
    'pointmaze_umaze_86ad8d7ae8a1.npz'
    """
    return cache_dir(CACHE_FOLDER) / f"{prefix}_{spec_tag(spec)}{suffix}"


def validate_offline_rl(data: dict[str, np.ndarray], where: str) -> None:
    """Raises a ValueError naming ``where`` unless ``data`` is a well-formed offline-RL set.

    Checks: every field of ``D4RL_FIELDS`` is present with the same number of rows, every array
    is numeric, and every float array is finite.

    >>> validate_offline_rl({"observations": np.zeros((2, 1))}, "x.npz")
    Traceback (most recent call last):
    ...
    ValueError: x.npz: missing fields ['actions', 'rewards', ...]; expected [...]
    """
    missing = [k for k in D4RL_FIELDS if k not in data]
    if missing:
        raise ValueError(f"{where}: missing fields {missing}; expected {list(D4RL_FIELDS)}")
    n = data["observations"].shape[0]
    for k, v in data.items():
        v = np.asarray(v)
        if v.dtype.kind not in "fiub":
            raise ValueError(f"{where}[{k!r}]: expected a numeric array, got dtype {v.dtype}")
        if k in D4RL_FIELDS and (v.ndim == 0 or v.shape[0] != n):
            raise ValueError(f"{where}[{k!r}]: expected {n} rows, got shape {v.shape}")
        if v.dtype.kind == "f" and not np.all(np.isfinite(v)):
            raise ValueError(f"{where}[{k!r}]: expected finite values, got NaN or inf")


def save_offline_rl(path, data: dict[str, np.ndarray]) -> Path:
    """Writes ``data`` to ``path`` as an uncompressed npz (no pickle), checking it first.

    The file is written next to ``path`` and renamed into place, so a reader never sees half
    a file.

    Args:
      path: the ``.npz`` file; its folder is created.
      data: the arrays (see :func:`validate_offline_rl`).

    Returns:
      ``path`` as a ``Path``.

    >>> import tempfile
    >>> d = {k: np.zeros(3, np.float32) for k in D4RL_FIELDS}
    >>> save_offline_rl(Path(tempfile.mkdtemp()) / "d.npz", d).name
    'd.npz'
    """
    validate_offline_rl(data, str(path))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, **data)
    os.replace(tmp, path)
    return path


def load_offline_rl(path) -> dict[str, np.ndarray]:
    """Reads an offline-RL npz (no pickle) and checks the D4RL fields, row counts and NaNs.

    Args:
      path: the ``.npz`` file.

    Returns:
      a dict of numpy arrays.

    >>> import tempfile
    >>> d = {k: np.zeros(3, np.float32) for k in D4RL_FIELDS}
    >>> p = save_offline_rl(Path(tempfile.mkdtemp()) / "d.npz", d)
    >>> load_offline_rl(p)["rewards"].shape
    (3,)
    """
    data = load_npz(path, required=D4RL_FIELDS)
    validate_offline_rl(data, Path(path).name)
    return data
