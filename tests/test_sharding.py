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
