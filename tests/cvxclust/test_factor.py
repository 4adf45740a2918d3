"""FactorSolver: feasibility, an upper bound against SCS, the planted optimum, certificates."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hexad import cvxclust as cc
from tests.cvxclust.test_nuclear import _sbm, _scs_value

FACTOR = cc.FactorSolver(rank=32, steps=1000)
KEYS = 16


@pytest.fixture(scope="module")
def many():
    return jax.jit(jax.vmap(FACTOR, in_axes=(None, 0)))


@pytest.fixture(scope="module")
def planted():
    a, y = _sbm(np.random.default_rng(1), (5, 5, 5), 0.95, 0.05)
    return cc.graph_problem(a, 1.0), y


@pytest.fixture(scope="module")
def small():
    a, y = _sbm(np.random.default_rng(0), (4, 4, 4), 0.8, 0.25)
    return a, y


def _keys(seed=0):
    return jax.random.split(jax.random.key(seed), KEYS)


def _check_feasible(p, out):
    for i in range(KEYS):
        l = out.l[i]
        assert float(cc.box_violation(l)) == 0.0
        assert float(cc.min_eigenvalue(l)) >= -1e-12
        # ||L||_* = tr L = n for a PSD L in B: the reported objective is the exact one.
        np.testing.assert_allclose(out.objective[i], cc.nuclear_objective(p, l), rtol=1e-12)
    assert float(jnp.min(out.factor)) >= 0.0
    np.testing.assert_allclose(jnp.linalg.norm(out.factor, axis=-1), 1.0, rtol=1e-12)


def test_planted_optimum_reached_from_every_start_and_certified(many, planted):
    p, _ = planted
    out = many(p, _keys())
    _check_feasible(p, out)
    ref = _scs_value(p)
    # The PSD-hard optimum here has a non-negative factor. Measured over 64 keys (rank 32,
    # 1000 steps): every start within 4e-10 of SCS's value, which is SCS's own accuracy at
    # eps 1e-9; the bar leaves 2500x of room.
    assert float(jnp.max(jnp.abs(out.objective - ref))) <= 1e-6 * abs(ref)
    s = jax.jit(cc.NuclearSolver(tol=1e-7, max_iters=5000))(p)
    cert = jax.vmap(cc.nuclear_certificate, in_axes=(None, 0, None))(p, out.l, s.rho * s.dual)
    # Measured: 5.3e-8 with the ADMM's multiplier at tol 1e-7.
    assert float(jnp.max(cert.rel_gap)) <= 1e-6


@pytest.mark.parametrize("psd", [True, False])
def test_factor_point_is_an_upper_bound(many, small, psd):
    a, _ = small
    p = cc.graph_problem(a, 1.5, nonedge_weight=0.6, psd=psd)
    out = many(p, _keys(1))
    _check_feasible(p, out)
    ref = _scs_value(p)
    # Weak duality: a feasible point is never below the optimum (SCS at eps 1e-9). The factor
    # set is a strict subset here (measured: 6.2e-4 above the PSD-hard optimum from every
    # start, and 0.24 above the soft one, whose optimum is not PSD), so this is a bound only.
    assert float(jnp.min(out.objective)) >= ref - 1e-6 * abs(ref)


def test_a_warm_start_never_gets_worse(small):
    a, y = small
    p = cc.graph_problem(a, 1.5, nonedge_weight=0.6)
    f = jax.jit(cc.FactorSolver(rank=8, steps=20))
    first = f(p, jax.random.key(3))
    # The start is the first point the best-iterate rule scores.
    again = f(p, first.factor)
    assert float(again.objective) <= float(first.objective) * (1 + 1e-12)
    # A zero row restarts on the all-ones direction, and the result is feasible.
    out = f(p, jax.nn.one_hot(y, 8, dtype=p.target.dtype).at[0].set(0.0))
    assert float(cc.box_violation(out.l)) == 0.0
    assert float(jnp.min(out.factor)) >= 0.0
    np.testing.assert_allclose(jnp.linalg.norm(out.factor, axis=-1), 1.0, rtol=1e-12)


def test_traces_once_across_keys(planted):
    p, _ = planted
    f = jax.jit(chex.assert_max_traces(FACTOR.__call__, n=1))
    for k in _keys(2)[:3]:
        f(p, k)


def test_bad_input_raises(planted):
    p, _ = planted
    key = jax.random.key(0)
    for kw, name in [
        (dict(rank=0), "rank"),
        (dict(steps=0), "steps"),
        (dict(power_iters=0), "power_iters"),
        (dict(momentum=1.0), "momentum"),
        (dict(step_scale=0.0), "step_scale"),
        (dict(step_scale=4.0), "step_scale"),
    ]:
        with pytest.raises(ValueError, match=name):
            cc.FactorSolver(**kw)(p, key)
    with pytest.raises(ValueError, match="init"):
        FACTOR(p, jnp.ones((p.n, FACTOR.rank + 1)))
