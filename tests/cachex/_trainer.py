"""A trainer process for the kill tests: saves steps through CacheX, then hangs mid-save.

Usage: python _trainer.py LOCAL PFS HOST PORT TOKEN N_GOOD
Saves steps 0..N_GOOD-1 to completion (replica-durable), prints ``READY`` and then starts
saving step N_GOOD, whose replica ack is slow; the test SIGKILLs the process meanwhile.
"""

import os
import sys

if __name__ == "__main__":  # only as the script; `pytest --doctest-modules` imports it too
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

from hexad import cachex  # noqa: E402


def state(step: int) -> dict:
    rng = np.random.default_rng(step)
    return {"w": rng.standard_normal((64, 32)).astype(np.float32), "step": np.int64(step)}


def main() -> None:
    local, pfs, host, port, token, n_good = sys.argv[1:7]
    client = cachex.ReplicaClient((host, int(port)), token=token, timeout_s=30)
    m = cachex.CacheXManager(local, neighbour=client, pfs_dir=pfs, max_to_keep=1)
    for s in range(int(n_good)):
        m.save(s, state(s))
        m.wait_until_finished()
    print("READY", flush=True)
    m.save(int(n_good), state(int(n_good)))
    print("SAVING", flush=True)
    m.wait_until_finished()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
