"""Data: bundled sets and loaders. Reading files is allowed here; nothing is ever unpickled.

- this module: the bundled Planetoid graphs (Cora, Citeseer) and PBMC 68k reduced cells;
- :mod:`hexad.data.images`: scikit-learn digits, procedural image classes, and CIFAR-10 (binary
  format) / GTSRB (PPM + CSV) readers for a user-given path;
- :mod:`hexad.data.offline_rl`: offline RL data sets generated here in gymnasium(-robotics),
  cached as npz with D4RL field names: the scripted PointMaze oracle, the AntMaze oracle driven
  by a given controller, locomotion collection and evaluation with a given policy, and the
  vector-env helpers (the behaviour policies that need training are trained by
  :mod:`hexad.policy`, which stores their data here);
- :mod:`hexad.data.protein`: alanine dipeptide phi/psi torsions from OpenMM simulations, cached as
  npz, with a small bundled sample.

Generated data sets live under :func:`cache_dir` (``$HEXAD_CACHE``, default ``~/.cache/hexad``),
one sub-folder per kind (``cache_dir("offline_rl")``, ``cache_dir("protein")``).

Simulators and readers outside the core install come with extras (``hexad[policy]`` for
gymnasium and MuJoCo, ``hexad[protein]`` for OpenMM, ``hexad[images]`` for scikit-learn's
digits); :func:`require` imports one when it is first needed and names the extra when it is
missing.

This package reads and generates data; it trains nothing and imports no method package.
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
from hexad.data._optional import require

__all__ = [
    "Planetoid",
    "SingleCell",
    "bundled_path",
    "cache_dir",
    "load_npz",
    "load_pbmc68k",
    "load_planetoid",
    "require",
]
