"""Data: bundled sets (Planetoid, PBMC 68k reduced) and loaders. Reading files is allowed here.

Method packages may add their own loader modules here (``hexad.data.<name>``); nothing here is
ever unpickled.
"""

from hexad.data._bundled import (
    Planetoid,
    SingleCell,
    bundled_path,
    load_npz,
    load_pbmc68k,
    load_planetoid,
)

__all__ = [
    "Planetoid",
    "SingleCell",
    "bundled_path",
    "load_npz",
    "load_pbmc68k",
    "load_planetoid",
]
