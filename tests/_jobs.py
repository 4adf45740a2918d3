"""Helpers of the tests that start ``jax.distributed`` jobs of local processes on loopback."""

import os
import socket
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def port() -> int:
    """A free TCP port on loopback, for a job's coordinator."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(**extra) -> dict:
    """This environment for a job's process: the repository on the path, host CPU devices, the
    inherited ``XLA_FLAGS`` but a device count (each process sets its own), plus ``extra``."""
    out = dict(os.environ)
    flags = [f for f in out.pop("XLA_FLAGS", "").split() if "device_count" not in f]
    if flags:  # e.g. CI's --xla_cpu_max_isa=SSE4_2 reaches the job's processes too
        out["XLA_FLAGS"] = " ".join(flags)
    out["PYTHONPATH"] = os.pathsep.join([str(ROOT / "lib"), str(ROOT)])
    out["JAX_PLATFORMS"] = "cpu"
    return out | extra
