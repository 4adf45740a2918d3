"""A process that holds compiled data-parallel steps for ``kernels/scaling.py`` and runs one
when told: the device count of a process is fixed when JAX starts, so the scaling rows time
steps in processes of their own (4 forced host devices for the one-process rows; 2 each for
the 2-process ``jax.distributed`` job, launcher environment set by the parent).

Protocol (lines on stdin / stdout): at start it compiles and runs each of its steps once and
prints ``scaling-worker: ready``; then each ``step <family> <devices>`` line runs that step
once, to completion, and prints ``scaling-worker: ok``; ``quit`` (or end of input) exits.

Usage: python -m kernels._scaling_worker QUICK DEVICES[,DEVICES ...]
"""

from __future__ import annotations

import os
import sys

TAG = "scaling-worker:"  # every reply starts with it: other lines (gloo's, jax's) are not ours


def sizes(quick: bool) -> dict[str, tuple[int, int]]:
    """The global problem sizes: RWEFM's (clouds, points) and Pref-MH's (chains, steps)."""
    return {"rwefm": (8, 64) if quick else (32, 128),
            "prefmh": (1024, 20) if quick else (4096, 50)}  # fmt: skip


def _problems(quick: bool, mesh):
    """``{family: step()}`` on ``mesh``: one RWEFM training step on a batch of clouds split over
    the mesh, and a chunk of Pref-MH chains split over it (the global sizes fixed: strong
    scaling)."""
    import jax
    import numpy as np
    import optax
    from jax.sharding import NamedSharding, PartitionSpec

    from hexad import prefmh, sharding
    from hexad.geometry import Sphere
    from hexad.rwefm import CloudBatch, NoiseModel, VectorField, make_trainer
    from kernels.prefmh import _logdensity, _scan_ours

    s2 = Sphere(2)
    bsz, npts = sizes(quick)["rwefm"]
    full = CloudBatch(np.asarray(s2.random_uniform(jax.random.key(0), (bsz, npts))),
                      np.ones((bsz, npts), np.float32))  # fmt: skip
    rows = sharding.process_rows(mesh, bsz)
    batch = sharding.from_process_rows(mesh, jax.tree.map(lambda a: a[rows], full), bsz)
    tr = make_trainer(s2, VectorField(s2, width=64, depth=2, heads=4), optax.adam(1e-3),
                      NoiseModel(s2), mesh=mesh, sinkhorn_iterations=20,
                      sinkhorn_threshold=1e-30)  # fmt: skip
    state = tr.init(jax.random.key(3), full)  # host-side checks on the host batch
    state = sharding.put(jax.tree.map(np.asarray, state), NamedSharding(mesh, PartitionSpec()))
    train = jax.jit(tr.step)
    key = jax.random.key(4)
    box = {"state": state}

    def rwefm():
        box["state"], _ = train(key, box["state"], batch)
        jax.block_until_ready(box["state"])

    chains, steps = sizes(quick)["prefmh"]
    algo = prefmh.prefmh(prefmh.bradley_terry_judge(_logdensity), prefmh.random_walk(1.0))
    run, init = _scan_ours(algo, steps)
    x0 = np.linspace(-3.0, 3.0, 2 * chains, dtype=np.float32).reshape(chains, 2)
    start = sharding.put(jax.tree.map(np.asarray, init(x0)), sharding.batch_sharding(mesh))
    chain = jax.jit(run)

    def prefmh_chains():
        jax.block_until_ready(chain(key, start))

    return {"rwefm": rwefm, "prefmh": prefmh_chains}


def main(quick: bool, counts: list[int]) -> None:
    import jax

    if "JAX_NUM_PROCESSES" in os.environ:
        from experiments._runner import initialize_distributed

        initialize_distributed()
    from hexad import sharding

    steps = {}
    for d in counts:
        for name, fn in _problems(quick, sharding.data_mesh(jax.devices()[:d])).items():
            fn()  # compile and warm
            steps[name, d] = fn
    print(TAG, "ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        steps[words[1], int(words[2])]()
        print(TAG, "ok", flush=True)
    if jax.process_count() > 1:  # every process leaves together (no process sees another die)
        jax.distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1] == "1", [int(c) for c in sys.argv[2].split(",")])
