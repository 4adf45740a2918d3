"""Exactness of the acceptance rules on a small discrete space, in float64.

For each rule we build the exact transition matrix ``P = Q * A`` (plus the rejection mass on
the diagonal) with ``A(x, y) = E[a(W)]`` from :func:`acceptance_probability`, and check
detailed balance and ``pi P = pi`` to 1e-10.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import optimize, stats

from hexad import prefmh

N_STATES = 6


def _problem(symmetric: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    logpi = rng.normal(scale=1.5, size=N_STATES)
    logpi -= np.log(np.sum(np.exp(logpi)))
    w = rng.uniform(0.2, 1.0, size=(N_STATES, N_STATES))
    if symmetric:
        w = w + w.T
    np.fill_diagonal(w, 0.0)
    q = w / w.sum(axis=1, keepdims=True)  # row-stochastic, full off-diagonal support
    return logpi, q


def _transition(rule: str, logpi, q, k: int) -> np.ndarray:
    lp = jnp.asarray(logpi)
    log_p_win = lp[None, :] - jnp.logaddexp(lp[None, :], lp[:, None])  # P(y beats x), [x, y]
    with np.errstate(divide="ignore", invalid="ignore"):
        log_rho = np.log(q.T) - np.log(q)
    np.fill_diagonal(log_rho, 0.0)
    a = np.asarray(prefmh.acceptance_probability(rule, log_p_win, jnp.asarray(log_rho), k))
    p = q * a
    np.fill_diagonal(p, 0.0)
    np.fill_diagonal(p, 1.0 - p.sum(axis=1))
    return p


def _stationary(p: np.ndarray) -> np.ndarray:
    # Solve pi (P - I) = 0 with sum(pi) = 1 by least squares.
    n = p.shape[0]
    a = np.vstack([(p - np.eye(n)).T, np.ones((1, n))])
    b = np.zeros(n + 1)
    b[-1] = 1.0
    return np.linalg.lstsq(a, b, rcond=None)[0]


@pytest.mark.parametrize("symmetric", [True, False])
def test_kbudget_exact_for_k_1_to_9(float64, symmetric):
    logpi, q = _problem(symmetric)
    pi = np.exp(logpi)
    for k in range(1, 10):
        p = _transition("kbudget", logpi, q, k)
        assert p.dtype == np.float64
        assert np.all(p >= -1e-15) and np.allclose(p.sum(1), 1.0, atol=1e-12)
        flow = pi[:, None] * p
        np.testing.assert_allclose(flow, flow.T, atol=1e-10, rtol=0, err_msg=f"K={k}")
        np.testing.assert_allclose(pi @ p, pi, atol=1e-10, rtol=0)
        np.testing.assert_allclose(_stationary(p), pi, atol=1e-10, rtol=0)


@pytest.mark.parametrize("rule", ["mh", "barker_oracle", "two_coin"])
@pytest.mark.parametrize("symmetric", [True, False])
def test_reference_rules_exact(float64, rule, symmetric):
    logpi, q = _problem(symmetric, seed=1)
    pi = np.exp(logpi)
    p = _transition(rule, logpi, q, 1)
    flow = pi[:, None] * p
    np.testing.assert_allclose(flow, flow.T, atol=1e-10, rtol=0)
    np.testing.assert_allclose(_stationary(p), pi, atol=1e-10, rtol=0)


@pytest.mark.parametrize("symmetric", [True, False])
def test_majority_vote_is_not_exact(float64, symmetric):
    logpi, q = _problem(symmetric, seed=2)
    pi = np.exp(logpi)
    for k in (3, 5):
        p = _transition("majority", logpi, q, k)
        flow = pi[:, None] * p
        assert np.max(np.abs(flow - flow.T)) > 1e-3
        # Its stationary law differs from the target by a visible total variation.
        assert 0.5 * np.abs(_stationary(p) - pi).sum() > 1e-2


def test_k1_symmetric_is_barker_and_large_k_tends_to_mh(float64):
    log_p = jnp.log(jnp.linspace(0.01, 0.99, 41))
    zero = jnp.zeros_like(log_p)
    k1 = prefmh.acceptance_probability("kbudget", log_p, zero, 1)
    np.testing.assert_allclose(k1, np.exp(log_p), atol=1e-14)  # Barker: a = p
    mh = prefmh.acceptance_probability("mh", log_p, zero)
    gaps = [
        float(jnp.max(jnp.abs(prefmh.acceptance_probability("kbudget", log_p, zero, k) - mh)))
        for k in (1, 9, 99, 999)
    ]
    assert all(b < a for a, b in itertools.pairwise(gaps))
    # The gap to MH shrinks like 1/sqrt(K) near p = 1/2 (measured 0.025 at K = 999).
    assert gaps[-1] < 0.03 and gaps[-1] < gaps[1] / 4


def test_even_budget_wastes_its_last_comparison(float64):
    log_p = jnp.log(jnp.linspace(0.01, 0.99, 41))
    zero = jnp.zeros_like(log_p)
    for m in (1, 2, 3, 4):
        odd = prefmh.acceptance_probability("kbudget", log_p, zero, 2 * m - 1)
        even = prefmh.acceptance_probability("kbudget", log_p, zero, 2 * m)
        np.testing.assert_allclose(even, odd, atol=1e-13)


def _exact_rule_lp(k: int, rho: float, objective: np.ndarray) -> float:
    """Max of ``objective @ a_rho`` over all exact rules (a_rho, a_{1/rho}) in [0, 1]."""
    nv = 2 * (k + 1)  # a_rho(0..K), then a_{1/rho}(0..K)
    rows, rhs = [], []
    for j in range(1, k + 1):  # (K+1-j) a_rho(j) = rho j a_{1/rho}(K+1-j)
        r = np.zeros(nv)
        r[j] = k + 1 - j
        r[k + 1 + (k + 1 - j)] = -rho * j
        rows.append(r)
        rhs.append(0.0)
    for idx in (0, k + 1):  # a(0) = 0 for both
        r = np.zeros(nv)
        r[idx] = 1.0
        rows.append(r)
        rhs.append(0.0)
    c = np.zeros(nv)
    c[: k + 1] = -objective
    res = optimize.linprog(c, A_eq=np.array(rows), b_eq=np.array(rhs), bounds=(0, 1))
    assert res.status == 0
    return -res.fun


@pytest.mark.parametrize("rho", [1.0, pytest.param(0.4, marks=pytest.mark.slow), 2.5])
def test_astar_dominates_every_exact_rule_linprog(float64, rho):
    for k in range(1, 10):
        a_star = np.asarray(prefmh.kbudget_acceptance(jnp.arange(k + 1), k, jnp.log(rho)))
        # a* is itself exact ...
        a_rev = np.asarray(prefmh.kbudget_acceptance(jnp.arange(k + 1), k, -jnp.log(rho)))
        for j in range(1, k + 1):
            assert abs((k + 1 - j) * a_star[j] - rho * j * a_rev[k + 1 - j]) < 1e-12
        # ... and pointwise largest: no exact rule exceeds a*(j) at any j ...
        for j in range(k + 1):
            e = np.zeros(k + 1)
            e[j] = 1.0
            assert _exact_rule_lp(k, rho, e) <= a_star[j] + 1e-9
        # ... hence it maximises every off-diagonal transition q(x,y) E_p[a(W)].
        for p in (0.1, 0.5, 0.8):
            pmf = stats.binom.pmf(np.arange(k + 1), k, p)
            assert abs(_exact_rule_lp(k, rho, pmf) - pmf @ a_star) < 1e-9


def test_closed_forms():
    assert float(prefmh.mh_acceptance(jnp.log(0.25))) == pytest.approx(0.25)
    assert float(prefmh.mh_acceptance(jnp.array(3.0))) == 1.0
    assert float(prefmh.barker_acceptance(jnp.log(3.0))) == pytest.approx(0.75)
    assert float(prefmh.two_coin_acceptance(jnp.log(0.5), jnp.log(3.0))) == pytest.approx(0.75)
    k = jnp.arange(4)
    np.testing.assert_allclose(prefmh.kbudget_acceptance(k, 3, 0.0), [0, 1 / 3, 1, 1], rtol=1e-6)
    # rho = inf accepts any win and rho = 0 none; zero wins never accept, whatever rho.
    np.testing.assert_allclose(prefmh.kbudget_acceptance(k, 3, jnp.inf), [0, 1, 1, 1])
    np.testing.assert_allclose(prefmh.kbudget_acceptance(k, 3, -jnp.inf), [0, 0, 0, 0])
    np.testing.assert_allclose(
        prefmh.kbudget_acceptance(k, 3, jnp.log(0.5)), [0, 1 / 6, 1 / 2, 1], rtol=1e-6
    )
    np.testing.assert_allclose(prefmh.majority_acceptance(k, 3), [0, 0, 1, 1])
    np.testing.assert_allclose(prefmh.majority_acceptance(jnp.arange(3), 2), [0, 0.5, 1])


def test_bad_rule_and_budget():
    with pytest.raises(ValueError, match="rule"):
        prefmh.acceptance_probability("bogus", jnp.log(0.5), 0.0)
    with pytest.raises(ValueError, match="num_comparisons"):
        prefmh.acceptance_probability("kbudget", jnp.log(0.5), 0.0, 0)
    with pytest.raises(ValueError, match=r"num_comparisons: expected an int >= 1, got 1\.5"):
        prefmh.acceptance_probability("kbudget", jnp.log(0.5), 0.0, 1.5)


def test_comparison_rules_at_p_zero_and_one():
    # p = 0 (pi(y) = 0) and p = 1 (pi(x) = 0), also float32 underflow of a score gap of 120:
    # W is 0 or K surely (0 log 0 = 0), so kbudget and majority give exact 0 or 1, like mh.
    log_p = jnp.array([-jnp.inf, 0.0, jax.nn.log_sigmoid(jnp.float32(120.0))])
    zero = jnp.zeros_like(log_p)
    for k in (1, 2, 3):
        for rule in ("mh", "barker_oracle", "kbudget", "majority"):
            a = np.asarray(prefmh.acceptance_probability(rule, log_p, zero, k))
            np.testing.assert_array_equal(a, [0.0, 1.0, 1.0], err_msg=f"{rule}, K={k}")
