"""Runs a few steps of each training loop and chain runner that takes a mesh, on a 4-device data
mesh, for tests/test_distributed_families.py: as one process with 4 host devices, or as each
process of a 2-process ``jax.distributed`` job with 2 host devices each (launcher environment
set by the test). Each process loads only its rows of the batches
(:func:`hexad.sharding.from_process_rows`); process 0 writes the results (``np.savez``) with
how many rows of the batch each process held.

Usage: python tests/_dist_families.py OUT.npz FAMILY [FAMILY ...]
"""

import os
import sys

if __name__ == "__main__":  # before jax starts; importing this file (doctest collection) sets
    # nothing: a job's process has 2 devices, the one process 4
    n = 2 if "JAX_NUM_PROCESSES" in os.environ else 4
    flags = os.environ.get("XLA_FLAGS", "").split()
    os.environ["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={n}"])

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

from hexad import sharding  # noqa: E402

STEPS = 3


def _global(tree):
    """Every leaf as one numpy array on every process (gathered from the shards)."""
    return jax.tree.map(lambda a: np.asarray(multihost_utils.process_allgather(a, tiled=True)),
                        tree)  # fmt: skip


def rwefm(mesh):
    from hexad.geometry import Torus
    from hexad.rwefm import CloudBatch, NoiseModel, VectorField, make_trainer

    t2, n = Torus(2), 16
    full = CloudBatch(np.asarray(t2.random_uniform(jax.random.key(0), (n, 4))),
                      np.ones((n, 4), np.float32))  # fmt: skip
    rows = sharding.process_rows(mesh, n)
    batch = sharding.from_process_rows(mesh, jax.tree.map(lambda a: a[rows], full), n)
    model = VectorField(t2, width=8, depth=1, heads=1)
    # SGD, not Adam: some of the network's parameters get an exactly-zero gradient (a bias
    # ahead of a normalisation), and Adam scales their rounding noise up to the step size
    tr = make_trainer(t2, model, optax.sgd(0.1), NoiseModel(t2), pairing="none", mesh=mesh)
    # init reads the clouds on the host (its input checks), so it is given the whole host batch
    # (every process the same), and its state is replicated over the mesh from there
    state = tr.init(jax.random.key(1), full)
    state = sharding.put(jax.tree.map(np.asarray, state), NamedSharding(mesh, PartitionSpec()))
    step = jax.jit(tr.step)
    for i in range(STEPS):
        state, _ = step(jax.random.key(10 + i), state, batch)
    held = batch.points.addressable_shards
    return _global(state.params), sum(s.data.shape[0] for s in held)


def prefmh(mesh):
    from hexad import prefmh as pm

    n = 16
    judge = pm.bradley_terry_judge(lambda x: -0.5 * jnp.sum(x**2))
    algo = pm.prefmh(judge, pm.random_walk(1.0))
    rows = sharding.process_rows(mesh, n)
    start = np.linspace(-1.0, 1.0, 2 * n, dtype=np.float32).reshape(n, 2)
    x0 = sharding.from_process_rows(mesh, start[rows], n)
    out = pm.run_chains(jax.random.key(0), algo, x0, 20, mesh=mesh)
    held = out.state.position.addressable_shards
    return _global({"position": out.state.position, "trace": out.trace}), sum(
        s.data.shape[0] for s in held)  # fmt: skip


def policy(mesh):
    from hexad import policy as pol

    n = 64
    rng = np.random.default_rng(0)
    data = pol.Batch(*(rng.normal(size=s).astype(np.float32)
                       for s in ((n, 3), (n, 2), (n,), (n, 3), (n,))))  # fmt: skip
    algo = pol.bc(pol.GaussianActor(2, hidden=(8,)), optax.adam(1e-2))
    train = jax.jit(pol.make_train(algo, n_steps=STEPS, batch_size=16, mesh=mesh))
    state = algo.init(jax.random.key(0), data)
    state, _ = train(jax.random.key(1), state, data)
    return _global(state.params), -1  # the dataset is replicated; each minibatch is split


def compose(mesh):
    from hexad import policy as pol

    n, d = 16, 2
    rng = np.random.default_rng(1)
    rows = sharding.process_rows(mesh, n)
    mean, prior_mean = rng.normal(size=(2, n, d)).astype(np.float32)
    std, prior_std = rng.uniform(0.3, 1.5, size=(2, n, d)).astype(np.float32)
    local = (mean[rows], std[rows], prior_mean[rows], prior_std[rows])
    m, s, pm, ps = sharding.from_process_rows(mesh, local, n)
    method = np.tile(np.array([pol.Method.POE, pol.Method.ADDITIVE, pol.Method.KL_STATE,
                               pol.Method.ZERO]), n // 4)  # fmt: skip
    meth = sharding.from_process_rows(mesh, method[rows], n)
    act = jax.jit(lambda meth, m, s, pm, ps: pol.compose(
        meth, pol.DiagGaussian(m, s), pol.DiagGaussian(pm, ps), 0.5, kl_budget=0.3))(
        meth, m, s, pm, ps)  # fmt: skip
    return _global(act), sum(a.data.shape[0] for a in act.addressable_shards)


def backdoor(mesh):
    from hexad.backdoor import SmallCNN, fit

    n, m = 32, SmallCNN(2, (2,), 4)
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(n, 8, 8, 1)).astype(np.float32)
    y = rng.integers(0, 2, n)
    p0 = m.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    params, _ = fit(jax.random.key(1), p0, jnp.asarray(x), jnp.asarray(y), m.apply,
                    optax.sgd(0.1), n_steps=STEPS, batch_size=8, mesh=mesh, pad=1)  # fmt: skip
    return _global(params), -1


def _shapes(n, seed):
    """``n`` random 8x8 one-channel images and their 2 classes (the backdoor families' data)."""
    rng = np.random.default_rng(seed)
    return rng.uniform(size=(n, 8, 8, 1)).astype(np.float32), rng.integers(0, 2, n)


def dtb(mesh):
    import hexad.backdoor as bd

    m = bd.SmallCNN(2, (2,), 4)
    x, y = _shapes(32, 2)
    p0 = m.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    pr = bd.DTBProblem(bd.patch_trigger((8, 8, 1), 2), bd.patch_trigger((8, 8, 1), 2, (0, 0)),
                       0, 1)  # fmt: skip
    cfg = bd.DTBConfig(inner_steps=1, inner_batch=8, inner_lr=0.05, family=("ft", "noise_ft"),
                       pad=1)  # fmt: skip
    params, info = bd.implant(jax.random.key(1), m, p0, pr, jnp.asarray(x), jnp.asarray(y),
                              jnp.asarray(x[:16]), jnp.asarray(y[:16]), cfg, optax.sgd(0.1),
                              STEPS, 8, mesh=mesh)  # fmt: skip
    return _global({"params": params, "loss": info.steps.loss}), -1


def defense(mesh):
    """The fine-tuning defenses (FT here) on the defender's clean split placed over the mesh,
    each process holding only its rows: the drawn minibatches follow that placement."""
    import hexad.backdoor as bd
    from hexad.backdoor.defenses import DefenseData, finetune

    n, m = 16, bd.SmallCNN(2, (2,), 4)
    x, y = _shapes(n, 3)
    rows = sharding.process_rows(mesh, n)
    data = DefenseData(*sharding.from_process_rows(mesh, (x[rows], y[rows]), n))
    p0 = m.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    out = finetune(jax.random.key(1), m, p0, data, n_steps=STEPS, lr=0.1, batch_size=8)
    held = data.x_clean.addressable_shards
    return _global(out.params), sum(s.data.shape[0] for s in held)


FAMILIES = {"rwefm": rwefm, "prefmh": prefmh, "policy": policy, "compose": compose,
            "backdoor": backdoor, "dtb": dtb, "defense": defense}  # fmt: skip


def main(out: str, families: list[str]) -> None:
    if "JAX_NUM_PROCESSES" in os.environ:
        from experiments._runner import initialize_distributed

        initialize_distributed()
    mesh = sharding.data_mesh()
    assert mesh.shape["data"] == 4, mesh.shape
    res = {}
    for f in families:
        tree, held = FAMILIES[f](mesh)
        leaves, _ = jax.tree.flatten(tree)
        res.update({f"{f}/{i}": v for i, v in enumerate(leaves)})
        res[f"{f}/held_rows"] = np.asarray(held)
    if jax.process_index() == 0:
        np.savez(out, processes=jax.process_count(), **res)
    multihost_utils.sync_global_devices("done")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
