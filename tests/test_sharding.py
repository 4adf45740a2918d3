"""hexad.sharding: Auto-axis data meshes that work inside scans on 8 simulated devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec

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


def test_dtb_step_splits_outer_and_clean_rows_over_the_mesh():
    import optax

    from hexad import backdoor as bd

    pr = bd.DTBProblem(bd.patch_trigger((8, 8, 1), 2), bd.patch_trigger((8, 8, 1), 2, (0, 0)),
                       0, 1)  # fmt: skip
    cfg = bd.DTBConfig(inner_steps=1, inner_batch=8, family=("ft",))
    dtb = bd.make_dtb(bd.SmallCNN(2, (2,), 4), optax.sgd(0.1), cfg, pr, mesh=sharding.data_mesh())
    b = bd.DTBBatch(jnp.zeros((16, 8, 8, 1)), jnp.zeros(16, int), jnp.zeros((8, 8, 8, 1)),
                    jnp.zeros(8, int))  # fmt: skip
    state = dtb.init(jax.random.key(0), b)
    lowered = jax.jit(dtb.step).lower(jax.random.key(1), state, b)
    assert _shards_batch(lowered), "the rows are not split over the 8 devices"
    short = b._replace(x_clean=b.x_clean[:4], y_clean=b.y_clean[:4])
    with pytest.raises(ValueError, match="^batch.x_clean: leading dimension 4"):
        jax.jit(dtb.step).lower(jax.random.key(1), state, short)


def test_minimize_draws_follow_the_data_placement():
    import optax

    from hexad.backdoor import _train, minimize

    mesh = sharding.data_mesh()
    x = np.linspace(-1.0, 1.0, 32, dtype=np.float32)
    placed = sharding.from_process_rows(mesh, x, 32)
    assert sharding.row_placement(placed).spec == PartitionSpec("data")
    assert sharding.row_placement(x) is None
    assert sharding.row_placement(sharding.put(x, NamedSharding(mesh, PartitionSpec()))) is None
    loss = lambda p, k, b: jnp.mean((p - b) ** 2)
    args = (jnp.ones(()), loss)
    ref, _ = minimize(jax.random.key(0), *args, x, optax.sgd(0.1), 3, 16)
    got, _ = minimize(jax.random.key(0), *args, placed, optax.sgd(0.1), 3, 16)
    np.testing.assert_allclose(got, ref, rtol=1e-6)  # the same draws; a mean in another order
    static = dict(loss_fn=loss, update=optax.sgd(0.1).update, batch_size=16, project=None,
                  has_consts=False, rows=sharding.row_placement(placed))  # fmt: skip
    carry = (jnp.ones(()), optax.sgd(0.1).init(jnp.ones(())))
    lowered = _train._run_chunk.lower(carry, jax.random.split(jax.random.key(0), 1), placed,
                                      None, **static)  # fmt: skip
    assert _shards_batch(lowered), "the minibatch is not split over the 8 devices"
    with pytest.raises(ValueError, match="^batch_size: expected a multiple of the 8 shards"):
        minimize(jax.random.key(0), *args, placed, optax.sgd(0.1), 3, 12)


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
