"""hexad.sharding: Auto-axis data meshes that work inside scans on 8 simulated devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, PartitionSpec

from hexad import sharding


def test_data_mesh_is_auto_over_all_devices():
    mesh = sharding.data_mesh()
    assert mesh.shape == {"data": 8}
    assert mesh.axis_types == (AxisType.Auto,)


def test_auto_axes_converts_explicit_and_keeps_auto():
    explicit = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    auto = sharding.auto_axes(explicit)
    assert auto.axis_types == (AxisType.Auto, AxisType.Auto)
    assert auto.axis_names == ("data", "model")
    assert np.array_equal(auto.devices, explicit.devices)
    assert sharding.auto_axes(auto) is auto


def test_constraint_inside_scan_on_converted_mesh():
    # The reason this module exists: on an Explicit mesh this constraint inside a scan fails.
    mesh = sharding.auto_axes(jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,)))
    spec = sharding.batch_sharding(mesh)
    assert spec.spec == PartitionSpec("data")

    @jax.jit
    def f(x):
        def body(c, _):
            c = jax.lax.with_sharding_constraint(c * 2.0, spec)
            return c, c.sum()

        return jax.lax.scan(body, x, None, length=3)

    x = jax.device_put(jnp.arange(16.0).reshape(8, 2), spec)
    c, s = f(x)
    np.testing.assert_allclose(c, 8.0 * np.arange(16.0).reshape(8, 2))
    assert c.sharding.spec == PartitionSpec("data")


def test_bad_input_names_the_argument():
    mesh = sharding.data_mesh()
    assert sharding.check_divisible(mesh, "data", 16, "batch") == 8
    with pytest.raises(ValueError, match="batch: leading dimension 12"):
        sharding.check_divisible(mesh, "data", 12, "batch")
    with pytest.raises(ValueError, match="axis: 'model'"):
        sharding.batch_sharding(mesh, "model")
    with pytest.raises(ValueError, match="devices"):
        sharding.data_mesh([])
    with pytest.raises(TypeError, match="mesh"):
        sharding.auto_axes("data")


# --- the training loops and chain runners that take a Mesh keep their documented shardings ---


def _shards_batch(lowered) -> bool:
    # The batch's constraint to the data axis shows in the lowered module (Shardy), and the
    # partitioned program reduces the gradient across the devices with an all-reduce: a batch
    # silently replicated would have neither.
    constrained = (
        "sdy.sharding_constraint" in lowered.as_text() and '[{"data"}' in lowered.as_text()
    )
    return constrained and "all-reduce" in lowered.compile().as_text()


def test_policy_make_train_splits_each_minibatch_over_the_mesh():
    import optax

    from hexad import policy

    mesh = sharding.data_mesh()
    algo = policy.bc(policy.GaussianActor(2, hidden=(8,)), optax.adam(1e-3))
    n = 64
    data = policy.Batch(
        jnp.ones((n, 3)), jnp.zeros((n, 2)), jnp.zeros(n), jnp.ones((n, 3)), jnp.zeros(n)
    )
    train = jax.jit(policy.make_train(algo, n_steps=2, batch_size=16, mesh=mesh))
    state = algo.init(jax.random.key(0), data)
    lowered = train.lower(jax.random.key(1), state, data)
    assert _shards_batch(lowered), "the minibatch is not split over the 8 devices"
    # Documented: parameters and optimiser state come back replicated on every device.
    out_state, _ = lowered.compile().output_shardings
    assert all(s.is_fully_replicated for s in jax.tree.leaves(out_state))


def test_prefmh_run_chains_keeps_the_chains_split_over_the_mesh():
    from hexad import prefmh

    mesh = sharding.data_mesh()
    judge = prefmh.bradley_terry_judge(lambda x: -0.5 * jnp.sum(x**2))
    algo = prefmh.prefmh(judge, prefmh.random_walk(1.0))
    out = prefmh.run_chains(jax.random.key(0), algo, jnp.zeros((16, 2)), 20, mesh=mesh)
    # Documented: the chains are sharded along the data axis, in the state and in the trace.
    assert out.state.position.sharding.spec == PartitionSpec("data")
    assert out.trace.sharding.spec[0] == "data"
    assert len(out.trace.sharding.device_set) == 8


def test_rwefm_trainer_step_splits_the_clouds_over_the_mesh():
    import optax

    from hexad.geometry import Torus
    from hexad.rwefm import CloudBatch, NoiseModel, VectorField, make_trainer

    t2 = Torus(2)
    model = VectorField(t2, width=8, depth=1, heads=1)
    tr = make_trainer(
        t2, model, optax.adam(1e-3), NoiseModel(t2), pairing="none", mesh=sharding.data_mesh()
    )
    batch = CloudBatch(t2.random_uniform(jax.random.key(0), (16, 4)), jnp.ones((16, 4)))
    state = tr.init(jax.random.key(1), batch)
    lowered = jax.jit(tr.step).lower(jax.random.key(2), state, batch)
    assert _shards_batch(lowered), "the clouds are not split over the 8 devices"
    # Documented: parameters are replicated.
    out_state, _ = lowered.compile().output_shardings
    assert all(s.is_fully_replicated for s in jax.tree.leaves(out_state.params))


def test_backdoor_trainer_step_splits_the_batch_over_the_mesh():
    import optax

    from hexad.backdoor import SmallCNN, make_trainer

    tr = make_trainer(SmallCNN(2, (2,), 4), optax.sgd(0.1), mesh=sharding.data_mesh())
    batch = (jnp.zeros((16, 8, 8, 1)), jnp.zeros(16, int))
    state = tr.init(jax.random.key(0), batch)
    lowered = jax.jit(tr.step).lower(jax.random.key(1), state, batch)
    assert _shards_batch(lowered), "the batch is not split over the 8 devices"
    out_state, _ = lowered.compile().output_shardings
    assert all(s.is_fully_replicated for s in jax.tree.leaves(out_state))


# --- a process's rows of a batch (one process here; tests/test_distributed_families.py: two) ---


def test_process_rows_are_the_whole_batch_on_one_process():
    mesh = sharding.data_mesh()
    assert sharding.process_rows(mesh, 16) == slice(0, 16)
    x = np.arange(32, dtype=np.float32).reshape(16, 2)
    tree = sharding.from_process_rows(mesh, {"x": x, "y": x[:, 0]}, 16)
    assert tree["x"].sharding.spec == PartitionSpec("data")
    assert len(tree["x"].addressable_shards) == 8
    np.testing.assert_array_equal(np.asarray(tree["x"]), x)
    with pytest.raises(ValueError, match=r"local: expected 16 rows .* got shape \(12, 2\)"):
        sharding.from_process_rows(mesh, x[:12], 16)
    with pytest.raises(ValueError, match="^n: leading dimension 12"):
        sharding.process_rows(mesh, 12)
    put = sharding.put(x, sharding.batch_sharding(mesh))
    assert put.sharding.spec == PartitionSpec("data")
    np.testing.assert_array_equal(np.asarray(put), x)
