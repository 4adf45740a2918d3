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


# --- the tests -----------------------------------------------------------------------------

SUBPACKAGES = ("geometry", "ot", "prefmh", "sharding")


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
