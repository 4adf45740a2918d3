"""One of N processes joined by jax.distributed on loopback, each a "node" with its own
local directory and replica server; used by test_cachex_multiprocess.py.

Usage: python _mp_worker.py COORD_PORT PROCESS_ID N_PROCESSES BASE_DIR TOKEN PORT0,PORT1,...
Prints one JSON line with the results.
"""

import json
import os
import sys
import time

if __name__ == "__main__":  # only as the script; `pytest --doctest-modules` imports it too
    # 2 CPU devices per process, keeping any other flag the parent runs under (an ISA cap)
    _flags = os.environ.get("XLA_FLAGS", "").split()
    _flags = [f for f in _flags if not f.startswith("--xla_force_host_platform_device_count")]
    os.environ["XLA_FLAGS"] = " ".join([*_flags, "--xla_force_host_platform_device_count=2"])
    os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402


def main() -> None:
    coord, pid, n, base, token, ports = sys.argv[1:7]
    pid, n = int(pid), int(n)
    ports = [int(p) for p in ports.split(",")]
    jax.distributed.initialize(f"127.0.0.1:{coord}", num_processes=n, process_id=pid)
    from hexad import cachex

    server = cachex.ReplicaServer(
        os.path.join(base, f"node{pid}", "replicas"), token, port=ports[pid], max_lifetime_s=120
    ).start()
    client = cachex.ReplicaClient(("127.0.0.1", ports[(pid + 1) % n]), token, timeout_s=30)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharding = NamedSharding(mesh, P("data"))

    def state(step):
        glob = np.random.default_rng(step).standard_normal((4 * n, 3)).astype(np.float32)
        return {
            "w": jax.make_array_from_callback(glob.shape, sharding, lambda i: glob[i]),
            "step": np.int64(step),
        }, glob

    def mark(what):
        print(f"[{pid}] {what}", file=sys.stderr, flush=True)

    mark("initialized")
    multihost_utils.sync_global_devices("servers up")
    mark("servers up")
    m = cachex.CacheXManager(
        os.path.join(base, f"node{pid}", "local"),
        neighbour=client,
        pfs_dir=os.path.join(base, "pfs"),
    )
    for s in range(2):
        m.save(s, state(s)[0])
        m.wait_until_finished()
    mark("saved")
    t_pfs = time.monotonic()
    pfs_ok = m.wait_for_pfs(1, timeout_s=60)
    mark(f"pfs {pfs_ok} after {time.monotonic() - t_pfs:.1f} s")
    # What the test prints if step 1 is not PFS-committed: each rank's records, the drainer's
    # state and the PFS folder.
    diag = None
    if not pfs_ok:
        pfs = os.path.join(base, "pfs")
        diag = {
            "records": {s: m.durability(s) for s in range(2)},
            "health": m.health(ping_neighbour=False),
            "drainer_log": m.drainer_log.read_text()[-2000:] if m.drainer_log.exists() else None,
            "pfs": sorted(
                os.path.relpath(os.path.join(d, f), pfs)
                for d, dirs, files in os.walk(pfs)
                for f in [*dirs, *files]
            ),
        }
    multihost_utils.sync_global_devices("saved")
    target, glob1 = state(7)
    r = m.restore(target)
    mark("restored")
    _, want = state(1)
    exact = all(
        np.asarray(sh.data).tobytes() == want[sh.index].tobytes()
        for sh in r.state["w"].addressable_shards
    )
    out = {"pid": pid, "pfs_ok": pfs_ok, "pfs_diag": diag, "first": [r.step, r.tier, exact]}
    multihost_utils.sync_global_devices("restored")
    # Process 0 loses step 1 everywhere (local bit flip, its replica on the neighbour and its
    # PFS copy): every process must then agree on step 0.
    if pid == 0:
        for d in (
            os.path.join(base, "node0", "local", "steps", "1", "state"),
            os.path.join(base, f"node{1 % n}", "replicas", "rank_0", "1"),
            os.path.join(base, "pfs", "1", "rank_0"),
        ):
            path = os.path.join(d, "data.bin")
            data = bytearray(open(path, "rb").read())
            data[0] ^= 1
            open(path, "wb").write(bytes(data))
    multihost_utils.sync_global_devices("corrupted")
    r = m.restore(target)
    _, want0 = state(0)
    exact0 = all(
        np.asarray(sh.data).tobytes() == want0[sh.index].tobytes()
        for sh in r.state["w"].addressable_shards
    )
    out["second"] = [r.step, r.tier, exact0]
    multihost_utils.sync_global_devices("done")
    m.close()
    server.stop()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
