"""The trainer process that ``experiments.cachex_durability`` kills (not a study).

Usage: python -m experiments._cachex_faultworker LOCAL PFS HOST PORT TOKEN N_GOOD FAULT SEED

Saves steps ``0 .. N_GOOD-1`` through CacheX to completion, prints ``READY``, then saves step
``N_GOOD``, whose fault hook (:func:`hexad.cachex.kill_at`) SIGKILLs this process at the
point :data:`experiments._cachex.KILL_POINTS` names for ``FAULT``: ``kill_staging`` (before the
T0 copy), ``kill_after_t1`` (after the local write, replica push possibly still running),
``kill_after_replica_ack`` (after the neighbour's ack, before orbax's commit).
:func:`run_killed` runs it from the study.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path


def run_killed(fault: str, local: Path, pfs: Path, address, token: str, n_good: int, seed: int):
    """Runs this worker for ``fault`` against the replica server at ``address``, checks that
    its fault hook SIGKILLed it (RuntimeError otherwise) and gives its drainer 0.3 s."""
    host, port = address
    args = [local, pfs, host, port, token, n_good, fault, seed]
    cmd = [sys.executable, "-m", "experiments._cachex_faultworker", *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    if proc.returncode != -signal.SIGKILL:
        raise RuntimeError(f"{fault}: worker was not killed: {proc.stderr[-2000:]}")
    time.sleep(0.3)  # the killed trainer's orphaned drainer may still persist a step; let it


def main(argv: list[str]) -> None:
    local, pfs, host, port, token, n_good, fault, seed = argv
    n_good, seed = int(n_good), int(seed)
    from experiments._cachex import KILL_POINTS, save_steps
    from hexad import cachex

    if fault not in KILL_POINTS:
        raise SystemExit(f"unknown fault {fault!r}")
    client = cachex.ReplicaClient((host, int(port)), token=token, timeout_s=30)
    hooks = {KILL_POINTS[fault]: cachex.kill_at(n_good)}
    m = cachex.CacheXManager(
        local, neighbour=client, pfs_dir=pfs, max_to_keep=2, seed=seed, fault_hooks=hooks
    )
    save_steps(m, seed, range(n_good))
    print("READY", flush=True)
    save_steps(m, seed, [n_good])
    print("NOT KILLED", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
