"""The roofline calibration, reported as kernels: float32 matmul and a streaming update.

These are the same jnp kernels :func:`kernels._harness.measure_roofline` uses at start-up, timed
again as ordinary rows, so their roofline fraction says how steady the machine is (close to
1.0 on a quiet machine). Peer: numpy's own matmul (BLAS) and streaming update on the host.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from kernels._harness import Case


def _stream(x):
    return x * 1.5 + 0.25


def _np_stream(x):
    return x * np.float32(1.5) + np.float32(0.25)


def cases(quick: bool) -> list[Case]:
    n = 1024 if quick else 2048
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, (n, n), jnp.float32)
    b = jax.random.normal(kb, (n, n), jnp.float32)
    m = (16 if quick else 64) * 2**20 // 4
    x = jnp.arange(m, dtype=jnp.float32)
    return [
        Case(
            name=f"roofline/matmul n={n}",
            fn=jnp.dot,
            args=(a, b),
            shapes=f"[{n},{n}]@[{n},{n}]",
            flops=2.0 * n**3,
            bytes=3.0 * 4 * n * n,
            items=2.0 * n**3,
            unit="FLOP",
            peer=np.dot,
            peer_args=(np.asarray(a), np.asarray(b)),
            peer_name="numpy.dot",
            peer_jit=False,
        ),
        Case(
            name=f"roofline/stream {m * 4 // 2**20}MiB",
            fn=_stream,
            args=(x,),
            shapes=f"[{m}]",
            bytes=8.0 * m,
            items=8.0 * m,
            unit="B",
            peer=_np_stream,
            peer_args=(np.asarray(x),),
            peer_name="numpy a*x+b",
            peer_jit=False,
        ),
    ]
