"""Critic-guided steering: reaches the critic's maximiser inside the trust region, else clips."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hexad import policy as P


def _q(target):
    return lambda s, a: -jnp.sum(jnp.square(a - target), axis=-1)


def test_steer_reaches_interior_maximiser():
    target = jnp.array([[0.3, -0.6], [0.0, 0.9]])
    a = P.q_steer(_q(target), jnp.zeros((2, 3)), jnp.zeros((2, 2)), 1.0, 300, max_shift=5.0)
    np.testing.assert_allclose(a, target, atol=1e-4)  # concave in a, argmax inside (-1, 1)


def test_steer_trust_region_and_identity():
    u0 = jnp.zeros((1, 1))
    a = P.q_steer(_q(jnp.array([[0.99]])), jnp.zeros((1, 1)), u0, 1.0, 300, max_shift=0.5)
    np.testing.assert_allclose(a, np.tanh(0.5), rtol=1e-5)  # clipped at u0 + max_shift
    # One trust region per state.
    shifts = jnp.array([0.25, 0.5])
    a = P.q_steer(_q(0.99), jnp.zeros((2, 1)), jnp.zeros((2, 1)), 1.0, 300, max_shift=shifts)
    np.testing.assert_allclose(a[:, 0], np.tanh(shifts), rtol=1e-5)
    u = jnp.array([[0.7, -0.2]])
    np.testing.assert_allclose(P.q_steer(_q(0.0), u, u, 1.0, 0), np.tanh(u), rtol=1e-6)


def test_steer_traces_once_and_bad_input():
    f = jax.jit(chex.assert_max_traces(lambda t, u: P.q_steer(_q(t), u, u, 0.5, 5), n=1))
    for i in range(3):
        f(jnp.full((4, 2), 0.1 * i), jnp.zeros((4, 2)))
    with pytest.raises(ValueError, match="step_size"):
        P.q_steer(_q(0.0), jnp.zeros((1, 1)), jnp.zeros((1, 1)), step_size=0.0)
    with pytest.raises(ValueError, match="n_steps"):
        P.q_steer(_q(0.0), jnp.zeros((1, 1)), jnp.zeros((1, 1)), n_steps=-1)
    with pytest.raises(ValueError, match="max_shift"):
        P.q_steer(_q(0.0), jnp.zeros((2, 1)), jnp.zeros((2, 1)), max_shift=jnp.array([1.0, 0.0]))
    with pytest.raises(ValueError, match="rows"):
        P.q_steer(_q(0.0), jnp.zeros((2, 1)), jnp.zeros((1, 1)))
