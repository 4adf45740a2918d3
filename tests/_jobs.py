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
    """This environment for a job's process: the repository on the path, host CPU devices, no
    inherited ``XLA_FLAGS`` (each process sets its own device count), plus ``extra``."""
    out = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out["PYTHONPATH"] = os.pathsep.join([str(ROOT / "lib"), str(ROOT)])
    out["JAX_PLATFORMS"] = "cpu"
    return out | extra
