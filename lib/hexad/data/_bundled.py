"""Loaders for the data sets bundled with hexad as package data (no downloads, no pickle)."""

from __future__ import annotations

import dataclasses
import os
from importlib import resources
from pathlib import Path

import numpy as np

__all__ = [
    "Planetoid",
    "SingleCell",
    "bundled_path",
    "cache_dir",
    "load_npz",
    "load_pbmc68k",
    "load_planetoid",
]

PLANETOID_NAMES = ("cora", "citeseer")


def bundled_path(*parts: str) -> Path:
    """Returns the path of a bundled file under ``hexad/data/files/``.

    >>> bundled_path("planetoid", "cora.npz").name
    'cora.npz'
    """
    path = Path(str(resources.files("hexad.data").joinpath("files", *parts)))
    if not path.exists():
        raise FileNotFoundError(f"bundled file {'/'.join(parts)!r} is missing from the package")
    return path


def cache_dir(*parts: str) -> Path:
    """The folder for data generated here and cached (never downloaded), not created.

    ``$HEXAD_CACHE`` if set, else ``~/.cache/hexad``, joined with ``parts``.

    >>> cache_dir("offline_rl").name
    'offline_rl'
    """
    root = os.environ.get("HEXAD_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "hexad")
    return Path(root).joinpath(*parts)


def load_npz(path: str | os.PathLike, required: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """Reads an ``.npz`` without pickle and checks that ``required`` arrays are present.

    Args:
      path: the file.
      required: names that must be in the file.

    Returns:
      a dict of numpy arrays.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"path: no such file {str(path)!r}")
    with np.load(path, allow_pickle=False) as f:
        data = {k: f[k] for k in f.files}
    missing = [k for k in required if k not in data]
    if missing:
        raise ValueError(f"path: {path.name} lacks the arrays {missing}; it has {sorted(data)}")
    return data


def _range(a: np.ndarray) -> str:
    return f"[{a.min()}, {a.max()}]" if a.size else "empty"


def _ints(d: dict[str, np.ndarray], key: str, where: str) -> np.ndarray:
    """``d[key]``, which must have an integer dtype (a float array would be truncated)."""
    a = d[key]
    if not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{key}: expected an integer array, got dtype {a.dtype} {where}")
    return a


@dataclasses.dataclass(frozen=True)
class Planetoid:
    """A Planetoid citation graph (Sen et al. 2008; split of Yang et al. 2016, arXiv 1603.08861).

    Attributes:
      name: ``"cora"`` or ``"citeseer"``.
      features: ``[n, f]`` float32 dense bag-of-words features.
      edges: ``[E, 2]`` int32 undirected edges, each once with ``i < j``, no self loops.
      labels: ``[n]`` int32 class ids; ``-1`` for the unlabelled Citeseer nodes.
      train_idx, val_idx, test_idx: the standard split (int32 index arrays).
      num_classes: number of classes.
    """

    name: str
    features: np.ndarray
    edges: np.ndarray
    labels: np.ndarray
    train_idx: np.ndarray
    val_idx: np.ndarray
    test_idx: np.ndarray
    num_classes: int

    @property
    def num_nodes(self) -> int:
        return int(self.labels.shape[0])


def load_planetoid(name: str, path: str | os.PathLike | None = None) -> Planetoid:
    """Loads Cora or Citeseer from the bundled files (or from ``path``).

    Args:
      name: ``"cora"`` or ``"citeseer"``.
      path: optional ``.npz`` in the same format (see the bundled README); default: bundled.

    Raises:
      ValueError: the file lacks an array or its arrays disagree, naming the array: a CSR
        ``features_*`` whose ``features_indptr`` is not ``[n + 1]`` non-decreasing from 0 to
        ``len(features_indices)`` or whose column ids are outside ``[0, f)``; ``labels`` not
        ``[n]`` ids ``>= -1``; ``edges`` not ``[E, 2]`` node ids with ``i < j``, each once;
        split indices outside ``[0, n)``; an id array of a non-integer dtype.

    >>> g = load_planetoid("cora")
    >>> g.features.shape, g.num_classes
    ((2708, 1433), 7)
    """
    if name not in PLANETOID_NAMES:
        raise ValueError(f"name: expected one of {PLANETOID_NAMES}, got {name!r}")
    path = bundled_path("planetoid", f"{name}.npz") if path is None else Path(path)
    keys = ("features_data", "features_indices", "features_indptr", "features_shape", "edges")
    d = load_npz(path, keys + ("labels", "train_idx", "val_idx", "test_idx"))
    where = f"(in {path.name})"
    shape = _ints(d, "features_shape", where)
    if shape.shape != (2,) or shape.min() < 0:
        raise ValueError(
            f"features_shape: expected two non-negative ints [n, f], got {shape.tolist()} {where}"
        )
    n, f = (int(v) for v in shape)
    indices = _ints(d, "features_indices", where)
    data = d["features_data"]
    if indices.ndim != 1 or (indices.size and (indices.min() < 0 or indices.max() >= f)):
        raise ValueError(
            f"features_indices: expected a 1-d array of column ids in [0, {f}), got shape "
            f"{indices.shape}, range {_range(indices)} {where}"
        )
    if data.shape != indices.shape:
        raise ValueError(
            f"features_data: expected shape {indices.shape} (one value per features_indices "
            f"entry), got {data.shape} {where}"
        )
    indptr = _ints(d, "features_indptr", where).astype(np.int64)
    if (
        indptr.shape != (n + 1,)
        or indptr[0] != 0
        or indptr[-1] != indices.size
        or (np.diff(indptr) < 0).any()
    ):
        raise ValueError(
            f"features_indptr: expected shape ({n + 1},), non-decreasing from 0 to "
            f"len(features_indices)={indices.size}, got shape {indptr.shape}, first "
            f"{indptr[:1].tolist()}, last {indptr[-1:].tolist()} {where}"
        )
    labels = _ints(d, "labels", where)
    if labels.shape != (n,) or (n and not -1 <= labels.min() <= labels.max() < 2**31 - 1):
        raise ValueError(
            f"labels: expected shape ({n},) (the rows of features_shape) with class ids >= 0 "
            f"or -1, got shape {labels.shape}, range {_range(labels)} {where}"
        )
    edges = _ints(d, "edges", where)
    if edges.ndim != 2 or edges.shape[1] != 2:
        raise ValueError(f"edges: expected shape [E, 2], got {edges.shape} {where}")
    if edges.size and (edges.min() < 0 or edges.max() >= n):
        raise ValueError(f"edges: expected node ids in [0, {n}), got range {_range(edges)} {where}")
    bad = np.flatnonzero(edges[:, 0] >= edges[:, 1])
    if bad.size:
        raise ValueError(
            f"edges: expected each edge (i, j) with i < j (no self loops), got "
            f"{edges[bad[0]].tolist()} at row {bad[0]} {where}"
        )
    if np.unique(edges, axis=0).shape[0] != edges.shape[0]:
        raise ValueError(f"edges: expected each undirected edge once, found duplicates {where}")
    split = {}
    for key in ("train_idx", "val_idx", "test_idx"):
        idx = _ints(d, key, where)
        if idx.ndim != 1 or (idx.size and (idx.min() < 0 or idx.max() >= n)):
            raise ValueError(
                f"{key}: expected a 1-d array of node ids in [0, {n}), got shape {idx.shape}, "
                f"range {_range(idx)} {where}"
            )
        split[key] = idx.astype(np.int32)
    features = np.zeros((n, f), np.float32)
    rows = np.repeat(np.arange(n), np.diff(indptr))
    features[rows, indices] = data
    labels = labels.astype(np.int32)
    return Planetoid(
        name=name,
        features=features,
        edges=edges.astype(np.int32),
        labels=labels,
        **split,
        num_classes=int(labels.max(initial=-1)) + 1,
    )


@dataclasses.dataclass(frozen=True)
class SingleCell:
    """The PBMC 68k reduced single-cell set (10x Genomics via scanpy's bundled copy).

    Attributes:
      X_pca: ``[700, 50]`` float32 PCA coordinates.
      X_umap: ``[700, 2]`` float32 UMAP coordinates (plots only).
      cell_type: ``[700]`` int32 index into ``cell_type_names``.
      cell_type_names: the 10 cell-type names.
      louvain: ``[700]`` int32 Louvain cluster ids.
    """

    X_pca: np.ndarray
    X_umap: np.ndarray
    cell_type: np.ndarray
    cell_type_names: tuple[str, ...]
    louvain: np.ndarray


def load_pbmc68k(path: str | os.PathLike | None = None) -> SingleCell:
    """Loads the bundled PBMC 68k reduced set (or the same format from ``path``).

    Raises:
      ValueError: the file lacks an array, or, naming the array, ``X_pca``, ``X_umap``,
        ``cell_type`` and ``louvain`` disagree on the number of cells, an id array is not of an
        integer dtype or has a negative id, or a ``cell_type`` id is not below
        ``len(cell_type_names)``.

    >>> d = load_pbmc68k()
    >>> d.X_pca.shape, len(d.cell_type_names)
    ((700, 50), 10)
    """
    path = bundled_path("pbmc68k_reduced", "pbmc68k_reduced.npz") if path is None else Path(path)
    d = load_npz(path, ("X_pca", "X_umap", "cell_type", "cell_type_names", "louvain"))
    where = f"(in {path.name})"
    if d["X_pca"].ndim != 2:
        raise ValueError(f"X_pca: expected shape [n, k], got {d['X_pca'].shape} {where}")
    n = d["X_pca"].shape[0]
    if d["X_umap"].ndim != 2 or d["X_umap"].shape[0] != n:
        raise ValueError(
            f"X_umap: expected shape [{n}, 2] (one row per X_pca row), got "
            f"{d['X_umap'].shape} {where}"
        )
    names = d["cell_type_names"]
    if names.ndim != 1:
        raise ValueError(f"cell_type_names: expected a 1-d array, got shape {names.shape} {where}")
    for key in ("cell_type", "louvain"):
        a = _ints(d, key, where)
        if a.shape != (n,) or (n and a.min() < 0):
            raise ValueError(
                f"{key}: expected shape ({n},) (one id >= 0 per X_pca row), got shape "
                f"{a.shape}, range {_range(a)} {where}"
            )
    cell_type = d["cell_type"]
    if n and cell_type.max() >= len(names):
        raise ValueError(
            f"cell_type: expected ids in [0, {len(names)}) (len(cell_type_names)), got "
            f"{cell_type.max()} {where}"
        )
    return SingleCell(
        X_pca=d["X_pca"].astype(np.float32),
        X_umap=d["X_umap"].astype(np.float32),
        cell_type=cell_type.astype(np.int32),
        cell_type_names=tuple(str(s) for s in names),
        louvain=d["louvain"].astype(np.int32),
    )
