"""Successor features + GPI: TD recovers the closed form, GPI dominates the library, one trace."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from hexad import policy as P

S, A, K, F, GAMMA = 4, 2, 2, 3, 0.8


class Tabular(nn.Module):
    """psi(one-hot s [.., S], one-hot a [.., A]) -> [.., K, F]: a free table over (s, a)."""

    @nn.compact
    def __call__(self, obs, act):
        table = self.param("table", nn.initializers.zeros, (S, A, K, F))
        return jnp.einsum("...s,...a,sakf->...kf", obs, act, table)


def _closed_form_psi(nxt, pis, phi, gamma):
    """``[K, S, A, F]`` (I - gamma P_pi)^-1 phi over state-action pairs, deterministic P."""
    n_s, n_a = nxt.shape
    out = []
    for pi in pis:
        p = np.zeros((n_s * n_a, n_s * n_a))
        for s in range(n_s):
            for a in range(n_a):
                s2 = nxt[s, a]
                p[s * n_a + a, s2 * n_a + pi[s2]] = 1.0
        psi = np.linalg.solve(np.eye(n_s * n_a) - gamma * p, phi.reshape(n_s * n_a, -1))
        out.append(psi.reshape(n_s, n_a, -1))
    return np.stack(out)


@pytest.fixture(scope="module")
def tabular_problem():
    rng = np.random.default_rng(0)
    nxt = rng.integers(0, S, (S, A))  # deterministic transitions s, a -> s'
    pis = rng.integers(0, A, (K, S))  # K deterministic library policies
    phi = rng.normal(size=(S, A, F))  # phi(s, a, s') with s' a function of (s, a)
    eye_s, eye_a = np.eye(S, dtype=np.float32), np.eye(A, dtype=np.float32)
    ss, aa = np.meshgrid(np.arange(S), np.arange(A), indexing="ij")
    ss, aa = ss.ravel(), aa.ravel()
    batch = P.SFBatch(
        jnp.asarray(eye_s[ss]),
        jnp.asarray(eye_a[aa]),
        jnp.asarray(phi[ss, aa], jnp.float32),
        jnp.asarray(eye_s[nxt[ss, aa]]),
        jnp.zeros(S * A),
    )
    pis_j = jnp.asarray(pis)

    def next_actions(s_next):  # [B, S] one-hot -> [B, K, A] one-hot
        idx = jnp.argmax(s_next, axis=-1)
        return jax.nn.one_hot(pis_j[:, idx].T, A)

    return nxt, pis, phi, batch, next_actions


def test_sf_td_matches_closed_form(tabular_problem):
    nxt, pis, phi, batch, next_actions = tabular_problem
    n = batch.observations.shape[0]
    # Loss 0.5 mean over (B, K, F): each table entry's gradient is (psi - y) / (B K F); this
    # SGD rate moves it half-way to its TD target, and tau = 1 copies the target each step,
    # so the error contracts by 0.5 + 0.5 gamma = 0.9 per step: 0.9^400 ~ 5e-19.
    algo = P.sf_td(Tabular(), optax.sgd(0.5 * n * K * F), next_actions, discount=GAMMA, tau=1.0)
    state = algo.init(jax.random.key(0), batch)

    def body(st, k):
        return algo.step(k, st, batch)

    state, infos = jax.jit(
        lambda s: jax.lax.scan(body, s, jax.random.split(jax.random.key(1), 400))
    )(state)
    want = _closed_form_psi(nxt, pis, phi, GAMMA)  # [K, S, A, F]
    got = np.moveaxis(np.asarray(state.params["params"]["table"]), 2, 0)
    # float32 arithmetic on values of size ~1/(1 - gamma) = 5.
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert float(infos.loss[-1]) < 1e-9


@pytest.mark.slow  # the closed-form test above is the default one
def test_sf_td_learns_through_make_train(tabular_problem):
    nxt, pis, phi, batch, next_actions = tabular_problem
    algo = P.sf_td(Tabular(), optax.adam(0.05), next_actions, discount=GAMMA, tau=0.05)
    state = algo.init(jax.random.key(0), batch)
    train = jax.jit(P.make_train(algo, 1500, 32))
    state, infos = train(jax.random.key(2), state, batch)
    want = _closed_form_psi(nxt, pis, phi, GAMMA)
    got = np.moveaxis(np.asarray(state.params["params"]["table"]), 2, 0)
    # Minibatches drawn with replacement and a slow Polyak target: within 5% of the scale of
    # psi (|psi| up to ~10 here). Max error / tolerance, measured over 5 tabular problems x 4
    # train keys under SSE4_2 and problem 0 x 4 keys under default (= AVX2 here): mean 0.02, sd
    # 0.025, max 0.095 (untrained: 20).
    np.testing.assert_allclose(got, want, atol=0.05 * np.abs(want).max())


def test_sf_step_traces_once(tabular_problem, fast_compile):
    *_, batch, next_actions = tabular_problem
    net = P.SuccessorFeatures(K, F, hidden=(8,))
    algo = P.sf_td(net, optax.adam(1e-3), next_actions, discount=GAMMA)
    step = jax.jit(chex.assert_max_traces(algo.step, n=1))
    state = algo.init(jax.random.key(0), batch)
    for i in range(3):
        state, info = step(jax.random.key(i), state, batch)
    assert int(state.step) == 3
    assert np.isfinite(float(info.loss))


def _exact_values(p, r, pi, gamma):
    """V^pi [S] for a deterministic pi [S] on transition tensor p [S, A, S], rewards r [S, A]."""
    n_s = p.shape[0]
    p_pi = p[np.arange(n_s), pi]
    return np.linalg.solve(np.eye(n_s) - gamma * p_pi, r[np.arange(n_s), pi])


@pytest.mark.parametrize("seed", [0, 1])
def test_gpi_dominates_every_library_policy(seed, float64):
    n_s, n_a, n_k, n_f, gamma = 6, 3, 4, 5, 0.9
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(n_s), size=(n_s, n_a))  # [S, A, S]
    phi = rng.normal(size=(n_s, n_a, n_f))  # phi(s, a)
    pis = rng.integers(0, n_a, (n_k, n_s))
    w = rng.normal(size=n_f)
    # Exact successor features psi^k(s, a) = phi(s, a) + gamma sum_s' P psi^k(s', pi_k(s')).
    psi = np.zeros((n_k, n_s, n_a, n_f))
    for k, pi in enumerate(pis):
        p_pi = np.zeros((n_s * n_a, n_s * n_a))
        for s in range(n_s):
            for a in range(n_a):
                p_pi[s * n_a + a, np.arange(n_s) * n_a + pi] = p[s, a]
        psi[k] = np.linalg.solve(
            np.eye(n_s * n_a) - gamma * p_pi, phi.reshape(n_s * n_a, n_f)
        ).reshape(n_s, n_a, n_f)
    table = jnp.asarray(np.moveaxis(psi, 0, 2))  # [S, A, K, F]
    psi_fn = lambda s, a: jnp.einsum("ms,ma,sakf->mkf", s, a, table)  # noqa: E731
    obs = jnp.eye(n_s)
    cands = jnp.broadcast_to(jnp.eye(n_a), (n_s, n_a, n_a))
    act, val = P.gpi(psi_fn, obs, cands, jnp.asarray(w))
    pi_gpi = np.argmax(np.asarray(act), axis=-1)
    r = phi @ w
    v_lib = np.stack([_exact_values(p, r, pi, gamma) for pi in pis])  # [K, S]
    v_gpi = _exact_values(p, r, pi_gpi, gamma)
    # Theorem 1 of arXiv 1606.05312 with exact psi: V^GPI >= max_k V^k everywhere (float64).
    assert np.all(v_gpi >= v_lib.max(0) - 1e-9)
    # The returned value is max_a max_k Q^k(s, a).
    q = np.einsum("ksaf,f->ksa", psi, w)
    np.testing.assert_allclose(np.asarray(val), q.max(axis=(0, 2)), rtol=1e-10)
    # Masking to one library member gives that member's greedy improvement, which also
    # dominates that member (policy improvement).
    act1, _ = P.gpi(psi_fn, obs, cands, jnp.asarray(w), policy_mask=np.arange(n_k) == 0)
    v1 = _exact_values(p, r, np.argmax(np.asarray(act1), -1), gamma)
    assert np.all(v1 >= v_lib[0] - 1e-9)


def test_task_weights_exact_and_per_state_gpi(fast_compile):
    rng = np.random.default_rng(3)
    phi = jnp.asarray(rng.normal(size=(50, 4)), jnp.float32)
    w = jnp.asarray([0.5, -1.0, 2.0, 0.0])
    np.testing.assert_allclose(P.task_weights(phi, phi @ w, ridge=0.0), w, atol=1e-4)
    # A per-state w [B, F] picks a different candidate per state.
    psi = lambda s, a: a[:, None, :]  # noqa: E731
    cands = jnp.broadcast_to(jnp.eye(2), (2, 2, 2))
    act, _ = P.gpi(psi, jnp.zeros((2, 1)), cands, jnp.array([[1.0, 0.0], [0.0, 1.0]]))
    np.testing.assert_array_equal(act, jnp.eye(2))


def test_sf_bad_input(tabular_problem):
    *_, next_actions = tabular_problem
    net = P.SuccessorFeatures(K, F, hidden=(8,))
    with pytest.raises(ValueError, match="discount"):
        P.sf_td(net, optax.adam(1e-3), next_actions, discount=1.0)
    with pytest.raises(ValueError, match="tau"):
        P.sf_td(net, optax.adam(1e-3), next_actions, tau=0.0)
    with pytest.raises(TypeError, match="next_actions"):
        P.sf_td(net, optax.adam(1e-3), None)
    with pytest.raises(ValueError, match="rewards"):
        P.task_weights(jnp.ones((5, 2)), jnp.ones(4))
    with pytest.raises(ValueError, match="ridge"):
        P.task_weights(jnp.ones((5, 2)), jnp.ones(5), ridge=-1.0)
    psi = lambda s, a: a[:, None, :]  # noqa: E731
    with pytest.raises(ValueError, match="candidates"):
        P.gpi(psi, jnp.zeros((2, 1)), jnp.zeros((3, 2, 2)), jnp.ones(2))
    with pytest.raises(ValueError, match="w"):
        P.gpi(psi, jnp.zeros((2, 1)), jnp.zeros((2, 2, 2)), jnp.ones(3))
    with pytest.raises(ValueError, match="policy_mask"):
        P.gpi(psi, jnp.zeros((2, 1)), jnp.zeros((2, 2, 2)), jnp.ones(2), policy_mask=np.ones(3))


def test_task_fit_weights_and_r2_closed_forms():
    rng = np.random.default_rng(0)
    phi = rng.normal(size=(40, 3)).astype(np.float32)
    w_true = np.array([1.0, -2.0, 0.5])
    w, r2 = P.task_fit(phi, phi @ w_true, ridge=0.0)  # exactly linear: R^2 = 1
    np.testing.assert_allclose(w, w_true, atol=1e-4)
    assert r2 == pytest.approx(1.0, abs=1e-6)
    # A constant feature alone fits the mean: R^2 = 0 exactly (up to rounding).
    r = rng.normal(size=40)
    w, r2 = P.task_fit(np.ones((40, 1), np.float32), r, ridge=0.0)
    assert float(w[0]) == pytest.approx(r.mean(), abs=1e-5) and r2 == pytest.approx(0.0, abs=1e-5)
    with pytest.raises(ValueError, match="rewards"):
        P.task_fit(phi, np.ones(40))


def test_sf_batch_from_batch_keeps_the_transitions():
    b = P.Batch(
        jnp.zeros((3, 2)), jnp.ones((3, 1)), jnp.zeros(3), jnp.full((3, 2), 2.0), jnp.ones(3)
    )
    phi = jnp.arange(12.0).reshape(3, 4)
    sb = P.SFBatch.from_batch(b, phi)
    assert sb.features is phi and sb.actions is b.actions and sb.terminals is b.terminals
    assert sb.observations is b.observations and sb.next_observations is b.next_observations
    with pytest.raises(ValueError, match="features"):
        P.SFBatch.from_batch(b, phi[:2])
