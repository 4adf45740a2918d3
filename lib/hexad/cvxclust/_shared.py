"""The joint program with one shared model per cluster: a convex shared-atomic-norm program.

This is our formulation of the "shared atomic norm representation" of graph and node
information in arXiv:2508.20231 (the paper's exact generalised program could not be read
offline; this is the convex program proposed in the review of ``hexad.cvxclust``, not a
reproduction). Atoms are unit vectors ``a = (e; phi)`` of ``R^{n+p}``: a cluster embedding
``e`` and its model ``phi``. A non-negative combination ``M = sum_i lambda_i a_i a_i^T`` is a
PSD matrix ``[[L, U], [U^T, T]]``, and the atomic gauge of ``(L, U)`` is ``min_T tr M``,
which equals ``tr L + tr(U^T L^+ U)`` when ``range U`` lies in ``range L`` (the
matrix-fractional function; jointly convex). The program::

    min_{M >= 0, L in B}  sum_{u != v} C_uv |L_uv - A_uv|  +  mu0 tr M  +  mu1 sum_v l_v(u_v)

with ``B`` the symmetric matrices with entries in ``[0, 1]`` and a unit diagonal (so
``tr L = n``), ``u_v`` the ``v``-th row of ``U`` (the model node ``v`` uses), and the per-node
loss ``l_v(m, s) = ||x_v - m||^2 / 2 + w_v (logsumexp(s) - s_{y_v})``: a Gaussian feature
model ``m in R^d`` and softmax label scores ``s in R^K`` (``w_v = label_weight`` on labelled
nodes, 0 elsewhere). At a cluster-indicator ``L`` the range condition forces
``u_v = phi_i`` on cluster ``i``: one model per cluster, penalised by
``sum_i ||phi_i||^2`` (against ``sum_v ||u_v||^2`` at ``L = I``), so sharing a model between
the nodes of a cluster is rewarded. ``mu1 = 0`` gives the PSD-hard graph program;
``C = 0`` a convex node-only program (a cluster norm, Jacob, Bach & Vert 2008). With
``C_uv = 1`` the graph term is ``const - <A_bar, L>`` (``A_bar = 2A - 1`` off the diagonal).

Solver: ADMM on ``M = Z`` (Boyd et al. 2011), ``M`` carrying ``PSD + mu0 tr``, whose prox is
an eigendecomposition of the ``(n + p)``-sized iterate with eigenvalues ``max(lambda -
mu0 / rho, 0)`` (for ``n`` in the thousands optionally on a rank-``k`` subspace warm-started
across iterations, with the growth rule and the exact-prox check of the rank-``k`` path of
:class:`~hexad.cvxclust.NuclearSolver`), and ``Z`` the rest: the ``L`` block takes the
entrywise soft threshold and box of the graph program, the ``U`` block the prox of the loss
(closed form for the features, a few Newton steps per labelled node for the softmax), the
``T`` block is free. Residual balancing as in :class:`~hexad.cvxclust.NuclearSolver`.
:func:`shared_atom_certificate` bounds the suboptimality of any iterate by a duality gap.
"""

from __future__ import annotations

from typing import NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from hexad._base import check_positive
from hexad.cvxclust._fusion import _check_labels
from hexad.cvxclust._graphs import check_adjacency
from hexad.cvxclust._nuclear import (
    NuclearSolver,
    _AAState,
    _accelerate,
    _Anderson,
    _check_admm,
    _check_settings,
    _cost_matrix,
    _EigenStep,
    _feasible_from_psd,
    _project_b,
    admm_residuals,
    psd_repair,
)

__all__ = [
    "SharedAtomCertificate",
    "SharedAtomOutput",
    "SharedAtomProblem",
    "SharedAtomSolver",
    "shared_atom_certificate",
    "shared_atom_problem",
]

_NEWTON_STEPS = 12


@flax.struct.dataclass
class SharedAtomProblem:
    r"""The shared-model joint program (module docstring) as a pytree (all leaves).

    Attributes:
      target: ``[n, n]`` adjacency with a unit diagonal.
      cost: ``[n, n]`` graph weights :math:`C \ge 0` (zero diagonal; all zero without a graph).
      x: ``[n, d]`` features (``d`` may be 0).
      y: ``[n, K]`` one-hot labels on labelled nodes, zero rows elsewhere (``K`` may be 0).
      label_weight: ``[n]`` :math:`w_v`: the label loss weight, 0 on unlabelled nodes.
      mu0: atomic-norm weight :math:`\mu_0 > 0`.
      mu1: node-loss weight :math:`\mu_1 \ge 0`.
    """

    target: jax.Array
    cost: jax.Array
    x: jax.Array
    y: jax.Array
    label_weight: jax.Array
    mu0: jax.Array
    mu1: jax.Array

    @property
    def n(self) -> int:
        return self.target.shape[0]

    @property
    def p(self) -> int:
        return self.x.shape[1] + self.y.shape[1]


def shared_atom_problem(
    mu0: float,
    mu1: float,
    *,
    adjacency=None,
    features=None,
    labels=None,
    labeled=None,
    num_classes: int | None = None,
    label_weight: float = 1.0,
    edge_weight: float = 1.0,
    nonedge_weight: float = 1.0,
    n: int | None = None,
) -> SharedAtomProblem:
    """Returns the shared-model joint program of a graph, node features and partial labels.

    Args:
      mu0: atomic-norm weight ``> 0``.
      mu1: node-loss weight ``>= 0``.
      adjacency: optional ``[n, n]`` binary symmetric adjacency (none: ``C = 0``).
      features: optional ``[n, d]`` finite features (used as given; standardise them first if
        their scales differ).
      labels: optional ``[n]`` int labels with ``labeled`` ``[n]`` bool and ``num_classes``.
      label_weight: ``w`` of the softmax label loss on labelled nodes, ``> 0``.
      edge_weight, nonedge_weight: ``c_A`` and ``c_Ac`` as in :func:`graph_problem`.
      n: the number of nodes, needed only when no source gives it.

    >>> p = shared_atom_problem(1.0, 1.0, features=np.array([[1.0], [1.2], [-1.0]]))
    >>> p.n, p.p
    (3, 1)
    """
    check_positive("mu0", mu0)
    check_positive("mu1", mu1, allow_zero=True)
    check_positive("label_weight", label_weight)
    sizes = {
        name: np.shape(v)[0]
        for name, v in (("adjacency", adjacency), ("features", features), ("labels", labels))
        if v is not None
    }
    if n is not None:
        sizes["n"] = n
    if not sizes:
        raise ValueError("adjacency, features, labels: expected at least one, got none")
    if len(set(sizes.values())) != 1:
        raise ValueError(f"adjacency, features, labels: expected the same n, got {sizes}")
    n = int(next(iter(sizes.values())))
    if adjacency is not None:
        a = check_adjacency(adjacency).astype(np.float64)
        c = _cost_matrix(a, None, edge_weight, nonedge_weight)
    else:
        a, c = np.zeros((n, n)), np.zeros((n, n))
    np.fill_diagonal(a, 1.0)
    if features is not None:
        x = np.asarray(features, dtype=np.float64)
        if x.ndim != 2 or not np.isfinite(x).all():
            raise ValueError(f"features: expected a finite [n, d] array, got shape {x.shape}")
    else:
        x = np.zeros((n, 0))
    if labels is not None:
        if labeled is None or num_classes is None:
            raise ValueError("labeled, num_classes: required with labels")
        labels = np.asarray(labels)
        labeled = np.asarray(labeled)
        if labels.shape != (n,) or labeled.shape != (n,) or labeled.dtype != bool:
            raise ValueError(
                f"labels, labeled: expected [{n}] ints and [{n}] bools, got {labels.shape} "
                f"and {labeled.dtype} {labeled.shape}"
            )
        _check_labels(labels, labeled, num_classes)
        y = np.zeros((n, num_classes))
        y[np.flatnonzero(labeled), labels[labeled]] = 1.0
        w = labeled * float(label_weight)
    else:
        y, w = np.zeros((n, 0)), np.zeros(n)
    dt = jax.dtypes.canonicalize_dtype(np.float64)
    return SharedAtomProblem(
        *(jnp.asarray(v, dt) for v in (a, c, x, y, w)),
        jnp.asarray(mu0, dt),
        jnp.asarray(mu1, dt),
    )


# ------------------------------------------------------------------------------------------
# Pieces
# ------------------------------------------------------------------------------------------


def _node_loss(problem: SharedAtomProblem, u):
    d = problem.x.shape[1]
    m, s = u[:, :d], u[:, d:]
    val = 0.5 * jnp.sum((problem.x - m) ** 2)
    if problem.y.shape[1]:
        ce = jax.nn.logsumexp(s, axis=1) - jnp.sum(problem.y * s, axis=1)
        val = val + jnp.sum(problem.label_weight * ce)
    return val


def _loss_prox(problem: SharedAtomProblem, v, tau):
    """``argmin_u tau l(u) + ||u - v||^2 / 2`` row by row (features closed form, labels by
    Newton on a 1-strongly convex function with Hessian ``I + tau w (diag p - p p^T)``)."""
    d = problem.x.shape[1]
    m = (v[:, :d] + tau * problem.x) / (1.0 + tau)
    if not problem.y.shape[1]:
        return m
    vs = v[:, d:]
    a = (tau * problem.label_weight)[:, None]
    k = vs.shape[1]
    eye = jnp.eye(k, dtype=v.dtype)

    def newton(_, s):
        p = jax.nn.softmax(s, axis=1)
        g = a * (p - problem.y) + (s - vs)
        h = eye[None] + a[:, :, None] * (jax.vmap(jnp.diag)(p) - p[:, :, None] * p[:, None, :])
        return s - jnp.linalg.solve(h, g[:, :, None])[:, :, 0]

    s = jax.lax.fori_loop(0, _NEWTON_STEPS, newton, vs)
    return jnp.concatenate([m, s], axis=1)


def _graph_term(problem: SharedAtomProblem, l):
    return jnp.sum(problem.cost * jnp.abs(l - problem.target))


def _simplex(v):
    """Euclidean projection of each row of ``v`` onto the probability simplex."""
    k = v.shape[-1]
    srt = -jnp.sort(-v, axis=-1)
    css = jnp.cumsum(srt, axis=-1) - 1.0
    idx = jnp.arange(1, k + 1, dtype=v.dtype)[None, :]
    cond = srt - css / idx > 0
    r = jnp.sum(cond, axis=-1, keepdims=True)
    theta = jnp.take_along_axis(css, r - 1, axis=-1) / r.astype(v.dtype)
    return jnp.maximum(v - theta, 0.0)


# ------------------------------------------------------------------------------------------
# Certificate
# ------------------------------------------------------------------------------------------


class SharedAtomCertificate(NamedTuple):
    """A duality-gap certificate (:func:`shared_atom_certificate`).

    Attributes:
      primal: the objective at a feasible point built from the candidate (an upper bound).
      dual: the dual function at the multiplier made dual-feasible (a lower bound).
      gap: ``primal - dual``; rel_gap: ``gap / max(1, |primal|)``.
      min_eig: smallest eigenvalue of the feasible point's ``L`` (``>= 0`` up to rounding).
    """

    primal: jax.Array
    dual: jax.Array
    gap: jax.Array
    rel_gap: jax.Array
    min_eig: jax.Array


_CUTOFFS = (1e-12, 1e-10, 1e-8, 1e-6, 1e-4, 1e-2)


def shared_atom_objective(problem: SharedAtomProblem, l, u) -> tuple[jax.Array, jax.Array]:
    r"""Returns :math:`(\text{objective}, \lambda_{\min}(L'))` at a feasible point built from
    ``(l, u)``.

    ``l`` is projected onto :math:`B` and made PSD (:func:`psd_repair`); ``u`` is projected onto
    the span of the eigenvectors of :math:`L'` with eigenvalues above a cutoff
    :math:`c \lambda_{\max}`, and :math:`T = U^\top L'^{+} U` on that span, which makes
    :math:`\begin{bmatrix} L' & U \\ U^\top & T \end{bmatrix}` PSD; the smallest objective over
    the cutoffs :math:`c` in :math:`10^{-12}, \dots, 10^{-2}` is returned (each is an upper
    bound on the optimum).
    """
    l2, min_eig = psd_repair(_project_b(l))
    lam, vec = jnp.linalg.eigh(l2)
    graph = _graph_term(problem, l2) + problem.mu0 * jnp.trace(l2)
    coef = vec.T @ u

    def value(c):
        keep = lam > c * jnp.maximum(lam[-1], 1e-300)
        inv = jnp.where(keep, 1.0 / jnp.where(keep, lam, 1.0), 0.0)
        up = vec @ (coef * keep[:, None])
        tr_t = jnp.sum(inv[:, None] * coef**2)
        return graph + problem.mu0 * tr_t + problem.mu1 * _node_loss(problem, up)

    vals = jnp.stack([value(c) for c in _CUTOFFS])
    return jnp.min(vals), min_eig


def shared_atom_certificate(problem: SharedAtomProblem, l, u, multiplier) -> SharedAtomCertificate:
    r"""Returns a duality-gap certificate for the candidate ``(l, u)`` and multiplier ``Y``.

    The splitting :math:`\min f(M) + g(Z)` s.t. :math:`M = Z`, with :math:`f` the PSD
    indicator plus :math:`\mu_0 \operatorname{tr}`, and :math:`g` the graph term on
    :math:`Z_L \in B` plus :math:`\mu_1 \sum_v l_v` on :math:`Z_U` (:math:`Z_T` free), has the
    dual

    .. math::

       d(Y) = \min_M \big( f(M) + \langle Y, M \rangle \big)
         + \min_Z \big( g(Z) - \langle Y, Z \rangle \big).

    The first term is 0 iff :math:`Y + \mu_0 I \succeq 0`; the second is :math:`-\infty` unless
    :math:`Y_T = 0` and each row of :math:`2 Y_U / \mu_1` lies in the domain of :math:`l_v^*`
    (label part: :math:`e_y + g / w` in the simplex on labelled nodes, 0 on unlabelled ones).
    :math:`Y` is made feasible in that order (:math:`Y_T = 0`; label rows projected; then
    :math:`Y_L \mathrel{+}= c I` with :math:`c` the deficit of the Schur complement
    :math:`Y_L + \mu_0 I - Y_U Y_U^\top / \mu_0`), which changes the :math:`L` part by
    :math:`-c n` only (:math:`\operatorname{diag} Z_L = 1`). Then :math:`d(Y)` is the entrywise
    minimum of the graph program plus :math:`-\mu_1 \sum_v l_v^*(2 Y_U[v] / \mu_1)` with

    .. math::

       l^*(g) = \langle g_m, x \rangle + \tfrac{1}{2} \|g_m\|^2 + w \sum_k q_k \log q_k,
       \qquad q = e_y + g_s / w.

    Valid for any input; with :math:`\mu_1 = 0`, :math:`Y_U` is set to 0.

    Args:
      problem: the problem.
      l: ``[n, n]``; u: ``[n, p]`` candidate.
      multiplier: ``[n + p, n + p]`` candidate ``Y`` (for :class:`SharedAtomSolver`,
        ``output.rho * output.dual``).
    """
    n, d, k = problem.n, problem.x.shape[1], problem.y.shape[1]
    primal, min_eig = shared_atom_objective(problem, l, u)
    y = 0.5 * (multiplier + multiplier.T)
    yl, yu = y[:n, :n], y[:n, n:]
    mu0, mu1 = problem.mu0, problem.mu1
    safe1 = jnp.maximum(mu1, 1e-300)
    gm = 2.0 * yu[:, :d] / safe1
    conj = jnp.sum(gm * problem.x) + 0.5 * jnp.sum(gm**2)
    if k:
        w = problem.label_weight[:, None]
        lab = w > 0
        gs = 2.0 * yu[:, d:] / safe1
        q = _simplex(problem.y + gs / jnp.where(lab, w, 1.0))
        gs = jnp.where(lab, (q - problem.y) * w, 0.0)
        conj = conj + jnp.sum(w * jax.scipy.special.xlogy(q, q) * lab)
        yu = jnp.concatenate([yu[:, :d], 0.5 * mu1 * gs], axis=1)
    yu = jnp.where(mu1 > 0, yu, 0.0)
    node_dual = jnp.where(mu1 > 0, -mu1 * conj, 0.0)
    schur = yl + mu0 * jnp.eye(n, dtype=y.dtype) - (yu @ yu.T) / mu0
    c = jnp.maximum(0.0, -jnp.linalg.eigvalsh(0.5 * (schur + schur.T))[0])
    yl = yl + c * jnp.eye(n, dtype=y.dtype)
    eye = jnp.eye(n, dtype=bool)
    a, cost, slope = problem.target, problem.cost, yl
    cand = jnp.stack([cost * a, cost * jnp.abs(1.0 - a) - slope, -slope * a])
    off = jnp.where(eye, 0.0, jnp.min(cand, axis=0))
    diag = jnp.where(eye, -slope, 0.0)
    dual = jnp.sum(off) + jnp.sum(diag) + node_dual
    gap = primal - dual
    return SharedAtomCertificate(
        primal, dual, gap, gap / jnp.maximum(1.0, jnp.abs(primal)), min_eig
    )


# ------------------------------------------------------------------------------------------
# Solver
# ------------------------------------------------------------------------------------------


class SharedAtomOutput(NamedTuple):
    r"""What :class:`SharedAtomSolver` returns.

    Attributes:
      l: ``[n, n]`` in ``B`` and PSD, with ``u`` ``[n, p]`` (node ``v``'s model
        ``(m_v, s_v)``): of two feasible points the one with the lower objective, the ``Z``
        iterate's ``(Z_L, Z_U)`` with ``Z_L`` made PSD by :func:`psd_repair`, or the PSD
        iterate's ``(L, U)`` with ``L`` made feasible by :func:`psd_rescale` and ``U``
        scaled alike (short of convergence usually the second).
      m: ``[n + p, n + p]`` the :math:`Z` iterate
        :math:`\begin{bmatrix} Z_L & Z_U \\ Z_U^\top & Z_T \end{bmatrix}` (the box and
        loss-prox block of the splitting, not the PSD iterate); a warm start's ``init``
        takes it as ``z``.
      dual: ``[n + p, n + p]`` scaled ADMM dual; rho: final penalty.
      objective: :func:`shared_atom_objective` at ``(l, u)``.
      min_eig: smallest eigenvalue of ``l`` (``>= 0`` up to rounding).
      rank: eigenvalues kept in the last ``M`` step.
      rank_saturated: with the rank-``k`` step, True if the last step may not have been the
        exact prox (as :attr:`NuclearOutput.rank_saturated`); False for the full ``eigh``.
      subspace_rank: the subspace size of the last step (``n + p`` for the full ``eigh``).
      primal_residuals, dual_residuals: ``[max_iters]`` histories, -1 padded.
      n_iters: iterations run.
      converged: both residuals ``<= tol`` (False when the solve stopped at ``max_iters``).
    """

    l: jax.Array
    u: jax.Array
    m: jax.Array
    dual: jax.Array
    rho: jax.Array
    objective: jax.Array
    min_eig: jax.Array
    primal_residuals: jax.Array
    dual_residuals: jax.Array
    n_iters: jax.Array
    converged: jax.Array
    rank: jax.Array
    rank_saturated: jax.Array
    subspace_rank: jax.Array


class _SState(NamedTuple):
    it: jax.Array
    m: jax.Array
    z: jax.Array
    w: jax.Array
    rho: jax.Array
    q: jax.Array
    level: jax.Array
    rank: jax.Array
    sat: jax.Array
    pres: jax.Array
    dres: jax.Array
    hist_p: jax.Array
    hist_d: jax.Array
    aa: _AAState


@flax.struct.dataclass
class SharedAtomSolver:
    """ADMM for :class:`SharedAtomProblem` (all settings static; module docstring).

    Gradients: not supported (``lax.while_loop``).

    Attributes:
      tol: relative tolerance on both residuals.
      max_iters: iteration cap.
      rho: initial ADMM penalty.
      adapt_every: residual balancing every this many iterations (0: fixed ``rho``).
      balance: the residual ratio past which balancing changes ``rho`` (as in
        :class:`~hexad.cvxclust.NuclearSolver`).
      relaxation: over-relaxation in ``(0, 2)``.
      rank, max_rank, rank_margin, power_iters, check_iters: the rank-``k`` eigen step of
        :class:`~hexad.cvxclust.NuclearSolver` (PSD-hard), on the ``(n + p)``-sized iterate;
        ``rank`` ``None``: a full ``eigh`` per iteration.
      anderson: Anderson acceleration's memory (0: none), as in
        :class:`~hexad.cvxclust.NuclearSolver`, on the ``(n + p)``-sized ``Z + W``.

    >>> a = np.kron(np.eye(2), np.ones((3, 3))) - np.eye(6)
    >>> out = jax.jit(SharedAtomSolver())(shared_atom_problem(1.0, 0.0, adjacency=a))
    >>> bool(out.converged), float(jnp.round(out.l[0, 1], 3)), float(jnp.round(out.l[0, 4], 3))
    (True, 1.0, 0.0)
    """

    tol: float = flax.struct.field(pytree_node=False, default=1e-5)
    max_iters: int = flax.struct.field(pytree_node=False, default=3000)
    rho: float = flax.struct.field(pytree_node=False, default=1.0)
    adapt_every: int = flax.struct.field(pytree_node=False, default=10)
    balance: float = flax.struct.field(pytree_node=False, default=10.0)
    relaxation: float = flax.struct.field(pytree_node=False, default=1.0)
    rank: int | None = flax.struct.field(pytree_node=False, default=None)
    max_rank: int | None = flax.struct.field(pytree_node=False, default=None)
    rank_margin: int | None = flax.struct.field(pytree_node=False, default=None)
    power_iters: int = flax.struct.field(pytree_node=False, default=2)
    check_iters: int = flax.struct.field(pytree_node=False, default=60)
    anderson: int = flax.struct.field(pytree_node=False, default=0)

    def __post_init__(self) -> None:
        _check_settings(self)

    def __call__(self, problem: SharedAtomProblem, init=None) -> SharedAtomOutput:
        """Solves ``problem``; ``init`` is ``None`` or ``(z, dual, rho)`` of an earlier output
        (``z`` the ``[n + p, n + p]`` iterate: ``output.m``)."""
        n, p = problem.n, problem.p
        big = n + p
        dt = problem.target.dtype
        _check_admm(self)
        if init is None:
            z0 = jnp.eye(big, dtype=dt)
            w0, rho0 = jnp.zeros((big, big), dt), jnp.asarray(self.rho, dt)
        else:
            z0, w0, rho0 = (jnp.asarray(v, dt) for v in init)
            if z0.shape != (big, big) or w0.shape != (big, big):
                raise ValueError(
                    f"init: expected [{big}, {big}] matrices, got {z0.shape}, {w0.shape}"
                )
        eye_n = jnp.eye(n, dtype=bool)
        knobs = ("rank", "max_rank", "rank_margin", "power_iters", "check_iters")
        eig = _EigenStep(NuclearSolver(**{k: getattr(self, k) for k in knobs}), big, True, dt)
        acc = _Anderson(self.anderson, (big, big), dt)

        def z_step(v, rho):
            vl = v[:n, :n]
            zl = problem.target + jnp.sign(vl - problem.target) * jnp.maximum(
                jnp.abs(vl - problem.target) - problem.cost / rho, 0.0
            )
            zl = jnp.where(eye_n, 1.0, jnp.clip(zl, 0.0, 1.0))
            vu = 0.5 * (v[:n, n:] + v[n:, :n].T)
            zu = _loss_prox(problem, vu, problem.mu1 / (2.0 * rho))
            zt = v[n:, n:]
            return jnp.block([[zl, zu], [zu.T, zt]])

        def cond(s: _SState):
            return (s.it < self.max_iters) & ((s.pres > self.tol) | (s.dres > self.tol))

        def body(s: _SState):
            t = problem.mu0 / s.rho
            v = s.z - s.w
            m, q, rank, sat = eig.step(v, s.q, s.level, t)
            mr = m if self.relaxation == 1.0 else self.relaxation * m + (1 - self.relaxation) * s.z
            g = mr + s.w
            z = z_step(g, s.rho)
            pres, dres, rho, w = admm_residuals(
                m, z, s.z, g - z, s.rho, s.it, self.adapt_every, self.balance
            )
            level, pres = eig.grow(v, q, s.level, t, sat, rank, pres, dres, self.tol)
            z, w, aa = _accelerate(acc, s, g, z, w, rho, pres, dres, self, z_step)
            return _SState(
                s.it + 1,
                m,
                z,
                w,
                rho,
                q,
                level,
                rank,
                sat,
                pres,
                dres,
                s.hist_p.at[s.it].set(pres),
                s.hist_d.at[s.it].set(dres),
                aa,
            )

        hist = -jnp.ones((self.max_iters,), dt)
        inf = jnp.asarray(jnp.inf, dt)
        z0 = z_step(0.5 * (z0 + z0.T), rho0)
        zero = jnp.zeros((), jnp.int32)
        w0 = 0.5 * (w0 + w0.T)
        s = _SState(zero, z0, z0, w0, rho0, eig.q0, eig.level0, zero, jnp.array(False), inf, inf,
                    hist, hist, acc.init())  # fmt: skip
        s = jax.lax.while_loop(cond, body, s)
        sat = s.sat | eig.short(s.z - s.w, s.q, s.level, problem.mu0 / s.rho)
        # Two feasible points: the box iterate's Z_L made PSD with its Z_U, and the PSD
        # iterate's L scaled to unit diagonal and made non-negative (psd_rescale) with its U
        # scaled alike (D M D stays PSD, and the all-ones mix shrinks U by 1 - t); the lower.
        l_a, min_a = psd_repair(s.z[:n, :n])
        u_a = s.z[:n, n:]
        obj_a, _ = shared_atom_objective(problem, l_a, u_a)
        l_b, min_b, d, t_b = _feasible_from_psd(s.m[:n, :n])
        u_b = (1.0 - t_b) * d[:, None] * s.m[:n, n:]
        obj_b, _ = shared_atom_objective(problem, l_b, u_b)
        pick = obj_b < obj_a
        l_out, u_out = jnp.where(pick, l_b, l_a), jnp.where(pick, u_b, u_a)
        min_eig, obj = jnp.where(pick, min_b, min_a), jnp.where(pick, obj_b, obj_a)
        return SharedAtomOutput(
            l=l_out,
            u=u_out,
            m=s.z,
            dual=s.w,
            rho=s.rho,
            objective=obj,
            min_eig=min_eig,
            primal_residuals=s.hist_p,
            dual_residuals=s.hist_d,
            n_iters=s.it,
            converged=(s.pres <= self.tol) & (s.dres <= self.tol),
            rank=s.rank,
            rank_saturated=sat,
            subspace_rank=eig.subspace_rank(s.level),
        )
