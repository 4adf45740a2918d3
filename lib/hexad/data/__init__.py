"""Data: bundled sets and loaders. Reading files is allowed here; nothing is ever unpickled.

- this module: the bundled Planetoid graphs (Cora, Citeseer) and PBMC 68k reduced cells;
- :mod:`hexad.data.images`: scikit-learn digits, procedural image classes, and CIFAR-10 (binary
  format) / GTSRB (PPM + CSV) readers for a user-given path;
- :mod:`hexad.data.offline_rl`: offline RL data sets generated here in gymnasium(-robotics)
  (scripted PointMaze oracles, SAC-trained HalfCheetah / Hopper levels), cached as npz with D4RL
  field names;
- :mod:`hexad.data.protein`: alanine dipeptide phi/psi torsions from OpenMM simulations, cached as
  npz, with a small bundled sample.

Generated data sets live under :func:`cache_dir` (``$HEXAD_CACHE``, default ``~/.cache/hexad``).
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
