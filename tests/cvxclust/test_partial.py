"""The rank-k (partial eigendecomposition) path of NuclearSolver: agreement with the full eigh,
the adaptive rank, the outside-the-subspace check and its input validation."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hexad import cvxclust as cc

TOL = 1e-7
FULL = cc.NuclearSolver(tol=TOL, max_iters=5000)


def _planted(seed: int = 5):
    """Three planted clusters of 10 nodes (p = 0.9, q = 0.1): the optimum at ``mu = 5`` is the
    planted partition, of rank 3, for both programs."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(3), 10)
    prob = np.where(y[:, None] == y[None, :], 0.9, 0.1)
    a = np.triu(rng.random(prob.shape) < prob, 1).astype(float)
    return a + a.T, y


@pytest.fixture(scope="module", params=[True, False], ids=["psd", "soft"])
def case(request):
    a, y = _planted()
    p = cc.graph_problem(a, 5.0, psd=request.param)
    return p, jax.jit(FULL)(p), y


KWS = [dict(rank=8), dict(rank=2, max_rank=16), dict(rank=2, max_rank=16, rank_margin=3)]


@pytest.mark.parametrize("kw", KWS, ids=["fixed", "grown", "tracked"])
def test_partial_solve_matches_full_eigh(case, kw):
    p, full, y = case
    low = jax.jit(FULL.replace(**kw))(p)
    assert bool(full.converged) and bool(low.converged) and not bool(low.rank_saturated)
    assert int(low.rank) == int(full.rank) == 3
    # Both solves stop at relative residuals <= TOL; |L - Z| <= TOL max(1, ||L||_F) <= TOL n
    # entrywise, and the optimum here is unique (the planted partition), so the two solutions
    # differ by the solvers' distances to it: allow 1000 TOL (3x the TOL n = 3e-6 bound plus
    # the ADMM's distance to the fixed point; measured 1e-7). The objective is Lipschitz in L
    # with constant sum C + mu n <= 2 n^2 here; relative to its value (~230) that allows 10 TOL
    # (measured 7e-8 relative).
    np.testing.assert_allclose(np.asarray(low.l), np.asarray(full.l), atol=1000 * TOL)
    np.testing.assert_allclose(float(low.objective), float(full.objective), rtol=10 * TOL)
    truth = (y[:, None] == y[None, :]).astype(float)
    assert float(cc.recovery_error(low.l, jnp.asarray(y))) <= 1000 * TOL
    # The planted partition is the optimum: its objective is the reference value.
    opt = float(cc.nuclear_objective(p, jnp.asarray(truth)))
    np.testing.assert_allclose(float(low.objective), opt, rtol=10 * TOL)
    if "rank_margin" in kw:
        # The start Z = I keeps every eigenvalue, so k first grows (levels 2, 3, 4, 5, 7, 9,
        # 12, 15, 16); it then tracks the kept rank 3 plus the margin 3: the level of 7. (With
        # margins of 1 and 2 the step at the subspace's edge kept a fourth eigenvalue of 3e-7
        # and 4e-8 at convergence: within tolerance, but the rank counted would read 4.)
        assert int(low.subspace_rank) == 7
    elif "max_rank" in kw:
        # It grew from 2 (too small for rank 3) and stopped at a sufficient size.
        assert 4 <= int(low.subspace_rank) <= 16
    else:
        assert int(low.subspace_rank) == 8
    cert = cc.nuclear_certificate(p, low.l, low.rho * low.dual)
    assert float(cert.rel_gap) <= 1e-5


def test_warm_start_keeps_the_subspace_and_its_rank(case):
    p, _, _ = case
    solver = jax.jit(FULL.replace(rank=2, max_rank=16))
    out = solver(p)
    again = solver(p, (out.l, out.dual, out.rho, out.subspace))
    # Restarted at its own fixed point with its subspace, the solve starts at the rank it had
    # reached and stops within a few steps (a cold start takes about 20).
    assert bool(again.converged) and not bool(again.rank_saturated)
    assert int(again.subspace_rank) == int(out.subspace_rank)
    assert int(again.n_iters) <= 5
    with pytest.raises(ValueError, match="subspace"):
        solver(p, (out.l, out.dual, out.rho, jnp.zeros((p.n, 17))))


def test_tracked_rank_shrinks_from_a_large_warm_subspace(case):
    p, _, _ = case
    # A neighbouring grid value's solve (mu = 4) on a 16-column subspace as the warm start.
    near = cc.graph_problem(_planted()[0], 4.0, psd=p.psd)
    prev = jax.jit(FULL.replace(rank=16))(near)
    start = (prev.l, prev.dual, prev.rho, prev.subspace)
    again = jax.jit(FULL.replace(rank=2, max_rank=16, rank_margin=3))(p, start)
    # It starts at the top level (16 live columns) and steps down to the kept rank 3 plus the
    # margin 3 (level 7) in the 12 steps it takes to converge; the answer stays exact.
    assert bool(again.converged) and not bool(again.rank_saturated)
    assert int(again.rank) == 3 and int(again.subspace_rank) == 7
    assert float(cc.nuclear_certificate(p, again.l, again.rho * again.dual).rel_gap) <= 1e-5


def test_ritz_step_with_a_rank_deficient_residual_block():
    # q holds the top 8 eigenvectors and two mixes (u_8 + u_20, u_9 + u_21) / sqrt 2: its
    # residual block (I - q q^T) m q has rank 2 of 10 columns. The extension must stay
    # orthonormal to q: a QR of the projected residual alone gave 8 columns along q (basis
    # off orthonormal by 2.4e-2) and Ritz values above the largest eigenvalue (10.0055 for
    # 10). span[q, m q] holds the top 10 eigenvectors, so one sweep returns them to rounding.
    n, k = 40, 10
    rng = np.random.default_rng(2)
    u = np.linalg.qr(rng.normal(size=(n, n)))[0]
    lam = np.linspace(10.0, -3.0, n)
    m = jnp.asarray((u * lam) @ u.T)
    mixes = [(u[:, 8] + u[:, 20]) / np.sqrt(2), (u[:, 9] + u[:, 21]) / np.sqrt(2)]
    base = np.c_[u[:, :8], np.stack(mixes, 1)]
    q = jnp.asarray(np.linalg.qr(base @ np.linalg.qr(rng.normal(size=(k, k)))[0])[0])
    got, vec = cc.NuclearSolver(power_iters=1)._ritz_step(m, q, True)
    np.testing.assert_allclose(np.sort(np.asarray(got))[::-1], lam[:k], atol=1e-9)
    np.testing.assert_allclose(np.asarray(vec.T @ vec), np.eye(k), atol=1e-9)


def test_too_small_fixed_rank_is_flagged(case):
    p, full, _ = case
    low = jax.jit(FULL.replace(rank=2))(p)
    # rank 2 < 3 = the optimum's rank: no rank-2 step is the exact prox, and the output says so;
    # its answer is worse than the optimum (by a planted block's worth of cost, not a rounding).
    assert bool(low.rank_saturated)
    assert float(low.objective) > float(full.objective) + 1.0


@pytest.mark.parametrize("psd", [True, False], ids=["psd", "soft"])
def test_outside_check_reads_the_right_end_of_the_spectrum(psd):
    # m has eigenvalues 9, 7 (spanned by q), 3 and -50 outside, the rest in [-1, 1]: the
    # PSD-hard step only keeps positive eigenvalues, so the check must report 3 (a big
    # negative eigenvalue is harmless); the soft step keeps both signs, so it must report 50.
    n = 40
    rng = np.random.default_rng(0)
    u = np.linalg.qr(rng.normal(size=(n, n)))[0]
    lam = np.r_[9.0, 7.0, 3.0, -50.0, rng.uniform(-1, 1, n - 4)]
    m = jnp.asarray((u * lam) @ u.T)
    q = jnp.asarray(u[:, :2])
    est = cc.NuclearSolver(check_iters=30)._outside_spectrum(m, q, psd, 30)
    # Lanczos with full reorthogonalisation on a 38-dimensional space: 30 steps resolve the
    # isolated ends to near machine precision (the gaps are over 2 on a spread of 53).
    np.testing.assert_allclose(float(est), 3.0 if psd else 50.0, rtol=1e-8)


def test_check_flags_a_missed_eigenvalue_the_ritz_values_do_not_show():
    # A subspace of 4 that holds the eigenvalues -50, -40, 9, 7 but misses 3: with threshold
    # t = 1 the PSD-hard step keeps 2 of 4 (not "all kept"), yet 3 > t lies outside.
    n = 40
    rng = np.random.default_rng(1)
    u = np.linalg.qr(rng.normal(size=(n, n)))[0]
    lam = np.r_[-50.0, -40.0, 9.0, 7.0, 3.0, rng.uniform(-0.5, 0.5, n - 5)]
    m = jnp.asarray((u * lam) @ u.T)
    est = cc.NuclearSolver()._outside_spectrum(m, jnp.asarray(u[:, :4]), True, 30)
    assert float(est) > 1.0
    est = cc.NuclearSolver()._outside_spectrum(m, jnp.asarray(u[:, :5]), True, 30)
    assert float(est) <= 0.5 + 1e-8


def test_one_trace_per_jitted_partial_solve():
    a, _ = _planted()

    @jax.jit
    @chex.assert_max_traces(n=1)
    def f(p):
        return cc.NuclearSolver(tol=1e-3, max_iters=50, rank=2, max_rank=8)(p)

    for mu in (0.5, 1.0, 3.0):
        f(cc.graph_problem(a, mu))


def test_split_caps_the_adaptive_rank_at_each_block():
    a, y = _planted()
    two = np.kron(np.eye(2), a)  # two disconnected copies: two blocks of 30
    p = cc.graph_problem(two, 5.0)
    solver = cc.SplitNuclearSolver(FULL.replace(rank=2, max_rank=64), small_max=5)
    out = solver(p)
    assert bool(out.converged) and not bool(out.rank_saturated)
    assert int(out.rank) == 6 and 4 <= int(out.subspace_rank) <= 30
    assert float(cc.recovery_error(out.l, jnp.asarray(np.r_[y, y + 3]))) <= 1000 * TOL


def test_bad_rank_input_raises():
    p = cc.graph_problem(np.ones((3, 3)) - np.eye(3), 1.0)
    for kw, match in (
        (dict(rank=0), "rank"),
        (dict(rank=4), "rank"),
        (dict(rank=1.5), "rank"),
        (dict(rank=2, max_rank=1), "max_rank"),
        (dict(rank=2, max_rank=4), "max_rank"),
        (dict(max_rank=2), "max_rank"),
        (dict(rank=2, rank_margin=1), "rank_margin"),
        (dict(rank=1, max_rank=2, rank_margin=-1), "rank_margin"),
        (dict(rank=2, power_iters=0), "power_iters"),
        (dict(rank=2, check_iters=-1), "check_iters"),
    ):
        with pytest.raises(ValueError, match=match):
            cc.NuclearSolver(**kw)(p)
