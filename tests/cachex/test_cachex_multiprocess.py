"""2 (and, marked slow, 4) JAX processes joined by jax.distributed on loopback, one per node."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest


def _free_ports(k: int) -> list[int]:
    socks = [socket.socket() for _ in range(k)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.mark.parametrize("n", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_multi_process_round_trip_replica_pfs_and_agreement(tmp_path, n):
    coord, *ports = _free_ports(1 + n)
    script = Path(__file__).with_name("_mp_worker.py")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    # Output goes to files, not pipes: a worker blocked on a full pipe while the test waits on
    # another worker would stall the whole jax.distributed group.
    logs = [(tmp_path / f"w{i}.out", tmp_path / f"w{i}.err") for i in range(n)]
    procs = []
    for i in range(n):
        cmd = [sys.executable, str(script), str(coord), str(i), str(n), str(tmp_path / "nodes"),
               "multiprocess-test-token", ",".join(map(str, ports))]  # fmt: skip
        with open(logs[i][0], "w") as out, open(logs[i][1], "w") as err:
            procs.append(subprocess.Popen(cmd, stdout=out, stderr=err, env=env))
    deadline = time.monotonic() + 150 * n
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for q in procs:
            q.kill()
            q.wait()
        tails = [e.read_text()[-1500:] for _, e in logs]
        pytest.fail("workers timed out; stderr tails:\n" + "\n---\n".join(tails))
    outs = []
    for p, (o, e) in zip(procs, logs, strict=True):
        assert p.returncode == 0, e.read_text()[-3000:]
        outs.append(json.loads(o.read_text().strip().splitlines()[-1]))
    assert len(outs) == n
    for o in outs:
        assert o["pfs_ok"], json.dumps(o["pfs_diag"], indent=1)
        assert o["first"] == [1, "local", True]  # bit-exact shards of an n-process array
        assert o["second"][0] == 0 and o["second"][2]  # all agree on the older step
