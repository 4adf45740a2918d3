"""hexad.policy kernels: scanned IQL updates, composed-action latency, vectorised env steps.

Rows:

- ``policy/iql scan``: updates per second of :func:`hexad.policy.iql` run by
  :func:`hexad.policy.make_train` (``K`` updates in one ``lax.scan``; Q, V and actor each with
  two 256-wide hidden layers, batch 256, HalfCheetah-sized obs 17 / act 6). Peer: a
  straightforward single-file JAX IQL written below (hand-rolled ``jnp`` MLPs, the same losses
  and optax Adam), one jitted update per Python-loop iteration, ``K`` iterations. Goal: ratio
  <= 1.0 (at least the peer's updates/s).
- ``policy/poe action``: latency of the deployed composed action (actor forward + prior forward
  + PoE + tanh) against the frozen actor's own forward pass (+ tanh); and ``policy/poe head``:
  the actor forward + PoE with the prior's Gaussian already given, i.e. the composition's own
  overhead. Goal: under 5% overhead (ratio <= 1.05); met only by the head, not by the whole
  composed action, which runs the prior's network too (about two actor passes).
  ``policy/poe fused``: the composed
  action with the actor and the prior run as one vmapped network over stacked parameters (the
  actor's first layer zero-padded for the goal inputs), so each layer is one batched matmul.
  ``policy/dispatch floor``: a jitted ``obs + 1`` against the actor, i.e. how much of the
  actor's own latency is the fixed cost of calling a jitted function.
- ``policy/sfgpi action``: latency of the SF + GPI baseline's deployed action (Barreto et al.
  2017, arXiv 1606.05312), the library's ``M + 1``
  candidate actions (the prior at ``M = 5`` commanded velocities in one batched forward, plus the
  actor), the successor features ``psi^k(s, c) [K = 6, F = 6]`` of every candidate (one network
  forward on ``B (M + 1)`` state-action pairs) and the argmax over ``max_k psi^k . w``. Peer: the
  frozen actor's forward pass. ``policy/gpi head``: the same with the candidates given (the psi
  forward and the argmax only). No goal is set for a baseline; the row states its cost:
  about ``M + 1`` prior/actor passes plus ``M + 1`` psi passes, so roughly 10x an actor pass where
  compute dominates (batch 256) and near the dispatch floor at batch 1.
- ``policy/pointmaze vec`` and ``policy/antmaze vec``: environment steps per second of
  gymnasium-robotics ``PointMaze_UMaze-v3`` / ``AntMaze_UMaze-v5`` in a ``SyncVectorEnv`` of
  ``n`` envs driven by a jitted actor. Peer: the same ``n`` envs stepped one by one in a Python
  loop (no vector env); both batch the actor call, the vector env adds its own bookkeeping.

Bounds. ``policy/iql scan``: the roofline of its matmul FLOPs. The latency rows at batch 256,
where compute dominates: the roofline of their matmul FLOPs, counted in frozen-actor forward
passes (``2 B (o h + h h + 2 h d)`` each): 2 for the composed actions (actor and prior), 1 for
the PoE head, ``2 (M + 1)`` for SF + GPI (``M + 1`` policy and ``M + 1`` psi passes), ``M + 1``
for the GPI head. (A count of measured actor passes is no lower bound on 2 cores: XLA runs the
actor's and the prior's independent layers concurrently.) The dispatch floor's own bound is
the roofline of its bytes. At batch 1 every latency row is bounded by one jitted dispatch (the
floor row's ``obs + 1``), since no jitted call can return sooner. The environment rows: the
same ``n`` environments stepped with a fixed action and nothing else (no actor, no stacking).

Run: ``python -m kernels policy [--quick]``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from hexad import policy
from kernels._harness import Case

OBS, ACT, HID, BATCH = 17, 6, 256, 256
# The goal for the composed action, and why it is out of reach: the prior is a second
# network of the actor's size that reads the state, so its forward pass cannot be hoisted out
# and the composed action costs about two actor passes where compute dominates. The PoE head
# itself (``policy/poe head``) is the part that can and must meet the bar.
_TWO_NETWORKS = (
    "goal: overhead < 5% (ratio <= 1.05); not reachable: two networks' forwards, "
    "floor ~2x where compute dominates"
)


def _dataset(n: int) -> policy.Batch:
    k = jax.random.split(jax.random.key(0), 4)
    obs = jax.random.normal(k[0], (n, OBS))
    return policy.Batch(
        obs,
        jnp.tanh(jax.random.normal(k[1], (n, ACT))),
        jax.random.normal(k[2], (n,)),
        jax.random.normal(k[3], (n, OBS)),
        jnp.zeros(n),
    )


# --------------------------------------------------------------------------------------------
# The peer: a plain single-file JAX IQL update (what one writes without a library).
# --------------------------------------------------------------------------------------------


def _mlp_init(key, sizes):
    params = []
    for k, (i, o) in zip(
        jax.random.split(key, len(sizes) - 1), zip(sizes[:-1], sizes[1:], strict=True), strict=True
    ):
        params.append((jax.random.normal(k, (i, o)) / np.sqrt(i), jnp.zeros(o)))
    return params


def _mlp(params, x):
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    return x @ w + b


def _peer_init(key):
    k = jax.random.split(key, 4)
    sizes_q = [OBS + ACT, HID, HID, 1]
    q = {"q1": _mlp_init(k[0], sizes_q), "q2": _mlp_init(k[1], sizes_q)}
    v = _mlp_init(k[2], [OBS, HID, HID, 1])
    pi = _mlp_init(k[3], [OBS, HID, HID, 2 * ACT])
    opt = optax.adam(3e-4)
    return {
        "q": q,
        "tq": q,
        "v": v,
        "pi": pi,
        "oq": opt.init(q),
        "ov": opt.init(v),
        "opi": opt.init(pi),
    }


def _peer_update(state, key, data, discount=0.99, tau_e=0.7, temp=3.0, polyak=0.005):
    opt = optax.adam(3e-4)
    idx = jax.random.randint(key, (BATCH,), 0, data.observations.shape[0])
    s, a, r = data.observations[idx], data.actions[idx], data.rewards[idx]
    s2, d = data.next_observations[idx], data.terminals[idx]
    sa = jnp.concatenate([s, a], -1)

    def q_both(q, sa):
        return _mlp(q["q1"], sa)[:, 0], _mlp(q["q2"], sa)[:, 0]

    tq = jnp.minimum(*q_both(state["tq"], sa))

    def v_loss(v):
        u = tq - _mlp(v, s)[:, 0]
        return jnp.mean(jnp.abs(tau_e - (u < 0)) * u**2)

    gv = jax.grad(v_loss)(state["v"])
    up, ov = opt.update(gv, state["ov"])
    v = optax.apply_updates(state["v"], up)
    w = jnp.minimum(jnp.exp(temp * (tq - _mlp(v, s)[:, 0])), 100.0)

    def pi_loss(pi):
        out = _mlp(pi, s)
        mu, log_std = out[:, :ACT], jnp.clip(out[:, ACT:], -5.0, 2.0)
        u = jnp.arctanh(jnp.clip(a, -1 + 1e-6, 1 - 1e-6))
        logp = jnp.sum(-0.5 * ((u - mu) / jnp.exp(log_std)) ** 2 - log_std, -1)
        return -jnp.mean(w * logp)

    gpi = jax.grad(pi_loss)(state["pi"])
    up, opi = opt.update(gpi, state["opi"])
    pi = optax.apply_updates(state["pi"], up)
    y = r + discount * (1 - d) * _mlp(v, s2)[:, 0]

    def q_loss(q):
        q1, q2 = q_both(q, sa)
        return jnp.mean((q1 - y) ** 2 + (q2 - y) ** 2)

    gq = jax.grad(q_loss)(state["q"])
    up, oq = opt.update(gq, state["oq"])
    q = optax.apply_updates(state["q"], up)
    tq_new = jax.tree.map(lambda t, o: (1 - polyak) * t + polyak * o, state["tq"], q)
    return {"q": q, "tq": tq_new, "v": v, "pi": pi, "oq": oq, "ov": ov, "opi": opi}


_peer_update_jit = jax.jit(_peer_update)


def _peer_loop(k_steps: int, state, keys, data):
    for i in range(k_steps):
        state = _peer_update_jit(state, keys[i], data)
    return state


# --------------------------------------------------------------------------------------------
# Ours
# --------------------------------------------------------------------------------------------


def _actor_flops(batch: int) -> float:
    """Matmul FLOPs of one actor forward pass (two hidden layers, mean and log-std heads)."""
    return 2.0 * batch * (OBS * HID + HID * HID + HID * 2 * ACT)


def _dispatch(obs):
    return obs + 1.0


def _latency_bound(obs, work: float) -> dict:
    """A latency row's bound: one jitted dispatch at batch 1, else the roofline of ``work``
    actor passes."""
    if obs.shape[0] == 1:
        return dict(bound_fn=_dispatch, bound_args=(obs,), bound_note="one jitted dispatch")
    flops = work * _actor_flops(obs.shape[0])
    return dict(flops=flops, bound_note=f"roofline of {work:g} actor passes")


def _iql_case(quick: bool) -> Case:
    k_steps = 50 if quick else 200
    data = _dataset(10_000)
    algo = policy.iql(
        policy.GaussianActor(ACT, (HID, HID)),
        policy.TwinCritic((HID, HID)),
        policy.ValueNet((HID, HID)),
        optax.adam(3e-4),
        optax.adam(3e-4),
        optax.adam(3e-4),
    )
    state = algo.init(jax.random.key(1), data)
    train = policy.make_train(algo, k_steps, BATCH)
    peer_state = _peer_init(jax.random.key(1))
    keys = list(jax.random.split(jax.random.key(2), k_steps))
    jax.block_until_ready(_peer_update_jit(peer_state, keys[0], data))  # compile outside timing
    # matmul FLOPs per update: forward + backward ~ 3x forward, for 2 Q + V + actor forwards
    # plus the extra forwards (target Q, V at s and s').
    fwd = 2 * BATCH * (OBS * HID + HID * HID + HID)
    flops = k_steps * 3.0 * fwd * 6
    return Case(
        name=f"policy/iql scan K={k_steps}",
        fn=lambda key, st, d: train(key, st, d)[0],
        args=(jax.random.key(2), state, data),
        shapes=f"obs{OBS} act{ACT} hid{HID}x2 batch{BATCH}",
        items=float(k_steps),
        unit="updates",
        flops=flops,
        peer=functools.partial(_peer_loop, k_steps),
        peer_args=(peer_state, keys, data),
        peer_name="single-file JAX IQL, jitted step in a loop",
        peer_jit=False,
        goal="ratio <= 1.0 (peer ~280 updates/s on 2 cores)",
        repeats=5,
        warmup=1,
    )


def _latency_cases(batch: int) -> list[Case]:
    actor = policy.GaussianActor(ACT, (HID, HID))
    prior = policy.GaussianActor(ACT, (HID, HID))
    obs = jax.random.normal(jax.random.key(3), (batch, OBS))
    goal_obs = jax.random.normal(jax.random.key(4), (batch, OBS + 2))
    ap = actor.init(jax.random.key(5), obs)
    pp = prior.init(jax.random.key(6), goal_obs)
    given = prior.apply(pp, goal_obs)

    def own(ap, obs):
        return policy.squash(actor.apply(ap, obs))

    def composed(ap, pp, obs, goal_obs, alpha):
        return policy.squash(policy.poe(actor.apply(ap, obs), prior.apply(pp, goal_obs), alpha))

    def head(ap, obs, prior_mean, prior_std, alpha):
        return policy.squash(
            policy.poe(actor.apply(ap, obs), policy.DiagGaussian(prior_mean, prior_std), alpha)
        )

    # Fused: the prior sees (obs, goal), the actor obs only. Zero-pad the actor's first-layer
    # kernel with rows for the goal inputs, stack both parameter trees and run the two networks
    # as one vmapped network (one batched matmul per layer instead of two matmuls).
    def pad_actor(p):
        p = jax.tree.map(lambda x: x, p)
        k = p["params"]["Dense_0"]["kernel"]
        p["params"]["Dense_0"]["kernel"] = jnp.concatenate([k, jnp.zeros((2, k.shape[1]))], 0)
        return p

    stacked = jax.tree.map(lambda a, b: jnp.stack([a, b]), pad_actor(ap), pp)

    def fused(stacked, goal_obs, alpha):
        both = jax.vmap(prior.apply, in_axes=(0, None))(stacked, goal_obs)
        a = jax.tree.map(lambda x: x[0], both)
        p = jax.tree.map(lambda x: x[1], both)
        return policy.squash(policy.poe(a, p, alpha))

    alpha = jnp.float32(0.5)
    common = dict(unit="actions", items=float(batch), peer=own, peer_args=(ap, obs))

    return [
        Case(
            name=f"policy/poe fused b={batch}",
            fn=fused,
            args=(stacked, goal_obs, alpha),
            shapes=f"[{batch},{OBS}+2] hid{HID}x2 x2 stacked",
            peer_name="frozen actor forward",
            goal=_TWO_NETWORKS,
            repeats=50,
            **common,
            **_latency_bound(obs, 2),
        ),
        Case(
            name=f"policy/dispatch floor b={batch}",
            fn=_dispatch,
            args=(obs,),
            shapes=f"[{batch},{OBS}]",
            peer_name="frozen actor forward",
            goal="none: the share of the actor's latency that is jit dispatch",
            repeats=50,
            bytes=2.0 * obs.size * obs.dtype.itemsize,
            bound_note="roofline of reading and writing obs",
            **common,
        ),
        Case(
            name=f"policy/poe action b={batch}",
            fn=composed,
            args=(ap, pp, obs, goal_obs, alpha),
            shapes=f"[{batch},{OBS}] hid{HID}x2",
            peer_name="frozen actor forward",
            goal=_TWO_NETWORKS,
            repeats=50,
            **common,
            **_latency_bound(obs, 2),
        ),
        Case(
            name=f"policy/poe head b={batch}",
            fn=head,
            args=(ap, obs, given.mean, given.std, alpha),
            shapes=f"[{batch},{OBS}] hid{HID}x2",
            peer_name="frozen actor forward",
            goal="overhead < 5% (ratio <= 1.05)",
            repeats=50,
            **common,
            **_latency_bound(obs, 1),
        ),
    ]


def _sfgpi_cases(batch: int, n_cmd: int = 5) -> list[Case]:
    actor = policy.GaussianActor(ACT, (HID, HID))
    prior = policy.GaussianActor(ACT, (HID, HID))
    n_lib = n_cmd + 1
    sf_net = policy.SuccessorFeatures(n_lib, n_cmd + 1, (HID, HID))
    obs = jax.random.normal(jax.random.key(7), (batch, OBS))
    ap = actor.init(jax.random.key(8), obs)
    pp = prior.init(jax.random.key(9), jnp.zeros((1, OBS + 1)))
    sp = sf_net.init(jax.random.key(10), obs, jnp.zeros((batch, ACT)))
    cmds = jnp.linspace(-1.0, 1.0, n_cmd)
    w = jax.random.normal(jax.random.key(11), (n_cmd + 1,))

    def library(ap, pp, obs):  # [B, M + 1, d]: the prior at each command, then the actor
        return policy.ExpertLibrary(actor, prior, (ap,), (pp,), cmds[:, None]).actions(obs)

    def action(ap, pp, sp, obs, w):
        psi_fn = lambda s_, a_: sf_net.apply(sp, s_, a_)
        return policy.gpi(psi_fn, obs, library(ap, pp, obs), w)[0]

    def head(sp, obs, cands, w):
        psi_fn = lambda s_, a_: sf_net.apply(sp, s_, a_)
        return policy.gpi(psi_fn, obs, cands, w)[0]

    def own(ap, obs):
        return policy.squash(actor.apply(ap, obs))

    cands = jax.jit(library)(ap, pp, obs)
    goal = (
        "none (a baseline): ~M+1 policy passes + M+1 psi passes (M=5), "
        "~10x the actor where compute dominates"
    )
    common = dict(
        unit="actions",
        items=float(batch),
        peer=own,
        peer_args=(ap, obs),
        peer_name="frozen actor forward",
        goal=goal,
        repeats=50,
    )
    return [
        Case(
            name=f"policy/sfgpi action b={batch}",
            fn=action,
            args=(ap, pp, sp, obs, w),
            shapes=f"[{batch},{OBS}] hid{HID}x2 K={n_lib} C={n_lib} F={n_cmd + 1}",
            **common,
            **_latency_bound(obs, 2 * n_lib),
        ),
        Case(
            name=f"policy/gpi head b={batch}",
            fn=head,
            args=(sp, obs, cands, w),
            shapes=f"[{batch},{n_lib},{ACT}] candidates K={n_lib} F={n_cmd + 1}",
            **common,
            **_latency_bound(obs, n_lib),
        ),
    ]


def features(obs: dict) -> np.ndarray:
    """A goal-conditioned actor's input from a maze observation dict (batched)."""
    return np.concatenate([obs["observation"], obs["desired_goal"], obs["achieved_goal"]], -1)


def _env_case(quick: bool, env_id: str = "PointMaze_UMaze-v3", label: str = "pointmaze") -> Case:
    import gymnasium as gym
    import gymnasium_robotics

    gym.register_envs(gymnasium_robotics)
    n, steps = (8, 50) if quick else (16, 200)
    venv = gym.make_vec(env_id, num_envs=n, vectorization_mode="sync")
    envs = [gym.make(env_id) for _ in range(n)]
    first, _ = venv.reset(seed=0)
    for i, e in enumerate(envs):
        e.reset(seed=i)
    act_dim = venv.single_action_space.shape[0]
    actor = policy.GaussianActor(act_dim, (HID, HID))
    ap = actor.init(jax.random.key(0), jnp.asarray(features(first), jnp.float32))
    act_fn = jax.jit(lambda p, o: policy.squash(actor.apply(p, o)))

    def vec_rollout():
        obs, _ = venv.reset(seed=0)
        for _ in range(steps):
            a = np.asarray(act_fn(ap, features(obs)))
            obs, *_ = venv.step(a)
        return obs["observation"]

    def loop_rollout():
        obs = [e.reset(seed=i)[0] for i, e in enumerate(envs)]
        for _ in range(steps):
            stacked = {k: np.stack([o[k] for o in obs]) for k in obs[0]}
            a = np.asarray(act_fn(ap, features(stacked)))
            obs = [e.step(a[i])[0] for i, e in enumerate(envs)]
        return obs[0]["observation"]

    fixed = np.zeros(act_dim, np.float32)

    def envs_alone():
        for i, e in enumerate(envs):
            e.reset(seed=i)
        for _ in range(steps):
            for e in envs:
                e.step(fixed)

    return Case(
        name=f"policy/{label} vec n={n}",
        fn=vec_rollout,
        jit=False,
        shapes=f"{n} envs x {steps} steps",
        dtype="float64",
        items=float(n * steps),
        unit="env-steps",
        peer=loop_rollout,
        peer_name="same envs stepped in a Python loop",
        peer_jit=False,
        goal="throughput (no goal)",
        repeats=5,
        warmup=1,
        bound_fn=envs_alone,
        bound_args=(),
        bound_jit=False,
        bound_note="the environments alone, a fixed action, no actor",
    )


def cases(quick: bool) -> list[Case]:
    return [
        _iql_case(quick),
        *_latency_cases(1),
        *_latency_cases(256),
        *_sfgpi_cases(1),
        *_sfgpi_cases(256),
        _env_case(quick),
        _env_case(quick, "AntMaze_UMaze-v5", "antmaze"),
    ]
