"""A feasible point of the nuclear programs from a non-negative low-rank factor.

For ``V >= 0`` ``[n, r]`` with unit rows, ``L = V V^T`` lies in ``B`` (entries
``v_u . v_v in [0, 1]``, unit diagonal) and is PSD, so it is feasible for the PSD-hard and the
soft program alike, and its objective is an upper bound on both optima. On ``B`` and for a
binary target ``A`` the data term is linear, ``sum C |L - A| = sum C A + <C (1 - 2A), L>``, so
over such factors the program is ``min <K, V V^T>`` with ``K = C (1 - 2A) - S`` off the
diagonal (``mu ||L||_* = mu tr L = mu n`` is constant for a PSD ``L``): the Burer-Monteiro
factorisation of the PSD-hard program (Burer & Monteiro 2003) restricted to non-negative
factors. :class:`FactorSolver` runs projected gradient descent with momentum on it.

Each step is one ``[n, n] x [n, r]`` product, where an ADMM step of
:class:`~hexad.cvxclust.NuclearSolver` needs an eigendecomposition or a block Krylov sweep,
and every iterate is feasible, where the ADMM's are so only in the limit. It is a heuristic:
the factor set is non-convex, and the completely positive matrices ``V V^T`` are a strict
subset of the feasible ones, so the best factor can stay above the optimum. It gives an upper
bound; a dual multiplier from :class:`~hexad.cvxclust.NuclearSolver` gives the lower bound
that certifies it (:func:`~hexad.cvxclust.nuclear_certificate`). The point is also a start
for that solver (``init=out.l``): its ADMM then starts from a near-optimal ``Z``.

For a target with fractional entries ``C (A + (1 - 2A) L)`` is the chord above
``C |L - A|`` on ``[0, 1]``: the descent then minimises that majoriser, and the objective
reported is still the exact one.
"""

from __future__ import annotations

from typing import NamedTuple

import flax.struct
import jax
import jax.numpy as jnp

from hexad._base import check_int, check_unit
from hexad.cvxclust._nuclear import NuclearProblem, _data_term, _project_b

__all__ = ["FactorOutput", "FactorSolver"]


class FactorOutput(NamedTuple):
    r"""What :class:`FactorSolver` returns.

    Attributes:
      l: ``[n, n]`` :math:`V V^\top` of the best factor, in :math:`B` (clipped to
        :math:`[0, 1]` with a unit diagonal against rounding) and PSD up to rounding.
      factor: ``[n, rank]`` the best factor ``V``: non-negative, unit rows.
      objective: ``nuclear_objective(problem, l)``, computed as the data term plus
        :math:`\mu n` (:math:`\|L\|_* = \operatorname{tr} L = n` for a PSD :math:`L` in
        :math:`B`): an upper bound on the optimum of the PSD-hard and of the soft program.
    """

    l: jax.Array
    factor: jax.Array
    objective: jax.Array


def _unit_rows(v):
    v = jnp.maximum(v, 0.0)
    norm = jnp.linalg.norm(v, axis=1, keepdims=True)
    # A row that the step drove to zero restarts on the all-ones direction.
    return jnp.where(norm > 0.0, v / jnp.where(norm > 0.0, norm, 1.0), v.shape[1] ** -0.5)


@flax.struct.dataclass
class FactorSolver:
    r"""Projected gradient descent with momentum over non-negative unit-row factors.

    Minimises :math:`\langle K, V V^\top \rangle` over :math:`V \ge 0` ``[n, rank]`` with unit
    rows: for such factors :math:`L = V V^\top` lies in the box :math:`B` and is PSD, and for a
    binary target the nuclear program's objective there is this linear function plus a
    constant (:math:`K = C (1 - 2A) - S` off the diagonal), the Burer-Monteiro factorisation of
    the PSD-hard program restricted to non-negative factors. With :math:`P`
    the projection onto non-negative unit rows, :math:`\beta` the ``momentum`` and
    :math:`\eta` = ``step_scale`` :math:`/ \|K\|_2` (the norm from ``power_iters`` power
    iterations from a fixed random vector),

    .. math::

       Y = P\big(V_t + \beta (V_t - V_{t-1})\big), \qquad V_{t+1} = P(Y - 2 \eta K Y).

    It keeps the extrapolated point :math:`Y` of lowest :math:`\langle K, Y Y^\top \rangle`
    (read off the step's own product :math:`K Y`). All settings static; one
    ``[n, n] x [n, rank]`` product per step. Many starts: ``jax.vmap`` over keys.

    Attributes:
      rank: columns of ``V``; the non-negative rank the optimum needs is at least its number
        of clusters.
      steps: gradient steps.
      momentum: extrapolation weight in ``[0, 1)``.
      step_scale: :math:`\eta \|K\|_2`, in ``(0, 4)``.
      power_iters: power iterations for :math:`\|K\|_2`.

    >>> from hexad import cvxclust as cc
    >>> p = cc.graph_problem(jnp.kron(jnp.eye(2), jnp.ones((3, 3))), 1.0)
    >>> out = jax.jit(FactorSolver(rank=4, steps=200))(p, jax.random.key(0))
    >>> float(cc.recovery_error(out.l, jnp.array([0, 0, 0, 1, 1, 1]))) < 1e-3
    True
    """

    rank: int = flax.struct.field(pytree_node=False, default=128)
    steps: int = flax.struct.field(pytree_node=False, default=2000)
    momentum: float = flax.struct.field(pytree_node=False, default=0.5)
    step_scale: float = flax.struct.field(pytree_node=False, default=1.0)
    power_iters: int = flax.struct.field(pytree_node=False, default=30)

    def __post_init__(self) -> None:
        self._check()

    def _check(self) -> None:
        check_int("rank", self.rank, 1)
        check_int("steps", self.steps, 1)
        check_int("power_iters", self.power_iters, 1)
        check_unit("momentum", self.momentum, lo_open=False)
        if not 0.0 < self.step_scale < 4.0:
            raise ValueError(f"step_scale: expected a float in (0, 4), got {self.step_scale!r}")

    def __call__(self, problem: NuclearProblem, init) -> FactorOutput:
        """Descends from ``init``: a PRNG key (a uniform random non-negative start) or an
        ``[n, rank]`` start (projected onto non-negative unit rows first)."""
        self._check()
        n, dt = problem.n, problem.target.dtype
        if isinstance(init, jax.Array) and jnp.issubdtype(init.dtype, jax.dtypes.prng_key):
            v0 = jax.random.uniform(init, (n, self.rank), dt)
        else:
            v0 = jnp.asarray(init, dt)
            if v0.shape != (n, self.rank):
                raise ValueError(
                    f"init: expected a PRNG key or an [{n}, {self.rank}] start, got {v0.shape}"
                )
        v0 = _unit_rows(v0)
        eye = jnp.eye(n, dtype=bool)
        a, c, s = problem.target, problem.cost, problem.linear
        k = c * (1.0 - 2.0 * a) - s
        k = jnp.where(eye, 0.0, 0.5 * (k + k.T))

        def power(_, x):
            y = k @ x
            return y / jnp.maximum(jnp.linalg.norm(y), jnp.finfo(dt).tiny)

        # A fixed random start: almost surely not orthogonal to the top eigenvector.
        x0 = jax.random.normal(jax.random.key(1), (n,), dt)
        x = jax.lax.fori_loop(0, self.power_iters, power, x0 / jnp.linalg.norm(x0))
        knorm = jnp.linalg.norm(k @ x)
        eta = self.step_scale / jnp.maximum(knorm, jnp.finfo(dt).tiny)

        def body(_, carry):
            v, v_prev, best, best_f = carry
            y = _unit_rows(v + self.momentum * (v - v_prev))
            ky = k @ y
            f = jnp.sum(ky * y)
            better = f < best_f
            best, best_f = jnp.where(better, y, best), jnp.where(better, f, best_f)
            return _unit_rows(y - 2.0 * eta * ky), v, best, best_f

        inf = jnp.asarray(jnp.inf, dt)
        v, _, best, best_f = jax.lax.fori_loop(0, self.steps, body, (v0, v0, v0, inf))
        f_last = jnp.sum((k @ v) * v)
        best = jnp.where(f_last < best_f, v, best)
        l = _project_b(best @ best.T)
        return FactorOutput(l=l, factor=best, objective=_data_term(problem, l) + problem.mu * n)
