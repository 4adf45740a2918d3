"""The shared test set-up does what docs/design.md says it does."""

import jax
import jax.numpy as jnp
import pytest


def test_eight_simulated_devices():
    assert jax.device_count() == 8


def test_rank_promotion_raises():
    with pytest.raises(ValueError, match="rank promotion|rank_promotion"):
        _ = jnp.ones((3, 2)) + jnp.ones((2,))


def test_float64_fixture_is_opt_in(float64):
    assert jnp.ones(1, jnp.float64).dtype == jnp.float64


def test_float32_by_default():
    assert jnp.ones(1).dtype == jnp.float32


def test_key_fixture_is_a_typed_key(key):
    assert jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
