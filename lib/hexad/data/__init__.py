"""Data: bundled sets and loaders. Reading files is allowed here; nothing is ever unpickled.

- this module: the bundled Planetoid graphs (Cora, Citeseer) and PBMC 68k reduced cells;
- :mod:`hexad.data.images`: scikit-learn digits, procedural image classes, and CIFAR-10 (binary
  format) / GTSRB (PPM + CSV) readers for a user-given path;
- :mod:`hexad.data.offline_rl`: offline RL data sets generated here in gymnasium(-robotics),
  cached as npz with D4RL field names.
"""

from hexad.data._bundled import (
    Planetoid,
    SingleCell,
    bundled_path,
    cache_dir,
    load_npz,
    load_pbmc68k,
    load_planetoid,
)

__all__ = [
    "Planetoid",
    "SingleCell",
    "bundled_path",
    "cache_dir",
    "load_npz",
    "load_pbmc68k",
    "load_planetoid",
]
