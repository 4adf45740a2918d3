"""Convex clustering (sum-of-norms fusion) over a sparse edge list, with general losses.

The program (Hocking et al. 2011; Chi & Lange 2015, arXiv:1304.0499, eq. 1.1), generalised to
entry-weighted losses so that features and partial labels fit in one problem::

    min_U  sum_{i,k} M_ik * loss(X_ik, U_ik)  +  gamma * sum_{l=(i,j)} w_l ||u_i - u_j||_2

with ``loss`` one of ``squared`` (``(x - u)^2 / 2``), ``huber`` (``delta``-Huber of ``x - u``)
or ``logistic`` (``softplus(u) - x u`` for ``x`` in ``[0, 1]``, the Bernoulli deviance used by
generalised convex clustering). ``M = 0`` marks an unobserved entry: a partial label is a
one-hot block of columns observed only on labelled nodes (:func:`with_labels`).

Softmax label loss. With ``label_classes = K > 0`` the last ``K`` columns are a label block
``s_v in R^K`` scored by the multinomial (softmax cross-entropy) loss instead of ``loss``::

    m_v * (logsumexp(s_v) - <y_v, s_v>)  +  (label_ridge / 2) ||s_v||^2

with ``y_v`` the one-hot label row of ``X`` (zero on unlabelled nodes) and ``m_v`` the
row's mask. The ridge keeps the minimum attained (without it a cluster holding labels of one
class only drives its scores to infinity); it applies to every node. The label block enters
the solver as a smooth term (gradient steps, Condat-Vu), the feature block through its prox.

Solver: a primal-dual method (Chambolle & Pock 2011; Condat 2013 / Vu 2013 for the smooth
logistic part) on ``min_U F(U) + G(DU)`` with ``D`` the ``[E, n]`` edge incidence. The dual
variable ``Lambda`` ``[E, d]`` lives in the product of balls ``||Lambda_l|| <= gamma w_l``, so
the same dual iterate is the AMA dual of Chi & Lange. For the squared loss with all ``M > 0``
the primal is ``min(M)``-strongly convex and Chambolle & Pock's accelerated steps (their
Algorithm 2) are available as an option. ``D U`` and ``D^T Lambda`` are gathers and
``segment_sum``s over the edge list: nothing dense of size ``n x n`` is ever formed.
"""

from __future__ import annotations

from typing import NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from hexad._base import check_finite, check_int, check_positive, is_traced
from hexad.cvxclust._graphs import check_edges

__all__ = [
    "FusionOutput",
    "FusionPath",
    "FusionProblem",
    "FusionSolver",
    "clusterpath",
    "fused_clusters",
    "fusion_dual_objective",
    "fusion_objective",
    "with_labels",
]

LOSSES = ("squared", "huber", "logistic")


@flax.struct.dataclass
class FusionProblem:
    r"""A convex clustering problem (a pytree; ``loss`` and ``huber_delta`` are static).

    Build it with :meth:`create`, which validates. ``gamma`` is a leaf, so a clusterpath over
    ``gamma`` reuses one compiled solve.

    Attributes:
      x: ``[n, d]`` data (features, optionally with label columns).
      mask: ``[n, d]`` non-negative loss weights :math:`M`; 0 marks an unobserved entry.
      edges: ``[E, 2]`` int32 undirected edges ``(i, j)``, ``i != j``.
      weights: ``[E]`` non-negative fusion weights :math:`w`.
      gamma: scalar fusion strength :math:`\gamma`.
      loss: ``"squared"``, ``"huber"`` or ``"logistic"`` (static), on the feature columns.
      huber_delta: the Huber threshold (static).
      label_classes: ``K``, the number of trailing columns scored by the softmax label loss
        (static; 0: none).
      label_ridge: the ridge on the label block (static).
    """

    x: jax.Array
    mask: jax.Array
    edges: jax.Array
    weights: jax.Array
    gamma: jax.Array
    loss: str = flax.struct.field(pytree_node=False, default="squared")
    huber_delta: float = flax.struct.field(pytree_node=False, default=1.0)
    label_classes: int = flax.struct.field(pytree_node=False, default=0)
    label_ridge: float = flax.struct.field(pytree_node=False, default=0.0)

    @classmethod
    def create(
        cls,
        x,
        edges,
        weights,
        gamma: float,
        *,
        mask=None,
        loss: str = "squared",
        huber_delta: float = 1.0,
        label_classes: int = 0,
        label_ridge: float = 0.1,
    ) -> FusionProblem:
        """Validates the inputs and returns the problem.

        Args:
          x: ``[n, d]`` finite data; for ``loss="logistic"``, entries in ``[0, 1]``.
          edges: ``[E, 2]`` integer node ids, no self loops (duplicates add up).
          weights: ``[E]`` finite weights ``>= 0``.
          gamma: fusion strength ``>= 0``.
          mask: ``[n, d]`` loss weights ``>= 0`` (default all ones).
          loss: one of ``"squared"``, ``"huber"``, ``"logistic"`` (static).
          huber_delta: Huber threshold ``> 0`` (static).
          label_classes: ``K >= 0``: the last ``K`` columns of ``x`` are one-hot label rows
            (or zero rows) scored by the softmax cross-entropy (module docstring); ``K >= 2``
            when used, and ``x`` keeps at least one feature column.
          label_ridge: ridge ``> 0`` on the label block (used only with ``label_classes``).

        A node without edges keeps its own fit; nodes in different connected components never
        fuse (documented behaviour, not an error).

        >>> p = FusionProblem.create(np.zeros((3, 2)), np.array([[0, 1], [1, 2]]), np.ones(2), 1.0)
        >>> p.x.shape, p.loss
        ((3, 2), 'squared')
        """
        xa = np.asarray(x)
        if xa.ndim != 2:
            raise ValueError(f"x: expected a [n, d] array, got shape {xa.shape}")
        if not np.issubdtype(xa.dtype, np.floating) and not np.issubdtype(xa.dtype, np.integer):
            raise TypeError(f"x: expected a real array, got dtype {xa.dtype}")
        if not np.isfinite(xa).all():
            raise ValueError("x: expected finite values, got NaN or inf")
        if loss not in LOSSES:
            raise ValueError(f"loss: expected one of {LOSSES}, got {loss!r}")
        huber_delta = check_positive("huber_delta", huber_delta)
        n = xa.shape[0]
        label_classes = check_int("label_classes", label_classes, 0, max(0, xa.shape[1] - 1))
        if label_classes == 1:
            raise ValueError("label_classes: expected 0 or an int >= 2, got 1")
        if label_classes:
            label_ridge = check_positive("label_ridge", label_ridge)
            yb = xa[:, -label_classes:]
            rows = yb.sum(1)
            if not (np.isin(yb, (0, 1)).all() and np.isin(rows, (0, 1)).all()):
                raise ValueError(
                    f"x: the last label_classes={label_classes} columns must be one-hot or "
                    "zero rows"
                )
        fx = xa[:, : xa.shape[1] - label_classes]
        if loss == "logistic" and ((fx < 0).any() or (fx > 1).any()):
            raise ValueError(
                f"x: the logistic loss expects entries in [0, 1], got [{fx.min()}, {fx.max()}]"
            )
        e, w = check_edges(edges, n, weights)
        check_positive("gamma", gamma, allow_zero=True)
        if mask is None:
            m = np.ones(xa.shape)
        else:
            m = np.asarray(mask, dtype=np.float64)
            if m.shape != xa.shape:
                raise ValueError(f"mask: expected shape {xa.shape}, got {m.shape}")
            if not np.isfinite(m).all() or (m < 0).any():
                raise ValueError("mask: expected finite values >= 0")
        dtype = xa.dtype if np.issubdtype(xa.dtype, np.floating) else np.float32
        dtype = jax.dtypes.canonicalize_dtype(dtype)  # float64 only where x64 is enabled
        return cls(
            x=jnp.asarray(xa, dtype),
            mask=jnp.asarray(m, dtype),
            edges=jnp.asarray(e),
            weights=jnp.asarray(w, dtype),
            gamma=jnp.asarray(gamma, dtype),
            loss=loss,
            huber_delta=float(huber_delta),
            label_classes=int(label_classes),
            label_ridge=float(label_ridge) if label_classes else 0.0,
        )

    @property
    def n(self) -> int:
        return self.x.shape[0]


def with_labels(
    x, labels, labeled, num_classes: int, label_weight: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """Appends one-hot partial labels to the features; returns ``(x_aug, mask)``.

    The label block is observed (mask ``label_weight``) on labelled nodes only and unobserved
    (mask 0, value 0) elsewhere, so the fused solution carries labels to unlabelled nodes.
    This is our concrete choice for "convex clustering with partial labels" (the paper leaves
    the loss open): it keeps the program a single convex fusion problem. The label block is
    scored by the problem's ``loss``, or by the softmax cross-entropy with
    ``FusionProblem.create(..., label_classes=num_classes)``.

    Args:
      x: ``[n, d]`` features.
      labels: ``[n]`` ints in ``[0, num_classes)`` (values on unlabelled nodes are ignored).
      labeled: ``[n]`` bool, which labels are observed.
      num_classes: number of classes (static); every class must have a labelled node.
      label_weight: weight of the label block ``> 0``.

    >>> xa, m = with_labels(np.zeros((3, 1)), np.array([0, 1, 0]), np.array([1, 1, 0], bool), 2)
    >>> xa.shape, m[2].tolist()
    ((3, 3), [1.0, 0.0, 0.0])
    """
    x = np.asarray(x, dtype=np.float64)
    labels = np.asarray(labels)
    labeled = np.asarray(labeled, dtype=bool)
    n = x.shape[0]
    if labels.shape != (n,) or labeled.shape != (n,):
        raise ValueError(
            f"labels, labeled: expected shape ({n},), got {labels.shape}, {labeled.shape}"
        )
    _check_labels(labels, labeled, num_classes)
    label_weight = check_positive("label_weight", label_weight)
    y = np.zeros((n, num_classes))
    y[np.flatnonzero(labeled), labels[labeled]] = 1.0
    m = np.concatenate(
        [np.ones_like(x), np.repeat(labeled[:, None] * label_weight, num_classes, 1)], 1
    )
    return np.concatenate([x, y], 1), m


def _check_labels(labels, labeled, num_classes: int) -> None:
    if not np.issubdtype(labels.dtype, np.integer):
        raise TypeError(f"labels: expected integer class ids, got dtype {labels.dtype}")
    got = labels[labeled]
    if got.size and (got.min() < 0 or got.max() >= num_classes):
        raise ValueError(
            f"labels: expected values in [0, {num_classes}), got [{got.min()}, {got.max()}]"
        )
    missing = sorted(set(range(num_classes)) - set(got.tolist()))
    if missing:
        raise ValueError(f"labels: classes {missing} have no labelled node")


# ------------------------------------------------------------------------------------------
# Pieces: losses, incidence operators, projection
# ------------------------------------------------------------------------------------------


def _split_cols(problem: FusionProblem, v):
    k = problem.label_classes
    d = v.shape[-1] - k
    return v[..., :d], v[..., d:]


def _label_loss(problem: FusionProblem, s):
    y = _split_cols(problem, problem.x)[1]
    m = _split_cols(problem, problem.mask)[1][:, 0]
    ce = jax.nn.logsumexp(s, axis=1) - jnp.sum(y * s, axis=1)
    return jnp.sum(m * ce) + 0.5 * problem.label_ridge * jnp.sum(s**2)


def _label_grad(problem: FusionProblem, s):
    y = _split_cols(problem, problem.x)[1]
    m = _split_cols(problem, problem.mask)[1][:, :1]
    return m * (jax.nn.softmax(s, axis=1) - y) + problem.label_ridge * s


def _loss(problem: FusionProblem, u):
    if problem.label_classes:
        uf, us = _split_cols(problem, u)
        return _feature_loss(problem, uf) + _label_loss(problem, us)
    return _feature_loss(problem, u)


def _feature_loss(problem: FusionProblem, u):
    x = _split_cols(problem, problem.x)[0]
    mask = _split_cols(problem, problem.mask)[0]
    r = x - u
    if problem.loss == "squared":
        v = 0.5 * r**2
    elif problem.loss == "huber":
        d = problem.huber_delta
        v = jnp.where(jnp.abs(r) <= d, 0.5 * r**2, d * (jnp.abs(r) - 0.5 * d))
    else:
        v = jax.nn.softplus(u) - x * u
    return jnp.sum(mask * v)


def _loss_grad(problem: FusionProblem, u):
    if problem.label_classes:
        uf, us = _split_cols(problem, u)
        return jnp.concatenate([_feature_grad(problem, uf), _label_grad(problem, us)], axis=1)
    return _feature_grad(problem, u)


def _feature_grad(problem: FusionProblem, u):
    x = _split_cols(problem, problem.x)[0]
    mask = _split_cols(problem, problem.mask)[0]
    r = u - x
    if problem.loss == "squared":
        g = r
    elif problem.loss == "huber":
        g = jnp.clip(r, -problem.huber_delta, problem.huber_delta)
    else:
        g = jax.nn.sigmoid(u) - x
    return mask * g


def _loss_prox(problem: FusionProblem, v, tau):
    """prox of ``tau * sum M loss(x, .)`` at the feature block ``v`` (squared and Huber;
    closed forms)."""
    x = _split_cols(problem, problem.x)[0]
    a = tau * _split_cols(problem, problem.mask)[0]
    r = v - x
    if problem.loss == "squared":
        return x + r / (1.0 + a)
    d = problem.huber_delta
    return x + jnp.where(jnp.abs(r) <= d * (1.0 + a), r / (1.0 + a), r - a * d * jnp.sign(r))


def _diff(edges, u):
    return u[edges[:, 0]] - u[edges[:, 1]]


def _diff_t(edges, lam, n: int):
    return jax.ops.segment_sum(lam, edges[:, 0], n) - jax.ops.segment_sum(lam, edges[:, 1], n)


def _norms(v):
    return jnp.sqrt(jnp.sum(v**2, axis=-1))


def _project(problem: FusionProblem, lam):
    bound = problem.gamma * problem.weights
    nrm = _norms(lam)
    scale = jnp.minimum(1.0, bound / jnp.maximum(nrm, jnp.finfo(lam.dtype).tiny))
    return lam * scale[:, None]


def _incidence_norm_sq(problem: FusionProblem):
    # ||D||^2 = lambda_max(graph Laplacian) <= max over edges of deg(i) + deg(j) (Anderson-Morley).
    ones = jnp.ones(problem.edges.shape[0], problem.x.dtype)
    deg = jax.ops.segment_sum(ones, problem.edges[:, 0], problem.n) + jax.ops.segment_sum(
        ones, problem.edges[:, 1], problem.n
    )
    return jnp.max(deg[problem.edges[:, 0]] + deg[problem.edges[:, 1]])


def fusion_objective(problem: FusionProblem, u) -> jax.Array:
    r"""Returns the primal objective
    :math:`\sum M \operatorname{loss}(X, U) + \gamma \sum_l w_l \|u_{i_l} - u_{j_l}\|`.

    Independent of any solver (it only evaluates the formula).

    Args:
      problem: the problem.
      u: ``[n, d]`` candidate solution.

    >>> p = FusionProblem.create(np.array([[0.0], [1.0]]), np.array([[0, 1]]), np.ones(1), 1.0)
    >>> float(fusion_objective(p, jnp.array([[0.0], [1.0]])))
    1.0
    """
    penalty = jnp.sum(problem.weights * _norms(_diff(problem.edges, u)))
    return _loss(problem, u) + problem.gamma * penalty


def fusion_dual_objective(problem: FusionProblem, dual) -> jax.Array:
    r"""Returns the Lagrange dual value at ``dual`` ``[E, d]`` for the squared loss.

    .. math::

       g(\Lambda) = \langle D^\top \Lambda, X \rangle
         - \tfrac{1}{2} \sum (D^\top \Lambda)^2 / M
       \quad \text{on} \quad \|\Lambda_l\| \le \gamma w_l

    (``dual`` is projected onto that set first), a lower bound of the optimum: the duality gap
    ``fusion_objective - fusion_dual_objective`` certifies accuracy. Where :math:`M = 0` (an
    unobserved entry) a term is its limit: 0 where :math:`D^\top \Lambda` is 0 there, else
    :math:`+\infty` (the dual is :math:`-\infty`: the entry's :math:`u` is free). Implemented for
    ``loss="squared"`` without a label block (``label_classes = 0``); otherwise a ValueError
    names which.

    >>> p = FusionProblem.create(np.array([[0.0], [1.0]]), np.array([[0, 1]]), np.ones(1), 1.0)
    >>> float(fusion_dual_objective(p, jnp.array([[-0.5]])))
    0.25
    """
    if problem.loss != "squared":
        raise ValueError(
            f"problem.loss: the dual is implemented for 'squared', got {problem.loss!r}"
        )
    if problem.label_classes:
        raise ValueError(
            "problem.label_classes: the dual is implemented without a label block (0), got "
            f"{problem.label_classes}"
        )
    lam = _project(problem, dual)
    g = _diff_t(problem.edges, lam, problem.n)
    m = problem.mask
    quad = jnp.where(m > 0, g**2 / jnp.where(m > 0, m, 1.0), jnp.where(g == 0, 0.0, jnp.inf))
    return jnp.sum(g * problem.x) - 0.5 * jnp.sum(quad)


# ------------------------------------------------------------------------------------------
# Solver
# ------------------------------------------------------------------------------------------


class FusionOutput(NamedTuple):
    r"""What :class:`FusionSolver` returns.

    Attributes:
      u: ``[n, d]`` primal solution (cluster centroids per node).
      dual: ``[E, d]`` dual variable, :math:`\|\Lambda_l\| \le \gamma w_l`.
      objective: scalar, ``fusion_objective(problem, u)``.
      primal_residuals: ``[max_iters]`` relative stationarity residual per iteration, -1 after
        the last one.
      dual_residuals: ``[max_iters]`` relative complementarity residual, -1 padded.
      n_iters: int, iterations run.
      converged: bool, both residuals ``<= tol`` at the end.
    """

    u: jax.Array
    dual: jax.Array
    objective: jax.Array
    primal_residuals: jax.Array
    dual_residuals: jax.Array
    n_iters: jax.Array
    converged: jax.Array


class _State(NamedTuple):
    it: jax.Array
    u: jax.Array
    lam: jax.Array
    du: jax.Array  # D u
    g: jax.Array  # D^T lam
    tau: jax.Array
    sigma: jax.Array
    pres: jax.Array
    dres: jax.Array
    hist_p: jax.Array
    hist_d: jax.Array


@flax.struct.dataclass
class FusionSolver:
    r"""Primal-dual solver for :class:`FusionProblem` (all settings static).

    Residuals (both vanish exactly at a KKT point, for every loss since all three are
    :math:`C^1`), with :math:`F` the loss term, :math:`D` the edge-difference operator and
    :math:`\Lambda` the dual:

    - primal (stationarity):
      :math:`\|\nabla F(U) + D^\top \Lambda\|_F / \max(1, \|M \odot X\|_F)`;
    - dual (complementarity):
      :math:`\|\Lambda - P(\Lambda + D U)\|_F / \max(1, \|M \odot X\|_F)`, where :math:`P`
      projects on the balls :math:`\|\cdot\| \le \gamma w_l`; it is zero iff :math:`\Lambda_l`
      is a subgradient of :math:`\gamma w_l \|\cdot\|` at :math:`(DU)_l`.

    Iteration stops when both are ``<= tol`` or after ``max_iters``; ``converged`` says which.
    Gradients: not supported (the loop is a ``lax.while_loop``; no unrolled or implicit
    differentiation is provided).

    Attributes:
      tol: relative residual tolerance, ``>= 0``.
      max_iters: iteration cap, ``>= 1``.
      step_ratio: ``> 0``, the :math:`\sigma / \tau` balance of the primal-dual steps
        (:math:`\tau \sigma \|D\|^2 < 1`).
        The default 10 converged fastest on k-NN blobs (n = 200, 1000; gamma = 0.1, 1).
      accelerate: use Chambolle & Pock's Algorithm 2 steps for the squared loss. Off by
        default: it makes the primal converge at :math:`O(1/k^2)` but the dual only
        sublinearly, so the residuals above fall more slowly than with constant steps, which
        converge linearly on these piecewise-quadratic problems in practice.

    >>> p = FusionProblem.create(np.array([[0.0], [1.0]]), np.array([[0, 1]]), np.ones(1), 1.0)
    >>> out = jax.jit(FusionSolver())(p)
    >>> bool(out.converged), float(jnp.round(out.u[0, 0], 4))
    (True, 0.5)
    """

    tol: float = flax.struct.field(pytree_node=False, default=1e-5)
    max_iters: int = flax.struct.field(pytree_node=False, default=5000)
    step_ratio: float = flax.struct.field(pytree_node=False, default=10.0)
    accelerate: bool = flax.struct.field(pytree_node=False, default=False)

    def __post_init__(self) -> None:
        # Static settings, checked at construction: a NaN step_ratio gave a NaN solution and a
        # negative max_iters an error deep inside XLA.
        check_positive("tol", self.tol, allow_zero=True)
        check_int("max_iters", self.max_iters)
        check_positive("step_ratio", self.step_ratio)

    def __call__(self, problem: FusionProblem, init=None) -> FusionOutput:
        """Solves ``problem``; ``init`` is ``None`` or a warm start ``(u [n,d], dual [E,d])``.

        Any warm start is valid: the dual part is projected onto its feasible set first.
        """
        x = problem.x
        n, d = x.shape
        if init is None:
            u0 = jnp.zeros_like(x) if problem.loss == "logistic" else x
            lam0 = jnp.zeros((problem.edges.shape[0], d), x.dtype)
        else:
            u0, lam0 = init
            u0 = jnp.asarray(u0, x.dtype)
            lam0 = jnp.asarray(lam0, x.dtype)
            if u0.shape != x.shape or lam0.shape != (problem.edges.shape[0], d):
                raise ValueError(
                    f"init: expected shapes {x.shape} and {(problem.edges.shape[0], d)}, "
                    f"got {u0.shape} and {lam0.shape}"
                )
        lam0 = _project(problem, lam0)
        smooth = problem.loss == "logistic"
        mf, ms = _split_cols(problem, problem.mask)
        lip = 0.25 * jnp.max(mf) if smooth else jnp.zeros((), x.dtype)
        if problem.label_classes:  # Hessian of logsumexp <= 1/2, plus the ridge
            lip = jnp.maximum(lip, 0.5 * jnp.max(ms) + problem.label_ridge)
        # Strong convexity modulus of the squared loss (0 makes the steps constant).
        strong = problem.loss == "squared" and self.accelerate and not problem.label_classes
        mu = jnp.min(problem.mask) if strong else jnp.zeros((), x.dtype)
        dnorm = jnp.sqrt(jnp.maximum(_incidence_norm_sq(problem), 1e-12))
        r = self.step_ratio
        sigma0 = 0.99 * jnp.sqrt(r) / dnorm
        # Condat-Vu: 1/tau - sigma ||D||^2 >= L/2.
        tau0 = 0.99 / (jnp.sqrt(r) * dnorm + 0.5 * lip)
        scale = jnp.maximum(1.0, jnp.sqrt(jnp.sum((problem.mask * x) ** 2)))
        edges = problem.edges

        def residuals(u, lam, du, g):
            stat = _loss_grad(problem, u) + g
            comp = lam - _project(problem, lam + du)
            return jnp.linalg.norm(stat) / scale, jnp.linalg.norm(comp) / scale

        def cond(s: _State):
            return (s.it < self.max_iters) & ((s.pres > self.tol) | (s.dres > self.tol))

        def body(s: _State):
            # One D and one D^T product per iteration: D u_bar is linear in the carried D u,
            # and D^T lam of the new dual serves both its residual and the next step.
            if smooth:
                u_new = s.u - s.tau * (_loss_grad(problem, s.u) + s.g)
            else:
                v = s.u - s.tau * s.g
                u_new = _loss_prox(problem, _split_cols(problem, v)[0], s.tau)
                if problem.label_classes:
                    us = _split_cols(problem, s.u)[1]
                    ls = _split_cols(problem, v)[1] - s.tau * _label_grad(problem, us)
                    u_new = jnp.concatenate([u_new, ls], axis=1)
            theta = 1.0 / jnp.sqrt(1.0 + 2.0 * mu * s.tau)
            du = _diff(edges, u_new)
            lam_new = _project(problem, s.lam + s.sigma * (du + theta * (du - s.du)))
            g = _diff_t(edges, lam_new, n)
            pres, dres = residuals(u_new, lam_new, du, g)
            return _State(
                it=s.it + 1,
                u=u_new,
                lam=lam_new,
                du=du,
                g=g,
                tau=theta * s.tau,
                sigma=s.sigma / theta,
                pres=pres,
                dres=dres,
                hist_p=s.hist_p.at[s.it].set(pres),
                hist_d=s.hist_d.at[s.it].set(dres),
            )

        du0, g0 = _diff(edges, u0), _diff_t(edges, lam0, n)
        p0, d0 = residuals(u0, lam0, du0, g0)
        hist = -jnp.ones((self.max_iters,), x.dtype)
        s = _State(jnp.zeros((), jnp.int32), u0, lam0, du0, g0, tau0, sigma0, p0, d0, hist, hist)
        s = jax.lax.while_loop(cond, body, s)
        return FusionOutput(
            u=s.u,
            dual=s.lam,
            objective=fusion_objective(problem, s.u),
            primal_residuals=s.hist_p,
            dual_residuals=s.hist_d,
            n_iters=s.it,
            converged=(s.pres <= self.tol) & (s.dres <= self.tol),
        )


# ------------------------------------------------------------------------------------------
# Clusters and the clusterpath
# ------------------------------------------------------------------------------------------


def _components(edges, active, n: int):
    """Connected components of the graph of ``active`` edges: ``[n]`` min node id per node."""

    def cond(c):
        return c[1]

    def body(c):
        lab, _ = c
        a = jnp.where(active, lab[edges[:, 0]], n)
        b = jnp.where(active, lab[edges[:, 1]], n)
        m = jnp.minimum(a, b)
        new = jnp.minimum(lab, jax.ops.segment_min(m, edges[:, 0], n))
        new = jnp.minimum(new, jax.ops.segment_min(m, edges[:, 1], n))
        new = new[new]  # pointer jumping: labels are node ids
        return new, jnp.any(new != lab)

    lab, _ = jax.lax.while_loop(cond, body, (jnp.arange(n), jnp.array(True)))
    return lab


def _compact(root):
    n = root.shape[0]
    is_root = root == jnp.arange(n)
    rank = jnp.cumsum(is_root) - 1
    return rank[root].astype(jnp.int32), jnp.sum(is_root).astype(jnp.int32)


def fused_clusters(u, edges, tol: float) -> tuple[jax.Array, jax.Array]:
    r"""Returns ``(ids [n] in 0..k-1, k)``: components of edges with
    :math:`\|u_i - u_j\| \le` ``tol``.

    Only edges of the fusion graph can fuse (as in the solution's optimality conditions), so
    clusters are connected components of the fused edges. Ids follow the smallest node id.

    Args:
      u: ``[n, d]`` fused solution; finite when concrete (a ValueError names ``u``; under a
        trace a NaN row fuses with nothing).
      edges: ``[E, 2]`` edge list of the problem.
      tol: absolute fusion threshold ``>= 0`` (pick it well above the solver's accuracy).

    >>> ids, k = fused_clusters(jnp.array([[0.0], [0.0], [5.0]]), jnp.array([[0, 1], [1, 2]]), 1e-3)
    >>> ids.tolist(), int(k)
    ([0, 0, 1], 2)
    """
    shape = jnp.shape(u)
    if len(shape) != 2:
        raise ValueError(f"u: expected a [n, d] array, got shape {shape}")
    check_positive("tol", tol, allow_zero=True)
    # a NaN row would fuse with nothing, one cluster per node, a plausible answer
    check_finite("u", u)
    edges = jnp.asarray(edges)
    active = _norms(_diff(edges, u)) <= tol
    return _compact(_components(edges, active, u.shape[0]))


class FusionPath(NamedTuple):
    """A clusterpath: one solve per ``gamma`` (ascending), warm-started from the previous one.

    Attributes:
      gammas: ``[k]``.
      u: ``[k, n, d]`` solutions.
      objective: ``[k]``.
      n_iters: ``[k]``.
      converged: ``[k]`` bool.
      clusters: ``[k, n]`` cluster ids with monotone merging (see :func:`clusterpath`).
      n_clusters: ``[k]`` cluster counts (non-increasing by construction).
      raw_n_clusters: ``[k]`` counts from each solution alone (may increase with non-uniform
        weights, where exact clusterpaths can split; Hocking et al. 2011).
    """

    gammas: jax.Array
    u: jax.Array
    objective: jax.Array
    n_iters: jax.Array
    converged: jax.Array
    clusters: jax.Array
    n_clusters: jax.Array
    raw_n_clusters: jax.Array


def clusterpath(
    problem: FusionProblem, gammas, solver: FusionSolver | None = None, rtol: float = 1e-3
) -> FusionPath:
    r"""Returns the clusterpath over ascending ``gammas`` with warm starts (one ``lax.scan``).

    Each solve starts from the previous ``u`` and the previous dual scaled by
    ``gamma_new / gamma_old`` (which keeps it feasible). An edge counts as fused at step ``k``
    if :math:`\|u_i - u_j\| \le` ``rtol`` :math:`\cdot \operatorname{rms}(X)` at step :math:`k`
    or it was fused at an earlier step:
    this union makes the merge tree monotone (our documented choice; ``raw_n_clusters`` gives
    the counts without it).

    Args:
      problem: the problem (its own ``gamma`` is ignored).
      gammas: ``[k]`` ascending finite fusion strengths ``>= 0`` (checked when concrete;
        under ``jit`` a NaN entry makes its solve and every later one NaN, not converged).
      solver: the solver (default ``FusionSolver()``).
      rtol: fusion threshold relative to the RMS of ``X`` (static).

    >>> p = FusionProblem.create(np.array([[0.0], [1.0]]), np.array([[0, 1]]), np.ones(1), 0.0)
    >>> clusterpath(p, jnp.array([0.1, 1.0])).n_clusters.tolist()
    [2, 1]
    """
    solver = FusionSolver() if solver is None else solver
    if not is_traced(gammas):  # validate when concrete (outside jit)
        g = np.asarray(gammas)
        bad = g.ndim != 1 or g.size == 0 or not np.isfinite(g).all()
        if bad or (g < 0).any() or (np.diff(g) < 0).any():
            raise ValueError(f"gammas: expected a non-empty ascending finite [k] >= 0, got {g!r}")
    gammas = jnp.asarray(gammas, problem.x.dtype)
    n = problem.n
    thresh = rtol * jnp.sqrt(jnp.mean(problem.x**2))
    u0 = jnp.zeros_like(problem.x) if problem.loss == "logistic" else problem.x
    lam0 = jnp.zeros((problem.edges.shape[0], problem.x.shape[1]), problem.x.dtype)
    fused0 = jnp.zeros(problem.edges.shape[0], bool)

    def step(carry, gamma):
        u, lam, g_old, fused = carry
        p = problem.replace(gamma=gamma)
        # A NaN gamma (possible only under jit, where gammas are not checked) poisons its solve
        # and the rest of the path: restarting from a zero dual would give finite, wrong ones.
        poisoned = jnp.isnan(gamma) | jnp.isnan(g_old)
        scale = jnp.where(g_old > 0, gamma / jnp.maximum(g_old, 1e-30), 0.0)
        lam = lam * jnp.where(poisoned, jnp.nan, scale)
        u = jnp.where(poisoned, jnp.nan, u)
        out = solver(p, (u, lam))
        now = _norms(_diff(p.edges, out.u)) <= thresh
        _, raw_k = _compact(_components(p.edges, now, n))
        fused = fused | now
        ids, k = _compact(_components(p.edges, fused, n))
        ys = (out.u, out.objective, out.n_iters, out.converged, ids, k, raw_k)
        return (out.u, out.dual, gamma, fused), ys

    _, ys = jax.lax.scan(step, (u0, lam0, jnp.zeros((), gammas.dtype), fused0), gammas)
    return FusionPath(gammas, *ys)
