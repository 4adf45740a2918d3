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

    >>> g = load_planetoid("cora")
    >>> g.features.shape, g.num_classes
    ((2708, 1433), 7)
    """
    if name not in PLANETOID_NAMES:
        raise ValueError(f"name: expected one of {PLANETOID_NAMES}, got {name!r}")
    path = bundled_path("planetoid", f"{name}.npz") if path is None else path
    keys = ("features_data", "features_indices", "features_indptr", "features_shape", "edges")
    d = load_npz(path, keys + ("labels", "train_idx", "val_idx", "test_idx"))
    n, f = (int(v) for v in d["features_shape"])
    indptr = d["features_indptr"].astype(np.int64)
    if indptr.shape != (n + 1,):
        raise ValueError(f"path: features_indptr has shape {indptr.shape}, expected ({n + 1},)")
    features = np.zeros((n, f), np.float32)
    rows = np.repeat(np.arange(n), np.diff(indptr))
    features[rows, d["features_indices"]] = d["features_data"]
    labels = d["labels"].astype(np.int32)
    edges = d["edges"].astype(np.int32)
    if edges.ndim != 2 or edges.shape[1] != 2 or edges.min() < 0 or edges.max() >= n:
        raise ValueError(f"path: edges must be [E, 2] node ids in [0, {n}), got {edges.shape}")
    return Planetoid(
        name=name,
        features=features,
        edges=edges,
        labels=labels,
        train_idx=d["train_idx"].astype(np.int32),
        val_idx=d["val_idx"].astype(np.int32),
        test_idx=d["test_idx"].astype(np.int32),
        num_classes=int(labels.max()) + 1,
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

    >>> d = load_pbmc68k()
    >>> d.X_pca.shape, len(d.cell_type_names)
    ((700, 50), 10)
    """
    path = bundled_path("pbmc68k_reduced", "pbmc68k_reduced.npz") if path is None else path
    d = load_npz(path, ("X_pca", "X_umap", "cell_type", "cell_type_names", "louvain"))
    return SingleCell(
        X_pca=d["X_pca"].astype(np.float32),
        X_umap=d["X_umap"].astype(np.float32),
        cell_type=d["cell_type"].astype(np.int32),
        cell_type_names=tuple(str(s) for s in d["cell_type_names"]),
        louvain=d["louvain"].astype(np.int32),
    )
