"""Glue for the cvxclust studies: what a study records of a ``NuclearSolver`` solve, and the
duality-gap certificate of its answer."""

from __future__ import annotations

from typing import Any

import jax

from hexad import cvxclust as cc

_certificate = jax.jit(cc.nuclear_certificate)


def solve_report(out: cc.NuclearOutput) -> dict[str, Any]:
    """Per-solve convergence record: iterations, last residuals, rank."""
    it = int(out.n_iters)
    return {
        "iters": it,
        "converged": bool(out.converged),
        "primal_res": float(out.primal_residuals[it - 1]),
        "dual_res": float(out.dual_residuals[it - 1]),
        "rank": int(out.rank),
        "rank_saturated": bool(out.rank_saturated),
    }


def certify(problem: cc.NuclearProblem, out: cc.NuclearOutput, tol: float) -> dict[str, Any]:
    """``rel_gap``: the relative duality gap of the better of the output's two primal
    candidates (``Z`` and the eigen-thresholded ``L``, each projected onto ``B``: both are
    upper bounds) against the ADMM multiplier ``rho * dual``; ``certified``: ``rel_gap <= tol``.
    Two dense ``n x n`` eigendecompositions per candidate."""
    y = out.rho * out.dual
    gap = min(float(_certificate(problem, c, y).rel_gap) for c in (out.l, out.low_rank))
    return {"rel_gap": gap, "certified": bool(gap <= tol)}
