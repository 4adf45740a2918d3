"""float64 for the whole cvxclust test modules: CVXPY agreement at 1e-4 needs it."""

import pytest


@pytest.fixture(scope="module", autouse=True)
def x64_module(float64_module):
    yield
