"""Exact splitting of the nuclear-norm program into independent blocks ("super-components").

For ``min_{L in B} F(L) + mu ||L||_*`` with the separable data term
``F(L) = sum_{u != v} f_uv(L_uv)``, ``f_uv(z) = C_uv |z - A_uv| - S_uv z``
(:class:`~hexad.cvxclust.NuclearProblem`), call a pair *linked* when zero is not a minimiser of
``f_uv`` on ``[0, 1]``. ``f_uv`` is convex and piecewise linear with its kink at ``A_uv``, so
its minimum over ``[0, 1]`` is attained in ``{0, A_uv, 1}`` and the pair is linked iff
``min(f_uv(A_uv), f_uv(1)) < f_uv(0)``: for a binary graph, an edge with ``S_uv > -C_uv`` or a
non-edge with ``S_uv > C_uv`` (for the graph-plus-labels program, an edge or two labelled nodes
with equal labels). The *blocks* are the connected components of the linked pairs.

Claim: some optimum is block-diagonal, and its blocks are the optima of the block problems
(the same program restricted to each block), so the blocks can be solved separately and the
optimal value is the sum of theirs plus ``sum f_uv(0)`` over pairs across blocks.

Proof. Let ``P`` be the pinching onto the blocks (keep the diagonal blocks, zero the rest).
(1) ``P(L) in B`` for ``L in B``: the diagonal, the symmetry and the box are kept, and 0 lies in
``[0, 1]``. (2) ``||P(L)||_* <= ||L||_*``: ``P(L) = 2^-m sum_D D L D`` over the ``2^m`` diagonal
sign matrices ``D`` that are constant on each of the ``m`` blocks (each off-block entry
averages to zero, each block entry is kept), ``||D L D||_* = ||L||_*`` (``D`` is orthogonal),
and the norm is convex; for the PSD-hard program (``problem.psd``) the same average keeps
``P(L)`` PSD, since each ``D L D`` is. (3) Off-block pairs are not linked, so
``f_uv(0) <= f_uv(L_uv)``.
Hence ``F(P(L)) + mu ||P(L)||_* <= F(L) + mu ||L||_*`` for every ``L in B``: pinching an optimum
gives an optimum. On block-diagonal matrices the nuclear norm is the sum of the blocks' and
``F`` separates, so the problem decomposes. (Bhatia, *Matrix Analysis*, 1997, Problem II.5.5
and Sec. IV.2 for the pinching inequality.) For the joint program the feature reward links
almost every pair and there is one block; the split is useful for graph-only programs, whose
blocks are the graph's connected components joined through labelled nodes of equal labels.

Small blocks are padded to a power-of-two size and solved in batches with ``jax.vmap`` and
the exact ``eigh`` step. A padding node has ``A = 0``, ``C = 0`` and ``S = 0`` towards every
node: by the same pinching argument a padded optimum restricted to the real nodes is a block
optimum (the padding block is worth at least ``mu`` per node, its trace, which the identity
attains), so padding changes nothing but the constant.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from hexad._base import check_int
from hexad.cvxclust._nuclear import (
    NuclearOutput,
    NuclearProblem,
    NuclearSolver,
    nuclear_objective,
)

__all__ = ["SplitNuclearSolver", "nuclear_blocks"]


def nuclear_blocks(problem: NuclearProblem) -> tuple[np.ndarray, int]:
    """Returns ``(block ids [n] int, number of blocks)``: the components of the linked pairs.

    Host-side (NumPy/SciPy, one pass over the ``n x n`` data; not traceable). A pair is linked
    when zero does not minimise its entrywise term (module docstring); pairs across blocks are
    zero at some optimum. Ids are numbered in order of each block's smallest node.

    Args:
      problem: a :class:`~hexad.cvxclust.NuclearProblem` ``[n, n]``.

    >>> from hexad.cvxclust import graph_problem
    >>> a = np.kron(np.eye(2), np.ones((2, 2))) - np.eye(4)
    >>> ids, k = nuclear_blocks(graph_problem(a, 1.0))
    >>> ids.tolist(), k
    ([0, 0, 1, 1], 2)
    """
    if not isinstance(problem, NuclearProblem):
        raise TypeError(f"problem: expected a NuclearProblem, got {type(problem).__name__}")
    a, c, s = (np.asarray(v, np.float64) for v in (problem.target, problem.cost, problem.linear))
    f0 = c * a
    best = np.minimum(c * np.abs(1.0 - a) - s, -s * a)  # f(1), f(A)
    link = best < f0
    np.fill_diagonal(link, False)
    k, ids = connected_components(sp.csr_matrix(link), directed=False)
    return ids.astype(np.int64), int(k)


@functools.lru_cache(maxsize=64)
def _jit_single(solver: NuclearSolver):
    return jax.jit(solver)


@functools.lru_cache(maxsize=64)
def _jit_batched(solver: NuclearSolver):
    return jax.jit(jax.vmap(solver))


def _bucket(m: int) -> int:
    return max(2, 1 << (m - 1).bit_length())


@dataclasses.dataclass(frozen=True)
class SplitNuclearSolver:
    """Solves a :class:`~hexad.cvxclust.NuclearProblem` block by block (exact; module docstring).

    Host-level orchestration, not traceable (the blocks are data): blocks larger than
    ``small_max`` are solved one at a time by ``jax.jit(solver)`` (with ``rank`` capped at the
    block size), the others padded to the next power of two (at least 2) and solved in one
    ``jax.jit(jax.vmap(small_solver))`` call per padded size. The jitted functions are cached
    per solver, so repeated calls with the same block sizes compile nothing. Gradients: not
    supported.

    The returned :class:`~hexad.cvxclust.NuclearOutput` is assembled block-diagonally: ``l``
    and ``low_rank`` are zero across blocks; ``dual`` is the (unscaled) Lagrange multiplier
    ``rho_b W_b`` of each block and ``rho`` is 1, so ``nuclear_certificate(problem, out.l,
    out.rho * out.dual)`` certifies the whole problem and ``(out.l, out.dual, out.rho)`` is a
    valid warm start; ``rank`` is the sum of the blocks' ranks (a small block's rank counted on
    the host from its eigen-thresholded iterate); ``rank_saturated`` and ``converged`` are the
    any / all over blocks; ``n_iters`` the largest block count; the residual histories the
    largest residual among the blocks still running at each iteration (-1 padded);
    ``objective`` the full :func:`nuclear_objective` if ``solver.compute_objective``;
    ``subspace_rank`` the largest over blocks (a small block's padded size); ``subspace`` is
    ``[n, 1]`` zeros (the blocks' subspaces are not assembled). ``rank`` and
    ``max_rank`` of ``solver`` are capped at each large block's size.

    Attributes:
      solver: the :class:`~hexad.cvxclust.NuclearSolver` for large blocks.
      small_solver: solver for small blocks; ``None`` uses ``solver`` with the full ``eigh``.
      small_max: blocks of at most this many nodes are batched (static).

    >>> from hexad.cvxclust import graph_problem
    >>> a = np.kron(np.eye(3), np.ones((3, 3))) - np.eye(9)
    >>> out = SplitNuclearSolver(NuclearSolver(tol=1e-6))(graph_problem(a, 1.0))
    >>> bool(out.converged), round(float(out.l[0, 1]), 4), round(float(out.l[0, 3]), 4)
    (True, 1.0, 0.0)
    """

    solver: NuclearSolver = dataclasses.field(default_factory=NuclearSolver)
    small_solver: NuclearSolver | None = None
    small_max: int = 64

    def _small(self) -> NuclearSolver:
        if self.small_solver is not None:
            return self.small_solver
        return self.solver.replace(rank=None, compute_objective=False)

    def __call__(self, problem: NuclearProblem, init=None) -> NuclearOutput:
        """Solves ``problem``; ``init`` as for :class:`~hexad.cvxclust.NuclearSolver` (the
        subspace of a 4-tuple is ignored: each block starts its own)."""
        if not isinstance(self.solver, NuclearSolver):
            raise TypeError(f"solver: expected a NuclearSolver, got {type(self.solver).__name__}")
        check_int("small_max", self.small_max)
        n = problem.n
        dt = problem.target.dtype
        if init is None:
            z0, w0, rho0 = np.eye(n), np.zeros((n, n)), self.solver.rho
        elif isinstance(init, tuple):
            if len(init) not in (3, 4):
                raise ValueError(
                    f"init: expected (z, dual, rho) or (z, dual, rho, subspace), got a tuple of "
                    f"{len(init)}"
                )
            # a subspace is of the whole problem, not of a block: it is not used
            z0, w0, rho0 = (np.asarray(v, np.float64) for v in init[:3])
        else:
            z0, w0, rho0 = np.asarray(init, np.float64), np.zeros((n, n)), self.solver.rho
        if z0.shape != (n, n) or w0.shape != (n, n):
            raise ValueError(f"init: expected [{n}, {n}] matrices, got {z0.shape}, {w0.shape}")
        w0 = w0 * float(rho0)  # unscaled multiplier; each block starts at its own rho
        ids, k = nuclear_blocks(problem)
        members = [np.flatnonzero(ids == b) for b in range(k)]
        a, c, s = (np.asarray(v) for v in (problem.target, problem.cost, problem.linear))
        l_full, lr_full, y_full = np.zeros((n, n)), np.zeros((n, n)), np.zeros((n, n))
        ranks, sats, convs, iters, hp, hd, eigs = [], [], [], [], [], [], []
        subspaces = []

        def sub(m, idx, size, pad=0.0):
            # Padding nodes: diagonal 1 (as in B), zero cost and reward towards every node.
            out = np.eye(size) * pad
            out[: len(idx), : len(idx)] = m[np.ix_(idx, idx)]
            return out

        def block_init(idx, size, rho):
            z = sub(z0, idx, size, pad=1.0)
            w = sub(w0, idx, size) / rho  # the scaled dual of a block starting at rho
            return z, w

        def keep(idx, l, lr, y):
            ix = np.ix_(idx, idx)
            m = len(idx)
            l_full[ix], lr_full[ix], y_full[ix] = l[:m, :m], lr[:m, :m], y[:m, :m]

        large = [idx for idx in members if len(idx) > self.small_max]
        small = [idx for idx in members if len(idx) <= self.small_max]
        for idx in large:
            m = len(idx)
            cap = lambda r: None if r is None else min(r, m)  # noqa: E731
            solver = self.solver.replace(
                rank=cap(self.solver.rank),
                max_rank=cap(self.solver.max_rank),
                compute_objective=False,
            )
            p = NuclearProblem(
                *(jnp.asarray(sub(v, idx, m), dt) for v in (a, c, s)), problem.mu, psd=problem.psd
            )
            z, w = block_init(idx, m, solver.rho)
            init_b = (jnp.asarray(z, dt), jnp.asarray(w, dt), jnp.asarray(solver.rho, dt))
            out = _jit_single(solver)(p, init_b)
            rho = float(out.rho)
            keep(idx, np.asarray(out.l), np.asarray(out.low_rank), rho * np.asarray(out.dual))
            ranks.append(int(out.rank))
            subspaces.append(int(out.subspace_rank))
            eigs.append(float(out.min_eig))
            sats.append(bool(out.rank_saturated))
            convs.append(bool(out.converged))
            iters.append(int(out.n_iters))
            hp.append(np.asarray(out.primal_residuals))
            hd.append(np.asarray(out.dual_residuals))
        buckets: dict[int, list[np.ndarray]] = {}
        for idx in small:
            buckets.setdefault(_bucket(len(idx)), []).append(idx)
        small_solver = self._small()
        for size, group in sorted(buckets.items()):
            stack = [
                np.stack([sub(v, idx, size, pad) for idx in group])
                for v, pad in ((a, 1.0), (c, 0.0), (s, 0.0))
            ]
            p = NuclearProblem(
                *(jnp.asarray(v, dt) for v in stack),
                jnp.broadcast_to(problem.mu, (len(group),)),
                psd=problem.psd,
            )
            inits = [block_init(idx, size, small_solver.rho) for idx in group]
            z = jnp.asarray(np.stack([i[0] for i in inits]), dt)
            w = jnp.asarray(np.stack([i[1] for i in inits]), dt)
            rho = jnp.full((len(group),), small_solver.rho, dt)
            out = _jit_batched(small_solver)(p, (z, w, rho))
            ls, lrs = np.asarray(out.l), np.asarray(out.low_rank)
            ys = np.asarray(out.rho)[:, None, None] * np.asarray(out.dual)
            for j, idx in enumerate(group):
                keep(idx, ls[j], lrs[j], ys[j])
                eigs.append(float(np.linalg.eigvalsh(ls[j][: len(idx), : len(idx)])[0]))
                lam = np.linalg.eigvalsh(lrs[j][: len(idx), : len(idx)])
                ranks.append(int(np.sum(np.abs(lam) > 1e-10 * max(1.0, np.abs(lam).max()))))
            subspaces.append(size)
            sats.append(bool(np.any(np.asarray(out.rank_saturated))))
            convs.append(bool(np.all(np.asarray(out.converged))))
            iters.append(int(np.max(np.asarray(out.n_iters))))
            hp.extend(np.asarray(out.primal_residuals))
            hd.extend(np.asarray(out.dual_residuals))
        length = max(len(h) for h in hp)

        def merge(hs):
            padded = np.stack([np.pad(h, (0, length - len(h)), constant_values=-1.0) for h in hs])
            return jnp.asarray(padded.max(axis=0), dt)

        l = jnp.asarray(l_full, dt)
        obj = nuclear_objective(problem, l) if self.solver.compute_objective else None
        return NuclearOutput(
            l=l,
            low_rank=jnp.asarray(lr_full, dt),
            dual=jnp.asarray(y_full, dt),
            rho=jnp.asarray(1.0, dt),
            objective=obj,
            rank=jnp.asarray(sum(ranks), jnp.int32),
            rank_saturated=jnp.asarray(any(sats)),
            primal_residuals=merge(hp),
            dual_residuals=merge(hd),
            n_iters=jnp.asarray(max(iters), jnp.int32),
            converged=jnp.asarray(all(convs)),
            min_eig=jnp.asarray(min(eigs), dt),
            subspace_rank=jnp.asarray(max(subspaces), jnp.int32),
            subspace=jnp.zeros((n, 1), dt),
        )
