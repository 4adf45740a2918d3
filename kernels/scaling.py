"""Data-parallel scaling: the RWEFM training step and the Pref-MH chains on 1, 2 and 4 devices
of one process, and on 2 processes x 2 devices (a ``jax.distributed`` job on loopback).

Rows (strong scaling: the global batch is fixed and split over the devices' data axis):

- ``scaling/rwefm step d=2`` and ``d=4``: one RWEFM training step on ``S^2`` (32 clouds of 128
  points, 20 Sinkhorn iterations a map; ``--quick``: 8 x 64) on a ``d``-device mesh;
  ``scaling/rwefm step 2 proc x 2``: the same 4-device mesh spanning two processes, each
  loading only its clouds (:func:`hexad.sharding.from_process_rows`).
- ``scaling/prefmh chains d=2``, ``d=4`` and ``2 proc x 2``: 4096 Pref-MH chains (K = 1, the
  kernels' mixture target), 50 steps in one scan (``--quick``: 1024 x 20), chains split.

Peer: the same step on one device of the one-process worker, timed interleaved with the row.
``ratio`` = median / one device's median, so the throughput ratio against one device is
``1 / ratio``. Bound: perfect scaling, one device's median / ``d`` (the row's fraction of
the bound is its parallel efficiency).

On a CPU host the devices are host devices forced with
``--xla_force_host_platform_device_count`` (4 in the one-process worker, 2 in each process of
the job); they share the host's cores, so the rows measure the cost of the split (partitioned
programs, collectives, process-to-process traffic) more than a speed-up, which needs as many
cores per device as the one-device run had. On a host with 4 or more accelerators the
one-process rows use them and the job row is left out; with fewer (one GPU), every row runs on
host devices as on a CPU host.

The steps run in worker processes (``kernels._scaling_worker``), started when the cases are
built and stopped at exit; each timed call sends one line and waits for the reply (a round
trip of well under a millisecond on these steps of tens of milliseconds).

Run: ``python -m kernels scaling [--quick]``.
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
from functools import partial
from pathlib import Path

import jax

from kernels._harness import Case
from kernels._scaling_worker import TAG, sizes

ROOT = Path(__file__).resolve().parents[1]
COUNTS = (1, 2, 4)


class _Worker:
    """One worker process, or the processes of one job, told to step together."""

    def __init__(self, quick: bool, counts, processes: int = 1):
        env = dict(os.environ)
        # the caller's XLA flags (an ISA limit, say) but its device count: each sets its own
        flags = [f for f in env.pop("XLA_FLAGS", "").split() if "device_count" not in f]
        if flags:
            env["XLA_FLAGS"] = " ".join(flags)

        def devices(k: int) -> str:
            return " ".join([*flags, f"--xla_force_host_platform_device_count={k}"])

        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "lib"), str(ROOT)])
        args = [sys.executable, "-m", "kernels._scaling_worker", "1" if quick else "0",
                ",".join(map(str, counts))]  # fmt: skip
        envs = []
        if processes == 1:
            if not _on_accelerators():
                env["JAX_PLATFORMS"] = "cpu"
                env["XLA_FLAGS"] = devices(4)
            envs.append(env)
        else:
            port = _port()
            for i in range(processes):
                envs.append(env | {
                    "JAX_PLATFORMS": "cpu", "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
                    "JAX_NUM_PROCESSES": str(processes), "JAX_PROCESS_ID": str(i),
                    "XLA_FLAGS": devices(4 // processes),
                })  # fmt: skip
        self.procs = [subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       text=True, env=e, cwd=ROOT) for e in envs]  # fmt: skip
        atexit.register(self.close)
        for p in self.procs:
            self._expect(p, "ready")

    @staticmethod
    def _expect(p, word: str) -> None:
        # the worker's replies carry a tag; other lines (gloo's, jax's) are skipped
        while line := p.stdout.readline():
            if line.startswith(TAG):
                if line.split()[1:2] == [word]:
                    return
                break
        raise RuntimeError(f"scaling worker: expected {word!r}, got {line!r} "
                           f"(exit code {p.poll()})")  # fmt: skip

    def step(self, family: str, devices: int) -> None:
        for p in self.procs:
            p.stdin.write(f"step {family} {devices}\n")
            p.stdin.flush()
        for p in self.procs:
            self._expect(p, "ok")

    def close(self) -> None:
        for p in self.procs:  # all told first: a job's processes leave together
            if p.poll() is None:
                try:
                    p.stdin.write("quit\n")
                    p.stdin.flush()
                except OSError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _on_accelerators() -> bool:
    """Whether the one-process rows run on this host's accelerators (4 or more of them)."""
    return jax.default_backend() != "cpu" and jax.device_count() >= max(COUNTS)


def cases(quick: bool) -> list[Case]:
    one = _Worker(quick, COUNTS)
    # the job runs on host devices: beside accelerator rows its peer would be another device
    job = None if _on_accelerators() else _Worker(quick, (4,), processes=2)
    (bsz, npts), (chains, steps) = sizes(quick)["rwefm"], sizes(quick)["prefmh"]
    rows = {"rwefm": (f"clouds[{bsz},{npts},3]", bsz, "clouds"),
            "prefmh": (f"chains={chains} steps={steps}", chains * steps, "steps")}  # fmt: skip
    out = []
    for family, (shapes, items, unit) in rows.items():
        what = "step" if family == "rwefm" else "chains"
        runs = [(f"d={d}", one, d) for d in COUNTS if d > 1]
        runs += [("2 proc x 2", job, 4)] if job is not None else []
        peer = partial(one.step, family, 1)  # the peer and the bound: one device's median
        for label, worker, d in runs:
            out.append(
                Case(
                    name=f"scaling/{family} {what} {label}",
                    fn=partial(worker.step, family, d),
                    jit=False,
                    shapes=f"{shapes} over {d} devices",
                    items=float(items),
                    unit=unit,
                    peer=peer,
                    peer_jit=False,
                    peer_name="the same step on 1 device",
                    goal="report: throughput x 1/ratio of one device's",
                    bound_fn=peer,
                    bound_work=1.0 / d,
                    bound_jit=False,
                    bound_note=f"perfect scaling: 1 device's median / {d}",
                    repeats=5,
                    warmup=1,
                )
            )
    return out
