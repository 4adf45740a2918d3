"""CacheX: checkpoint staging through orbax, with neighbour replication and a durability model.

Tiers (CacheX, NeurIPS 2026): T0 host-DRAM staging (the only part that blocks training), T1
node-local write with file and directory ``fsync``, T2 a neighbour's replica server (TCP on
loopback, shared token, bounded messages, ``fsync`` + rename + ack), T3 an eventual PFS drain
by a separate drainer process. :class:`CacheXManager` runs them under
``orbax.checkpoint.CheckpointManager``; :func:`resume` gives studies ``--resume`` semantics
(:class:`ItemCheckpoint` for studies that loop over independent items);
:mod:`hexad.cachex._model` fits the lognormal body / Gumbel tail of writer completion times
and computes the contention threshold C*_p(n).
"""

import importlib

_EXPORTS = {
    "_format": ("CorruptCheckpointError", "StagingPool"),
    "_fsio": ("validate_file_name", "validate_step_name"),
    "_items": ("ItemCheckpoint",),
    "_manager": (
        "CacheXHandler",
        "CacheXManager",
        "CacheXRestore",
        "CacheXSave",
        "PFSDelayHandler",
        "PFSDelayRestore",
        "PFSDelaySave",
        "Restored",
        "resume",
    ),
    "_model": (
        "DurabilityModel",
        "choose_path",
        "critical_contention",
        "fit_durability_model",
        "fit_gumbel",
        "fit_lognormal",
        "gumbel_of_max_lognormal",
        "pfs_time_quantile",
    ),
    "_pfs": ("DrainerConfig", "PFSModel", "spawn_drainer"),
    "_replica": ("ReplicaClient", "ReplicaError", "ReplicaServer", "spawn_replica_server"),
}
_WHERE = {name: mod for mod, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    # Lazy (PEP 562): the drainer and replica-server processes import only the jax-free
    # modules they need (_fsio, _format, _pfs, _replica), so they start in a fraction of a second.
    if name in _WHERE:
        value = getattr(importlib.import_module(f"hexad.cachex.{_WHERE[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'hexad.cachex' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *__all__])
