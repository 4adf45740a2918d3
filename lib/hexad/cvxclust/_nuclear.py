"""Nuclear-norm graph clustering and the joint (graph + features + labels) program.

The graph program (arXiv:2508.20231, Sec. 2; Chen, Sanghavi & Xu 2014, arXiv:1210.3335)::

    min_{L in B}  sum_{uv} C_uv |L_uv - A_uv|  +  mu ||L||_*

with ``B`` the symmetric matrices with entries in ``[0, 1]`` and ones on the diagonal. ``C``
holds the weights of Chen, Sanghavi & Xu (``c_A`` on edges, ``c_Ac`` on non-edges) times the
observation mask (0 = unobserved pair), so the full, weighted and partially observed variants
are one problem. With a binary ``A`` and ``C = 1`` the data term equals
``const - <A_bar, L>`` on ``B`` (``A_bar = 2A - 1``, the polarised adjacency), which is the
paper's atomic form ``-<A_bar, L> + mu sum_i lambda_i`` with ``L = sum_i lambda_i e_i e_i^T``.

The PSD-hard program (``psd=True``, the default of :func:`graph_problem` and
:func:`joint_problem`) adds ``L >= 0``: the paper's atomic form ``L = sum_i lambda_i e_i
e_i^T`` with ``lambda_i >= 0``. Its ADMM ``L`` step keeps ``max(lambda - mu / rho, 0)`` of the
eigenvalues (the prox of ``mu tr L`` plus the PSD cone; ``mu tr L = mu n`` is a constant on
``B``). The solver returns the better (lower objective) of two feasible points: the ``Z``
iterate (in ``B``) made PSD by :func:`psd_repair`, and the eigen-thresholded ``L`` iterate
(PSD) scaled to unit diagonal and made non-negative by :func:`psd_rescale`. Short of
convergence the second is usually far better: ``Z``'s small entrywise differences from ``L``
add up to a negative eigenvalue that the identity mix pays for with the whole objective. The
certificate is extended to the PSD-hard program (:func:`nuclear_certificate`).
``psd=False`` is the soft-PSD nuclear-norm program described below.

The linear-reward surrogate joint program (a labelled surrogate, not the paper's program; the
program with one shared model per cluster is :class:`~hexad.cvxclust.SharedAtomProblem`):
node features and partial labels enter as a linear reward ``<S, L>`` with
``S = alpha K_x + beta S_y`` (:func:`joint_problem`)::

    min_{L in B}  sum C |L - A|  -  <S, L>  +  mu ||L||_*.

In the atomic form ``<S, L> = sum_i lambda_i e_i^T S e_i``: each atom (cluster) pays a
per-atom quadratic loss of its embedding against the node information, so graph, features and
labels share one atomic representation and the program stays convex. ``K_x`` is the linear
kernel of standardised features divided by their dimension, ``S_y`` is ``+1`` for two labelled
nodes with equal labels and ``-1`` for different labels (0 otherwise).

Relation to the paper's program. The paper (arXiv:2508.20231) extends the atomic form
with node information ``z_v`` (features, and noisy labels on training nodes) and one model
``theta_i`` per atom, fitted to the nodes that atom covers. Its exact per-node loss could not be
read here (only the abstract and a summary of the paper were reachable offline), so this module
implements one instance of that shape and states it exactly: atom ``i`` carries a linear
feature model ``theta_i in R^d`` with a ridge penalty and the reward
``2 e_i^T X theta_i - ||theta_i||^2``; its maximum over ``theta_i`` is ``e_i^T X X^T e_i``
(at ``theta_i = X^T e_i``), so ``sum_i lambda_i max_theta_i (...) = <X X^T, L>``, linear in
``L``, and the program stays convex without the bilinear ``(e_i, theta_i)`` coupling. With
``X = X_s / sqrt(d)`` this is ``<K_x, L>`` up to the constant ``sum_v ||x_v||^2 / d`` on ``B``
(``K_x`` has a zero diagonal and ``diag L = 1``). The label term is the same construction
with one-hot labels ``Y`` on labelled nodes, ``2 Y Y^T``, minus the agreement penalty
``1_l 1_l^T`` that makes ``S_y = 2 Y Y^T - 1_l 1_l^T`` (off the diagonal) score unequal labels
``-1``. ``tests/cvxclust/test_nuclear.py::test_linear_reward_is_per_atom_model_fit`` checks
the identity against a numerical maximisation over ``theta_i``. Any other per-atom loss of the
paper (for example logistic) would not reduce to a linear term in ``L`` and is not
implemented.

What ``mu`` does on ``B``. For ``L in B``, ``||L||_* = tr L + 2 ||L_-||_* = n + 2 ||L_-||_*``
(``L_-`` the negative-eigenvalue part; the diagonal is fixed at 1), so ``mu`` only penalises
negative eigenvalues: a larger ``mu`` removes negative directions and drives the solution to
the PSD cone (the paper's atomic form has ``lambda_i >= 0``, where ``mu sum_i lambda_i =
mu tr L = mu n`` is constant), but it cannot push the rank below that of the PSD-constrained
optimum, which the data set. A subspace smaller than the optimum's rank cannot be the exact
prox (the rank-``k`` step reports ``rank_saturated``). :func:`nuclear_certificate` bounds the
suboptimality of any iterate by a duality gap, independently of how it was computed.
Disconnected parts of the graph add to that rank (a component with no labelled node is its own
cluster); :class:`~hexad.cvxclust.SplitNuclearSolver` (``hexad.cvxclust._split``) solves
such programs exactly block by block, the blocks being the components of the pairs whose
entrywise optimum is not zero (soft and PSD-hard alike).

Solver: ADMM on ``L = Z`` (Boyd et al. 2011): the ``L`` step thresholds eigenvalues
(the prox of ``mu ||.||_*`` on symmetric matrices), the ``Z`` step is a soft threshold towards
``A`` followed by the box projection (exact, because the entrywise problem is one-dimensional
and convex), with residual-balancing penalty updates. For ``n`` in the thousands the eigen step
can run on a rank-``k`` subspace warm-started across iterations (randomised subspace iteration,
Halko, Martinsson & Tropp 2011, arXiv:0909.4061, for the soft program; restarted block Krylov
Rayleigh-Ritz for the PSD-hard one, which needs the largest rather than the largest-magnitude
eigenvalues), optionally doubling ``k`` while it is too small (``max_rank``), with a Lanczos
check at the end that no eigenvalue off the subspace should have been kept (else reported as
saturated). Optionally (``anderson``) the iteration, a relaxed Douglas-Rachford map on
``Z + W``, is Anderson-accelerated with a safeguard.
"""

from __future__ import annotations

from typing import NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from hexad._base import check_finite, check_int, check_positive, is_traced
from hexad.cvxclust._fusion import _check_labels
from hexad.cvxclust._graphs import check_adjacency

__all__ = [
    "NuclearOutput",
    "NuclearProblem",
    "NuclearSolver",
    "assign_labels",
    "box_violation",
    "feature_similarity",
    "graph_problem",
    "joint_problem",
    "NuclearCertificate",
    "label_similarity",
    "matrix_clusters",
    "min_eigenvalue",
    "nuclear_certificate",
    "nuclear_objective",
    "psd_repair",
    "psd_rescale",
    "recovery_error",
]


@flax.struct.dataclass
class NuclearProblem:
    r"""The graph clustering program below, as a pytree.

    .. math::

       \min_{L \in B} \; \sum_{uv} C_{uv} |L_{uv} - A_{uv}| - \langle S, L \rangle + \mu \|L\|_*

    where :math:`B` is the box of symmetric matrices with entries in :math:`[0, 1]` and a unit
    diagonal. With ``psd=True`` (static) the constraint :math:`L \succeq 0` is added: the
    paper's atomic program, where :math:`\mu \|L\|_* = \mu \operatorname{tr} L = \mu n` is a
    constant on :math:`B`. With ``psd=False`` it is the soft-PSD nuclear-norm program.

    Attributes:
      target: ``[n, n]`` symmetric :math:`A` with entries in :math:`[0, 1]`.
      cost: ``[n, n]`` symmetric weights :math:`C \ge 0` (0 = unobserved; the diagonal is
        unused).
      linear: ``[n, n]`` symmetric node-information reward :math:`S`.
      mu: scalar :math:`\mu > 0`.
      psd: static; True for the PSD-hard program.
    """

    target: jax.Array
    cost: jax.Array
    linear: jax.Array
    mu: jax.Array
    psd: bool = flax.struct.field(pytree_node=False, default=False)

    @property
    def n(self) -> int:
        return self.target.shape[0]


def _cost_matrix(adj, observed, edge_weight, nonedge_weight) -> np.ndarray:
    n = adj.shape[0]
    check_positive("edge_weight", edge_weight, allow_zero=True)
    check_positive("nonedge_weight", nonedge_weight, allow_zero=True)
    c = np.where(adj > 0, edge_weight, nonedge_weight)
    if observed is not None:
        obs = np.asarray(observed)
        if obs.shape != (n, n) or obs.dtype != bool or not (obs == obs.T).all():
            raise ValueError(
                f"observed: expected a symmetric bool [{n}, {n}] mask, got {obs.dtype} {obs.shape}"
            )
        c = c * obs
    np.fill_diagonal(c, 0.0)
    return c


def graph_problem(
    adjacency,
    mu: float,
    *,
    observed=None,
    edge_weight: float = 1.0,
    nonedge_weight: float = 1.0,
    psd: bool = True,
) -> NuclearProblem:
    """Returns the graph clustering problem of a binary graph (PSD-hard by default).

    Args:
      adjacency: ``[n, n]`` binary symmetric adjacency (diagonal ignored). Isolated nodes are
        allowed (they end up in singleton clusters).
      mu: nuclear-norm weight ``> 0``.
      observed: optional ``[n, n]`` symmetric bool mask of observed pairs (partially observed
        graph; Chen, Sanghavi & Xu 2014).
      edge_weight: ``c_A``, the weight of disagreeing with an edge.
      nonedge_weight: ``c_Ac``, the weight of disagreeing with a non-edge.
      psd: True (default) for the paper's program ``L in B, L >= 0``; False for the soft-PSD
        nuclear-norm program (``mu`` then only penalises negative eigenvalues).

    >>> p = graph_problem(np.ones((3, 3)) - np.eye(3), 0.5)
    >>> p.target.shape
    (3, 3)
    """
    a = check_adjacency(adjacency)
    check_positive("mu", mu)
    c = _cost_matrix(a, observed, edge_weight, nonedge_weight)
    a = a.copy()
    np.fill_diagonal(a, 1.0)
    dt = jax.dtypes.canonicalize_dtype(np.float64)
    n = a.shape[0]
    return NuclearProblem(
        jnp.asarray(a, dt),
        jnp.asarray(c, dt),
        jnp.zeros((n, n), dt),
        jnp.asarray(mu, dt),
        psd=_check_bool("psd", psd),
    )


def _check_bool(name: str, value) -> bool:
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name}: expected a bool, got {value!r}")
    return bool(value)


def feature_similarity(x) -> np.ndarray:
    r"""Returns :math:`K = X_s X_s^\top / d` ``[n, n]`` with zero diagonal, :math:`X_s`
    column-standardised.

    Constant columns (all entries equal, tested exactly: a float standard deviation of a
    constant column need not be 0) are dropped. Used as the feature reward of
    :func:`joint_problem`.

    >>> feature_similarity(np.array([[1.0], [1.0], [-1.0]]))[0].round(3).tolist()
    [0.0, 0.5, -1.0]
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or not np.isfinite(x).all():
        raise ValueError(f"features: expected a finite [n, d] array, got shape {x.shape}")
    sd = x.std(0)
    keep = (np.ptp(x, axis=0) > 0) & (sd > 0)
    if not keep.any():
        raise ValueError("features: every column is constant; nothing to compare")
    xs = (x[:, keep] - x[:, keep].mean(0)) / sd[keep]
    k = xs @ xs.T / xs.shape[1]
    np.fill_diagonal(k, 0.0)
    return k


def label_similarity(labels, labeled, num_classes: int) -> np.ndarray:
    r"""Returns :math:`S_y` ``[n, n]``: +1 for equal, -1 for different labels of labelled pairs.

    Raises ValueError for labels out of ``[0, num_classes)`` or a class with no labelled node.

    >>> label_similarity(np.array([0, 1, 0]), np.array([1, 1, 0], bool), 2)[0].tolist()
    [0.0, -1.0, 0.0]
    """
    labels = np.asarray(labels)
    labeled = np.asarray(labeled, dtype=bool)
    if labels.ndim != 1 or labeled.shape != labels.shape:
        raise ValueError(
            f"labels, labeled: expected equal [n] shapes, got {labels.shape}, {labeled.shape}"
        )
    _check_labels(labels, labeled, num_classes)
    on = labeled.astype(np.float64)
    s = np.where(labels[:, None] == labels[None, :], 1.0, -1.0) * on[:, None] * on[None, :]
    np.fill_diagonal(s, 0.0)
    return s


def joint_problem(
    mu: float,
    *,
    adjacency=None,
    features=None,
    labels=None,
    labeled=None,
    num_classes: int | None = None,
    alpha: float = 1.0,
    beta: float = 1.0,
    observed=None,
    edge_weight: float = 1.0,
    nonedge_weight: float = 1.0,
    psd: bool = True,
) -> NuclearProblem:
    r"""Returns the linear-reward surrogate joint program of graph, features and partial labels.

    .. math::

       \min_{L \in B} \; \sum C |L - A|
         - \langle \alpha K_x + \beta S_y, L \rangle + \mu \|L\|_*

    with :math:`K_x` the :func:`feature_similarity` and :math:`S_y` the :func:`label_similarity`.
    Any source may be left out: no ``adjacency`` gives the node-information-only program,
    no ``features``/``labels`` the graph-only one.

    Args:
      mu: nuclear-norm weight :math:`\mu > 0`.
      adjacency: optional ``[n, n]`` binary symmetric adjacency.
      features: optional ``[n, d]`` node features.
      labels: optional ``[n]`` int labels (with ``labeled`` ``[n]`` bool and ``num_classes``).
      alpha: feature weight :math:`\alpha \ge 0`; beta: label weight :math:`\beta \ge 0`.
      observed, edge_weight, nonedge_weight, psd: as in :func:`graph_problem`.

    This is a labelled surrogate, not the paper's per-cluster program: at planted clusters the
    reward is an unnormalised k-means objective that can merge clusters whose centred means
    have a positive inner product. :class:`~hexad.cvxclust.SharedAtomProblem` is the program
    with one shared model per cluster.

    >>> p = joint_problem(1.0, features=np.array([[1.0], [1.2], [-1.0]]))
    >>> float(p.linear[0, 1]) > 0
    True
    """
    if adjacency is None and features is None and labels is None:
        raise ValueError("adjacency, features, labels: expected at least one, got none")
    check_positive("mu", mu)
    check_positive("alpha", alpha, allow_zero=True)
    check_positive("beta", beta, allow_zero=True)
    sizes = {
        name: np.shape(v)[0]
        for name, v in (("adjacency", adjacency), ("features", features), ("labels", labels))
        if v is not None
    }
    if len(set(sizes.values())) != 1:
        raise ValueError(f"adjacency, features, labels: expected the same n, got {sizes}")
    n = next(iter(sizes.values()))
    if adjacency is not None:
        a = check_adjacency(adjacency)
        c = _cost_matrix(a, observed, edge_weight, nonedge_weight)
    else:
        a, c = np.zeros((n, n)), np.zeros((n, n))
    s = np.zeros((n, n))
    if features is not None:
        s = s + alpha * feature_similarity(features)
    if labels is not None:
        if labeled is None or num_classes is None:
            raise ValueError("labeled, num_classes: required with labels")
        s = s + beta * label_similarity(labels, labeled, num_classes)
    a = np.array(a, dtype=np.float64)
    np.fill_diagonal(a, 1.0)
    dt = jax.dtypes.canonicalize_dtype(np.float64)
    return NuclearProblem(
        jnp.asarray(a, dt),
        jnp.asarray(c, dt),
        jnp.asarray(s, dt),
        jnp.asarray(mu, dt),
        psd=_check_bool("psd", psd),
    )


def nuclear_objective(problem: NuclearProblem, l) -> jax.Array:
    r"""Returns :math:`\sum C |L - A| - \langle S, L \rangle + \mu \|L\|_*` at ``l`` ``[n, n]``
    (full eigvalsh).

    Independent of the solver. It does not check :math:`L \in B` (see :func:`box_violation`)
    nor, for a PSD-hard problem, :math:`L \succeq 0` (see :func:`min_eigenvalue`).

    >>> p = graph_problem(np.zeros((2, 2)), 1.0)
    >>> float(nuclear_objective(p, jnp.eye(2)))
    2.0
    """
    sym = 0.5 * (l + l.T)
    nuc = jnp.sum(jnp.abs(jnp.linalg.eigvalsh(sym)))
    return _data_term(problem, l) + problem.mu * nuc


def _project_b(l):
    """Symmetrises ``l``, clips it to ``[0, 1]`` and sets the diagonal to 1 (onto ``B``)."""
    eye = jnp.eye(l.shape[0], dtype=bool)
    return jnp.where(eye, 1.0, jnp.clip(0.5 * (l + l.T), 0.0, 1.0))


def _data_term(problem: NuclearProblem, l) -> jax.Array:
    """``sum C |L - A| - <S, L>``: the objective without its nuclear-norm term."""
    return jnp.sum(problem.cost * jnp.abs(l - problem.target)) - jnp.sum(problem.linear * l)


class NuclearCertificate(NamedTuple):
    r"""A duality-gap certificate of a candidate solution (:func:`nuclear_certificate`).

    Attributes:
      primal: the objective at the candidate made feasible (projected onto ``B``; for a
        PSD-hard problem then mixed with the identity, :func:`psd_repair`): an upper bound on
        the optimum.
      dual: the Lagrange dual function at the multiplier projected onto the dual-feasible set
        (the spectral-norm ball of radius :math:`\mu`; for a PSD-hard problem
        :math:`\{Y \succeq -\mu I\}`): a lower bound on the optimum, by weak duality.
      gap: ``primal - dual``, :math:`\ge 0` up to rounding: the candidate is at most this far
        from optimal.
      rel_gap: ``gap`` :math:`/ \max(1, |\text{primal}|)`.
      dual_norm: spectral norm of the multiplier before the projection (:math:`\le \mu` at an
        optimum of the soft program); for a PSD-hard problem :math:`\max(0, -\lambda_{\min}(Y))`
        (:math:`\le \mu`).
      min_eig: smallest eigenvalue of the feasible primal candidate (``>= 0`` up to rounding for
        a PSD-hard problem).
    """

    primal: jax.Array
    dual: jax.Array
    gap: jax.Array
    rel_gap: jax.Array
    dual_norm: jax.Array
    min_eig: jax.Array


def psd_repair(l) -> tuple[jax.Array, jax.Array]:
    r"""Returns :math:`(L', \lambda_{\min}(L'))`: :math:`L` in :math:`B` mixed with :math:`I` just
    enough to be PSD.

    :math:`L' = (1 - t) L + t I` with :math:`t = \max(0, -\lambda_{\min}) / (1 - \lambda_{\min})`:
    :math:`I` is in :math:`B` and PSD and :math:`B` is convex, so :math:`L'` is in :math:`B` with
    eigenvalues :math:`(1 - t) \lambda + t \ge 0`. :math:`t = 0` when :math:`L` is already PSD.
    Two ``eigvalsh``.

    >>> l2, m = psd_repair(jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 1.0, 1.0]]))
    >>> bool(m >= -1e-6)
    True
    """
    lam = jnp.linalg.eigvalsh(0.5 * (l + l.T))[0]
    t = jnp.maximum(0.0, -lam) / (1.0 - jnp.minimum(lam, 0.0))
    out = (1.0 - t) * l + t * jnp.eye(l.shape[0], dtype=l.dtype)
    return out, jnp.linalg.eigvalsh(0.5 * (out + out.T))[0]


def psd_rescale(l) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Returns ``(l', d, t)``: a PSD ``l`` scaled to unit diagonal and made non-negative.

    ``l' = (1 - t) D l D + t J`` with ``D = diag(d)``, ``d_v = l_vv^(-1/2)`` (a node with
    ``l_vv <= 1e-12`` keeps only its diagonal 1: ``D l D`` is completed by ``I`` on those
    nodes), ``J`` the all-ones matrix and ``t = max(0, -m) / (1 - m)``, ``m`` the smallest
    entry of ``D l D``. For PSD ``l``, ``D l D`` is PSD with unit diagonal, so its entries lie
    in ``[-1, 1]``, and ``J`` is PSD with entries 1: ``l'`` lies in ``B`` and the PSD cone.
    This is the feasible point of the PSD-hard program nearest in spirit to the ADMM's
    eigen-thresholded (PSD) iterate: its violations are of the box, entry by entry, where the
    box iterate's (:func:`psd_repair`) are spectral, so near convergence it loses far less
    objective. ``l`` must be PSD (it is not checked here; :class:`NuclearSolver` applies
    :func:`psd_repair` after it, which is then the identity up to rounding).

    >>> l2, d, t = psd_rescale(jnp.array([[4.0, -2.0], [-2.0, 4.0]]))
    >>> l2.round(3).tolist(), round(float(t), 4)
    ([[1.0, 0.0], [0.0, 1.0]], 0.3333)
    """
    diag = jnp.diagonal(l)
    live = diag > 1e-12
    d = jnp.where(live, jax.lax.rsqrt(jnp.where(live, diag, 1.0)), 0.0)
    s = d[:, None] * l * d[None, :]
    s = jnp.where(jnp.eye(l.shape[0], dtype=bool), 1.0, 0.5 * (s + s.T))
    m = jnp.min(s)
    t = jnp.maximum(0.0, -m) / (1.0 - jnp.minimum(m, 0.0))
    return (1.0 - t) * s + t, d, t


def _feasible_from_psd(l):
    """``(l', lambda_min(l'), d, t)``: an ADMM's PSD iterate ``l`` made feasible by
    :func:`psd_rescale` (its ``d`` and ``t``), then :func:`psd_repair` against rounding."""
    l2, d, t = psd_rescale(l)
    l2, min_eig = psd_repair(l2)
    return l2, min_eig, d, t


def min_eigenvalue(l) -> jax.Array:
    """Returns the smallest eigenvalue of the symmetric part of ``l``.

    >>> float(min_eigenvalue(jnp.eye(2)))
    1.0
    """
    return jnp.linalg.eigvalsh(0.5 * (l + l.T))[0]


def nuclear_certificate(problem: NuclearProblem, l, multiplier) -> NuclearCertificate:
    r"""Returns a duality-gap certificate for ``l`` with Lagrange multiplier ``multiplier``.

    The ADMM splitting :math:`\min \mu \|L\|_* + F(Z)` s.t. :math:`L = Z`, :math:`Z \in B`, with
    :math:`F(Z) = \sum C |Z - A| - \langle S, Z \rangle`, has the Lagrangian
    :math:`\mu \|L\|_* + F(Z) + \langle Y, L - Z \rangle` and the dual function (Boyd &
    Vandenberghe 2004, Sec. 5.1; the dual norm of :math:`\|\cdot\|_*` is the spectral norm)

    .. math::

       g(Y) = \begin{cases}
         \min_{Z \in B} F(Z) - \langle Y, Z \rangle & \text{if } \|Y\|_2 \le \mu, \\
         -\infty & \text{otherwise.}
       \end{cases}

    :math:`\min_{Z \in B}` separates over entries: each off-diagonal term
    :math:`C_{uv} |z - A_{uv}| - (S_{uv} + Y_{uv}) z` is convex and piecewise linear on
    :math:`[0, 1]` with its kink at :math:`A_{uv}`, so its minimum is at
    :math:`z \in \{0, A_{uv}, 1\}`; the diagonal is fixed at 1. The multiplier is symmetrised
    and projected onto :math:`\{\|Y\|_2 \le \mu\}` (eigenvalues clipped to :math:`[-\mu, \mu]`),
    so ``dual`` is a valid lower bound for any input, and ``primal`` (the objective at ``l``
    projected onto :math:`B`) a valid upper bound: ``gap`` bounds the suboptimality of the
    projected ``l`` whether or not a solver converged.

    PSD-hard problems (``problem.psd``): the :math:`L` part of the Lagrangian is
    :math:`\min_{L \succeq 0} \langle \mu I + Y, L \rangle`, which is 0 iff
    :math:`Y \succeq -\mu I` (else :math:`-\infty`), so the multiplier's eigenvalues are clipped
    to :math:`[-\mu, \infty)` and :math:`g` is the same entrywise minimum; the primal candidate
    is the projection onto :math:`B` followed by :func:`psd_repair`, feasible for :math:`B` and
    the PSD cone. For :class:`NuclearSolver` the multiplier is ``output.rho * output.dual``.
    Costs two dense :math:`n \times n` eigendecompositions.

    Args:
      problem: the :class:`NuclearProblem`.
      l: ``[n, n]`` candidate solution.
      multiplier: ``[n, n]`` candidate Lagrange multiplier ``Y``.

    Returns:
      A :class:`NuclearCertificate`.

    >>> p = graph_problem(np.kron(np.eye(2), np.ones((2, 2))), 1.0)
    >>> out = NuclearSolver(tol=1e-8)(p)
    >>> c = nuclear_certificate(p, out.l, out.rho * out.dual)
    >>> bool(c.rel_gap < 1e-5)
    True
    """
    n = problem.n
    eye = jnp.eye(n, dtype=bool)
    z = _project_b(l)
    if problem.psd:
        z, min_eig = psd_repair(z)
    else:
        min_eig = min_eigenvalue(z)
    primal = nuclear_objective(problem, z)
    y = 0.5 * (multiplier + multiplier.T)
    lam, vec = jnp.linalg.eigh(y)
    hi = jnp.inf if problem.psd else problem.mu
    y = (vec * jnp.clip(lam, -problem.mu, hi)[None, :]) @ vec.T
    y = 0.5 * (y + y.T)
    a, c, slope = problem.target, problem.cost, problem.linear + y
    cand = jnp.stack(
        [c * a, c * jnp.abs(1.0 - a) - slope, -slope * a]  # z = 0, z = 1, z = A
    )
    off = jnp.where(eye, 0.0, jnp.min(cand, axis=0))
    diag = jnp.where(eye, c * jnp.abs(1.0 - a) - slope, 0.0)
    dual = jnp.sum(off) + jnp.sum(diag)
    gap = primal - dual
    return NuclearCertificate(
        primal=primal,
        dual=dual,
        gap=gap,
        rel_gap=gap / jnp.maximum(1.0, jnp.abs(primal)),
        dual_norm=jnp.maximum(0.0, -lam[0]) if problem.psd else jnp.max(jnp.abs(lam)),
        min_eig=min_eig,
    )


def box_violation(l) -> jax.Array:
    """Returns how far ``l`` is from the box :math:`B`: max of box, diagonal and asymmetry
    violations.

    >>> float(box_violation(jnp.eye(2)))
    0.0
    """
    n = l.shape[0]
    box = jnp.max(jnp.maximum(-l, 0.0) + jnp.maximum(l - 1.0, 0.0))
    diag = jnp.max(jnp.abs(jnp.diagonal(l) - 1.0))
    asym = jnp.max(jnp.abs(l - l.T))
    del n
    return jnp.maximum(jnp.maximum(box, diag), asym)


class NuclearOutput(NamedTuple):
    r"""What :class:`NuclearSolver` returns.

    Attributes:
      l: ``[n, n]`` solution in ``B``: the ADMM ``Z`` iterate; for a PSD-hard problem the
        better feasible point of ``Z`` and ``L`` (``min_eig``).
      low_rank: ``[n, n]`` the ``L`` iterate (eigen-thresholded; equals ``l`` at convergence).
      dual: ``[n, n]`` scaled ADMM dual.
      rho: final ADMM penalty.
      objective: ``nuclear_objective(problem, l)``; ``None`` when the solver's
        ``compute_objective`` is False (never a stand-in number).
      rank: number of nonzero eigenvalues kept in the last ``L`` step.
      rank_saturated: with a rank-``k`` eigen step, True if the last step may not have been
        the exact prox: all ``k`` Ritz values exceeded the threshold ``mu / rho`` (in absolute
        value for a soft problem), or the Lanczos estimate (``check_iters`` steps) of the
        largest eigenvalue (PSD-hard) or spectral norm (soft) of ``Z - W`` off the subspace
        does. Then ``k`` was too small and the answer may not be the optimum: re-solve with a
        larger ``rank`` / ``max_rank`` or the full ``eigh``. Whatever it says, the duality gap
        of :func:`nuclear_certificate` bounds the suboptimality of ``l``.
      primal_residuals: ``[max_iters]``
        :math:`\|L - Z\| / \max(1, \|L\|, \|Z\|)`, -1 padded.
      dual_residuals: ``[max_iters]``
        :math:`\rho \|Z - Z_{\text{prev}}\| / \max(1, \rho \|W\|)`, -1 padded.
      n_iters: iterations run.
      converged: both residuals ``<= tol`` (False when the solve stopped at ``max_iters``).
      min_eig: smallest eigenvalue of ``l``. For a PSD-hard problem ``l`` is the better of
        the ``Z`` iterate made PSD by :func:`psd_repair` and the ``L`` iterate made feasible by
        :func:`psd_rescale` (module docstring), so this is ``>= 0`` up to rounding.
      subspace_rank: the subspace size ``k`` of the last step (``n`` for the full ``eigh``);
        with ``max_rank`` the rank the adaptive path reached.
      subspace: ``[n, max_rank]`` (``[n, rank]`` without ``max_rank``): the last step's Ritz
        vectors in the first ``subspace_rank`` columns, zeros after; a warm start for the
        next solve (``init``). ``[n, 1]`` zeros for the full ``eigh``.
    """

    l: jax.Array
    low_rank: jax.Array
    dual: jax.Array
    rho: jax.Array
    objective: jax.Array | None
    rank: jax.Array
    rank_saturated: jax.Array
    primal_residuals: jax.Array
    dual_residuals: jax.Array
    n_iters: jax.Array
    converged: jax.Array
    min_eig: jax.Array
    subspace_rank: jax.Array
    subspace: jax.Array


class _AAState(NamedTuple):
    dg: jax.Array  # [memory, *shape] differences of map outputs
    df: jax.Array  # [memory, *shape] differences of residuals
    gram: jax.Array  # [memory, memory] df's inner products
    live: jax.Array  # [memory] which slots hold a difference
    slot: jax.Array  # the slot written next
    g_prev: jax.Array
    f_prev: jax.Array
    has_prev: jax.Array  # g_prev, f_prev belong to the current map
    fnorm: jax.Array  # ||f|| at the previous point
    accel: jax.Array  # whether the current point is an extrapolation


class _Anderson:
    """Type-II Anderson acceleration of a fixed-point map ``u -> g(u)`` (Walker & Ni 2011;
    with a safeguard as in Zhang, O'Donoghue & Boyd 2020, arXiv:1808.03971).

    :meth:`step` takes the current point ``u`` and its image ``g``, records the differences
    of ``g`` and of the residual ``f = g - u`` (the last ``memory``) and returns the next point
    ``g - dG gamma`` with ``gamma`` the ridge least-squares fit of ``f`` by ``dF``. It returns
    the plain ``g`` instead, and forgets the differences, where told to (``restart``: the map
    changed, for example with ``rho``) and where an extrapolated point's residual exceeds the
    previous point's (the safeguard; the plain iteration of an averaged operator never
    increases it). ``memory`` 0 is the plain iteration. Built at trace time.
    """

    def __init__(self, memory: int, shape, dt, ridge: float = 1e-6):
        self.memory = check_int("anderson", memory, 0)
        self.shape, self.dt, self.ridge = tuple(shape), dt, ridge

    def init(self) -> _AAState:
        k = max(self.memory, 1)
        buf = jnp.zeros((k if self.memory else 0, *self.shape), self.dt)
        zero = jnp.zeros(self.shape, self.dt)
        return _AAState(
            buf,
            buf,
            jnp.zeros((k, k), self.dt),
            jnp.zeros((k,), bool),
            jnp.zeros((), jnp.int32),
            zero if self.memory else buf,
            zero if self.memory else buf,
            jnp.array(False),
            jnp.asarray(jnp.inf, self.dt),
            jnp.array(False),
        )

    def step(self, st: _AAState, u, g, restart):
        """``(next point, state)``; ``restart`` (bool): take ``g`` and forget the history, also
        the last point (the next ``u`` is not ``g``)."""
        if not self.memory:
            return g, st
        f = g - u
        fnorm = jnp.linalg.norm(f)
        reject = st.accel & (fnorm > st.fnorm)
        add = st.has_prev & ~reject & ~restart
        df = st.df.at[st.slot].set(jnp.where(add, f - st.f_prev, st.df[st.slot]))
        dg = st.dg.at[st.slot].set(jnp.where(add, g - st.g_prev, st.dg[st.slot]))
        live = jnp.where(reject | restart, False, st.live.at[st.slot].set(st.live[st.slot] | add))
        flat = df.reshape(self.memory, -1)
        row, rhs = flat @ flat[st.slot], flat @ f.reshape(-1)
        gram = jnp.where(add, st.gram.at[st.slot].set(row).at[:, st.slot].set(row), st.gram)
        mask = live[:, None] & live[None, :]
        g_live = jnp.where(mask, gram, 0.0)
        scale = jnp.max(jnp.where(live, jnp.diag(gram), 0.0))
        reg = self.ridge * scale + jnp.finfo(self.dt).tiny
        lhs = g_live + jnp.diag(jnp.where(live, reg, 1.0))
        gamma = jnp.linalg.solve(lhs, jnp.where(live, rhs, 0.0))
        extra = jnp.any(live) & jnp.all(jnp.isfinite(gamma))
        gamma = jnp.where(extra, gamma, 0.0)
        nxt = jnp.where(extra, g - jnp.tensordot(gamma, dg, axes=1), g)
        new = _AAState(
            dg,
            df,
            gram,
            live,
            jnp.where(add, (st.slot + 1) % self.memory, st.slot),
            g,
            f,
            ~restart,
            fnorm,
            extra,
        )
        return nxt, new


class _NState(NamedTuple):
    it: jax.Array
    l: jax.Array
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


def _soft(v, t):
    return jnp.sign(v) * jnp.maximum(jnp.abs(v) - t, 0.0)


def _check_settings(solver) -> None:
    """Checks the static settings every ADMM solver has, at construction (``tol``,
    ``max_iters``, ``rho``, ``adapt_every``, ``relaxation``, ``balance``), so that a bad one is
    named before it reaches XLA (a negative ``max_iters`` failed there)."""
    check_positive("tol", solver.tol, allow_zero=True)
    check_int("max_iters", solver.max_iters)
    check_positive("rho", solver.rho)
    check_int("adapt_every", solver.adapt_every, 0)
    _check_admm(solver)


def _check_admm(solver) -> None:
    """Checks the ADMM settings shared by the solvers (``relaxation``, ``balance``)."""
    if not 0.0 < solver.relaxation < 2.0:
        raise ValueError(f"relaxation: expected a float in (0, 2), got {solver.relaxation!r}")
    if not solver.balance > 1.0:
        raise ValueError(f"balance: expected a float > 1, got {solver.balance!r}")


def admm_residuals(x, z, z_prev, w, rho, it, adapt_every: int, balance: float = 10.0):
    """Relative primal and dual residuals of a scaled-form ADMM iterate, and the penalty update.

    ``x`` and ``z`` are the two blocks' iterates (constraint ``x = z``), ``z_prev`` the previous
    ``z``, ``w`` the scaled dual ``y / rho``. Every ``adapt_every`` iterations (0: never) ``rho``
    doubles where the primal residual is over ``balance`` times the dual and halves in the
    opposite case, and ``w`` is rescaled so that ``y`` is unchanged. Returns
    ``(pres, dres, rho, w)``.
    """
    pres = jnp.linalg.norm(x - z) / jnp.maximum(
        1.0, jnp.maximum(jnp.linalg.norm(x), jnp.linalg.norm(z))
    )
    dres = rho * jnp.linalg.norm(z - z_prev) / jnp.maximum(1.0, rho * jnp.linalg.norm(w))
    if adapt_every:
        tick = (it + 1) % adapt_every == 0
        factor = jnp.where(
            tick & (pres > balance * dres), 2.0, jnp.where(tick & (dres > balance * pres), 0.5, 1.0)
        )
        rho = rho * factor
        w = w / factor
    return pres, dres, rho, w


@flax.struct.dataclass
class NuclearSolver:
    r"""ADMM for :class:`NuclearProblem` (all settings static).

    Gradients: not supported (``lax.while_loop``).

    Attributes:
      tol: relative tolerance on both residuals, ``>= 0``.
      max_iters: iteration cap, ``>= 1``.
      rho: initial ADMM penalty, ``> 0``.
      adapt_every: residual balancing (Boyd et al. 2011, Sec. 3.4.1) every this many
        iterations; 0 keeps ``rho`` fixed.
      balance: the residual ratio (``> 1``) past which balancing doubles or halves ``rho``
        (Boyd et al.'s 10; a smaller one follows the residuals more closely).
      rank: ``None`` for a full ``eigh`` per step, or ``k`` for the rank-``k`` step: Ritz
        pairs of the ADMM matrix on a ``k``-dimensional subspace warm-started from the previous
        step's (``power_iters`` block Krylov sweeps of Rayleigh-Ritz), for ``n`` in the
        thousands, where a dense ``eigh`` is most of an iteration.
      max_rank: with ``rank``, ``None`` keeps ``k = rank``; an int ``>= rank`` lets ``k``
        double (``rank, 2 rank, ...``, capped at ``max_rank``, static sizes chosen by
        ``lax.switch``) whenever a step is saturated (all ``k`` Ritz values kept) and whenever
        the residuals meet ``tol`` but the outside check (below) fails; the solve then goes on
        from the current iterate and subspace. (Under ``jax.vmap`` the check, a
        ``lax.cond``, runs at every step.)
      rank_margin: with ``max_rank``, ``None`` keeps the doubling rule above (``k`` only ever
        grows); an int ``>= 0`` makes ``k`` track the rank the step keeps: the static sizes
        are finer (``rank`` times ``5/4`` per level, rounded up, capped at ``max_rank``) and
        after each step ``k`` moves one level up when the step is saturated or keeps more than
        ``k - rank_margin`` eigenvalues, and one level down when the kept rank plus
        ``rank_margin`` fits the level below (the subspace's leading Ritz vectors stay; the
        others wait in the buffer as a warm start for a later growth). On a 500-node Cora
        block the doubling rule grew ``k`` to 256 to keep about 50 eigenvalues.
      power_iters: Rayleigh-Ritz sweeps per ADMM step (rank-``k`` path only).
      check_iters: Lanczos steps of the outside check (rank-``k`` path only): the largest
        eigenvalue (PSD-hard) or the spectral norm (soft) of the ADMM matrix projected off the
        subspace, which must not exceed the threshold ``mu / rho`` for the step to be the
        exact prox (reported in ``rank_saturated``).
      compute_objective: evaluate ``nuclear_objective`` at the end (a full ``eigvalsh``);
        False leaves the output's ``objective`` ``None``.
      relaxation: over-relaxation ``alpha`` in ``(0, 2)`` (Boyd et al. 2011, Sec. 3.4.3;
        Eckstein & Bertsekas 1992): the ``Z`` and dual steps use
        :math:`\alpha L + (1 - \alpha) Z_{\text{prev}}` in place of :math:`L`; 1 is plain ADMM.
      anderson: memory of type-II Anderson acceleration (0: none) of the ADMM as a fixed-point
        map on ``U = Z + W`` (``W`` the scaled dual; the map is the relaxed Douglas-Rachford
        step): each step moves ``U`` to the extrapolation of the last ``anderson`` steps, with
        a safeguard (an extrapolated point whose fixed-point residual exceeds the previous
        point's is left for the plain step) and a restart whenever ``rho`` changes. ``Z`` is
        the box step of ``U`` and stays in ``B``; the residuals tested against ``tol`` are
        the plain step's, and the last iterate is a plain step. Keeps ``2 anderson + 2``
        extra ``n x n`` matrices.

    >>> a = np.kron(np.eye(2), np.ones((3, 3)))
    >>> out = jax.jit(NuclearSolver())(graph_problem(a, 1.0))
    >>> bool(out.converged), float(jnp.round(out.l[0, 1], 3)), float(jnp.round(out.l[0, 4], 3))
    (True, 1.0, 0.0)
    """

    tol: float = flax.struct.field(pytree_node=False, default=1e-4)
    max_iters: int = flax.struct.field(pytree_node=False, default=2000)
    rho: float = flax.struct.field(pytree_node=False, default=1.0)
    adapt_every: int = flax.struct.field(pytree_node=False, default=10)
    balance: float = flax.struct.field(pytree_node=False, default=10.0)
    rank: int | None = flax.struct.field(pytree_node=False, default=None)
    max_rank: int | None = flax.struct.field(pytree_node=False, default=None)
    rank_margin: int | None = flax.struct.field(pytree_node=False, default=None)
    power_iters: int = flax.struct.field(pytree_node=False, default=2)
    check_iters: int = flax.struct.field(pytree_node=False, default=60)
    compute_objective: bool = flax.struct.field(pytree_node=False, default=True)
    relaxation: float = flax.struct.field(pytree_node=False, default=1.0)
    anderson: int = flax.struct.field(pytree_node=False, default=0)

    def __post_init__(self) -> None:
        _check_settings(self)

    def _levels(self, n: int) -> tuple[int, ...]:
        """The static ranks of the rank-``k`` path: ``rank`` doubled up to ``max_rank`` (times
        ``5/4``, rounded up, with ``rank_margin``)."""
        k = check_int("rank", self.rank, 1, n)
        top = k if self.max_rank is None else check_int("max_rank", self.max_rank, k, n)
        levels = [k]
        while levels[-1] < top:
            cur = levels[-1]
            nxt = 2 * cur if self.rank_margin is None else max(cur + 1, -(-5 * cur // 4))
            levels.append(min(nxt, top))
        return tuple(levels)

    def _ritz_step(self, m, q, psd: bool):
        """``k`` Ritz pairs of ``m`` from the warm start ``q`` ``[n, k]``; ``(lam [k], vec)``.

        PSD-hard: ``power_iters`` Rayleigh-Ritz sweeps on ``span[q, m q]``: each extends the
        orthonormal ``q`` by its orthonormalised residual block ``(I - q q^T) m q`` (at most
        ``n - k`` columns) and keeps the ``k`` largest Ritz pairs on that ``2k``-dimensional
        space. A block Krylov method restarted from ``k`` Ritz vectors, it converges to the
        largest eigenvalues, where subspace iteration converges to the largest in absolute
        value and a large negative part of ``m`` would crowd the positive one out. Soft:
        ``power_iters`` sweeps of subspace iteration (Halko, Martinsson & Tropp 2011), whose
        target, the largest ``|eigenvalues|``, is the soft prox's.
        """
        n, k = q.shape
        if not psd:
            # Soft: the prox needs the largest |eigenvalues|, which plain subspace iteration
            # finds at half the cost of a sweep below.
            for _ in range(self.power_iters):
                q = jnp.linalg.qr(m @ q)[0]
            b = q.T @ m @ q
            lam, e = jnp.linalg.eigh(0.5 * (b + b.T))
            return lam, q @ e
        q = jnp.linalg.qr(q)[0]
        lam = None
        for _ in range(self.power_iters):
            mq = m @ q
            h = q.T @ mq
            r = mq - q @ h
            # The residual block extends q through one Householder QR of [q, r]: its columns
            # past k are orthonormal to q even when r is rank-deficient (k > n / 2, or a
            # subspace close to invariant), where a QR of the projected r alone returned
            # columns along q and a non-orthonormal basis (wrong Ritz pairs).
            r = jnp.linalg.qr(jnp.concatenate([q, r], axis=1))[0][:, k : min(2 * k, n)]
            v = jnp.concatenate([q, r], axis=1)
            # v^T m v from three k x k blocks: q^T m r = (r^T m q)^T, as m is symmetric.
            c = r.T @ mq
            b = jnp.block([[0.5 * (h + h.T), c.T], [c, r.T @ (m @ r)]])
            theta, e = jnp.linalg.eigh(0.5 * (b + b.T))
            if psd:
                idx = jnp.arange(theta.shape[0] - k, theta.shape[0])
            else:
                idx = jnp.argsort(-jnp.abs(theta))[:k]
            lam, q = theta[idx], v @ e[:, idx]
        return lam, q

    def _outside_spectrum(self, m, qa, psd: bool, steps: int):
        """Estimates the largest eigenvalue (PSD-hard) or spectral norm (soft) of ``P m P``.

        ``P = I - qa qa^T`` (``qa`` ``[n, j]`` with orthonormal or zero columns). Lanczos with
        full reorthogonalisation, ``steps`` steps (static) from a fixed random start; its Ritz
        values lie inside the spectrum and converge to both ends first (Kuczynski &
        Wozniakowski 1992: for a PSD matrix the chance of a relative error over ``eps`` after
        ``j`` steps is at most ``1.648 sqrt(n) exp(-sqrt(eps) (2 j - 1))``). The rank-``k``
        step is the exact prox iff the true value is at most the threshold.
        """
        n = m.shape[0]
        if steps <= 0:
            return jnp.zeros((), m.dtype)

        def proj(v):
            return v - qa @ (qa.T @ v)

        v0 = proj(jax.random.normal(jax.random.key(1), (n,), m.dtype))
        v0 = v0 / jnp.linalg.norm(v0)
        basis = jnp.zeros((steps + 1, n), m.dtype).at[0].set(v0)

        def body(j, c):
            basis, alpha, beta = c
            v = basis[j]
            w = proj(m @ proj(v))
            a = v @ w
            w = w - basis.T @ (basis @ w)  # full reorthogonalisation (unused rows are 0)
            w = proj(w - basis.T @ (basis @ w))
            b = jnp.linalg.norm(w)
            ok = b > 1e-12 * jnp.maximum(1.0, jnp.abs(a))
            nxt = jnp.where(ok, w / jnp.where(ok, b, 1.0), 0.0)
            return (
                basis.at[j + 1].set(nxt),
                alpha.at[j].set(a),
                beta.at[j].set(jnp.where(ok, b, 0.0)),
            )

        zeros = jnp.zeros((steps,), m.dtype)
        _, alpha, beta = jax.lax.fori_loop(0, steps, body, (basis, zeros, zeros))
        tri = jnp.diag(alpha) + jnp.diag(beta[:-1], 1) + jnp.diag(beta[:-1], -1)
        theta = jnp.linalg.eigvalsh(tri)
        return theta[-1] if psd else jnp.maximum(theta[-1], -theta[0])

    def __call__(self, problem: NuclearProblem, init=None) -> NuclearOutput:
        """Solves ``problem``; ``init`` is ``None``, an ``[n, n]`` start for ``Z``,
        ``(z, dual, rho)`` from an earlier output, or ``(z, dual, rho, subspace)`` with an
        earlier output's ``subspace`` ``[n, j]`` (rank-``k`` path: its nonzero columns seed the
        subspace, and the rank starts at the first level that holds them). Any start is valid
        (``Z`` is projected onto ``B`` first)."""
        n = problem.n
        dt = problem.target.dtype
        _check_admm(self)
        if init is None:
            z0, w0, rho0 = jnp.eye(n, dtype=dt), jnp.zeros((n, n), dt), jnp.asarray(self.rho, dt)
        elif isinstance(init, tuple):
            z0, w0, rho0 = (jnp.asarray(v, dt) for v in init[:3])
        else:
            z0, w0, rho0 = jnp.asarray(init, dt), jnp.zeros((n, n), dt), jnp.asarray(self.rho, dt)
        if z0.shape != (n, n) or w0.shape != (n, n):
            raise ValueError(f"init: expected [{n}, {n}] matrices, got {z0.shape}, {w0.shape}")
        sub0 = init[3] if isinstance(init, tuple) and len(init) == 4 else None
        eig = _EigenStep(self, n, problem.psd, dt, sub0)
        acc = _Anderson(self.anderson, (n, n), dt)
        eye = jnp.eye(n, dtype=bool)

        def project_b(v):
            # Iterates stay symmetric by construction (symmetric data, V diag V^T steps), so
            # the loop never transposes an n x n matrix (slow on CPU); only the start is
            # symmetrised.
            return jnp.where(eye, 1.0, jnp.clip(v, 0.0, 1.0))

        z0 = project_b(0.5 * (z0 + z0.T))
        w0 = 0.5 * (w0 + w0.T)

        def z_step(v, rho):
            v = v + problem.linear / rho
            z = problem.target + _soft(v - problem.target, problem.cost / rho)
            return project_b(z)

        def cond(s: _NState):
            return (s.it < self.max_iters) & ((s.pres > self.tol) | (s.dres > self.tol))

        def body(s: _NState):
            m = s.z - s.w
            t = problem.mu / s.rho
            l, q, rank, sat = eig.step(m, s.q, s.level, t)
            lr = l if self.relaxation == 1.0 else self.relaxation * l + (1 - self.relaxation) * s.z
            g = lr + s.w
            z = z_step(g, s.rho)
            pres, dres, rho, w = admm_residuals(
                l, z, s.z, g - z, s.rho, s.it, self.adapt_every, self.balance
            )
            level, pres = eig.grow(m, q, s.level, t, sat, rank, pres, dres, self.tol)
            z, w, aa = _accelerate(acc, s, g, z, w, rho, pres, dres, self, z_step)
            return _NState(
                s.it + 1,
                l,
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
        s = _NState(
            jnp.zeros((), jnp.int32),
            z0,
            z0,
            w0,
            rho0,
            eig.q0,
            eig.level0,
            jnp.zeros((), jnp.int32),
            jnp.array(False),
            inf,
            inf,
            hist,
            hist,
            acc.init(),
        )
        s = jax.lax.while_loop(cond, body, s)
        # The exact-prox check of the next step's matrix on the last subspace.
        sat = s.sat | eig.short(s.z - s.w, s.q, s.level, problem.mu / s.rho)
        if problem.psd:  # the better feasible point; mu tr L = mu n on both: data decides
            l_a, min_a = psd_repair(s.z)
            l_b, min_b, _, _ = _feasible_from_psd(s.l)
            pick = _data_term(problem, l_b) < _data_term(problem, l_a)
            l_out, min_eig = jnp.where(pick, l_b, l_a), jnp.where(pick, min_b, min_a)
        else:
            l_out, min_eig = s.z, min_eigenvalue(s.z)
        obj = nuclear_objective(problem, l_out) if self.compute_objective else None
        return NuclearOutput(
            l=l_out,
            low_rank=s.l,
            dual=s.w,
            rho=s.rho,
            objective=obj,
            rank=s.rank,
            rank_saturated=sat,
            primal_residuals=s.hist_p,
            dual_residuals=s.hist_d,
            n_iters=s.it,
            converged=(s.pres <= self.tol) & (s.dres <= self.tol),
            min_eig=min_eig,
            subspace_rank=eig.subspace_rank(s.level),
            subspace=eig.subspace(s.q, s.level),
        )


def _accelerate(acc: _Anderson, s, g, z, w, rho, pres, dres, solver, z_step):
    """One Anderson step of an ADMM in the scaled form of :class:`NuclearSolver` and
    :class:`~hexad.cvxclust.SharedAtomSolver`: from the state ``s`` (``s.z``, ``s.w``,
    ``s.rho``, ``s.it``, ``s.aa``), the plain step's ``g = (relaxed L) + W`` and its
    ``z = box(g)``, ``w`` (after residual balancing, at ``rho``), returns ``(z, w, aa)``: the
    box step of the extrapolated ``U`` and its dual, or the plain pair on a restart (the first
    step, a change of ``rho``, and the last step, whose residuals are tested)."""
    if not acc.memory:
        return z, w, s.aa
    done = ((pres <= solver.tol) & (dres <= solver.tol)) | (s.it + 1 >= solver.max_iters)
    restart = (s.it == 0) | (rho != s.rho) | done
    u, aa = acc.step(s.aa, s.z + s.w, g, restart)
    za = z_step(u, s.rho)
    return jnp.where(restart, z, za), jnp.where(restart, w, u - za), aa


class _EigenStep:
    """The ``L`` step of an ADMM whose ``L`` block carries ``t tr(.)`` on the PSD cone
    (``psd``) or ``t ||.||_*``: with ``solver.rank`` ``None`` a full ``eigh``, else the rank-``k``
    path of :class:`NuclearSolver` (its ``rank``, ``max_rank``, ``power_iters`` and
    ``check_iters``): the static subspace sizes, the warm-started subspace, one thresholded
    step, the exact-prox check off the subspace and the growth rule. Shared by
    :class:`NuclearSolver` and :class:`~hexad.cvxclust.SharedAtomSolver`; built at trace time.
    """

    def __init__(self, solver, n: int, psd: bool, dt, sub0=None):
        if solver.max_rank is not None and solver.rank is None:
            raise ValueError(f"max_rank: expected None without rank, got {solver.max_rank!r}")
        if solver.rank_margin is not None:
            if solver.max_rank is None:
                raise ValueError(
                    f"rank_margin: expected None without max_rank, got {solver.rank_margin!r}"
                )
            check_int("rank_margin", solver.rank_margin, 0)
        check_int("power_iters", solver.power_iters)
        check_int("check_iters", solver.check_iters, 0)
        self.solver, self.psd, self.dt = solver, psd, dt
        self.levels = None if solver.rank is None else solver._levels(n)
        self.check = min(solver.check_iters, n - (self.levels or (n,))[-1])
        # The subspace buffer holds max_rank columns; level j uses the first levels[j] (the
        # columns past them stay the random start, so a grown subspace starts independent).
        self.kmax = 1 if self.levels is None else self.levels[-1]
        self.last = 0 if self.levels is None else len(self.levels) - 1
        self.q0 = jnp.linalg.qr(jax.random.normal(jax.random.key(0), (n, self.kmax), dt))[0]
        self.level0 = jnp.zeros((), jnp.int32)
        if sub0 is not None and self.levels is not None:
            sub0 = jnp.asarray(sub0, dt)
            if sub0.ndim != 2 or sub0.shape[0] != n or sub0.shape[1] > self.kmax:
                raise ValueError(
                    f"init: expected a subspace [{n}, j] with j <= {self.kmax}, got {sub0.shape}"
                )
            j = sub0.shape[1]
            live = jnp.linalg.norm(sub0, axis=0) > 0
            # Live columns first, so that the first levels[level0] columns hold them all.
            order = jnp.argsort(~live, stable=True)
            seeded = jnp.where(live[order][None, :], sub0[:, order], self.q0[:, :j])
            self.q0 = self.q0.at[:, :j].set(seeded)
            count = jnp.sum(live).astype(jnp.int32)
            self.level0 = jnp.minimum(
                jnp.searchsorted(jnp.asarray(self.levels, jnp.int32), count), self.last
            ).astype(jnp.int32)

    def prox(self, lam, vec, t):
        """The prox of ``t tr(.)`` + the PSD cone (``psd``) or of ``t ||.||_*`` from eigenpairs;
        ``(matrix, number of eigenvalues kept)``."""
        s = jnp.maximum(lam - t, 0.0) if self.psd else _soft(lam, t)
        return (vec * s[None, :]) @ vec.T, jnp.sum(s != 0).astype(jnp.int32)

    def step(self, m, q, level, t):
        """``(prox of m, subspace, rank kept, saturated)``; saturated: all ``k`` Ritz values
        kept (always False for the full ``eigh``)."""
        if self.levels is None:
            lam, vec = jnp.linalg.eigh(m)
            l, rank = self.prox(lam, vec, t)
            return l, q, rank, jnp.array(False)

        def at_level(k):
            def step(m, q):
                lam, vec = self.solver._ritz_step(m, q[:, :k], self.psd)
                l, rank = self.prox(lam, vec, t)
                kept = lam > t if self.psd else jnp.abs(lam) > t
                # Leading Ritz vectors first: a smaller level keeps the ones that matter.
                order = jnp.argsort(-lam if self.psd else -jnp.abs(lam))
                return l, q.at[:, :k].set(vec[:, order]), rank, jnp.all(kept)

            return step

        return jax.lax.switch(level, [at_level(k) for k in self.levels], m, q)

    def short(self, m, q, level, t):
        """Whether the spectrum of ``m`` off the active subspace (the first ``levels[level]``
        columns of ``q``) exceeds ``t``: the step was not the exact prox (False for ``eigh``)."""
        if self.levels is None:
            return jnp.array(False)
        mask = jnp.arange(self.kmax) < jnp.asarray(self.levels, jnp.int32)[level]
        qa = q * mask[None, :].astype(self.dt)
        return self.solver._outside_spectrum(m, qa, self.psd, self.check) > t

    def grow(self, m, q, level, t, sat, rank, pres, dres, tol):
        """``(level, pres)`` after the growth rule: one level up on a saturated step, and when
        the residuals meet ``tol`` but the step was not the exact prox (then ``pres`` is set to
        ``inf`` so that the solve goes on); with ``rank_margin``, also one up when the kept
        ``rank`` plus the margin exceeds the level and one down when it fits the level below
        (never on the last step, whose subspace the final check reads)."""
        if self.last == 0:
            return level, pres
        done = (pres <= tol) & (dres <= tol)
        short = jax.lax.cond(done & ~sat, lambda: self.short(m, q, level, t), lambda: sat)
        grow = short & (level < self.last)
        up, down = grow, jnp.array(False)
        if self.solver.rank_margin is not None:
            sizes = jnp.asarray(self.levels, jnp.int32)
            want = rank + self.solver.rank_margin
            up = grow | ((want > sizes[level]) & (level < self.last) & ~done)
            down = ~sat & ~done & (level > 0) & (want <= sizes[jnp.maximum(level - 1, 0)])
        new = jnp.where(up, level + 1, jnp.where(down, level - 1, level))
        return new, jnp.where(grow & done, jnp.inf, pres)

    def subspace_rank(self, level):
        """The subspace size at ``level`` (``n`` for the full ``eigh``)."""
        return jnp.asarray(self.levels or (self.q0.shape[0],), jnp.int32)[level]

    def subspace(self, q, level):
        """``q`` with the columns past the active subspace zeroed (a warm start)."""
        active = jnp.arange(self.kmax) < jnp.asarray(self.levels or (0,), jnp.int32)[level]
        return q * active[None, :]


def recovery_error(l, labels) -> jax.Array:
    r"""Returns :math:`\max_{uv} |L_{uv} - \mathbf{1}[y_u = y_v]|`: 0 means exact recovery of the
    partition.

    >>> float(recovery_error(jnp.eye(2), jnp.array([0, 1])))
    0.0
    """
    truth = (labels[:, None] == labels[None, :]).astype(l.dtype)
    return jnp.max(jnp.abs(l - truth))


def matrix_clusters(l, threshold: float = 0.5) -> tuple[jax.Array, jax.Array]:
    """Returns ``(cluster ids [n], k)``: connected components of the graph ``L_uv > threshold``.

    ``l`` is ``[n, n]``; a concrete one must be finite (a ValueError names ``l``: a NaN entry
    links nothing, one cluster per node); under a trace values are not checked.

    >>> ids, k = matrix_clusters(jnp.kron(jnp.eye(2), jnp.ones((2, 2))))
    >>> ids.tolist(), int(k)
    ([0, 0, 1, 1], 2)
    """
    shape = jnp.shape(l)
    if len(shape) != 2 or shape[0] != shape[1]:
        raise ValueError(f"l: expected a square [n, n] array, got shape {shape}")
    check_finite("l", l)
    if not is_traced(threshold) and not np.isfinite(threshold):
        raise ValueError(f"threshold: expected a finite number, got {threshold!r}")
    n = shape[0]
    adj = l > threshold

    def body(c):
        lab, _ = c
        new = jnp.min(jnp.where(adj, lab[None, :], n), axis=1)
        new = jnp.minimum(new, lab)
        new = new[new]
        return new, jnp.any(new != lab)

    lab, _ = jax.lax.while_loop(lambda c: c[1], body, (jnp.arange(n), jnp.array(True)))
    is_root = lab == jnp.arange(n)
    rank = jnp.cumsum(is_root) - 1
    return rank[lab].astype(jnp.int32), jnp.sum(is_root).astype(jnp.int32)


def assign_labels(l, labels, labeled, num_classes: int) -> tuple[jax.Array, jax.Array]:
    r"""Transductive labels from :math:`L`:
    :math:`\operatorname{argmax}_c \sum_{u \text{ labelled}, y_u = c} L_{vu}`.

    Returns ``(pred [n] int32, scores [n, num_classes])``. A node with no positive score (no
    labelled node in its cluster) gets ``-1``: unassigned, never a silent guess.

    Args:
      l: ``[n, n]`` solution.
      labels: ``[n]`` int labels (values on unlabelled nodes are ignored).
      labeled: ``[n]`` bool.
      num_classes: number of classes (static).

    >>> l = jnp.kron(jnp.eye(2), jnp.ones((2, 2)))
    >>> assign_labels(l, jnp.array([1, 0, 0, 0]), jnp.array([1, 0, 0, 0], bool), 2)[0].tolist()
    [1, 1, -1, -1]
    """
    onehot = jax.nn.one_hot(labels, num_classes, dtype=l.dtype) * labeled[:, None]
    scores = l @ onehot
    pred = jnp.where(jnp.max(scores, axis=1) > 0, jnp.argmax(scores, axis=1), -1)
    return pred.astype(jnp.int32), scores
