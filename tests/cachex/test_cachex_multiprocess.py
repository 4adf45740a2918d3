"""Two JAX processes joined by jax.distributed on loopback, each standing for a node."""

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


def test_two_process_round_trip_replica_pfs_and_agreement(tmp_path):
    n = 2
    coord, *ports = _free_ports(1 + n)
    script = Path(__file__).with_name("_mp_worker.py")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(script),
                str(coord),
                str(i),
                str(n),
                str(tmp_path),
                "tok",
                ",".join(map(str, ports)),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(n)
    ]
    outs = []
    deadline = time.monotonic() + 120 * n
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            tails = [q.communicate()[1][-1500:] for q in procs]
            pytest.fail("workers timed out; stderr tails:\n" + "\n---\n".join(tails))
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    for o in outs:
        assert o["pfs_ok"]
        assert o["first"] == [1, "local", True]  # bit-exact shards of a 2-process array
        assert o["second"][0] == 0 and o["second"][2]  # all agree on the older step
