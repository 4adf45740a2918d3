"""float64 for the whole cvxclust test modules: CVXPY agreement at 1e-4 needs it."""

import jax
import pytest


@pytest.fixture(scope="module", autouse=True)
def x64_module():
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", previous)
