"""The composition layer: Method codes, rows, the expert library and the per-row dispatcher."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hexad import policy
from hexad.policy import DiagGaussian, Method, Row

B, D, OBS = 8, 2, 3


def _gaussians(key):
    k = jax.random.split(key, 4)
    actor = DiagGaussian(
        jax.random.normal(k[0], (B, D)), jnp.exp(0.3 * jax.random.normal(k[1], (B, D)))
    )
    prior = DiagGaussian(
        jax.random.normal(k[2], (B, D)), jnp.exp(0.3 * jax.random.normal(k[3], (B, D)))
    )
    return actor, prior


def _q_toward(target):
    """A critic whose best action is ``target``: ``-|a - target|^2``."""
    return lambda s, a: -jnp.sum(jnp.square(a - target), axis=-1)


def test_method_codes_are_stable():
    # Traced code and saved tables see the integers: they must not move.
    assert [int(m) for m in Method] == list(range(8))
    assert Method.IQL_GUIDED == 3 and Method.CQL_GUIDED == 4 and Method.SFGPI == 5


def test_poe_at_alpha_zero_is_the_actor_and_at_one_the_prior():
    actor, prior = _gaussians(jax.random.key(0))
    # Equal up to rounding: PoE's mean is (lam_A mu_A) / lam_A at alpha 0.
    zero = policy.compose(Method.POE, actor, prior, 0.0, kl_budget=1.0)
    np.testing.assert_allclose(zero, jnp.tanh(actor.mean), rtol=1e-6)
    one = policy.compose(Method.POE, actor, prior, 1.0, kl_budget=1.0)
    np.testing.assert_allclose(one, jnp.tanh(prior.mean), rtol=1e-6)
    add0 = policy.compose(Method.ADDITIVE, actor, prior, 0.0, kl_budget=1.0)
    np.testing.assert_array_equal(add0, jnp.tanh(actor.mean))


def test_compose_dispatches_each_method_to_its_closed_form(fast_compile):
    actor, prior = _gaussians(jax.random.key(1))
    q_obs = jax.random.normal(jax.random.key(2), (B, OBS))
    gpi_action = jax.random.uniform(jax.random.key(3), (B, D), minval=-1, maxval=1)
    random_action = jax.random.uniform(jax.random.key(4), (B, D), minval=-1, maxval=1)
    q_iql, q_cql = _q_toward(0.5), _q_toward(-0.5)
    methods = jnp.array([0, 1, 2, 3, 4, 5, 6, 7])
    alpha = jnp.array([0.3, 0.6, 0.0, 0.5, 2.0, 0.0, 0.0, 0.0])  # guided: trust-region widths
    out = jax.jit(
        lambda m, al: policy.compose(
            m,
            actor,
            prior,
            al,
            kl_budget=0.2,
            q_fn={Method.IQL_GUIDED: q_iql, Method.CQL_GUIDED: q_cql},
            q_obs=q_obs,
            step_size=0.5,
            n_steps=20,
            gpi_action=gpi_action,
            random_action=random_action,
        )
    )(methods, alpha)
    kl_alpha = policy.kl_budget_alpha_per_state(actor, prior, 0.2)
    al = [float(x) for x in alpha]
    want = [  # each method's closed form on the whole batch, at that row's alpha
        jnp.tanh(policy.poe(actor, prior, al[0]).mean),
        jnp.tanh(policy.additive(actor, prior, al[1]).mean),
        jnp.tanh(policy.poe(actor, prior, kl_alpha).mean),
        policy.q_steer(q_iql, q_obs, actor.mean, 0.5, 20, al[3]),
        policy.q_steer(q_cql, q_obs, actor.mean, 0.5, 20, al[4]),
        gpi_action,
        jnp.zeros((B, D)),
        random_action,
    ]
    for i, w in enumerate(want):
        np.testing.assert_allclose(out[i], w[i], rtol=1e-6, atol=1e-7, err_msg=Method(i).name)
    # The per-state budget binds somewhere, so KL_STATE is not PoE at the row's alpha 0.
    assert not np.allclose(out[2], jnp.tanh(actor.mean[2]))
    # Steering moved the IQL row toward its critic's optimum and the CQL row toward its own.
    assert np.all(np.abs(out[3] - 0.5) < np.abs(jnp.tanh(actor.mean[3]) - 0.5) + 1e-6)
    assert np.all(np.abs(out[4] - (-0.5)) < np.abs(jnp.tanh(actor.mean[4]) + 0.5) + 1e-6)


def test_one_critic_serves_both_guided_methods():
    actor, prior = _gaussians(jax.random.key(5))
    q_obs = jnp.zeros((B, OBS))
    m = jnp.array([Method.IQL_GUIDED, Method.CQL_GUIDED] * (B // 2))
    out = policy.compose(m, actor, prior, 1.0, kl_budget=1.0, q_fn=_q_toward(0.2), q_obs=q_obs)
    np.testing.assert_allclose(out, policy.q_steer(_q_toward(0.2), q_obs, actor.mean), rtol=1e-6)


def test_missing_inputs_raise_when_concrete_and_are_nan_when_traced():
    actor, prior = _gaussians(jax.random.key(6))
    with pytest.raises(ValueError, match="gpi_action"):
        policy.compose(jnp.full(B, Method.SFGPI), actor, prior, 0.0, kl_budget=1.0)
    with pytest.raises(ValueError, match="q_fn"):
        policy.compose(Method.CQL_GUIDED, actor, prior, 0.5, kl_budget=1.0)
    with pytest.raises(ValueError, match="random_action"):
        policy.compose(Method.RANDOM, actor, prior, 0.0, kl_budget=1.0)
    with pytest.raises(ValueError, match="method"):
        policy.compose(jnp.full(B, 9), actor, prior, 0.0, kl_budget=1.0)
    with pytest.raises(ValueError, match="q_obs"):
        policy.compose(Method.POE, actor, prior, 0.0, kl_budget=1.0, q_fn=_q_toward(0.0))
    with pytest.raises(ValueError, match="gpi_action"):
        policy.compose(Method.POE, actor, prior, 0.0, kl_budget=1.0, gpi_action=jnp.zeros((1, D)))
    m = jnp.array([Method.SFGPI, Method.POE] * (B // 2))
    out = jax.jit(lambda m: policy.compose(m, actor, prior, 0.0, kl_budget=1.0))(m)
    assert np.all(np.isnan(out[0::2])) and np.all(np.isfinite(out[1::2]))


def test_a_guided_row_without_its_critic_or_a_positive_width_raises():
    actor, prior = _gaussians(jax.random.key(6))
    q_obs = jnp.zeros((B, OBS))
    only_iql = {Method.IQL_GUIDED: _q_toward(0.2)}
    m = jnp.array([Method.IQL_GUIDED, Method.CQL_GUIDED] * (B // 2))
    # A mapping without the CQL critic: the CQL rows have no argument (they would be NaN).
    with pytest.raises(ValueError, match="q_fn: expected an argument for the CQL_GUIDED rows"):
        policy.compose(m, actor, prior, 0.5, kl_budget=1.0, q_fn=only_iql, q_obs=q_obs)
    out = policy.compose(
        jnp.full(B, Method.IQL_GUIDED), actor, prior, 0.5, kl_budget=1.0, q_fn=only_iql,
        q_obs=q_obs,
    )  # fmt: skip
    assert np.all(np.isfinite(out))
    # The guided rows' trust-region half-width is compose's alpha, and the error names it.
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="alpha: expected a trust-region half-width > 0"):
            policy.compose(m, actor, prior, bad, kl_budget=1.0, q_fn=_q_toward(0.2), q_obs=q_obs)
    # alpha <= 0 is fine on rows that ignore it or read it as a coefficient.
    policy.compose(Method.ZERO, actor, prior, -1.0, kl_budget=1.0)
    policy.compose(Method.POE, actor, prior, 0.0, kl_budget=1.0)


def test_compose_traces_once_for_any_table(fast_compile):
    actor, prior = _gaussians(jax.random.key(7))
    fn = jax.jit(
        chex.assert_max_traces(
            lambda m, al: policy.compose(m, actor, prior, al, kl_budget=0.5), n=1
        )
    )
    rng = np.random.default_rng(0)
    for _ in range(3):
        m = jnp.asarray(rng.integers(0, 3, B))
        fn(m, jnp.asarray(rng.uniform(0, 1, B), jnp.float32))


def test_rows_stack_and_compare_exactly():
    rows = [Row(0, 1, Method.POE, 0.25), Row(1, 0, Method.KL_STATE, 0.0)]
    t = policy.stack_rows(rows + [Row(0, 1, Method.POE, 0.25)])
    assert t.actor.dtype == np.int32 and t.alpha.dtype == np.float32
    np.testing.assert_array_equal(t.method, [0, 2, 0])
    assert len(dict.fromkeys(rows + [Row(0, 1, Method.POE, 0.25)])) == 2
    assert Row(0, 1, Method.POE, 0.25) != Row(0, 1, Method.POE, 0.2500001)
    with pytest.raises(ValueError, match="rows"):
        policy.stack_rows([(0, 1, 0, 0.25)])
    with pytest.raises(ValueError, match="12"):
        policy.stack_rows([Row(0, 0, 12, 0.0)])


def _library(n_actors=2, n_priors=3, n_goals=4):
    net = policy.GaussianActor(D, (8,))
    keys = jax.random.split(jax.random.key(8), n_actors + n_priors)
    ap = tuple(net.init(k, jnp.zeros((1, OBS))) for k in keys[:n_actors])
    pp = tuple(net.init(k, jnp.zeros((1, OBS + 2))) for k in keys[n_actors:])
    goals = jax.random.normal(jax.random.key(9), (n_goals, 2))
    return policy.ExpertLibrary(net, net, ap, pp, goals)


def test_library_actions_are_each_member_in_order():
    lib = _library()
    obs = jax.random.normal(jax.random.key(10), (B, OBS))
    acts = lib.actions(obs)
    assert acts.shape == (B, lib.n_members, D) and lib.n_members == 3 * 4 + 2
    for pi, pp in enumerate(lib.prior_params):
        for j in range(4):
            og = jnp.concatenate([obs, jnp.broadcast_to(lib.goals[j], (B, 2))], -1)
            want = jnp.tanh(lib.prior.apply(pp, og).mean)
            np.testing.assert_allclose(acts[:, pi * 4 + j], want, rtol=1e-5, atol=1e-6)
    for ai, ap in enumerate(lib.actor_params):
        want = jnp.tanh(lib.actor.apply(ap, obs).mean)
        np.testing.assert_allclose(acts[:, 12 + ai], want, rtol=1e-5, atol=1e-6)
    mask = lib.members(1, 2)
    assert np.flatnonzero(mask).tolist() == [8, 9, 10, 11, 13]
    with pytest.raises(ValueError, match="actor, prior"):
        lib.members(2, 0)


def test_library_picks_each_rows_actor_and_prior():
    lib = _library()
    obs = jax.random.normal(jax.random.key(11), (B, OBS))
    idx = jnp.arange(B) % 2
    got = lib.actor_dist(obs, idx)
    for b in range(B):
        want = lib.actor.apply(lib.actor_params[int(idx[b])], obs[b : b + 1])
        np.testing.assert_allclose(got.mean[b], want.mean[0], rtol=1e-5, atol=1e-6)
    og = jnp.concatenate([obs, jnp.zeros((B, 2))], -1)
    pid = jnp.arange(B) % 3
    got = lib.prior_dist(og, pid)
    want = lib.prior.apply(lib.prior_params[2], og)
    np.testing.assert_array_equal(got.std[pid == 2], want.std[pid == 2])


def test_gpi_over_a_one_member_library_returns_that_member():
    lib = _library(n_actors=1, n_priors=0, n_goals=0)
    obs = jax.random.normal(jax.random.key(12), (B, OBS))

    def psi(s, a):  # K = 1, F = 3
        return jnp.concatenate([a, s[:, :1]], -1)[:, None, :]

    act = lib.gpi(psi, obs, jnp.array([1.0, -2.0, 0.5]), jnp.zeros(B, int), jnp.zeros(B, int))
    np.testing.assert_array_equal(act, lib.actions(obs)[:, 0])


def test_gpi_picks_the_best_member_of_each_rows_pair():
    lib = _library()
    obs = jax.random.normal(jax.random.key(13), (B, OBS))
    k = lib.n_members
    proj = jax.random.normal(jax.random.key(14), (D, k * 2))

    def psi(s, a):  # [M, K, F = 2], a different linear value per member
        return (a @ proj).reshape(-1, k, 2) + s[:, :1, None]

    w = jnp.array([1.0, -0.5])
    a_id, p_id = jnp.arange(B) % 2, jnp.arange(B) % 3
    got = lib.gpi(psi, obs, w, a_id, p_id)
    lib_acts = np.asarray(lib.actions(obs))
    for b in range(B):
        mask = lib.members(int(a_id[b]), int(p_id[b]))
        cands = lib_acts[b, mask]  # [C, d]
        q = np.asarray(psi(jnp.broadcast_to(obs[b], (len(cands), OBS)), cands)) @ np.asarray(w)
        best = cands[np.argmax(q[:, mask].max(axis=1))]
        np.testing.assert_allclose(got[b], best, rtol=1e-6)


def test_row_labels():
    names = ("good", "degraded", "random")
    assert Row(0, 1, Method.POE, 0.25).label(names) == "poe alpha=0.25 degraded"
    assert Row(0, 0, Method.ADDITIVE, 1.0).label(names) == "additive alpha=1 good"
    assert Row(0, 2, Method.KL_STATE, 0.0).label(names) == "poe_kl_state random"
    assert Row(0, 2, Method.SFGPI, 0.0).label(names) == "sfgpi random"
    assert Row(0, 0, Method.CQL_GUIDED, 0.5).label(names) == "cql_guided shift=0.5"
    assert Row(0, 0, Method.IQL_GUIDED, 2.0).label(()) == "iql_guided shift=2"
    assert Row(0, 0, Method.ZERO, 0.0).label(()) == "zero"
    with pytest.raises(ValueError, match="prior_names"):
        Row(0, 3, Method.POE, 0.5).label(names)


def test_kl_budget_alpha_fn_is_the_selector_of_each_prior(fast_compile):
    net = policy.GaussianActor(D, (8,))
    ks = jax.random.split(jax.random.key(3), 5)
    s = jax.random.normal(ks[0], (16, OBS))
    s_g = jnp.concatenate([s, jnp.ones((16, 1))], -1)
    ap = net.init(ks[1], s[:1])
    pps = [net.init(k, s_g[:1]) for k in ks[2:]]
    lib = policy.ExpertLibrary(net, net, (ap,), tuple(pps), jnp.ones((1, 1)))
    fn = jax.jit(chex.assert_max_traces(lib.kl_budget_alpha_fn(0, s, s_g, 0.3), n=1))
    for pp in pps:
        want = policy.kl_budget_alpha(net.apply(ap, s), net.apply(pp, s_g), 0.3)
        assert float(fn(pp)) == pytest.approx(float(want), abs=1e-6)
        kl = policy.poe_kl_to_actor(net.apply(ap, s), net.apply(pp, s_g), fn(pp))
        assert float(jnp.mean(kl)) <= 0.3 + 1e-5  # feasible
    with pytest.raises(ValueError, match="actor"):
        lib.kl_budget_alpha_fn(1, s, s_g, 0.3)
