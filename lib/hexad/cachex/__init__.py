"""CacheX: checkpoint staging through orbax, with neighbour replication and a durability model.

Tiers (CacheX, NeurIPS 2026): T0 host-DRAM staging (the only part that blocks training), T1
node-local write with file and directory ``fsync``, T2 a neighbour's replica server (TCP on
loopback, shared token, bounded messages, ``fsync`` + rename + ack), T3 an eventual PFS drain
by a separate drainer process. :class:`CacheXManager` runs them under
``orbax.checkpoint.CheckpointManager``; :func:`resume` gives studies ``--resume`` semantics;
:mod:`hexad.cachex._model` fits the lognormal body / Gumbel tail of writer completion times
and computes the contention threshold C*_p(n).
"""

from hexad.cachex._format import CorruptCheckpointError, StagingPool
from hexad.cachex._fsio import validate_file_name, validate_step_name
from hexad.cachex._manager import (
    CacheXHandler,
    CacheXManager,
    CacheXRestore,
    CacheXSave,
    Restored,
    resume,
)
from hexad.cachex._model import (
    DurabilityModel,
    choose_path,
    critical_contention,
    fit_durability_model,
    fit_gumbel,
    fit_lognormal,
    gumbel_of_max_lognormal,
    pfs_time_quantile,
)
from hexad.cachex._pfs import DrainerConfig, PFSModel, spawn_drainer
from hexad.cachex._replica import (
    ReplicaClient,
    ReplicaError,
    ReplicaServer,
    spawn_replica_server,
)

__all__ = [
    "CacheXHandler",
    "CacheXManager",
    "CacheXRestore",
    "CacheXSave",
    "CorruptCheckpointError",
    "DrainerConfig",
    "DurabilityModel",
    "PFSModel",
    "ReplicaClient",
    "ReplicaError",
    "ReplicaServer",
    "Restored",
    "StagingPool",
    "choose_path",
    "critical_contention",
    "fit_durability_model",
    "fit_gumbel",
    "fit_lognormal",
    "gumbel_of_max_lognormal",
    "pfs_time_quantile",
    "resume",
    "spawn_drainer",
    "spawn_replica_server",
    "validate_file_name",
    "validate_step_name",
]
