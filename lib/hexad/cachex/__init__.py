"""CacheX: checkpoint staging through orbax, with neighbour replication and a durability model.

Tiers (CacheX, NeurIPS 2026): T0 host-DRAM staging, T1 node-local write with file and directory
``fsync``, T2 a neighbour's replica server (TCP, shared token, bounded messages, ``fsync`` +
rename + ack), T3 an eventual PFS drain by a separate drainer process. :class:`CacheXManager`
runs them under ``orbax.checkpoint.CheckpointManager``. A ``save`` blocks for the host copy of
the arrays (T0) plus CacheX's checks, measured by ``stall_seconds`` (the copy alone by
``stage_seconds``); orbax's own save call (its bookkeeping), the local write, the replication and
the PFS drain run on the manager's threads after it returns (their errors are raised by the next
``save``, ``wait_until_finished`` or ``close``).
orbax keeps one save in flight: a ``save`` called while the previous one is still committing
first waits for the rest of that commit. ``CacheXManager.health()`` reports the drainer's and
the neighbour's liveness and the durability lag (steps and seconds not yet PFS-committed: the
rollback exposure); a dead drainer is restarted at the next save, and ``max_pinned_steps`` /
``max_pinned_bytes`` stop saving loudly (:class:`PinnedLimitError`) before undrained steps fill
a disk. :func:`resume` gives studies ``--resume`` semantics (:class:`ItemCheckpoint` for studies
that loop over independent items); it starts at step 0 only in an empty checkpoint directory,
and raises :class:`UnreadableCheckpointError` where steps exist that no tier could read. A
restore lists each tier and entry on its own, so one unreadable entry or tier never hides the
others. Leaves are arrays of any numeric dtype (bfloat16, int4, ...), 0-d or empty, and typed
PRNG keys; :func:`verified_steps` audits the tiers and :func:`check_restore` judges a restore
after a fault; :func:`fail_at`, :func:`kill_at` and :func:`quiet_failed_saves` are fault
injectors for the manager's ``fault_hooks``, :func:`wipe_local`, :func:`corrupt_file`,
:func:`refuse_drains` (with :func:`exhaust_drain_retries`) and :func:`kill_drainer_mid_drain`
faults of the tiers; :func:`fit_durability_model` fits the lognormal body / Gumbel tail of writer
completion times and :func:`critical_contention` computes the contention threshold
:math:`C^*_p(n)` (a curve over writer counts at once).
"""

import importlib

_EXPORTS = {
    "_format": (
        "DATA_FILE",
        "MANIFEST_FILE",
        "CorruptCheckpointError",
        "StagingPool",
        "assemble_tree",
        "read_rank_dir",
        "write_rank_dir",
    ),
    "_faults": (
        "corrupt_file",
        "disk_full",
        "exhaust_drain_retries",
        "fail_at",
        "io_error",
        "kill_at",
        "kill_drainer_mid_drain",
        "quiet_failed_saves",
        "refuse_drains",
        "wipe_local",
    ),
    "_fsio": ("fsync_dir", "validate_file_name", "validate_step_name"),
    "_items": ("ItemCheckpoint",),
    "_manager": (
        "CacheXHandler",
        "CacheXManager",
        "CacheXRestore",
        "CacheXSave",
        "PinnedLimitError",
        "RestoreCheck",
        "Restored",
        "UnreadableCheckpointError",
        "check_restore",
        "resume",
        "verified_steps",
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
    "_pfs": ("DrainerConfig", "PFSModel", "drain_once", "spawn_drainer", "sweep_pfs"),
    "_replica": (
        "ReplicaClient",
        "ReplicaError",
        "ReplicaServer",
        "choose_partner",
        "spawn_replica_server",
    ),
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
