"""The trainer process that ``experiments.cachex_durability`` kills (not a study).

Usage: python -m experiments._cachex_faultworker LOCAL PFS HOST PORT TOKEN N_GOOD FAULT SEED

Saves steps ``0 .. N_GOOD-1`` through CacheX to completion, prints ``READY``, installs the
fault and saves step ``N_GOOD``; the fault SIGKILLs this process at its point:
``kill_staging`` (inside T0 staging), ``kill_after_t1`` (after the local write, replica push
possibly still running), ``kill_after_replica_ack`` (after the neighbour's ack, before orbax's
commit).
"""

from __future__ import annotations

import os
import signal
import sys

import numpy as np


def state(seed: int, step: int) -> dict:
    """The deterministic training state of ``step`` (so a restore can be checked bit-exact)."""
    rng = np.random.default_rng([seed, step])
    return {
        "w": rng.standard_normal((128, 64)).astype(np.float32),
        "b": rng.standard_normal((64,)).astype(np.float32),
        "step": np.int64(step),
    }


def _die(*_args, **_kwargs):
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> None:
    local, pfs, host, port, token, n_good, fault, seed = argv
    n_good, seed = int(n_good), int(seed)
    from hexad import cachex
    from hexad.cachex import _manager

    client = cachex.ReplicaClient((host, int(port)), token=token, timeout_s=30)
    m = cachex.CacheXManager(local, neighbour=client, pfs_dir=pfs, max_to_keep=2, seed=seed)
    for s in range(n_good):
        m.save(s, state(seed, s))
        m.wait_until_finished()
    print("READY", flush=True)
    if fault == "kill_staging":
        m.pool.stage = _die
    elif fault == "kill_after_t1":
        write = _manager._format.write_encoded

        def write_then_die(*a, **k):
            write(*a, **k)
            _die()

        _manager._format.write_encoded = write_then_die
    elif fault == "kill_after_replica_ack":
        push = cachex.ReplicaClient.push_files

        def push_then_die(self, *a, **k):
            push(self, *a, **k)
            _die()

        cachex.ReplicaClient.push_files = push_then_die
    else:
        raise SystemExit(f"unknown fault {fault!r}")
    m.save(n_good, state(seed, n_good))
    m.wait_until_finished()
    print("NOT KILLED", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
