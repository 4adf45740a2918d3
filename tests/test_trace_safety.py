"""Every public function runs under ``jit``, ``grad`` and ``vmap`` the way users write them.

The harness is generated from each subpackage's ``__all__``: a name is either covered by a
case in :data:`CASES` or listed in :data:`EXEMPT` with the reason; NamedTuple types (data,
no computation) and constants are exempt by construction. A new public name fails
``test_every_public_name_is_covered_or_exempt`` until it gets one or the other.

A case is ``Case(f, args)``: ``f`` closes over *concrete* arrays (the ott-jax pattern
``jax.jit(lambda p: ot.entropic_map(M, p, y))(x)``, with ``y`` fixed) and takes the traced
ones as ``args``. Each case runs

- under ``jax.jit`` (always);
- under ``jax.vmap`` over two stacked copies of ``args`` (``vmap=True``), each batch element
  equal to the unbatched result;
- under ``jax.grad`` of the sum of its floating outputs with respect to ``args[0]``
  (``grad=True``; ``grad_f`` if set), where the result must be finite.

Shapes are tiny, and each case is one jitted program (the call, its vmap and its gradient
together) compiled with most XLA optimisations off: compiling is most of the cost.

Not under ``grad``: the entropic map and the entropic EMD. Their contract takes no gradients
through Sinkhorn (``EntropicMap``'s docstring), and ott-jax's implicit differentiation of it
fails here: under ``jax_numpy_rank_promotion="raise"`` its backward pass broadcasts ``[n, m]``
with ``[n]`` outside the forward pass's ``numpy_rank_promotion("allow")`` block, and on the
torus and in R^d lineax rejects its linear system as singular.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hexad import backdoor, geometry, ot, policy, prefmh, rwefm
from hexad import cvxclust as cc
from hexad.geometry import Euclidean, Product, Sphere, Torus

#: Subpackages whose ``__all__`` the harness walks.
PACKAGES = ("base", "geometry", "ot", "prefmh", "cvxclust", "rwefm", "policy", "backdoor")

#: Subpackages left out, with the reason.
EXEMPT_PACKAGES = {
    "cachex": "side-effecting by design: checkpoint files and replicas on disk, host-side I/O",
    "data": "host-side loaders and generators: read files, run simulators and write caches "
    "on disk, returning NumPy arrays",
}


class Case(NamedTuple):
    """A call spec: ``f(*args)`` with ``args`` traced and everything else closed over."""

    f: Callable[..., Any]
    args: tuple
    grad: bool = True
    vmap: bool = True
    grad_f: Callable[..., Any] | None = None  # a smaller function to differentiate, if set


@pytest.fixture(scope="module", autouse=True)
def _fast_compile():
    before = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", before)


def _key(i: int = 0) -> jax.Array:
    return jax.random.key(i)


def _points(m, n: int, seed: int) -> jax.Array:
    """``[n, m.dim]`` points on ``m``, away from the singular configurations."""
    if isinstance(m, Euclidean):
        return jax.random.normal(_key(seed), (n, m.dim))
    return m.random_uniform(_key(seed), (n,))


MANIFOLDS = {
    "sphere": Sphere(3),
    "torus": Torus(2),
    "euclidean": Euclidean(2),
}

# --------------------------------------------------------------------------------------------
# Cases. Each builder returns a Case; its key is "<package>.<name>" or "<package>.<name>[tag]".
# --------------------------------------------------------------------------------------------

CASES: dict[str, Callable[[], Case]] = {}


def case(name: str):
    def register(builder):
        assert name not in CASES, name
        CASES[name] = builder
        return builder

    return register


# ---- geometry -------------------------------------------------------------------------------


def _manifold_case(m) -> Case:
    # y, w and the key are concrete and closed over; x is traced.
    y = _points(m, 4, 1)
    w = jnp.array([0.1, 0.2, 0.3, 0.4])
    key = _key(2)

    def f(x):
        v = m.proj_tangent(x, 0.1 * (y - x))
        out = {
            "exp": m.exp(x, v),
            "log": m.log(x, y),
            "dist": m.dist(x, y + 0.0),
            "sqdist": m.sqdist(x, y),
            "inner": m.inner(x, v, v),
            "proj": m.proj(x),
            "err": m.manifold_error(x),
            "features": m.features(x),
            "geodesic": m.geodesic(x, v, 0.5),
            "pairwise": m.pairwise_sqdist(x, y),
            "wlog": m.weighted_log(x, jnp.full((4, 4), 0.25), y),
            "mean": m.mean(x, w),
            "normal": m.random_normal(key, x[0], 0.1, (3,)),
        }
        if hasattr(m, "random_uniform"):
            out["uniform"] = m.random_uniform(key, (3,))
        if isinstance(m, Sphere):
            out["vmf"] = m.random_vmf(key, x[0], 5.0, (3,))
        return out

    def grad_f(x):
        # the differentiable core; the samplers and projections above are jit/vmap only
        v = m.proj_tangent(x, 0.1 * (y - x))
        return m.exp(x, v), m.dist(x, y), m.pairwise_sqdist(x, y), m.mean(x, w)

    return Case(f, (_points(m, 4, 0),), grad_f=grad_f)


for _name, _m in [
    ("Euclidean", Euclidean(2)),
    ("Sphere", Sphere(3)),
    ("Torus", Torus(2)),
    ("Product", Product((Sphere(3), Torus(1)))),
]:
    case(f"geometry.{_name}")(lambda _m=_m: _manifold_case(_m))


@case("geometry.Sphere[as jit argument]")
def _():
    # The manifold itself passes through jit/vmap as a pytree with no leaves.
    y = _points(Sphere(4), 3, 1)

    def f(m, x):
        return m.dist(x, y)

    return Case(lambda x: jax.jit(f)(Sphere(4), x), (_points(Sphere(4), 3, 0),))


@case("geometry.check_points")
def _():
    m = Sphere(3)
    y = _points(m, 4, 1)  # concrete: checked by value under the trace

    def f(x):
        geometry.check_points(m, y, "y", ndim=2)
        geometry.check_points(m, x, "x", ndim=2)  # traced: shapes only
        return m.sqdist(x, y)

    return Case(f, (_points(m, 4, 0),))


@case("geometry.check_weights")
def _():
    a = jnp.array([0.5, 0.5, 1.0])

    def f(w):
        geometry.check_weights(a, "a", (3,))
        geometry.check_weights(w, "w", (3,))
        return jnp.sum(w * a)

    return Case(f, (jnp.ones(3),))


@case("geometry.wrap_angle")
def _():
    return Case(lambda a: geometry.wrap_angle(3.0 * a), (jnp.array([0.3, 1.4, -2.0]),))


# ---- ot -------------------------------------------------------------------------------------


def _cloud_pair(m, n: int = 6):
    return _points(m, n, 0), _points(m, n, 1)


for _tag, _m in MANIFOLDS.items():

    @case(f"ot.entropic_map[{_tag}]")
    def _(m=_m):
        # The issue's first pattern: jax.jit(lambda p: ot.entropic_map(M, p, y))(x).
        x, y = _cloud_pair(m)
        return Case(lambda p: ot.entropic_map(m, p, y, epsilon=0.1).mapped, (x,), grad=False)

    @case(f"ot.sinkhorn_divergence[{_tag}]")
    def _(m=_m):
        # The issue's second pattern: jax.jit(jax.grad(lambda p: sinkhorn_divergence(M, p, y))).
        # no vmap: three Sinkhorn solves make its compile slow; the entropic_map cases vmap
        # the same ott-jax solver
        x, y = _cloud_pair(m)
        return Case(lambda p: ot.sinkhorn_divergence(m, p, y, epsilon=0.1), (x,), vmap=False)


@case("ot.entropic_map[weights, batch_size]")
def _():
    m = Sphere(3)
    x, y = _cloud_pair(m)
    a, b = jnp.linspace(1.0, 2.0, 6), jnp.linspace(2.0, 1.0, 6)
    return Case(
        lambda p: (
            ot.entropic_map(m, p, y, a, b, epsilon=0.1, scale_cost="max_cost", batch_size=2).mapped
        ),
        (x,),
        grad=False,
        vmap=False,  # the dense path's vmap is the other entropic_map cases'
    )


@case("ot.EntropicMap")
def _():
    m = Torus(2)
    x, y = _cloud_pair(m)
    solver = ot.EntropicMap(m, epsilon=0.1)
    return Case(lambda p: solver(p, y).tangent, (x,), grad=False)


@case("ot.SqGeodesic")
def _():
    m = Sphere(3)
    x, y = _cloud_pair(m)
    cost = ot.SqGeodesic(m)

    def f(p):
        return cost(p[0], y[0]), cost.all_pairs(p, y), cost.twist_operator(p, 0.1 * y, False)

    return Case(f, (x,))


@case("ot.barycentric_tangent")
def _():
    m = Sphere(3)
    x, y = _cloud_pair(m)
    b, g = jnp.ones(6) / 6, jnp.linspace(-0.1, 0.1, 6)
    return Case(lambda p: ot.barycentric_tangent(m, p, y, b, g, 0.1), (x,))


@case("ot.chamfer")
def _():
    m = Torus(2)
    x, y = _cloud_pair(m)
    a, b = jnp.ones(6), jnp.linspace(1.0, 2.0, 6)
    return Case(lambda p: ot.chamfer(m, p, y, a, b), (x,))


@case("ot.entropic_emd")
def _():
    m = Sphere(3)
    x, y = _cloud_pair(m)
    a, b = jnp.ones(6), jnp.ones(6)
    return Case(lambda p: ot.entropic_emd(m, p, y, a, b, epsilon=0.1)[0], (x,), grad=False)


@case("ot.greedy_matching")
def _():
    plan = jax.random.uniform(_key(3), (5, 5))  # concrete: checked by value under the trace
    return Case(lambda q: ot.greedy_matching(plan + q), (jnp.zeros((5, 5)),), grad=False)


@case("ot.max_real_cost")
def _():
    a, b = jnp.array([1.0, 0.0, 1.0]), jnp.ones(3)
    return Case(lambda c: ot.max_real_cost(c, a, b), (jnp.arange(9.0).reshape(3, 3),))


@case("ot.mccann_interpolation")
def _():
    m = Sphere(3)
    x, y = _cloud_pair(m)
    tangent = m.log(x, y)
    return Case(lambda t: ot.mccann_interpolation(m, x, tangent, t), (jnp.float32(0.3),))


@case("ot.sinkhorn_w2")
def _():
    m = Torus(2)
    x, y = _cloud_pair(m)
    # grad and vmap: the sinkhorn_divergence cases (this is its clipped square root)
    return Case(lambda p: ot.sinkhorn_w2(m, p, y, epsilon=0.1), (x,), grad=False, vmap=False)


# ---- prefmh ---------------------------------------------------------------------------------


def _score(x):
    return -0.5 * jnp.sum(x**2)


@case("prefmh.mh_acceptance")
def _():
    return Case(prefmh.mh_acceptance, (jnp.array([-1.0, 0.5]),))


@case("prefmh.barker_acceptance")
def _():
    return Case(prefmh.barker_acceptance, (jnp.array([-1.0, 0.5]),))


@case("prefmh.kbudget_acceptance")
def _():
    wins = jnp.array([0, 1, 3])  # concrete: checked by value under the trace
    return Case(lambda r: prefmh.kbudget_acceptance(wins, 3, r), (jnp.array([-0.5, 0.1, 0.2]),))


@case("prefmh.majority_acceptance")
def _():
    wins = jnp.array([0, 1, 2])
    return Case(lambda w: prefmh.majority_acceptance(w + wins, 3), (jnp.zeros(3, int),), False)


@case("prefmh.two_coin_acceptance")
def _():
    log_rho = jnp.array([0.2, -0.3])
    return Case(
        lambda lp: prefmh.two_coin_acceptance(lp, log_rho), (jnp.log(jnp.array([0.3, 0.6])),)
    )


@case("prefmh.acceptance_probability")
def _():
    log_rho = jnp.array([0.2, -0.3])
    return Case(
        lambda lp: prefmh.acceptance_probability("kbudget", lp, log_rho, 3),
        (jnp.log(jnp.array([0.3, 0.6])),),
    )


def _proposal_case(propose) -> Case:
    key = _key(4)
    return Case(lambda x: propose(key, x), (jnp.array([0.5, -0.2]),))


@case("prefmh.random_walk")
def _():
    return _proposal_case(prefmh.random_walk(0.5))


@case("prefmh.autoregressive")
def _():
    return _proposal_case(prefmh.autoregressive(0.5, 0.2))


@case("prefmh.latent_random_walk")
def _():
    return _proposal_case(prefmh.latent_random_walk(0.5))


@case("prefmh.independent")
def _():
    return _proposal_case(
        prefmh.independent(lambda k: jax.random.normal(k, (2,)), lambda x: _score(x))
    )


def _judge_case(judge) -> Case:
    key, second = _key(5), jnp.array([0.3, 0.1])

    def f(x):
        out = {"outcomes": judge.compare(key, x, second, 3)}
        if judge.log_odds_features is not None:
            out["log_odds"] = judge.log_odds(x, second)
        return out

    return Case(f, (jnp.array([0.5, -0.2]),))


@case("prefmh.bradley_terry_judge")
def _():
    return _judge_case(prefmh.bradley_terry_judge(_score))


@case("prefmh.classifier_judge")
def _():
    return _judge_case(prefmh.classifier_judge(lambda x: jnp.stack([x[0], -x[0]]), 0))


@case("prefmh.pullback_judge")
def _():
    return _judge_case(prefmh.pullback_judge(prefmh.bradley_terry_judge(_score), lambda z: 2 * z))


@case("prefmh.external_judge")
def _():
    judge = prefmh.external_judge(lambda a, b, rng: (b.sum(-1) > a.sum(-1)).astype(int))
    # A host callback: no derivative (jax.pure_callback has no JVP).
    return _judge_case(judge)._replace(grad=False)


@case("prefmh.bt_consistency")
def _():
    judge, key = prefmh.bradley_terry_judge(jnp.sum), _key(6)
    second = jnp.ones((4, 1))
    # Outputs are rates of sampled 0/1 outcomes: piecewise constant, no useful gradient.
    return Case(
        lambda x: prefmh.bt_consistency(key, judge, x, second, 5), (jnp.zeros((4, 1)),), False
    )


def _kernel_case(algo) -> Case:
    key = _key(7)

    def f(x):
        state, info = algo.step(key, algo.init(x))
        return state.position, info

    # accept/reject: the position is piecewise constant in the chain's randomness
    return Case(f, (jnp.array([0.5, -0.2]),), grad=False)


@case("prefmh.prefmh")
def _():
    judge = prefmh.bradley_terry_judge(_score)
    return _kernel_case(prefmh.prefmh(judge, prefmh.random_walk(0.5), "kbudget", 3))


@case("prefmh.prefmh[two_coin]")
def _():
    judge = prefmh.bradley_terry_judge(_score)
    return _kernel_case(prefmh.prefmh(judge, prefmh.autoregressive(0.5, 0.1), "two_coin"))


@case("prefmh.build_kernel")
def _():
    judge = prefmh.bradley_terry_judge(_score)
    kernel, key = prefmh.build_kernel(judge, prefmh.random_walk(0.5), "majority", 3), _key(8)
    return Case(lambda x: kernel(key, prefmh.init(x, judge))[0].position, (jnp.ones(2),), False)


@case("prefmh.init")
def _():
    judge = prefmh.bradley_terry_judge(_score)
    return Case(lambda x: prefmh.init(x, judge), (jnp.ones(2),))


def _chains() -> jax.Array:
    return jax.random.normal(_key(9), (2, 8))


@case("prefmh.effective_sample_size")
def _():
    closed = _chains()  # concrete: checked by value under the trace
    return Case(
        lambda s: prefmh.effective_sample_size(s) + prefmh.effective_sample_size(closed),
        (_chains() + 1.0,),
    )


@case("prefmh.potential_scale_reduction")
def _():
    closed = _chains()
    return Case(
        lambda s: prefmh.potential_scale_reduction(s) + prefmh.potential_scale_reduction(closed),
        (_chains() + 1.0,),
    )


@case("prefmh.sliced_w1")
def _():
    b, directions = jnp.ones((5, 2)), jnp.eye(2)
    return Case(lambda a: prefmh.sliced_w1(a, b, directions), (jnp.arange(10.0).reshape(5, 2),))


@case("prefmh.grid_tv")
def _():
    probs = jnp.array([[0.25, 0.25], [0.25, 0.25]])
    samples = jnp.array([[-0.5, -0.5], [0.5, 0.2], [0.3, -0.7]])
    # counts of draws per cell: piecewise constant in the draws
    return Case(lambda s: prefmh.grid_tv(s, probs, 1.0), (samples,), grad=False)


@case("prefmh.PPCA")
def _():
    model = prefmh.fit_ppca(np.random.default_rng(0).normal(size=(20, 3)), 1)
    return Case(model.decode, (jnp.array([0.5]),))


@case("prefmh.trigram_sampler")
def _():
    sample = prefmh.trigram_sampler(prefmh.fit_trigram(np.array([0, 1, 2, 0, 1, 0]), 3, 0.5), 4)
    return Case(sample, (_key(10),), grad=False)


# ---- cvxclust -------------------------------------------------------------------------------

_X = np.array([[0.0, 0.1], [0.1, 0.0], [2.0, 2.1], [2.1, 2.0]], np.float32)
_EDGES = np.array([[0, 1], [1, 2], [2, 3]])
_BLOCKS = np.kron(np.eye(2), np.ones((2, 2))) - np.eye(4)


def _fusion_problem():
    return cc.FusionProblem.create(_X, _EDGES, np.ones(3), 0.5)


@case("cvxclust.FusionSolver")
def _():
    # the problem (a pytree of arrays) traced and vmapped; gradients are not supported
    # (lax.while_loop, documented)
    solver = cc.FusionSolver(max_iters=50)
    return Case(lambda p: solver(p).u, (_fusion_problem(),), grad=False)


@case("cvxclust.fusion_objective")
def _():
    p = _fusion_problem()
    return Case(lambda u: cc.fusion_objective(p, u), (jnp.asarray(_X) + 0.1,))


@case("cvxclust.fusion_dual_objective")
def _():
    p = _fusion_problem()
    return Case(lambda d: cc.fusion_dual_objective(p, d), (0.1 * jnp.ones((3, 2)),))


@case("cvxclust.fused_clusters")
def _():
    u = jnp.asarray(_X)  # concrete: checked by value under the trace
    return Case(lambda v: cc.fused_clusters(u + v, _EDGES, 0.5), (jnp.zeros((4, 2)),), False)


@case("cvxclust.clusterpath")
def _():
    p, solver = _fusion_problem(), cc.FusionSolver(max_iters=30)
    f = lambda g: cc.clusterpath(p, g, solver).n_clusters  # noqa: E731
    # no vmap: a lax.scan of the FusionSolver case's solve, the slowest to compile twice
    return Case(f, (jnp.array([0.1, 1.0]),), grad=False, vmap=False)


@case("cvxclust.label_propagation")
def _():
    labels = np.array([0, 0, 1, 1])  # concrete: checked by value under the trace
    labeled = np.array([True, False, False, True])
    return Case(
        lambda e: cc.label_propagation(e, labels, labeled, 2, num_iters=5),
        (jnp.asarray(_EDGES),),
        grad=False,
    )


def _nuclear_problem():
    return cc.graph_problem(_BLOCKS, 1.0)


def _l_matrix():
    return jnp.asarray(np.kron(np.eye(2), np.ones((2, 2))), jnp.float32)


@case("cvxclust.NuclearSolver")
def _():
    return Case(lambda p: cc.NuclearSolver(max_iters=30)(p).l, (_nuclear_problem(),), False)


@case("cvxclust.FactorSolver")
def _():
    p, solver = _nuclear_problem(), cc.FactorSolver(rank=2, steps=10, power_iters=3)
    return Case(lambda k: solver(p, k).l, (_key(11),), grad=False)


@case("cvxclust.SharedAtomSolver")
def _():
    p = cc.shared_atom_problem(1.0, 0.0, adjacency=_BLOCKS)
    # no vmap: the ADMM loop of the NuclearSolver case, vmapped there
    return Case(lambda p: cc.SharedAtomSolver(max_iters=20)(p).l, (p,), grad=False, vmap=False)


@case("cvxclust.nuclear_objective")
def _():
    p = _nuclear_problem()
    return Case(lambda l: cc.nuclear_objective(p, l), (_l_matrix() * 0.9 + 0.05,))


@case("cvxclust.nuclear_certificate")
def _():
    p, y = _nuclear_problem(), 0.1 * jnp.ones((4, 4))
    return Case(lambda l: cc.nuclear_certificate(p, l, y), (_l_matrix(),), grad=False)


@case("cvxclust.shared_atom_objective")
def _():
    p = cc.shared_atom_problem(1.0, 0.0, adjacency=_BLOCKS)
    u = jnp.zeros((4, p.p))
    return Case(lambda l: cc.shared_atom_objective(p, l, u), (_l_matrix(),), grad=False)


@case("cvxclust.shared_atom_certificate")
def _():
    p = cc.shared_atom_problem(1.0, 0.0, adjacency=_BLOCKS)
    size = 4 + p.p
    u, y = jnp.zeros((4, p.p)), 0.01 * jnp.ones((size, size))
    return Case(lambda l: cc.shared_atom_certificate(p, l, u, y), (_l_matrix(),), grad=False)


@case("cvxclust.matrix_clusters")
def _():
    closed = _l_matrix()  # concrete: checked by value under the trace
    return Case(lambda l: cc.matrix_clusters(closed * l), (jnp.ones((4, 4)),), grad=False)


@case("cvxclust.assign_labels")
def _():
    labels, labeled = jnp.array([0, 0, 1, 1]), jnp.array([True, False, True, False])
    return Case(lambda l: cc.assign_labels(l, labels, labeled, 2), (_l_matrix(),))


@case("cvxclust.box_violation")
def _():
    return Case(cc.box_violation, (_l_matrix() * 1.1,))


@case("cvxclust.min_eigenvalue")
def _():
    return Case(cc.min_eigenvalue, (_l_matrix() + jnp.diag(jnp.arange(4.0)),))


@case("cvxclust.psd_repair")
def _():
    return Case(cc.psd_repair, (_l_matrix() + jnp.diag(jnp.arange(4.0)),))


@case("cvxclust.psd_rescale")
def _():
    return Case(cc.psd_rescale, (_l_matrix() + jnp.eye(4),), grad=False)


@case("cvxclust.recovery_error")
def _():
    labels = jnp.array([0, 0, 1, 1])
    return Case(lambda l: cc.recovery_error(l, labels), (_l_matrix() * 0.9,))


# ---- rwefm, policy, backdoor: their pure array functions --------------------------------------

_D = jnp.array([[0.0, 1.0, 2.0], [1.0, 0.0, 1.5], [2.0, 1.5, 0.0]])


@case("rwefm.flow_matching_loss")
def _():
    target, w = jnp.ones((2, 3, 2)), jnp.ones((2, 3))
    return Case(lambda v: rwefm.flow_matching_loss(v, target, w), (jnp.zeros((2, 3, 2)),))


@case("rwefm.mmd")
def _():
    return Case(lambda d: rwefm.mmd(_D, _D + 0.5, d, 1.0), (_D + 0.2,))


@case("rwefm.median_bandwidth")
def _():
    return Case(rwefm.median_bandwidth, (_D,))


@case("rwefm.min_matching_distance")
def _():
    return Case(rwefm.min_matching_distance, (_D + 0.1,))


@case("rwefm.set_w2")
def _():
    return Case(rwefm.set_w2, (_D + 0.1,))


@case("rwefm.one_nn_accuracy")
def _():
    # a fraction of nearest-neighbour votes: piecewise constant
    return Case(lambda d: rwefm.one_nn_accuracy(_D, _D + 0.5, d), (_D + 0.2,), grad=False)


@case("rwefm.one_nn_accuracies")
def _():
    f = lambda d: rwefm.one_nn_accuracies(_D, _D + 0.5, d)  # noqa: E731
    return Case(f, (_D + 0.2,), grad=False)


@case("rwefm.time_embedding")
def _():
    return Case(lambda t: rwefm.time_embedding(t, 8), (jnp.array([0.1, 0.7]),))


@case("rwefm.chamfer_distances")
def _():
    m = Torus(2)
    ys, b = _points(m, 6, 1).reshape(2, 3, 2), jnp.ones((2, 3))
    return Case(
        lambda xs: rwefm.chamfer_distances(m, xs, jnp.ones((2, 3)), ys, b),
        (_points(m, 6, 0).reshape(2, 3, 2),),
    )


@case("rwefm.match_clouds")
def _():
    m = Torus(2)
    data, w = _points(m, 6, 1).reshape(2, 3, 2), jnp.ones((2, 3))
    # a permutation (integers); the plan it rounds is traced here
    return Case(
        lambda noise: rwefm.match_clouds(m, noise, data, w),
        (_points(m, 6, 0).reshape(2, 3, 2),),
        False,
    )


@case("rwefm.vmf_mixture_clouds")
def _():
    # jit only: a rejection sampler per cloud, slow to compile twice more
    f = lambda k: rwefm.vmf_mixture_clouds(k, 2, 4, n_modes=2)  # noqa: E731
    return Case(f, (_key(12),), grad=False, vmap=False)


@case("rwefm.wrapped_normal_mixture_clouds")
def _():
    f = lambda k: rwefm.wrapped_normal_mixture_clouds(k, 2, 4, n_modes=2)  # noqa: E731
    return Case(f, (_key(13),), grad=False, vmap=False)  # jit only, as vmf_mixture_clouds


def _gaussians():
    actor = policy.DiagGaussian(jnp.array([[0.1, -0.2], [0.3, 0.0]]), jnp.array([[0.5, 1.0]] * 2))
    prior = policy.DiagGaussian(jnp.array([[0.4, 0.2], [-0.1, 0.1]]), jnp.array([[1.0, 0.7]] * 2))
    return actor, prior


for _name in ("poe", "additive", "kl_regularised", "poe_kl_to_actor", "poe_mean_kl_to_actor"):

    @case(f"policy.{_name}")
    def _(name=_name):
        actor, prior = _gaussians()  # closed over: checked by value under the trace
        fn = getattr(policy, name)
        return Case(lambda a: fn(actor, prior, a), (jnp.float32(0.3),))


@case("policy.prior_only")
def _():
    actor, prior = _gaussians()
    return Case(lambda m: policy.prior_only(actor, prior._replace(mean=m)), (prior.mean,))


@case("policy.kl_diag_gaussian")
def _():
    actor, prior = _gaussians()
    return Case(lambda m: policy.kl_diag_gaussian(actor._replace(mean=m), prior), (actor.mean,))


@case("policy.squash")
def _():
    actor, _ = _gaussians()
    return Case(lambda m: policy.squash(actor._replace(mean=m)), (actor.mean,))


@case("policy.kl_budget_alpha")
def _():
    actor, prior = _gaussians()
    # bisection: alpha is piecewise constant in the budget
    return Case(
        lambda b: policy.kl_budget_alpha(actor, prior, b, n_iters=8), (jnp.float32(0.1),), False
    )


@case("policy.kl_budget_alpha_per_state")
def _():
    actor, prior = _gaussians()
    f = lambda b: policy.kl_budget_alpha_per_state(actor, prior, b, n_iters=8)  # noqa: E731
    return Case(f, (jnp.float32(0.1),), grad=False)


@case("policy.deterministic_action")
def _():
    flags = jnp.array([True, False])
    return Case(lambda m: policy.deterministic_action(m, flags), (jnp.array([[0.5], [0.2]]),))


@case("policy.expectile_loss")
def _():
    return Case(lambda d: policy.expectile_loss(d, 0.7), (jnp.array([-1.0, 0.5]),))


@case("policy.gaussian_log_prob")
def _():
    actor, _ = _gaussians()
    actions = jnp.array([[0.2, -0.3], [0.0, 0.4]])
    return Case(lambda m: policy.gaussian_log_prob(actor._replace(mean=m), actions), (actor.mean,))


@case("policy.sample_action")
def _():
    actor, key = _gaussians()[0], _key(14)
    return Case(lambda m: policy.sample_action(key, actor._replace(mean=m)), (actor.mean,))


@case("policy.soft_td_target")
def _():
    r, d, q2, lp = jnp.ones(2), jnp.array([0.0, 1.0]), jnp.zeros(2), jnp.full(2, -1.0)
    return Case(lambda q1: policy.soft_td_target(r, d, q1, q2, lp, 0.99, 0.2), (jnp.ones(2),))


@case("policy.task_weights")
def _():
    rewards = jnp.array([1.0, 0.0, 2.0])
    return Case(lambda f: policy.task_weights(f, rewards), (jnp.eye(3)[:, :2] + 0.1,))


def _module_case(net, x, method=None) -> Case:
    params = net.init(_key(15), x)  # closed over: the ordinary "apply with fixed params" use
    return Case(lambda o: net.apply(params, o), (x,))


@case("policy.MLP")
def _():
    return _module_case(policy.MLP((4,), 2), jnp.ones((2, 3)))


@case("policy.GaussianActor")
def _():
    return _module_case(policy.GaussianActor(2, (4,)), jnp.ones((2, 3)))


@case("policy.ValueNet")
def _():
    return _module_case(policy.ValueNet((4,)), jnp.ones((2, 3)))


@case("policy.TwinCritic")
def _():
    net, act = policy.TwinCritic((4,)), jnp.ones((2, 2))
    params = net.init(_key(16), jnp.ones((2, 3)), act)
    return Case(lambda o: net.apply(params, o, act), (jnp.ones((2, 3)),))


@case("policy.SuccessorFeatures")
def _():
    net, act = policy.SuccessorFeatures(2, 3, (4,)), jnp.ones((2, 2))
    params = net.init(_key(17), jnp.ones((2, 3)), act)
    return Case(lambda o: net.apply(params, o, act), (jnp.ones((2, 3)),))


@case("policy.state_noise")
def _():
    return Case(policy.state_noise(_key(18), 3, 2, 8), (jnp.ones((2, 3)),))


@case("policy.calibrate_kl_budget")
def _():
    actor, _ = _gaussians()
    return Case(lambda m: policy.calibrate_kl_budget(actor._replace(mean=m), 0.5), (actor.mean,))


@case("policy.precision_prior")
def _():
    actor, _ = _gaussians()
    noise = jnp.array([[0.5, -1.0], [1.2, 0.3]])
    f = lambda m: policy.precision_prior(actor._replace(mean=m), noise, 2.0)  # noqa: E731
    return Case(f, (actor.mean,))


@case("policy.perturbation_prior")
def _():
    actor, prior = _gaussians()
    noise = jnp.array([[0.5, -1.0], [1.2, 0.3]])
    f = lambda m: policy.perturbation_prior(actor, prior._replace(mean=m), noise)  # noqa: E731
    return Case(f, (prior.mean,))


@case("policy.degrade_params")
def _():
    key = _key(19)
    return Case(lambda p: policy.degrade_params(key, p, 0.1), ({"w": jnp.arange(4.0)},))


@case("backdoor.cross_entropy")
def _():
    labels = jnp.array([0, 2])
    return Case(lambda z: backdoor.cross_entropy(z, labels), (jnp.ones((2, 3)),))


@case("backdoor.weight_displacement")
def _():
    other = {"w": jnp.ones(3)}
    return Case(lambda p: backdoor.weight_displacement(p, other), ({"w": jnp.zeros(3)},))


def _metric_case(metric, *extra) -> Case:
    # a linear "model" on the first three pixels of each image, its weights traced
    apply = lambda w, x: x.reshape(x.shape[0], -1)[:, :3] @ w
    x, y = jnp.linspace(0.0, 1.0, 2 * 64 * 3).reshape(2, 8, 8, 3), jnp.array([0, 2])
    return Case(lambda w: metric(apply, w, x, y, *extra), (jnp.eye(3),))


@case("backdoor.accuracy")
def _():
    return _metric_case(backdoor.accuracy)


@case("backdoor.target_rate")
def _():
    return _metric_case(backdoor.target_rate, 1)


@case("backdoor.attack_success_rate")
def _():
    return _metric_case(backdoor.attack_success_rate, backdoor.patch_trigger((8, 8, 3)), 1)


@case("backdoor.robust_accuracy")
def _():
    return _metric_case(backdoor.robust_accuracy, backdoor.patch_trigger((8, 8, 3)), 1)


def _trigger_case(trigger) -> Case:
    return Case(lambda x: backdoor.apply_trigger(trigger, x), (jnp.full((2, 8, 8, 3), 0.5),))


@case("backdoor.apply_trigger")
def _():
    return _trigger_case(backdoor.patch_trigger((8, 8, 3)))


@case("backdoor.patch_trigger")
def _():
    return _trigger_case(backdoor.patch_trigger((8, 8, 3), size=2))


@case("backdoor.blend_trigger")
def _():
    return _trigger_case(backdoor.blend_trigger(_key(20), (8, 8, 3)))


@case("backdoor.warp_trigger")
def _():
    return _trigger_case(backdoor.warp_trigger(_key(21), (8, 8, 3), grid=2))


@case("backdoor.SmallCNN")
def _():
    # no vmap: a module already maps over its leading batch axis, and a vmapped
    # convolution is the slowest compile here
    return _module_case(backdoor.SmallCNN(3, (4,), 8), jnp.ones((2, 8, 8, 3)))._replace(vmap=False)


# --------------------------------------------------------------------------------------------
# Exemptions: name -> the reason it has no case.
# --------------------------------------------------------------------------------------------

_HOST_CVX = "host-side builder: validates and assembles arrays with NumPy (float64)"

EXEMPT: dict[str, str] = {
    "base.Manifold": "a typing.Protocol (a structural type, no computation); its members "
    "are exercised on every geometry manifold case",
    "geometry.Manifold": "a typing.Protocol (a structural type, no computation); its members "
    "are exercised on every geometry manifold case",
    "ot.check_settings": "host-side check of static Python settings (returns None); it runs "
    "at trace time inside the entropic_map, sinkhorn_divergence and entropic_emd cases",
    "prefmh.JudgeCounter": "host-side mutable counter of an external judge's calls (Python "
    "ints behind a lock), updated by the callback of the external_judge case",
    "prefmh.fit_ppca": "host-side NumPy float64 closed-form fit (module docstring: not "
    "traceable); its PPCA.decode is the prefmh.PPCA case",
    "prefmh.fit_trigram": "host-side NumPy fit of token counts (not traceable); its model is "
    "drawn from in the prefmh.trigram_sampler case",
    "prefmh.run_chains": "host-side driver: a Python loop over jitted lax.scan chunks, with a "
    "host callback and a host check of each chunk's validity (bool of a device value); the "
    "step it scans is the prefmh.prefmh case",
    "cvxclust.FusionProblem": "a pytree of arrays: traced through jit and vmap as the "
    "argument of the cvxclust.FusionSolver case",
    "cvxclust.NuclearProblem": "a pytree of arrays: traced through jit and vmap as the "
    "argument of the cvxclust.NuclearSolver case",
    "cvxclust.SharedAtomProblem": "a pytree of arrays: traced through jit and vmap as the "
    "argument of the cvxclust.SharedAtomSolver case",
    "cvxclust.SplitNuclearSolver": "host-side: splits the problem into blocks with "
    "NumPy/SciPy and reads each jitted NuclearSolver's result back (float, bool)",
    "cvxclust.nuclear_blocks": "host-side NumPy/SciPy connected components (documented not "
    "traceable)",
    "cvxclust.adjacency_from_edges": _HOST_CVX + "; returns a NumPy adjacency",
    "cvxclust.balanced_weights": _HOST_CVX + "; returns Python floats",
    "cvxclust.check_adjacency": _HOST_CVX + ": a validation helper returning NumPy",
    "cvxclust.check_edges": _HOST_CVX + ": a validation helper returning NumPy",
    "cvxclust.contextual_sbm": "host-side random graph generator driven by a numpy Generator",
    "cvxclust.feature_similarity": _HOST_CVX + "; returns a NumPy [n, n] matrix",
    "cvxclust.label_similarity": _HOST_CVX + "; returns a NumPy [n, n] matrix",
    "cvxclust.graph_problem": _HOST_CVX + "; the NuclearProblem it returns is traced in the "
    "cvxclust.NuclearSolver case",
    "cvxclust.joint_problem": _HOST_CVX + "; returns a NuclearProblem, the pytree traced in the "
    "cvxclust.NuclearSolver case",
    "cvxclust.shared_atom_problem": _HOST_CVX + "; the problem it returns is traced in the "
    "cvxclust.SharedAtomSolver case",
    "cvxclust.knn_gaussian_weights": _HOST_CVX + ": k-NN graph and weights as NumPy arrays",
    "cvxclust.with_labels": _HOST_CVX + ": appends one-hot labels, returns NumPy arrays",
    # rwefm
    "rwefm.NoiseModel": "a pytree of noise parameters; drawn from inside make_loss / "
    "make_trainer's step (tests/rwefm/test_rwefm.py)",
    "rwefm.VectorField": "a flax module; applied inside make_loss / make_sampler "
    "(tests/rwefm/test_rwefm.py)",
    "rwefm.calibrate_map_iterations": "host-side search over Sinkhorn bounds (docstring: host "
    "side), returning Python numbers",
    "rwefm.check_noise_kind": "host-side check of a static string",
    "rwefm.cloud_distances": "vmapped ot.sinkhorn_w2 over cloud pairs (covered); its doctest "
    "runs it under jax.jit",
    "rwefm.emd_distances": "vmapped ot.entropic_emd over cloud pairs (covered); its doctest "
    "runs it under jax.jit",
    "rwefm.euclidean_baseline": "host-side: returns a Euclidean manifold object (static)",
    "rwefm.fit_noise": "host-side fit of a NoiseModel to training clouds (docstring: host side)",
    "rwefm.make_loss": "factory: returns loss(params, key, batch), run under jit in "
    "tests/rwefm/test_rwefm.py",
    "rwefm.make_sampler": "factory: returns a Sampler (a lax.scan), exercised in "
    "tests/rwefm/test_rwefm.py",
    "rwefm.make_train": "factory: returns train(...), a lax.scan over the trainer's step, "
    "exercised in tests/rwefm/test_rwefm.py",
    "rwefm.make_trainer": "factory: returns an Algorithm (init, step), exercised in "
    "tests/rwefm/test_rwefm.py",
    "rwefm.pair_clouds": "entropic-map pairing of noise and data clouds (ot.entropic_map and "
    "greedy_matching, both covered); exercised in tests/rwefm",
    "rwefm.shard_batch": "host-side device placement on a mesh (jax.device_put)",
    "rwefm.validate_batch": "host-side validation (docstring: host side), returns None",
    # policy
    "policy.ExpertLibrary": "a container of frozen networks and goals; its policies are run "
    "in tests/policy/test_compose.py",
    "policy.Method": "an IntEnum of integer codes, no computation",
    "policy.Normaliser": "a fitted (mean, std) pair applied by the trainers' networks "
    "(tests/policy/test_offline.py)",
    "policy.OnlineEnv": "a typing.Protocol of a host-side vector environment",
    "policy.actor_for_space": "factory: returns a GaussianActor module (the policy.GaussianActor "
    "case)",
    "policy.ant_controller_spec": "host-side: returns a JSON settings dict",
    "policy.antmaze_dataset": "side-effecting: generates and caches a data set on disk",
    "policy.generate_locomotion": "side-effecting: trains SAC online in a simulator, host loop",
    "policy.locomotion_dataset": "side-effecting: generates and caches a data set on disk",
    "policy.train_ant_controller": "side-effecting: trains or loads a cached controller",
    "policy.train_online": "host-side loop stepping a host environment (OnlineEnv)",
    "policy.batch_from_dataset": "host-side conversion of a data set dict, checking NaNs",
    "policy.bc": "factory: returns an Algorithm (init, step), exercised in "
    "tests/policy/test_offline.py",
    "policy.cql": "factory: returns an Algorithm (init, step), exercised in "
    "tests/policy/test_offline.py",
    "policy.iql": "factory: returns an Algorithm (init, step), exercised in "
    "tests/policy/test_offline.py",
    "policy.sac": "factory: returns an Algorithm (init, step), exercised in "
    "tests/policy/test_online.py",
    "policy.sf_td": "factory: returns an Algorithm (init, step), exercised in "
    "tests/policy/test_sf.py",
    "policy.make_train": "factory: returns train(key, state, data), a lax.scan, exercised in "
    "tests/policy/test_offline.py",
    "policy.make_prior": "factory: returns prior(obs_goal), exercised in "
    "tests/policy/test_priors.py",
    "policy.compose": "exercised under jit with every Method in tests/policy/test_compose.py; "
    "a case needs a q_fn and a deployment table",
    "policy.check_disjoint": "host-side check of seed lists, returns None",
    "policy.check_space": "host-side check of a static string",
    "policy.hindsight_mean": "host-side NumPy, returns np.ndarray",
    "policy.precision_ratio": "host-side, returns np.ndarray",
    "policy.shuffle_goals_across_trajectories": "host-side NumPy, returns np.ndarray",
    "policy.trajectory_ends": "host-side NumPy, returns np.ndarray",
    "policy.return_range_scale": "host-side, returns a Python float",
    "policy.poe_prior_weight": "host-side, returns a Python float",
    "policy.task_fit": "returns (w, r2) with r2 a Python float (host); its w is the "
    "policy.task_weights case",
    "policy.stack_rows": "host-side: stacks Python Row records into arrays",
    "policy.velocity_goals": "host-side: reads a data set dict (NumPy)",
    "policy.future_goal_indices": "not yet given a case: a jnp function of (key, ends); "
    "exercised in tests/policy/test_priors.py",
    "policy.goal_conditioned": "not yet given a case: concatenates goals onto a Batch; "
    "exercised in tests/policy/test_priors.py",
    "policy.gpi": "not yet given a case: needs a psi network; exercised in tests/policy/test_sf.py",
    "policy.q_steer": "not yet given a case: needs a Q function; exercised in "
    "tests/policy/test_steering.py",
    # backdoor
    "backdoor.BlendTrigger": "a trigger pytree; applied in the backdoor.blend_trigger case",
    "backdoor.PatchTrigger": "a trigger pytree; applied in the backdoor.patch_trigger case",
    "backdoor.WarpTrigger": "a trigger pytree; applied in the backdoor.warp_trigger case",
    "backdoor.DTBConfig": "static hyper-parameters (hashable), no computation",
    "backdoor.DTBProblem": "a pair of triggers and targets, no computation",
    "backdoor.PreActResNet": "a flax module like backdoor.SmallCNN (covered); exercised in "
    "tests/backdoor/test_models.py",
    "backdoor.apply_channel_mask": "not yet given a case: needs conv params; exercised in "
    "tests/backdoor/test_defenses.py",
    "backdoor.channel_count": "host-side: returns a Python int from parameter shapes",
    "backdoor.conv_layers": "host-side: returns layer names (strings)",
    "backdoor.head_input_layer": "host-side: returns a layer name (a string)",
    "backdoor.mask_layers": "host-side: returns layer names (strings)",
    "backdoor.norm_layers": "host-side: returns layer names (strings)",
    "backdoor.check_images": "host-side validation, returns None",
    "backdoor.check_problem": "host-side validation of a DTBProblem",
    "backdoor.compose": "factory: returns a defense, a host-driven training run",
    "backdoor.benchmark_defenses": "host-side driver over defenses, returns Python floats",
    "backdoor.defense_table": "host-side: returns a flat dict of Python floats",
    "backdoor.detection_rates": "host-side: returns Python floats",
    "backdoor.defense_effectiveness_rating": "host-side: reads its four figures with float() "
    "and returns a Python float",
    "backdoor.evaluate": "jitted inside (docstring: do not wrap it in jax.jit)",
    "backdoor.finetune_trajectory": "host-driven fine-tuning run, returns NumPy arrays",
    "backdoor.fit": "host loop over jitted training chunks (see minimize)",
    "backdoor.minimize": "host loop over jitted chunks of straight-line steps (docstring)",
    "backdoor.implant": "host loop over jitted make_dtb steps (docstring)",
    "backdoor.make_defense": "factory: returns a host-driven defense run",
    "backdoor.surrogate_defense": "factory: returns a host-driven defense run",
    "backdoor.make_dtb": "factory: returns an Algorithm (init, step), exercised in "
    "tests/backdoor/test_dtb.py",
    "backdoor.make_trainer": "factory: returns an Algorithm (init, step), exercised in "
    "tests/backdoor/test_train.py",
    "backdoor.dtb_objective": "not yet given a case: needs a model, a config and a DTBBatch; "
    "its doctest and tests/backdoor/test_dtb.py exercise it",
    "backdoor.sanitise_surrogate": "not yet given a case: its doctest runs it under jax.jit",
    "backdoor.surrogate_path": "not yet given a case: sanitise_surrogate's end of it, whose "
    "doctest runs it under jax.jit",
    "backdoor.poison": "host-side: validates on the host and reads the label count from y "
    "(docstring: call it outside jit)",
    "backdoor.sample_batch": "not yet given a case: a jnp draw of rows; exercised in "
    "tests/backdoor/test_train.py",
}


# --------------------------------------------------------------------------------------------
# The harness
# --------------------------------------------------------------------------------------------


def _public(package: str) -> list[str]:
    return list(importlib.import_module(f"hexad.{package}").__all__)


def _exempt_by_kind(obj: Any) -> str | None:
    if inspect.isclass(obj) and issubclass(obj, tuple) and hasattr(obj, "_fields"):
        return "a NamedTuple type: a pytree container of results, no computation"
    if not callable(obj):
        return "a constant, not callable"
    return None


def _covered(qualified: str) -> bool:
    return any(k == qualified or k.startswith(qualified + "[") for k in CASES)


def test_every_public_name_is_covered_or_exempt():
    missing, stale = [], []
    for package in PACKAGES:
        module = importlib.import_module(f"hexad.{package}")
        for name in module.__all__:
            q = f"{package}.{name}"
            obj = getattr(module, name)
            if _covered(q) or q in EXEMPT or _exempt_by_kind(obj):
                continue
            missing.append(q)
    for q in EXEMPT:
        package, name = q.split(".", 1)
        if name not in _public(package):
            stale.append(q)
        elif _covered(q):
            stale.append(q + " (also has a case)")
    for k in CASES:
        package, name = k.split("[")[0].split(".", 1)
        if name not in _public(package):
            stale.append(k)
    assert not missing, f"public names with neither a case nor an exemption: {missing}"
    assert not stale, f"cases or exemptions of names that are not public: {stale}"
    assert not set(PACKAGES) & set(EXEMPT_PACKAGES)


def test_exempt_packages_are_real_subpackages():
    for package in EXEMPT_PACKAGES:
        importlib.import_module(f"hexad.{package}")


def _floats_sum(tree) -> jax.Array:
    leaves = [
        jnp.sum(leaf)
        for leaf in jax.tree.leaves(tree)
        if jnp.issubdtype(jnp.result_type(leaf), jnp.floating)
    ]
    return sum(leaves, jnp.zeros(()))


def _stack2(tree):
    return jax.tree.map(lambda a: jnp.stack([a, a]), tree)


def _assert_close(batched, single, what: str):
    for b, s in zip(jax.tree.leaves(batched), jax.tree.leaves(single), strict=True):
        if jnp.issubdtype(jnp.result_type(s), jax.dtypes.prng_key):
            continue
        for i in range(2):
            np.testing.assert_allclose(
                np.asarray(b[i]), np.asarray(s), rtol=1e-4, atol=1e-5, err_msg=what
            )


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_runs_under_jit_vmap_and_grad(name):
    spec = CASES[name]()
    gf = spec.f if spec.grad_f is None else spec.grad_f

    def program(*args):
        # One compiled program per case: the call, its vmap and its gradient, all traced
        # with the case's concrete arrays closed over.
        out = {"call": spec.f(*args)}
        if spec.vmap:
            out["vmap"] = jax.vmap(spec.f)(*_stack2(args))
        if spec.grad:
            out["grad"] = jax.grad(lambda a0, *rest: _floats_sum(gf(a0, *rest)))(*args)
        return out

    out = jax.jit(program)(*spec.args)
    if spec.vmap:
        _assert_close(out["vmap"], out["call"], f"{name}: vmap of two copies vs one call")
    if spec.grad:
        for leaf in jax.tree.leaves(out["grad"]):
            assert np.all(np.isfinite(np.asarray(leaf))), f"{name}: non-finite gradient"


def test_issue_closure_patterns_are_cases():
    """The two patterns of the issue, on the three manifolds, are among the cases."""
    for tag in ("sphere", "torus", "euclidean"):
        assert f"ot.entropic_map[{tag}]" in CASES
        spec = CASES[f"ot.sinkhorn_divergence[{tag}]"]()
        assert spec.grad
