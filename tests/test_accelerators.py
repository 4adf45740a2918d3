"""Every public jitted entry point lowers for CUDA and TPU, checked on a CPU-only machine.

``jax.export.export(jax.jit(f), platforms=[p])`` lowers ``f`` to StableHLO for a platform the
machine does not have, without compiling. It fails for what cannot run there: CPU-only custom
calls, host callbacks, float64 on TPU, shapes that depend on values. Each entry below builds a
small float32 instance of one public function (or, for a class, one function that calls every
jittable method) and the test lowers it for each platform.

Coverage is checked, not hoped for: every name in a subpackage's ``__all__`` is either lowered
here (``ENTRIES`` lists the public names each entry covers) or listed in ``NOT_LOWERED`` with the
reason (a container type, a host-side fit, a host callback). A new public name that is neither
fails :func:`test_every_public_name_is_covered`.

Lowering takes well under a second per entry and platform; the file runs in ``make test``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

PLATFORMS = ("cuda", "tpu")
F32 = jnp.float32

# name -> (builder returning (fn, args), public names it covers, as "<subpackage>.<name>")
ENTRIES: dict[str, tuple[Callable[[], tuple[Callable, tuple]], tuple[str, ...]]] = {}

# "<subpackage>.<name>" -> why it is not lowered, and what runs on an accelerator instead.
NOT_LOWERED: dict[str, str] = {}


def entry(name: str, covers: tuple[str, ...]):
    def register(builder):
        ENTRIES[name] = (builder, covers)
        return builder

    return register


def not_lowered(reason: str, *names: str) -> None:
    for n in names:
        NOT_LOWERED[n] = reason


def _lower(fn: Callable, args: tuple, platform: str) -> str:
    specs = jax.tree.map(
        lambda a: (
            jax.ShapeDtypeStruct(np.shape(a), jnp.asarray(a).dtype)
            if isinstance(a, (jax.Array, np.ndarray))
            else a
        ),
        args,
    )
    return export.export(jax.jit(fn), platforms=[platform])(*specs).mlir_module()


def _cloud(key, n, d):
    x = jax.random.normal(key, (n, d), F32)
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


# --- foundations ---------------------------------------------------------------------------

TYPES = "a type or protocol: its methods are lowered through the entries that use it"
not_lowered(TYPES, "geometry.Manifold")
not_lowered(TYPES, "base.Algorithm", "base.Manifold", "base.TrainState")
not_lowered("a constant: the default name of the data axis", "base.DATA_AXIS")
not_lowered(
    "a boundary check that reads concrete values on the host before anything is traced",
    "geometry.check_points",
    "geometry.check_weights",
)
not_lowered(
    "builds or inspects a Mesh on the host; the shardings it returns are exercised on 8 "
    "simulated devices in tests/test_sharding.py",
    "sharding.auto_axes",
    "sharding.batch_sharding",
    "sharding.check_divisible",
    "sharding.data_mesh",
    "sharding.process_rows",
    "sharding.row_placement",
)
not_lowered(
    "places host data on a mesh (this process's rows, or a whole value resharded): run on 8 "
    "simulated devices in tests/test_sharding.py and across 2 processes in "
    "tests/test_distributed_families.py",
    "sharding.from_process_rows",
    "sharding.put",
)


def _manifold_fn(m, x, y, w, t):
    v = m.log(x, y)
    out = [m.exp(x, v), m.dist(x, y), m.sqdist(x, y), m.inner(x, v, v), m.proj(x + 0.1)]
    out += [m.proj_tangent(x, v), m.manifold_error(x), m.pairwise_sqdist(x, y)]
    out += list(m.geodesic(x, v, t[:, None]))
    out += [m.weighted_log(x, jnp.tile(w, (x.shape[0], 1)), y), m.mean(x, w)]
    return out


@entry("geometry.Euclidean", ("geometry.Euclidean",))
def _():
    from hexad.geometry import Euclidean

    m = Euclidean(3)
    x, y = jax.random.normal(jax.random.key(0), (2, 16, 3), F32)
    w, t = jnp.full((16,), 1 / 16, F32), jnp.linspace(0, 1, 16, dtype=F32)
    return (lambda x, y, w, t: _manifold_fn(m, x, y, w, t)), (x, y, w, t)


@entry("geometry.Sphere", ("geometry.Sphere",))
def _():
    from hexad.geometry import Sphere

    m = Sphere(3)
    x, y = _cloud(jax.random.key(0), 16, 3), _cloud(jax.random.key(1), 16, 3)
    w, t = jnp.full((16,), 1 / 16, F32), jnp.linspace(0, 1, 16, dtype=F32)

    def fn(key, x, y, w, t):
        k1, k2, k3 = jax.random.split(key, 3)
        out = _manifold_fn(m, x, y, w, t)
        out += [m.random_uniform(k1, (8,)), m.random_normal(k2, x[0], 0.3, (8,))]
        out += [m.random_vmf(k3, x[0], 10.0, (8,))]
        return out

    return fn, (jax.random.key(2), x, y, w, t)


@entry("geometry.Torus", ("geometry.Torus", "geometry.wrap_angle"))
def _():
    from hexad.geometry import Torus, wrap_angle

    m = Torus(2)
    x, y = jax.random.uniform(jax.random.key(0), (2, 16, 2), F32, -np.pi, np.pi)
    w, t = jnp.full((16,), 1 / 16, F32), jnp.linspace(0, 1, 16, dtype=F32)
    return (lambda x, y, w, t: _manifold_fn(m, x, y, w, t) + [wrap_angle(3 * x)]), (x, y, w, t)


@entry("geometry.Product", ("geometry.Product",))
def _():
    from hexad.geometry import Product, Sphere, Torus

    m = Product((Sphere(3), Torus(1)))
    s = _cloud(jax.random.key(0), 32, 3)
    a = jax.random.uniform(jax.random.key(1), (32, 1), F32, -np.pi, np.pi)
    x, y = jnp.concatenate([s, a], -1)[:16], jnp.concatenate([s, a], -1)[16:]
    w, t = jnp.full((16,), 1 / 16, F32), jnp.linspace(0, 1, 16, dtype=F32)
    return (lambda x, y, w, t: _manifold_fn(m, x, y, w, t)), (x, y, w, t)


def _sphere_pair():
    from hexad.geometry import Sphere

    return Sphere(3), _cloud(jax.random.key(0), 24, 3), _cloud(jax.random.key(1), 20, 3)


@entry(
    "ot.entropic_map",
    ("ot.entropic_map", "ot.EntropicMap", "ot.EntropicMapOutput", "ot.SqGeodesic"),
)
def _():
    from hexad import ot

    m, x, y = _sphere_pair()
    return (lambda x, y: ot.entropic_map(m, x, y, epsilon=0.1, max_iterations=50)), (x, y)


@entry("ot.barycentric_tangent", ("ot.barycentric_tangent", "ot.mccann_interpolation"))
def _():
    from hexad import ot

    m, x, y = _sphere_pair()
    b, g = jnp.full((20,), 1 / 20, F32), jnp.zeros((20,), F32)

    def fn(x, y, b, g):
        v = ot.barycentric_tangent(m, x, y, b, g, 0.1)
        return ot.mccann_interpolation(m, x, v, jnp.full((24,), 0.5, F32))

    return fn, (x, y, b, g)


@entry("ot.sinkhorn_divergence", ("ot.sinkhorn_divergence", "ot.sinkhorn_w2"))
def _():
    from hexad import ot

    m, x, y = _sphere_pair()

    def fn(x, y):
        kw = dict(epsilon=0.1, max_iterations=50)
        return ot.sinkhorn_divergence(m, x, y, **kw), ot.sinkhorn_w2(m, x, y, **kw)

    return fn, (x, y)


# --- prefmh --------------------------------------------------------------------------------

not_lowered(
    TYPES,
    "prefmh.PPCA",
    "prefmh.Trigram",
    "prefmh.BTConsistency",
    "prefmh.ChainResult",
    "prefmh.Judge",
    "prefmh.PrefMHInfo",
    "prefmh.PrefMHState",
    "prefmh.SamplingAlgorithm",
    "prefmh.RULES",
)
not_lowered(
    "host-side: a thread-safe call counter for external judges, not array code",
    "prefmh.JudgeCounter",
)
not_lowered(
    "host-side fits in NumPy (once, before sampling); what they return is lowered through "
    "prefmh.trigram_sampler and prefmh.latent_random_walk",
    "prefmh.fit_ppca",
    "prefmh.fit_trigram",
)
not_lowered(
    "a host-driven loop over jitted lax.scan chunks (progress callbacks, an error raised between "
    "chunks); its chunk, vmap(step) in a scan, is lowered by the prefmh.prefmh entries",
    "prefmh.run_chains",
)
not_lowered(
    "calls the judge through jax.pure_callback with its operands placed on a local device, which "
    "an export for another platform refuses; on a GPU machine the chains run on the GPU and "
    "each step makes one batched host call (checked by test_runs_on_gpu when a GPU is lent)",
    "prefmh.external_judge",
)


def _mixture_logp(x):
    means = jnp.array([[-2.0, -2.0], [2.0, 2.0]], F32)
    return jax.scipy.special.logsumexp(-0.5 * jnp.sum((x[None] - means) ** 2, -1) / 0.36)


def _chains(algo, chains=8, steps=4, dim=2):
    step = jax.vmap(algo.step)

    def run(key, pos):
        state = jax.vmap(algo.init)(pos)

        def body(s, k):
            s, info = step(jax.random.split(k, chains), s)
            return s, info.is_accepted

        return jax.lax.scan(body, state, jax.random.split(key, steps))

    return run, (jax.random.key(0), jnp.zeros((chains, dim), F32))


for _rule in ("kbudget", "mh", "barker_oracle", "majority", "two_coin"):

    @entry(
        f"prefmh.prefmh rule={_rule}",
        (
            "prefmh.prefmh",
            "prefmh.build_kernel",
            "prefmh.init",
            "prefmh.bradley_terry_judge",
            "prefmh.random_walk",
        ),
    )
    def _(rule=_rule):
        from hexad import prefmh

        judge = prefmh.bradley_terry_judge(_mixture_logp)
        k = 3 if rule in ("kbudget", "majority") else 1
        return _chains(prefmh.prefmh(judge, prefmh.random_walk(0.8), rule, k))


@entry(
    "prefmh.proposals and judges",
    (
        "prefmh.autoregressive",
        "prefmh.independent",
        "prefmh.latent_random_walk",
        "prefmh.classifier_judge",
        "prefmh.pullback_judge",
    ),
)
def _():
    from hexad import prefmh

    w = jax.random.normal(jax.random.key(0), (2, 3), F32)
    judge = prefmh.classifier_judge(lambda x: x @ w, target_class=1)
    pulled = prefmh.pullback_judge(judge, lambda z: 2.0 * z)
    indep = prefmh.independent(
        lambda k: jax.random.normal(k, (2,), F32), lambda x: -0.5 * jnp.sum(x**2)
    )
    runs = [
        _chains(prefmh.prefmh(judge, prefmh.autoregressive(0.5, 0.9)))[0],
        _chains(prefmh.prefmh(judge, indep))[0],
        _chains(
            prefmh.prefmh(pulled, prefmh.latent_random_walk(0.5, lambda z: -0.5 * jnp.sum(z**2)))
        )[0],
    ]
    return (lambda key, pos: [r(key, pos) for r in runs]), (
        jax.random.key(0),
        jnp.zeros((8, 2), F32),
    )


@entry("prefmh.trigram_sampler", ("prefmh.trigram_sampler",))
def _():
    from hexad import prefmh

    model = prefmh.fit_trigram(np.array([0, 1, 2, 1, 0, 2, 2, 1]), 3, 0.5)
    sample = prefmh.trigram_sampler(model, 12)
    return (lambda key: jax.vmap(sample)(jax.random.split(key, 8))), (jax.random.key(0),)


@entry(
    "prefmh.acceptance rules",
    (
        "prefmh.acceptance_probability",
        "prefmh.barker_acceptance",
        "prefmh.kbudget_acceptance",
        "prefmh.majority_acceptance",
        "prefmh.mh_acceptance",
        "prefmh.two_coin_acceptance",
    ),
)
def _():
    from hexad import prefmh

    def fn(log_p, log_rho, wins):
        out = [prefmh.acceptance_probability(r, log_p, log_rho, 3) for r in prefmh.RULES]
        out += [prefmh.barker_acceptance(log_rho), prefmh.mh_acceptance(log_rho)]
        out += [prefmh.kbudget_acceptance(wins, 3, log_rho), prefmh.majority_acceptance(wins, 3)]
        return out + [prefmh.two_coin_acceptance(log_p, log_rho)]

    lp = jnp.log(jnp.linspace(0.1, 0.9, 8, dtype=F32))
    return fn, (lp, jnp.linspace(-2, 2, 8, dtype=F32), jnp.arange(8) % 4)


@entry(
    "prefmh.diagnostics",
    (
        "prefmh.effective_sample_size",
        "prefmh.potential_scale_reduction",
        "prefmh.sliced_w1",
        "prefmh.grid_tv",
        "prefmh.bt_consistency",
    ),
)
def _():
    from hexad import prefmh

    judge = prefmh.bradley_terry_judge(_mixture_logp, position_bias=0.2)

    def fn(key, trace, a, b, dirs, probs):
        return [
            prefmh.effective_sample_size(trace),
            prefmh.potential_scale_reduction(trace),
            prefmh.sliced_w1(a, b, dirs),
            prefmh.grid_tv(a, probs, 3.0),
            prefmh.bt_consistency(key, judge, a, b, 4),
        ]

    k = jax.random.split(jax.random.key(0), 4)
    trace = jax.random.normal(k[0], (4, 32, 2), F32)
    a, b = jax.random.normal(k[1], (2, 64, 2), F32)
    dirs = _cloud(k[2], 16, 2)
    return fn, (k[3], trace, a, b, dirs, jnp.full((8, 8), 1 / 64, F32))


@entry(
    "ot.cloud costs",
    ("ot.chamfer", "ot.entropic_emd", "ot.greedy_matching", "ot.max_real_cost"),
)
def _():
    from hexad import ot

    m, x, y = _sphere_pair()
    a, b = jnp.full((24,), 1 / 24, F32), jnp.full((20,), 1 / 20, F32)

    def fn(x, y, a, b):
        cost = m.pairwise_sqdist(x, y)
        return [
            ot.chamfer(m, x, y, a, b),
            ot.entropic_emd(m, x, y, a, b, max_iterations=50),
            ot.greedy_matching(jnp.exp(-cost[:20, :20])),
            ot.max_real_cost(cost, a, b),
        ]

    return fn, (x, y, a, b)


not_lowered("a boundary check of static settings on the host", "ot.check_settings")


# --- rwefm ---------------------------------------------------------------------------------

not_lowered(
    TYPES,
    "rwefm.NOISE_KINDS",
    "rwefm.PAIRINGS",
    "rwefm.CloudBatch",
    "rwefm.Sampler",
    "rwefm.TrainInfo",
    "rwefm.TrainState",
)
not_lowered(
    "host-side set-up before training: argument checks, a noise fit and a Sinkhorn-bound "
    "calibration that loops on the host over jitted maps (lowered through the train entry), "
    "the baseline's geometry, and placing a batch on a mesh (tests/test_sharding.py)",
    "rwefm.check_noise_kind",
    "rwefm.validate_batch",
    "rwefm.fit_noise",
    "rwefm.calibrate_map_iterations",
    "rwefm.euclidean_baseline",
    "rwefm.shard_batch",
)


def _rwefm_setup(pairing="matching"):
    import optax

    from hexad import rwefm
    from hexad.geometry import Sphere

    s2 = Sphere(3)
    clouds = rwefm.vmf_mixture_clouds(jax.random.key(0), 8, 12)
    weights = jnp.ones(clouds.shape[:2], F32)
    noise = rwefm.fit_noise(s2, rwefm.CloudBatch(clouds, weights))
    model = rwefm.VectorField(s2, width=16, depth=1, heads=2)
    trainer = rwefm.make_trainer(
        s2, model, optax.adam(1e-3), noise, sinkhorn_iterations=20, pairing=pairing
    )
    return s2, clouds, weights, noise, model, trainer


for _pairing in ("matching", "sample", "none"):

    @entry(
        f"rwefm.make_train pairing={_pairing}",
        (
            "rwefm.make_train",
            "rwefm.make_trainer",
            "rwefm.make_loss",
            "rwefm.flow_matching_loss",
            "rwefm.match_clouds",
            "rwefm.pair_clouds",
            "rwefm.VectorField",
            "rwefm.time_embedding",
            "rwefm.NoiseModel",
            "rwefm.vmf_mixture_clouds",
        ),
    )
    def _(pairing=_pairing):
        from hexad import rwefm

        _, clouds, weights, _, _, trainer = _rwefm_setup(pairing)
        state = trainer.init(jax.random.key(1), rwefm.CloudBatch(clouds[:4], weights[:4]))
        train = rwefm.make_train(trainer, n_steps=2, batch_size=4)
        return train, (jax.random.key(2), state, clouds, weights)


@entry("rwefm.make_sampler", ("rwefm.make_sampler", "rwefm.wrapped_normal_mixture_clouds"))
def _():
    from hexad import rwefm
    from hexad.geometry import Torus

    t2 = Torus(2)
    clouds = rwefm.wrapped_normal_mixture_clouds(jax.random.key(0), 4, 12, seam_width=1.0)
    model = rwefm.VectorField(t2, width=16, depth=1, heads=2)
    mask = jnp.ones(clouds.shape[:2], F32)
    params = model.init(jax.random.key(1), clouds, mask, jnp.zeros(4, F32))
    sampler = rwefm.make_sampler(t2, model, n_steps=4)
    return (lambda p, x0, m: sampler.sample(p, x0, m, None)), (params, clouds, mask)


@entry(
    "rwefm.metrics",
    (
        "rwefm.chamfer_distances",
        "rwefm.emd_distances",
        "rwefm.cloud_distances",
        "rwefm.one_nn_accuracy",
        "rwefm.one_nn_accuracies",
        "rwefm.mmd",
        "rwefm.median_bandwidth",
        "rwefm.min_matching_distance",
        "rwefm.set_w2",
    ),
)
def _():
    from hexad import rwefm
    from hexad.geometry import Sphere

    s2 = Sphere(3)
    xs = rwefm.vmf_mixture_clouds(jax.random.key(0), 4, 10)
    ys = rwefm.vmf_mixture_clouds(jax.random.key(1), 4, 10)
    w = jnp.ones(xs.shape[:2], F32)

    def fn(xs, ys, w):
        dxy = rwefm.chamfer_distances(s2, xs, w, ys, w)
        dxx = rwefm.chamfer_distances(s2, xs, w, xs, w)
        dyy = rwefm.chamfer_distances(s2, ys, w, ys, w)
        bw = rwefm.median_bandwidth(dyy)
        return [
            rwefm.emd_distances(s2, xs, w, ys, w, max_iterations=30),
            rwefm.cloud_distances(s2, xs, w, ys, w, max_iterations=30),
            rwefm.one_nn_accuracy(dxx, dyy, dxy),
            rwefm.one_nn_accuracies(dxx, dyy, dxy),
            rwefm.mmd(dxx, dyy, dxy, bw),
            rwefm.min_matching_distance(dxy),
            rwefm.set_w2(dxy),
        ]

    return fn, (xs, ys, w)


# --- cvxclust ------------------------------------------------------------------------------

not_lowered(
    TYPES,
    "cvxclust.ContextualSBM",
    "cvxclust.FusionOutput",
    "cvxclust.FusionPath",
    "cvxclust.NuclearCertificate",
    "cvxclust.NuclearOutput",
    "cvxclust.SharedAtomCertificate",
    "cvxclust.SharedAtomOutput",
)
not_lowered(
    "builds a problem, a graph or its weights with NumPy on the host (once, before solving); "
    "what it builds is solved by the lowered solvers",
    "cvxclust.adjacency_from_edges",
    "cvxclust.balanced_weights",
    "cvxclust.check_adjacency",
    "cvxclust.check_edges",
    "cvxclust.contextual_sbm",
    "cvxclust.feature_similarity",
    "cvxclust.graph_problem",
    "cvxclust.joint_problem",
    "cvxclust.knn_gaussian_weights",
    "cvxclust.label_similarity",
    "cvxclust.nuclear_blocks",
    "cvxclust.shared_atom_problem",
    "cvxclust.with_labels",
)
not_lowered(
    "splits the problem into its connected blocks on the host (nuclear_blocks) and solves each "
    "block with NuclearSolver, which is lowered",
    "cvxclust.SplitNuclearSolver",
)


def _two_blocks(n=8):
    a = np.kron(np.eye(2), np.ones((n // 2, n // 2))) - np.eye(n)
    return a


@entry(
    "cvxclust.NuclearSolver",
    (
        "cvxclust.NuclearSolver",
        "cvxclust.NuclearProblem",
        "cvxclust.nuclear_certificate",
        "cvxclust.nuclear_objective",
        "cvxclust.min_eigenvalue",
        "cvxclust.psd_repair",
        "cvxclust.psd_rescale",
        "cvxclust.box_violation",
        "cvxclust.recovery_error",
        "cvxclust.matrix_clusters",
        "cvxclust.assign_labels",
    ),
)
def _():
    from hexad import cvxclust as C

    labels = jnp.array([0, 0, 0, 0, 1, 1, 1, 1])
    labeled = jnp.array([1, 0, 0, 0, 1, 0, 0, 0], bool)

    def fn(problem):
        out = C.NuclearSolver(max_iters=20)(problem)
        cert = C.nuclear_certificate(problem, out.l, out.rho * out.dual)
        return [
            out,
            cert,
            C.nuclear_objective(problem, out.l),
            C.min_eigenvalue(out.l),
            C.psd_repair(out.l),
            C.psd_rescale(out.low_rank),
            C.box_violation(out.l),
            C.recovery_error(out.l, labels),
            C.matrix_clusters(out.l),
            C.assign_labels(out.l, labels, labeled, 2),
        ]

    return fn, (C.graph_problem(_two_blocks(), 1.0),)


@entry("cvxclust.FactorSolver", ("cvxclust.FactorSolver", "cvxclust.FactorOutput"))
def _():
    from hexad import cvxclust as C

    def fn(problem):
        return C.FactorSolver(rank=4, steps=5)(problem, jax.random.key(0))

    return fn, (C.graph_problem(_two_blocks(), 1.0),)


@entry(
    "cvxclust.FusionSolver",
    (
        "cvxclust.FusionSolver",
        "cvxclust.FusionProblem",
        "cvxclust.fusion_objective",
        "cvxclust.fusion_dual_objective",
        "cvxclust.fused_clusters",
    ),
)
def _():
    from hexad import cvxclust as C

    x = np.concatenate([np.zeros((4, 2)), np.ones((4, 2))]).astype(np.float32)
    edges = np.array([[i, j] for i in range(8) for j in range(i + 1, 8)])
    problem = C.FusionProblem.create(x, edges, np.ones(len(edges)), 0.1)

    def fn(problem):
        out = C.FusionSolver(max_iters=20)(problem)
        return [
            out,
            C.fusion_objective(problem, out.u),
            C.fusion_dual_objective(problem, out.dual),
            C.fused_clusters(out.u, problem.edges, 1e-3),
        ]

    return fn, (problem,)


@entry("cvxclust.clusterpath", ("cvxclust.clusterpath",))
def _():
    from hexad import cvxclust as C

    x = np.concatenate([np.zeros((3, 1)), np.ones((3, 1))]).astype(np.float32)
    edges = np.array([[i, j] for i in range(6) for j in range(i + 1, 6)])
    problem = C.FusionProblem.create(x, edges, np.ones(len(edges)), 0.0)
    solver = C.FusionSolver(max_iters=20)
    return (lambda p, g: C.clusterpath(p, g, solver)), (problem, jnp.array([0.1, 1.0], F32))


@entry(
    "cvxclust.SharedAtomSolver",
    (
        "cvxclust.SharedAtomSolver",
        "cvxclust.SharedAtomProblem",
        "cvxclust.shared_atom_certificate",
        "cvxclust.shared_atom_objective",
    ),
)
def _():
    from hexad import cvxclust as C

    x = np.concatenate([np.zeros((4, 1)), np.ones((4, 1))]).astype(np.float32)
    problem = C.shared_atom_problem(1.0, 1.0, adjacency=_two_blocks(), features=x)

    def fn(problem):
        out = C.SharedAtomSolver(max_iters=20)(problem)
        return [
            out,
            C.shared_atom_certificate(problem, out.l, out.u, out.rho * out.dual),
            C.shared_atom_objective(problem, out.l, out.u),
        ]

    return fn, (problem,)


@entry("cvxclust.label_propagation", ("cvxclust.label_propagation",))
def _():
    from hexad import cvxclust as C

    edges = np.array([[0, 1], [1, 2], [3, 4]])
    labeled = np.array([True, False, False, False, True])
    return (lambda lab: C.label_propagation(edges, lab, labeled, 2, num_iters=10)), (
        jnp.array([0, 0, 0, 0, 1]),
    )


# --- policy --------------------------------------------------------------------------------

not_lowered(
    TYPES,
    "policy.AntController",
    "policy.BCInfo",
    "policy.Batch",
    "policy.CQLInfo",
    "policy.CQLState",
    "policy.DiagGaussian",
    "policy.IQLInfo",
    "policy.IQLState",
    "policy.Method",
    "policy.OnlineEnv",
    "policy.OnlineResult",
    "policy.PRIOR_KINDS",
    "policy.PRECISION_RATIOS",
    "policy.REPLAY_FIELDS",
    "policy.Row",
    "policy.SACInfo",
    "policy.SACState",
    "policy.SFBatch",
    "policy.SFInfo",
    "policy.SFState",
    "policy.SPACES",
    "policy.VelocityGoals",
    "policy.ANT_CONTROLLER_DEFAULTS",
    "policy.stack_rows",
)
not_lowered(
    "runs a gymnasium / MuJoCo environment on the host (data generation, online training, "
    "behaviour policies); the networks and update steps it drives are lowered",
    "policy.antmaze_dataset",
    "policy.ant_controller_spec",
    "policy.generate_locomotion",
    "policy.locomotion_dataset",
    "policy.train_ant_controller",
    "policy.train_online",
)
not_lowered(
    "host-side bookkeeping of a data set or a study (NumPy indices, statistics, verdicts, "
    "argument checks), before or after the jitted work",
    "policy.batch_from_dataset",
    "policy.check_disjoint",
    "policy.check_space",
    "policy.hindsight_mean",
    "policy.poe_prior_weight",
    "policy.precision_ratio",
    "policy.return_range_scale",
    "policy.shuffle_goals_across_trajectories",
    "policy.trajectory_ends",
    "policy.velocity_goals",
    "policy.task_fit",
    "policy.task_weights",
)
not_lowered(
    "builds networks or parameters once on the host (a flax module, a prior's parameters); "
    "their apply functions are lowered by the policy.networks and policy.priors entries",
    "policy.actor_for_space",
    "policy.make_prior",
    "policy.Normaliser",
    "policy.ExpertLibrary",
)


def _pol_batch(n=16, o=3, d=2):
    from hexad import policy as P

    k = jax.random.split(jax.random.key(0), 3)
    obs = jax.random.normal(k[0], (n, o), F32)
    act = jnp.tanh(jax.random.normal(k[1], (n, d), F32))
    return P.Batch(obs, act, jnp.zeros(n, F32), obs + 0.1, jnp.zeros(n, F32))


@entry(
    "policy.networks",
    (
        "policy.GaussianActor",
        "policy.MLP",
        "policy.TwinCritic",
        "policy.ValueNet",
        "policy.SuccessorFeatures",
    ),
)
def _():
    from hexad import policy as P

    b = _pol_batch()
    nets = {
        "actor": (P.GaussianActor(2, hidden=(8,)), (b.observations,)),
        "mlp": (P.MLP((8,), 2), (b.observations,)),
        "critic": (P.TwinCritic(hidden=(8,)), (b.observations, b.actions)),
        "value": (P.ValueNet(hidden=(8,)), (b.observations,)),
        "sf": (P.SuccessorFeatures(3, 4, hidden=(8,)), (b.observations, b.actions)),
    }
    params = {k: m.init(jax.random.key(1), *a) for k, (m, a) in nets.items()}

    def fn(params, obs, act):
        out = []
        for k, (m, a) in nets.items():
            out.append(m.apply(params[k], *((obs,) if len(a) == 1 else (obs, act))))
        return out

    return fn, (params, b.observations, b.actions)


@entry(
    "policy.closed forms",
    (
        "policy.poe",
        "policy.additive",
        "policy.kl_regularised",
        "policy.prior_only",
        "policy.poe_kl_to_actor",
        "policy.poe_mean_kl_to_actor",
        "policy.kl_budget_alpha",
        "policy.kl_budget_alpha_per_state",
        "policy.calibrate_kl_budget",
        "policy.precision_prior",
        "policy.perturbation_prior",
        "policy.kl_diag_gaussian",
        "policy.squash",
        "policy.sample_action",
        "policy.gaussian_log_prob",
        "policy.deterministic_action",
        "policy.soft_td_target",
        "policy.expectile_loss",
    ),
)
def _():
    from hexad import policy as P

    def fn(key, m1, s1, m2, s2):
        a, p = P.DiagGaussian(m1, s1), P.DiagGaussian(m2, s2)
        act, _ = P.sample_action(key, a)
        z = jnp.zeros(m1.shape[0], F32)
        return [
            P.poe(a, p, 0.5),
            P.additive(a, p, 0.5),
            P.kl_regularised(a, p, 0.5),
            P.prior_only(a, p),
            P.poe_kl_to_actor(a, p, 0.5),
            P.poe_mean_kl_to_actor(a, p, 0.5),
            P.kl_budget_alpha(a, p, 0.3),
            P.kl_budget_alpha(a, p, 0.3, mean_only=True),
            P.kl_budget_alpha_per_state(a, p, 0.3),
            P.calibrate_kl_budget(a, 0.5),
            P.precision_prior(a, m2, 2.0),
            P.perturbation_prior(a, p, m2),
            P.kl_diag_gaussian(a, p),
            P.squash(a),
            P.gaussian_log_prob(a, act),
            P.deterministic_action(m1, True),
            P.soft_td_target(z, z, z, z, z, 0.99, 0.1),
            P.expectile_loss(m1 - m2, 0.7),
        ]

    k = jax.random.split(jax.random.key(0), 4)
    m1, m2 = jax.random.normal(k[0], (2, 16, 2), F32)
    s1, s2 = jnp.exp(jax.random.normal(k[1], (2, 16, 2), F32))
    return fn, (k[2], m1, s1, m2, s2)


@entry("policy.compose", ("policy.compose", "policy.q_steer"))
def _():
    from hexad import policy as P

    def q_fn(obs, act):
        return -jnp.sum((act - 0.3) ** 2, -1) + 0.0 * jnp.sum(obs, -1)

    def fn(m1, s1, m2, s2, obs, rnd):
        methods = jnp.arange(16) % 8
        a, p = P.DiagGaussian(m1, s1), P.DiagGaussian(m2, s2)
        alpha = jnp.full((16,), 0.5, F32)
        return P.compose(
            methods, a, p, alpha, kl_budget=0.3, q_fn=q_fn, q_obs=obs,
            gpi_action=rnd, random_action=rnd,
        )  # fmt: skip

    k = jax.random.split(jax.random.key(0), 4)
    m1, m2 = jax.random.normal(k[0], (2, 16, 2), F32)
    s1, s2 = jnp.exp(jax.random.normal(k[1], (2, 16, 2), F32))
    obs = jax.random.normal(k[2], (16, 3), F32)
    return fn, (m1, s1, m2, s2, obs, jnp.tanh(jax.random.normal(k[3], (16, 2), F32)))


def _algorithms():
    import optax

    from hexad import policy as P

    actor, critic, value = P.GaussianActor(2, hidden=(8,)), P.TwinCritic((8,)), P.ValueNet((8,))
    opt = optax.adam(1e-3)
    return {
        "bc": P.bc(actor, opt),
        "iql": P.iql(actor, critic, value, opt, opt, opt),
        "cql": P.cql(actor, critic, opt, opt, n_action_samples=2),
        "sac": P.sac(actor, critic, opt, opt, opt),
    }


for _name in ("bc", "iql", "cql", "sac"):

    @entry(
        f"policy.make_train {_name}",
        (f"policy.{_name}", "policy.make_train"),
    )
    def _(name=_name):
        from hexad import policy as P

        algo = _algorithms()[name]
        b = _pol_batch()
        state = algo.init(jax.random.key(0), b)
        train = P.make_train(algo, n_steps=2, batch_size=8)
        return train, (jax.random.key(1), state, b)


@entry("policy.sf_td and gpi", ("policy.sf_td", "policy.gpi"))
def _():
    import optax

    from hexad import policy as P

    b = _pol_batch()
    sfb = P.SFBatch(b.observations, b.actions, jnp.ones((16, 4), F32), b.next_observations,
                    b.terminals)  # fmt: skip
    net = P.SuccessorFeatures(3, 4, hidden=(8,))

    def next_actions(obs):
        return jnp.zeros((obs.shape[0], 3, 2), F32)

    algo = P.sf_td(net, optax.adam(1e-3), next_actions)
    state = algo.init(jax.random.key(0), sfb)

    def fn(key, state, batch, candidates, w):
        state, info = algo.step(key, state, batch)

        def psi_fn(o, a):
            return net.apply(state.params, o, a)

        return state, info, P.gpi(psi_fn, batch.observations, candidates, w)

    cands = jnp.zeros((16, 5, 2), F32)
    return fn, (jax.random.key(1), state, sfb, cands, jnp.ones((4,), F32))


@entry(
    "policy.priors",
    (
        "policy.degrade_params",
        "policy.future_goal_indices",
        "policy.state_noise",
        "policy.goal_conditioned",
    ),
)
def _():
    from hexad import policy as P

    actor = P.GaussianActor(2, hidden=(8,))
    b = _pol_batch()
    params = actor.init(jax.random.key(0), jnp.zeros((1, 5), F32))
    noise = P.state_noise(jax.random.key(1), 3, 2)

    def fn(key, params, batch, ends):
        k1, k2 = jax.random.split(key)
        goals = batch.observations[:, :2]
        return [
            P.degrade_params(k1, params, 0.5),
            P.future_goal_indices(k2, ends),
            noise(batch.observations),
            P.goal_conditioned(batch, goals),
        ]

    ends = jnp.full((16,), 15, jnp.int32)
    return fn, (jax.random.key(2), params, b, ends)


# --- cachex and data: host-side by design --------------------------------------------------

not_lowered(
    "checkpoint I/O on the host (orbax, files, sockets, processes): CacheX copies device arrays "
    "to host memory and never runs in a trace; on an accelerator the copy is a device-to-host "
    "transfer and the rest is unchanged",
    *[
        f"cachex.{n}"
        for n in (
            "CacheXHandler CacheXManager CacheXRestore CacheXSave CorruptCheckpointError "
            "DATA_FILE DrainerConfig ItemCheckpoint MANIFEST_FILE PFSModel PinnedLimitError "
            "ReplicaClient ReplicaError ReplicaServer RestoreCheck Restored StagingPool "
            "UnreadableCheckpointError assemble_tree disk_full io_error "
            "check_restore choose_partner corrupt_file drain_once exhaust_drain_retries fail_at "
            "fsync_dir kill_at kill_drainer_mid_drain quiet_failed_saves read_rank_dir "
            "refuse_drains resume spawn_drainer spawn_replica_server sweep_pfs validate_file_name "
            "validate_step_name verified_steps wipe_local write_rank_dir"
        ).split()
    ],
)
not_lowered(
    "data sets read or generated on the host (NumPy files, simulators)",
    *[
        f"data.{n}"
        for n in (
            "Planetoid SingleCell bundled_path cache_dir load_npz load_pbmc68k load_planetoid "
            "require"
        ).split()
    ],
)


@entry(
    "cachex.durability model",
    (
        "cachex.DurabilityModel",
        "cachex.choose_path",
        "cachex.critical_contention",
        "cachex.fit_durability_model",
        "cachex.fit_gumbel",
        "cachex.fit_lognormal",
        "cachex.gumbel_of_max_lognormal",
        "cachex.pfs_time_quantile",
    ),
)
def _():
    from hexad import cachex as X

    def fn(times):
        m = X.fit_durability_model(times)
        c = jnp.linspace(0.0, 1.0, 5, dtype=F32)
        return [
            m,
            X.fit_lognormal(times.reshape(-1)),
            X.fit_gumbel(jnp.log(jnp.max(times, axis=1))),
            X.gumbel_of_max_lognormal(m.mu, m.sigma, 16),
            X.pfs_time_quantile(m.mu, m.sigma, 16, 0.99, c),
            X.critical_contention(m.mu, m.sigma, 16, 0.99, 2.0),
            X.choose_path(m.mu, m.sigma, 16, 0.99, 2.0, c),
        ]

    return fn, (jnp.exp(0.5 * jax.random.normal(jax.random.key(0), (32, 16), F32)),)


# --- backdoor ------------------------------------------------------------------------------

not_lowered(
    TYPES,
    "backdoor.DEFENSES",
    "backdoor.FAMILY",
    "backdoor.NEEDS_TRAIN",
    "backdoor.BackdoorMetrics",
    "backdoor.BlendTrigger",
    "backdoor.DTBBatch",
    "backdoor.DTBConfig",
    "backdoor.DTBInfo",
    "backdoor.DTBProblem",
    "backdoor.DefenseData",
    "backdoor.DefenseOutput",
    "backdoor.PatchTrigger",
    "backdoor.Poisoned",
    "backdoor.TrainInfo",
    "backdoor.WarpTrigger",
    "backdoor.defenses",
)
not_lowered(
    "host-driven loops over one module-level compiled training chunk (every defense, the "
    "implant and fit loops, the study's evaluation tables), with stopping rules and pruning "
    "levels chosen on the host between chunks; the chunk's step is lowered by the "
    "backdoor.make_trainer and backdoor.make_dtb entries",
    "backdoor.benchmark_defenses",
    "backdoor.compose",
    "backdoor.defense_table",
    "backdoor.evaluate",
    "backdoor.finetune_trajectory",
    "backdoor.fit",
    "backdoor.implant",
    "backdoor.make_defense",
    "backdoor.minimize",
)
not_lowered(
    "host-side set-up and bookkeeping: triggers and poisoned sets built once with NumPy, "
    "argument checks, detection and rating arithmetic on host floats, layer names and "
    "channel counts read from a parameter tree's structure",
    "backdoor.blend_trigger",
    "backdoor.channel_count",
    "backdoor.check_images",
    "backdoor.check_problem",
    "backdoor.conv_layers",
    "backdoor.head_input_layer",
    "backdoor.defense_effectiveness_rating",
    "backdoor.detection_rates",
    "backdoor.mask_layers",
    "backdoor.norm_layers",
    "backdoor.patch_trigger",
    "backdoor.poison",
    "backdoor.warp_trigger",
)


def _bd_setup():
    import optax

    from hexad import backdoor as B

    shape = (16, 16, 3)
    model = B.SmallCNN(4, (4, 8), 16)
    x = jax.random.uniform(jax.random.key(0), (16, *shape), F32)
    y = jnp.arange(16) % 4
    problem = B.DTBProblem(
        B.patch_trigger(shape, 3), B.blend_trigger(jax.random.key(1), shape), 0, 1
    )
    return B, model, optax.sgd(0.01, momentum=0.9), x, y, problem


@entry(
    "backdoor.make_trainer and metrics",
    (
        "backdoor.make_trainer",
        "backdoor.SmallCNN",
        "backdoor.cross_entropy",
        "backdoor.accuracy",
        "backdoor.attack_success_rate",
        "backdoor.robust_accuracy",
        "backdoor.target_rate",
        "backdoor.apply_trigger",
        "backdoor.sample_batch",
        "backdoor.weight_displacement",
        "backdoor.apply_channel_mask",
    ),
)
def _():
    B, model, opt, x, y, problem = _bd_setup()
    tr = B.make_trainer(model, opt)
    state = tr.init(jax.random.key(2), (x, y))
    masks = {n: jnp.ones(()) for n in ()}

    def fn(key, state, x, y):
        k1, k2 = jax.random.split(key)
        bx, by = B.sample_batch(k1, (x, y), 8)
        new, info = tr.step(k2, state, (bx, by))
        apply = model.apply
        return [
            new,
            info,
            B.accuracy(apply, new.params, x, y),
            B.attack_success_rate(apply, new.params, x, y, problem.decoy, 0),
            B.robust_accuracy(apply, new.params, x, y, problem.hidden, 1),
            B.target_rate(apply, new.params, x, y, 1),
            B.apply_trigger(problem.decoy, x),
            B.weight_displacement(new.params, state.params),
            B.apply_channel_mask(new.params, masks),
        ]

    return fn, (jax.random.key(3), state, x, y)


@entry("backdoor.PreActResNet", ("backdoor.PreActResNet", "backdoor.warp_trigger"))
def _():
    from hexad import backdoor as B

    model = B.PreActResNet(4, (4, 8), 2)
    x = jax.random.uniform(jax.random.key(0), (4, 16, 16, 3), F32)
    warp = B.warp_trigger(jax.random.key(1), (16, 16, 3))
    params = model.init(jax.random.key(2), x)
    return (lambda p, x: model.apply(p, B.apply_trigger(warp, x))), (params, x)


for _member in ("ft", "prune_ft", "noise_ft", "ft2"):

    @entry(
        f"backdoor.make_dtb surrogate={_member}",
        (
            "backdoor.make_dtb",
            "backdoor.dtb_objective",
            "backdoor.sanitise_surrogate",
            "backdoor.surrogate_defense",
            "backdoor.surrogate_path",
        ),
    )
    def _(member=_member):
        B, model, opt, x, y, problem = _bd_setup()
        config = B.DTBConfig(inner_steps=2, inner_batch=8, family=(member,))
        algo = B.make_dtb(model, opt, config, problem)
        batch = B.DTBBatch(x, y, x, y)
        state = algo.init(jax.random.key(2), batch)
        return algo.step, (jax.random.key(3), state, batch)


# --- the tests -----------------------------------------------------------------------------

SUBPACKAGES = (
    "base",
    "geometry",
    "ot",
    "prefmh",
    "sharding",
    "rwefm",
    "cvxclust",
    "policy",
    "backdoor",
    "cachex",
    "data",
)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_lowers(name, platform):
    fn, args = ENTRIES[name][0]()
    text = _lower(fn, args, platform)
    assert "stablehlo" in text or "func.func" in text
    # float64 cannot run on a TPU, and nothing here asked for it.
    assert "f64" not in text, f"{name}: float64 in the lowered module for {platform}"


def test_external_judge_cannot_be_exported_and_says_why():
    from hexad import prefmh

    judge = prefmh.external_judge(
        lambda a, b, rng: (np.sum(b, -1) > np.sum(a, -1)).astype(np.int32)
    )
    run, args = _chains(prefmh.prefmh(judge, prefmh.random_walk(0.5)))
    # The callback's operands are placed on a device of this (CPU) machine, which an export for
    # another platform refuses; on a GPU machine the same code places them on the GPU and runs.
    with pytest.raises(Exception, match="(?i)callback|custom call|platform"):
        _lower(run, args, "cuda")


def _finite(tree) -> bool:
    leaves = [
        x for x in jax.tree.leaves(tree) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)
    ]
    return all(bool(jnp.all(jnp.isfinite(x))) for x in leaves)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_runs_on_gpu(name):
    # Compiled and run on the GPU, each entry gives finite results; the deterministic geometry
    # entries also agree with the CPU (matmuls at full float32 precision, not TF32).
    fn, args = ENTRIES[name][0]()
    gpu, cpu = jax.devices("gpu")[0], jax.devices("cpu")[0]
    with jax.default_matmul_precision("highest"):
        out = jax.jit(fn)(*jax.device_put(args, gpu))
        assert _finite(out), f"{name}: non-finite output on the GPU"
        if name.startswith("geometry."):
            ref = jax.jit(fn)(*jax.device_put(args, cpu))
            for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref), strict=True):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_external_judge_runs_on_gpu():
    from hexad import prefmh

    judge = prefmh.external_judge(
        lambda a, b, rng: (np.sum(b, -1) > np.sum(a, -1)).astype(np.int32)
    )
    run, args = _chains(prefmh.prefmh(judge, prefmh.random_walk(0.5)))
    _, accepted = jax.jit(run)(*jax.device_put(args, jax.devices("gpu")[0]))
    assert accepted.shape == (4, 8)


@pytest.mark.parametrize("sub", SUBPACKAGES)
def test_every_public_name_is_covered(sub):
    mod = importlib.import_module(f"hexad.{sub}")
    covered = {c for _, covers in ENTRIES.values() for c in covers} | set(NOT_LOWERED)
    missing = sorted(f"{sub}.{n}" for n in mod.__all__ if f"{sub}.{n}" not in covered)
    assert missing == [], f"public names neither lowered nor listed in NOT_LOWERED: {missing}"
