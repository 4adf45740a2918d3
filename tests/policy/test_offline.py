"""Offline RL: BC recovers a linear expert, the expectile loss, IQL/CQL run and trace once."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from hexad import policy as P
from hexad._base import Algorithm, TrainState

OBS, ACT, N = 3, 2, 256


@pytest.fixture(scope="module")
def linear_data():
    k1, k2 = jax.random.split(jax.random.key(42))
    w = 0.3 * jax.random.normal(k1, (OBS, ACT))
    obs = jax.random.normal(k2, (N, OBS))
    act = obs @ w
    data = P.Batch(obs, act, jnp.zeros(N), obs, jnp.zeros(N))
    return w, data


def test_bc_recovers_linear_expert_for_every_seed(linear_data):
    w, data = linear_data
    actor = P.GaussianActor(ACT, hidden=(), squash=False, state_dependent_std=False)
    algo = P.bc(actor, optax.adam(3e-2))
    # Many seeds for the price of one: vmap init and the scanned trainer over keys.
    seeds = jax.random.split(jax.random.key(0), 3)
    states = jax.vmap(algo.init, in_axes=(0, None))(seeds, data)
    train = jax.vmap(P.make_train(algo, n_steps=600, batch_size=64), in_axes=(0, 0, None))
    states, infos = jax.jit(train)(jax.random.split(jax.random.key(1), 3), states, data)
    kernel = states.params["params"]["mean"]["kernel"]
    bias = states.params["params"]["mean"]["bias"]
    assert kernel.shape == (3, OBS, ACT)
    # Noise-free linear expert: the maximum-likelihood mean is exactly W; Adam gets close. Worst
    # |error| over kernel, bias and the 3 seeds, measured over 20 key sets (data, init, train)
    # x {default, AVX2, SSE4_2}: mean 0.0034, sd 0.0029, min 0.0003, max 0.0145 (heavy-tailed);
    # atol 5e-2 (untrained: >= 0.43).
    for s in range(3):
        np.testing.assert_allclose(kernel[s], w, atol=5e-2)
        np.testing.assert_allclose(bias[s], 0.0, atol=5e-2)
    assert np.all(np.asarray(infos.loss[:, -1]) < np.asarray(infos.loss[:, 0]))


@pytest.mark.slow  # the unsquashed linear-expert test above is the default one
def test_bc_squashed_recovers_bounded_expert(linear_data):
    w, data = linear_data
    data = data._replace(actions=jnp.tanh(data.observations @ w))
    actor = P.GaussianActor(ACT, hidden=(), squash=True, state_dependent_std=False)
    algo = P.bc(actor, optax.adam(3e-2))
    state = algo.init(jax.random.key(0), data)
    state, _ = jax.jit(P.make_train(algo, 600, 64))(jax.random.key(1), state, data)
    # tanh(W s) is exactly representable in pre-tanh space. Max |error| measured over 20 key
    # sets (data, init, train) under SSE4_2, these keys also under default (= AVX2 here): mean
    # 0.0017, sd 0.0023, min 1e-5, max 0.008 (these keys 0.0005-0.001).
    kernel = state.params["params"]["mean"]["kernel"]
    np.testing.assert_allclose(kernel, w, atol=2e-2)


def test_expectile_loss_closed_form():
    u = jnp.array([-2.0, -0.5, 0.0, 0.5, 3.0])
    tau = 0.8
    expected = np.array([0.2 * 4.0, 0.2 * 0.25, 0.0, 0.8 * 0.25, 0.8 * 9.0])
    np.testing.assert_allclose(P.expectile_loss(u, tau), expected, rtol=1e-6)
    # tau = 1/2 is half the squared loss.
    np.testing.assert_allclose(P.expectile_loss(u, 0.5), 0.5 * u**2, rtol=1e-6)


def test_expectile_minimiser_is_the_expectile(float64):
    x = jnp.asarray(np.random.default_rng(0).gamma(2.0, size=200))
    tau = 0.9

    # The tau-expectile m solves tau E[(x - m)_+] = (1 - tau) E[(m - x)_+]; bisection in numpy.
    xs = np.asarray(x)
    lo, hi = xs.min(), xs.max()
    for _ in range(100):
        m = 0.5 * (lo + hi)
        g = tau * np.mean(np.maximum(xs - m, 0)) - (1 - tau) * np.mean(np.maximum(m - xs, 0))
        lo, hi = (m, hi) if g > 0 else (lo, m)
    m_star = 0.5 * (lo + hi)
    # Gradient descent on the mean expectile loss reaches the same point.
    loss = lambda m: jnp.mean(P.expectile_loss(x - m, tau))  # noqa: E731
    descend = jax.jit(lambda m: jax.lax.fori_loop(0, 2000, lambda _, m: m - jax.grad(loss)(m), m))
    m = descend(jnp.float64(0.0))
    assert float(m) == pytest.approx(m_star, abs=1e-8)


def _tiny_batch(key, n=32):
    k = jax.random.split(key, 3)
    obs = jax.random.normal(k[0], (n, OBS))
    act = jnp.tanh(jax.random.normal(k[1], (n, ACT)))
    rew = jax.random.normal(k[2], (n,))
    return P.Batch(obs, act, rew, jnp.roll(obs, 1, axis=0), jnp.zeros(n))


@pytest.fixture(scope="module")
def iql_algo():
    return P.iql(
        P.GaussianActor(ACT, (16,)),
        P.TwinCritic((16,)),
        P.ValueNet((16,)),
        optax.adam(1e-3),
        optax.adam(1e-3),
        optax.adam(1e-3),
    )


def test_iql_step_traces_once_and_is_finite(iql_algo, fast_compile):
    batch = _tiny_batch(jax.random.key(0))
    state = iql_algo.init(jax.random.key(1), batch)
    step = jax.jit(chex.assert_max_traces(iql_algo.step, n=1))
    for i in range(3):
        state, info = step(jax.random.key(i), state, batch)
    assert int(state.step) == 3
    assert all(np.isfinite(np.asarray(v)) for v in info)


@pytest.mark.slow  # 800 IQL updates; the expectile closed form itself is tested above
def test_iql_value_fits_expectile_of_one_step_returns(iql_algo, fast_compile):
    # Terminal transitions: Q -> r, and V -> expectile of Q over actions at each state. With one
    # state repeated and rewards r(a) = a_0, V must sit above the mean reward (tau = 0.7 > 1/2).
    n = 64
    act = jnp.tanh(jax.random.normal(jax.random.key(3), (n, ACT)))
    obs = jnp.zeros((n, OBS))
    data = P.Batch(obs, act, act[:, 0], obs, jnp.ones(n))
    algo = P.iql(
        P.GaussianActor(ACT, (16,)),
        P.TwinCritic((32, 32)),
        P.ValueNet((16,)),
        optax.adam(3e-3),
        optax.adam(3e-3),
        optax.adam(3e-3),
        tau=0.05,
    )
    state = algo.init(jax.random.key(1), data)
    state, infos = jax.jit(P.make_train(algo, 800, n))(jax.random.key(2), state, data)
    r = np.asarray(act[:, 0])
    lo, hi = r.min(), r.max()
    for _ in range(60):
        m = 0.5 * (lo + hi)
        g = 0.7 * np.mean(np.maximum(r - m, 0)) - 0.3 * np.mean(np.maximum(m - r, 0))
        lo, hi = (m, hi) if g > 0 else (lo, m)
    v = float(P.ValueNet((16,)).apply(state.value_params, obs[:1])[0])
    # Function-approximation slack: 0.1 on rewards spread over about [-1, 1]. Measured over 20
    # key sets (actions, init, train) under SSE4_2, these keys also under default (= AVX2 here):
    # v - expectile mean -0.003, sd 0.011, range [-0.020, 0.021]; v - mean(r) in [0.19, 0.27].
    assert v == pytest.approx(0.5 * (lo + hi), abs=0.1)
    assert v > float(np.mean(r))


def test_cql_step_traces_once_and_penalises_ood(fast_compile):
    algo = P.cql(
        P.GaussianActor(ACT, (16,)),
        P.TwinCritic((16,)),
        optax.adam(1e-3),
        optax.adam(3e-3),
        cql_weight=5.0,
        n_action_samples=4,
    )
    # 16 independent runs (batch, init and step keys) for the price of one compile: in one run
    # the gap fails to shrink for about 1 key in 6, so the assertion is on their mean.
    n_runs = 16
    keys = jax.random.split(jax.random.key(0), 3 * n_runs).reshape(3, n_runs)

    @jax.jit
    def setup(keys):
        batch = jax.vmap(_tiny_batch)(keys[0])
        step_keys = jax.vmap(lambda k: jax.random.split(k, 60))(keys[2])  # [runs, 60]
        return batch, jax.vmap(algo.init)(keys[1], batch), step_keys

    batch, state, step_keys = setup(keys)
    step = jax.jit(jax.vmap(chex.assert_max_traces(algo.step, n=1)))
    gaps = []
    for i in range(60):
        state, info = step(step_keys[:, i], state, batch)
        gaps.append(np.asarray(info.cql_gap))
    assert all(np.all(np.isfinite(np.asarray(v))) for v in info)
    # The conservative term pushes Q down off the data: the log-sum-exp gap shrinks. Mean over
    # the 16 runs of (first 10 steps' gap - last 10 steps'), measured over 20 key sets x
    # {default, AVX2, SSE4_2}: mean 0.11, sd 0.026, min 0.050 (> 0 by 4 sd); with
    # cql_weight=0 (no conservative term): mean -0.10, max -0.034, so it fails there.
    gaps = np.stack(gaps)  # [60, runs]
    assert np.mean(gaps[:10] - gaps[-10:]) > 0.0


def test_bc_step_traces_once(fast_compile):
    algo = P.bc(P.GaussianActor(ACT, (8,)), optax.adam(1e-3))
    batch = _tiny_batch(jax.random.key(0))
    state = algo.init(jax.random.key(1), batch)
    # The shared shapes of hexad._base: one Algorithm contract, one TrainState.
    assert isinstance(algo, Algorithm) and isinstance(state, TrainState)
    step = jax.jit(chex.assert_max_traces(algo.step, n=1))
    for i in range(3):
        state, _ = step(jax.random.key(i), state, batch)


@pytest.mark.slow  # three compiles of the scanned trainer; keeps the folder in budget
def test_sharded_training_matches_single_device(linear_data, fast_compile):
    _, data = linear_data
    # jax.make_mesh's default (Explicit) axes are accepted: make_train converts to Auto axes.
    mesh = jax.make_mesh((len(jax.devices()),), ("data",))
    algo = P.bc(P.GaussianActor(ACT, hidden=(), squash=False), optax.adam(1e-2))
    state = algo.init(jax.random.key(0), data)
    a, _ = jax.jit(P.make_train(algo, 20, 64))(jax.random.key(1), state, data)
    b, _ = jax.jit(P.make_train(algo, 20, 64, mesh=mesh))(jax.random.key(1), state, data)
    chex.assert_trees_all_close(a.params, b.params, atol=1e-5)
    # Any axis name, given as ``axis`` (the mesh convention of hexad._base).
    rows = jax.make_mesh((len(jax.devices()),), ("rows",))
    c, _ = jax.jit(P.make_train(algo, 20, 64, mesh=rows, axis="rows"))(
        jax.random.key(1), state, data
    )
    chex.assert_trees_all_close(a.params, c.params, atol=1e-5)
    with pytest.raises(ValueError, match="batch_size"):
        P.make_train(algo, 20, 60, mesh=mesh)  # 60 rows do not split over 8 devices
    with pytest.raises(ValueError, match="axis"):
        P.make_train(algo, 20, 64, mesh=rows)  # no "data" axis in this mesh


def test_hindsight_goals_and_degrade(fast_compile):
    ends = P.trajectory_ends(np.array([0, 0, 1, 0, 0]), np.array([0, 0, 0, 0, 1]))
    np.testing.assert_array_equal(ends, [2, 2, 2, 4, 4])
    idx = np.asarray(P.future_goal_indices(jax.random.key(0), jnp.asarray(ends)))
    i = np.arange(5)
    assert np.all((idx >= i) & (idx <= ends))
    params = {"w": jnp.ones((4, 4)), "b": jnp.zeros(4)}
    noisy = P.degrade_params(jax.random.key(0), params, 0.5)
    assert not np.allclose(noisy["b"], 0.0)


def test_dataset_validation():
    good = {
        "observations": np.zeros((4, 3)),
        "actions": np.zeros((4, 2)),
        "rewards": np.zeros(4),
        "next_observations": np.zeros((4, 3)),
        "terminals": np.zeros(4),
    }
    assert P.batch_from_dataset(good).observations.shape == (4, 3)
    bad = dict(good)
    del bad["rewards"]
    with pytest.raises(ValueError, match="rewards"):
        P.batch_from_dataset(bad)
    bad = dict(good, actions=np.full((4, 2), np.nan))
    with pytest.raises(ValueError, match="actions"):
        P.batch_from_dataset(bad)
    bad = dict(good, next_observations=np.zeros((4, 5)))
    with pytest.raises(ValueError, match="next_observations"):
        P.batch_from_dataset(bad)
    with pytest.raises(ValueError, match="expectile"):
        P.iql(
            P.GaussianActor(2), P.TwinCritic(), P.ValueNet(), *(optax.sgd(1.0),) * 3, expectile=1.5
        )


def test_normaliser_standardises_observations_and_batches():
    rng = np.random.default_rng(0)
    x = (3.0 + 2.0 * rng.normal(size=(500, 3))).astype(np.float32)
    x[:, 2] = 5.0  # a constant feature stays finite thanks to eps
    norm = P.Normaliser.fit(x, eps=1e-3)
    z = np.asarray(norm(jnp.asarray(x)))
    np.testing.assert_allclose(z.mean(0), 0.0, atol=1e-5)
    sd = x.std(0)
    np.testing.assert_allclose(z.std(0), sd / (sd + 1e-3), rtol=1e-4)
    # The same map inside jit (a pytree: its statistics are leaves), and on both batch fields.
    np.testing.assert_allclose(jax.jit(lambda n, o: n(o))(norm, x), z, rtol=1e-6)
    b = P.Batch(jnp.asarray(x), jnp.zeros((500, 1)), jnp.zeros(500), jnp.asarray(x), jnp.zeros(500))
    nb = norm.batch(b)
    np.testing.assert_allclose(nb.observations, z, rtol=1e-6)
    np.testing.assert_allclose(nb.next_observations, z, rtol=1e-6)
    assert nb.actions is b.actions
    with pytest.raises(ValueError, match="observations"):
        P.Normaliser.fit(x[:, 0])
    with pytest.raises(ValueError, match="eps"):
        P.Normaliser.fit(x, eps=0.0)
