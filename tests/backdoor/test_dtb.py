"""DTB: hypergradients against finite differences (float64), the gate, one trace per step."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from hexad import backdoor as bd

SHAPE = (8, 8, 1)


def _setup(key, dtype):
    model = bd.SmallCNN(num_classes=3, widths=(2, 3), hidden=4)
    k1, k2, k3, k4 = jax.random.split(key, 4)
    params = model.init(k1, jnp.zeros((1,) + SHAPE, dtype))
    params = jax.tree.map(lambda a: (a * 3.0).astype(dtype), params)  # larger weights: less flat
    problem = bd.DTBProblem(
        bd.patch_trigger(SHAPE, 2), bd.patch_trigger(SHAPE, 2, loc=(0, 0)), 0, 1
    )
    x = jax.random.uniform(k2, (6,) + SHAPE, dtype)
    xc = jax.random.uniform(k3, (5,) + SHAPE, dtype)
    y = jnp.arange(6) % 3
    yc = jax.random.randint(k4, (5,), 0, 3)
    return model, params, problem, bd.DTBBatch(x, y, xc, yc)


def _directional(key, cfg_kwargs):
    """Returns central finite differences along a random direction of the unrolled objective
    (``fd``), of the objective with the inner displacement frozen at its value at theta
    (``fd_frozen``: what the first-order hypergradient differentiates), and the directional
    derivatives of the unrolled and first-order hypergradients."""
    model, params, problem, batch = _setup(key, jnp.float64)
    direction = jax.tree.map(
        lambda a: jax.random.normal(jax.random.fold_in(key, a.size), a.shape, a.dtype), params
    )
    nk = jax.random.key(7)
    unrolled = bd.DTBConfig(hypergrad="unrolled", gate=False, **cfg_kwargs)
    first = bd.DTBConfig(hypergrad="first_order", gate=False, **cfg_kwargs)
    pre = bd.DTBConfig(inner_steps=0, gate=False, w_hidden_post=0.0)
    post = bd.DTBConfig(inner_steps=0, gate=False, w_clean=0.0, w_decoy=0.0, w_hidden_pre=0.0)

    @functools.partial(jax.jit, static_argnums=0)  # jitted: eager op-by-op is far slower
    def obj(cfg, p):
        return bd.dtb_objective(model, cfg, p, nk, problem, batch)[0]

    theta1 = bd.sanitise_surrogate(model, first, params, nk, problem, batch.x_clean, batch.y_clean)[
        0
    ]  # fd_frozen is meaningful for rounds == 1 only
    delta = jax.tree.map(jnp.subtract, theta1, params)

    def frozen(p):
        return obj(pre, p) + obj(post, jax.tree.map(jnp.add, p, delta))

    eps = 1e-5
    shift = lambda s: jax.tree.map(lambda a, d: a + s * eps * d, params, direction)
    fd = (obj(unrolled, shift(1.0)) - obj(unrolled, shift(-1.0))) / (2 * eps)
    fd_frozen = (frozen(shift(1.0)) - frozen(shift(-1.0))) / (2 * eps)
    dot = lambda g: sum(
        jnp.vdot(a, b) for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(direction), strict=True)
    )
    g_un = dot(jax.jit(jax.grad(lambda p: obj(unrolled, p)))(params))
    g_fo = dot(jax.jit(jax.grad(lambda p: obj(first, p)))(params))
    return float(fd), float(fd_frozen), float(g_un), float(g_fo)


def test_unrolled_hypergradient_matches_finite_differences(key, float64):
    # the cheap default check: one inner step, the unrolled objective and its gradient only
    model, params, problem, batch = _setup(key, jnp.float64)
    direction = jax.tree.map(
        lambda a: jax.random.normal(jax.random.fold_in(key, a.size), a.shape, a.dtype), params
    )
    cfg = bd.DTBConfig(hypergrad="unrolled", gate=False, inner_steps=1, inner_lr=0.1)
    nk = jax.random.key(7)
    obj = jax.jit(lambda p: bd.dtb_objective(model, cfg, p, nk, problem, batch)[0])
    eps = 1e-5
    both = jax.tree.map(lambda a, d: jnp.stack([a + eps * d, a - eps * d]), params, direction)
    f = jax.vmap(obj)(both)  # one compile for both shifts
    fd = float((f[0] - f[1]) / (2 * eps))
    g = jax.jit(jax.grad(obj))(params)
    pairs = zip(jax.tree.leaves(g), jax.tree.leaves(direction), strict=True)
    g_dir = float(sum(jnp.vdot(a, b) for a, b in pairs))
    # central differences in float64 with eps=1e-5: truncation ~1e-10, rounding ~1e-11
    assert abs(g_dir - fd) <= 1e-6 * max(1.0, abs(fd)), (g_dir, fd)


@pytest.mark.slow
def test_hypergradients_match_finite_differences(key, float64):
    fd, fd_frozen, g_un, g_fo = _directional(key, {"inner_steps": 2, "inner_lr": 0.1})
    # central differences in float64 with eps=1e-5: truncation ~1e-10, rounding ~1e-11
    assert abs(g_un - fd) <= 1e-6 * max(1.0, abs(fd)), (g_un, fd)
    assert abs(g_fo - fd_frozen) <= 1e-6 * max(1.0, abs(fd_frozen)), (g_fo, fd_frozen)
    # at this inner step the Jacobian term matters: first-order is an approximation
    assert abs(g_fo - fd) > 1e-3 * abs(fd)


@pytest.mark.slow
def test_first_order_approaches_the_unrolled_objective_for_small_steps(key, float64):
    # d theta'/d theta = I - lr * sum_k H_k: with lr = 1e-3 and K = 2 the first-order
    # hypergradient is within 2% of finite differences of the unrolled objective (measured
    # 0.5% on this model), and exact with K = 0.
    fd, _, g_un, g_fo = _directional(key, {"inner_steps": 2, "inner_lr": 1e-3, "rounds": 2})
    assert abs(g_un - fd) <= 1e-6 * max(1.0, abs(fd))
    assert abs(g_fo - fd) <= 0.02 * abs(fd), (g_fo, fd)
    fd0, _, g_un0, g_fo0 = _directional(key, {"inner_steps": 0})
    assert g_un0 == pytest.approx(g_fo0, rel=1e-12)
    assert g_fo0 == pytest.approx(fd0, rel=1e-6)


@pytest.mark.slow
def test_pruning_and_noise_keep_the_gradient_finite(key):
    model, params, problem, batch = _setup(key, jnp.float32)
    cfg = bd.DTBConfig(inner_steps=1, prune_frac=0.34, noise_std=0.1)
    rounds = bd.sanitise_surrogate(
        model, cfg, params, jax.random.key(1), problem, batch.x_clean, batch.y_clean
    )
    last = rounds[0]["params"]["conv1"]["kernel"]
    assert int(jnp.sum(jnp.all(last == 0, axis=(0, 1, 2)))) == 1  # one of 3 channels pruned
    g = jax.jit(jax.grad(lambda p: bd.dtb_objective(model, cfg, p, key, problem, batch)[0]))(params)
    assert all(bool(jnp.all(jnp.isfinite(a))) for a in jax.tree.leaves(g))


def test_gate_follows_the_decoy_probability(key):
    model, params, problem, batch = _setup(key, jnp.float32)
    # inner_steps=0: the gate reads the decoy probability wherever the surrogate leaves the
    # model; no inner step keeps the compile cheap
    cfg = bd.DTBConfig(inner_steps=0, gate_tau=0.3, gate_temp=0.05)
    # jitted: op-by-op the unrolled objective takes ~20x longer than its compile
    obj = jax.jit(functools.partial(bd.dtb_objective, model, cfg))
    _, info = obj(params, key, problem, batch)
    want = jax.nn.sigmoid((0.3 - info.decoy_prob_after) / 0.05)
    np.testing.assert_allclose(info.gate, want, rtol=1e-5)
    # gate=False (g = 1) is checked in test_dtb_step_traces_once_and_lowers_the_objective


def test_dtb_step_traces_once_and_lowers_the_objective(key):
    model, params, problem, batch = _setup(key, jnp.float32)
    dtb = bd.make_dtb(model, optax.adam(1e-2), bd.DTBConfig(inner_steps=2, gate=False))
    step = jax.jit(chex.assert_max_traces(dtb.step, n=1))
    state = dtb.init(params)
    losses = []
    for i in range(15):
        state, info = step(jax.random.key(i), state, problem, batch)
        losses.append(float(info.loss))
        assert float(info.gate) == 1.0  # gate=False: the hidden term is always on
    assert losses[-1] < 0.8 * losses[0], losses


def test_bad_config():
    with pytest.raises(ValueError, match="hypergrad"):
        bd.DTBConfig(hypergrad="second")
    with pytest.raises(ValueError, match="rounds"):
        bd.DTBConfig(rounds=0)
    with pytest.raises(TypeError, match="config"):
        bd.make_dtb(bd.SmallCNN(), optax.sgd(0.1), {"inner_steps": 1})
