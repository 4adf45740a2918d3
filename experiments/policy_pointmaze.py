"""PoE / KL composition of frozen offline actors with goal-conditioned priors on PointMaze.

The diagnostic of issue 6 at our scale. A scripted noisy oracle generates a PointMaze-UMaze data
set (gymnasium-robotics, cached npz with D4RL names). Offline, IQL trains a *competent* actor
for the data's task (sparse reward at the task goal (-1, -1), the end of the U) and an
*incompetent* one (the same IQL stopped after ``incompetent_steps`` updates); goal-conditioned
BC trains a *good* prior on (observation, commanded goal). The *degraded* prior is the good one
with parameter noise (``degrade_scale`` times each weight tensor's std); the *random* prior is
an untrained network. At deployment the objective shifts: each episode starts at the far end of
the U and must reach a new goal drawn uniformly within ``goal_shift`` of the task goal (free
space only). All methods act deterministically (tanh of the composed pre-tanh mean):

- actor: the frozen actor (alpha = 0);
- PoE over the alpha sweep ``alphas`` (alpha = 1 is the prior alone, "prior-only");
- PoE at the global KL-budget alpha (largest alpha with mean KL(pi_alpha || pi_actor) <=
  ``kl_budget`` over ``n_kl_states`` data states paired with deployment goals), and with the
  per-state KL-budget alpha;
- oracle alpha: the sweep's alpha with the best mean return (chosen on the evaluation
  episodes themselves, so an upper reference, not a method);
- additive: ``(1 - alpha) mu_actor + alpha mu_prior`` at the KL-budget alpha and at its own
  best sweep alpha;
- IQL-guided steering (no prior): the frozen actor's action moved by ``guide_steps`` steps of
  gradient ascent on a goal-conditioned IQL critic (trained offline on the same data, reward 1
  on reaching the commanded goal), within a trust region swept over ``guide_shifts``; the best
  shift is reported (swept like the oracle alpha, so also an upper reference);
- CQL-guided steering: the same, with a goal-conditioned CQL critic (``guide_cql_steps``
  updates, ``guide_action_samples`` samples per log-sum-exp) on the same relabelled data;
- SF + GPI (Barreto et al. 2017, arXiv 1606.05312), per prior quality: the library is the
  prior commanded with each of the J free-cell centres of the maze (fixed goals, not the
  deployment ones) plus the frozen actor. Features ``phi(s') = [exp(-|xy(s') - c_j|)]_j, 1``;
  the successor features of all 3 J + 2 library policies (every prior and both actors) are
  learned by TD on the task data (``sf_steps`` updates, ``sf_discount``); the task weights of
  a deployment goal g come from least squares (ridge ``sf_ridge``) of its dense reward
  ``exp(-|xy(s') - g|)`` on phi over ``n_kl_states`` data transitions; the action is
  ``argmax`` over the J + 1 library actions at s of ``max_k psi^k(s, a) . w(g)``.

Success: final distance to the goal <= 0.45; return: sum over steps of exp(-distance)
(gymnasium-robotics' dense reward). Every method sees the same goals and start seeds. The
diagnostic is ``run_maze(cfg, ctx, maze)`` on a :class:`Maze` (data, geometry, evaluator,
scripted oracle); ``experiments.policy_antmaze`` runs it on AntMaze.

Command:  python -m experiments.policy_pointmaze [--quick] [--out DIR] [--seed N] [--set k=v]
          The trained actors, priors and guide critic are checkpointed through hexad.cachex in
          ``--ckpt`` (default ``checkpoints/policy_pointmaze/<run>/``); ``--resume`` restores
          them and re-runs only the evaluation. The data set is cached (hexad.data.offline_rl).
Runtime:  --quick (20k transitions, 64-wide networks, 2000 updates each for IQL, the
          goal-conditioned BC prior, the IQL and CQL guide critics and the successor
          features, 3 episodes per method): 77 s of CPU (user+sys), 1.8 min wall on a shared
          2-core machine (load ~6, session 4). On an empty cache (the scripted data set takes
          seconds to generate): about 1.6 min wall on 2 idle CPU cores.
          Full (100k transitions, 256-wide networks, 10000 updates for IQL, the prior and the
          IQL guide, 5000 for the CQL guide and the successor features, 10 episodes per
          method, 124 methods): 773 s of CPU (user+sys), 19.9 min wall at load ~6, peak
          memory 1.7 GB (session 4; 883 s, 29.5 min at load ~9 in session 3, same summary).
          ``--seed 1`` / ``--seed 2``: 13.0 / 7.9 min wall at load ~3 / ~1 (session 5).

Seeds 0, 1, 2 (full; mean +- sd of the return over seeds; session 5): competent actor 95.3 +-
9.8 (success 0.0 / 0.6 / 0.2); with the good prior the KL-budget alpha is 0.86 / 0.81 / 0.87
and returns 123.8 +- 2.5 against the oracle alpha (1.0 in every seed) 129.3 +- 2.6; degraded
prior: alpha 0.00 / 0.60 / 0.00, 92.1 +- 14.2 (oracle 112.3 +- 12.8, prior-only 98.0 +- 5.3);
random prior: alpha 0.69 / 0.02 / 0.56, 83.8 +- 23.3 (prior-only 41.0 +- 34.2, additive at
the same alpha 86.4 +- 12.0). CQL-guided 106.2 +- 5.7 (incompetent actor: 121.4 +- 13.8, the
best row for that actor). Scripted oracle 203.1 +- 1.9.

summary.json keys (Q in good / degraded / random; every key also exists with the prefix
``incompetent_`` for the incompetent actor):
``actor_success``, ``actor_return``; ``iql_guided_success``, ``iql_guided_return``,
``iql_guided_shift``, ``iql_guided_return_curve`` (over ``guide_shifts``);
``poe_kl_budget_success_Q``, ``poe_kl_budget_return_Q``, ``poe_kl_budget_alpha_Q``;
``poe_kl_state_success_Q``, ``poe_kl_state_return_Q``;
``oracle_success_Q``, ``oracle_return_Q``, ``oracle_alpha_Q``; ``additive_success_Q``,
``additive_return_Q`` (at the KL-budget alpha); ``additive_oracle_success_Q``,
``additive_oracle_return_Q``, ``additive_oracle_alpha_Q``; ``prior_only_success_Q``,
``prior_only_return_Q``; ``poe_return_curve_Q``, ``additive_return_curve_Q``,
``poe_success_curve_Q`` (lists over ``alphas``); ``sfgpi_success_Q``, ``sfgpi_return_Q``;
``cql_guided_success``, ``cql_guided_return``, ``cql_guided_shift``,
``cql_guided_return_curve``; and once: ``alphas``, ``sf_final_loss`` (last TD loss),
``sf_reward_fit_r2`` (mean R^2 of the deployment rewards' least-squares fit on phi),
``sf_library_size`` (J + 1 members per GPI), ``return_se``, ``success_se`` (evaluation
noise: the standard error of a method's mean over its episodes, averaged over all method
rows; null with one episode),
``scripted_oracle_success``, ``scripted_oracle_return`` (the data's oracle on the same goals),
``dataset_reward_frac``, ``iql_final_critic_loss``, ``prior_final_nll``, ``runtime_s``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments import _runner
from hexad import cachex
from hexad import policy as P
from hexad.data import offline_rl as D

PRIORS = ("good", "degraded", "random")
ACTORS = ("", "incompetent_")
POE, ADDITIVE, KL_STATE, GUIDED, CQL_GUIDED, SFGPI = 0, 1, 2, 3, 4, 5


@dataclasses.dataclass(frozen=True)
class Config:
    n_transitions: int = 100_000
    noise_std: float = 0.3
    hidden: int = 256
    iql_steps: int = 10_000
    incompetent_steps: int = 100
    train_chunk: int = 100
    bc_steps: int = 10_000
    batch_size: int = 256
    lr: float = 3e-4
    expectile: float = 0.9
    temperature: float = 10.0
    alphas: tuple[float, ...] = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
    kl_budget: float = 1.0
    n_kl_states: int = 2048
    degrade_scale: float = 1.0
    goal_shift: float = 1.0
    n_episodes: int = 10
    episode_steps: int = 300
    n_envs: int = 48
    guide_iql_steps: int = 10_000
    guide_steps: int = 10
    guide_step_size: float = 1.0
    guide_shifts: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0)
    guide_cql_steps: int = 5000
    guide_action_samples: int = 4
    sf_steps: int = 5000
    sf_batch_size: int = 128
    sf_discount: float = 0.99
    sf_ridge: float = 1e-4

    def __post_init__(self):
        _runner.at_least(self, 1, "n_transitions", "hidden", "iql_steps", "incompetent_steps")
        _runner.at_least(self, 1, "train_chunk", "bc_steps", "batch_size", "n_kl_states")
        _runner.at_least(self, 1, "n_episodes", "episode_steps", "n_envs", "guide_iql_steps")
        _runner.at_least(self, 1, "guide_cql_steps", "guide_action_samples", "sf_steps")
        _runner.at_least(self, 1, "sf_batch_size")
        _runner.at_least(self, 0, "noise_std", "kl_budget", "degrade_scale", "goal_shift")
        _runner.at_least(self, 0, "temperature", "guide_steps", "guide_shifts", "sf_ridge")
        _runner.positive(self, "lr", "guide_step_size")
        _runner.in_unit(self, "expectile", lo_open=True, hi_open=True)
        _runner.in_unit(self, "alphas")
        _runner.in_unit(self, "sf_discount", hi_open=True)
        _runner.require(
            self.incompetent_steps % self.train_chunk == 0
            and self.incompetent_steps <= self.iql_steps,
            ("incompetent_steps", "train_chunk", "iql_steps"),
            f"incompetent_steps must be a multiple of train_chunk={self.train_chunk} in "
            f"(0, iql_steps={self.iql_steps}], got {self.incompetent_steps}",
        )


def _train(ctx, algo, data, n_steps, key, desc, batch_size, chunk, snapshot_at=0):
    """Trains in jitted chunks of ``chunk`` updates; also returns the state at ``snapshot_at``."""
    state = algo.init(key, data)
    train = jax.jit(P.make_train(algo, min(chunk, n_steps), batch_size))
    infos, snapshot = None, None
    for i in ctx.progress(range(max(n_steps // chunk, 1)), desc=desc):
        state, infos = train(jax.random.fold_in(key, i), state, data)
        ctx.log(stage=desc, chunk=i, **{k: float(v[-1]) for k, v in infos._asdict().items()})
        if (i + 1) * chunk == snapshot_at:
            snapshot = state
    return state, infos, snapshot


def anchor_goals(geom: D.MazeGeometry) -> np.ndarray:
    """``[J, 2]`` the centres of the maze's free cells: the SF library's fixed goals."""
    return np.stack([geom.cell_center(rc) for rc in geom.free]).astype(np.float32)


def sf_features(next_obs, anchors):
    """``[N, J + 1]`` phi(s'): ``exp(-|xy(s') - c_j|)`` per anchor ``c_j``, and a constant 1."""
    d = jnp.linalg.norm(next_obs[:, None, :2] - anchors[None], axis=-1)
    return jnp.concatenate([jnp.exp(-d), jnp.ones((next_obs.shape[0], 1), d.dtype)], -1)


def library_actions(actor_net, prior_net, actor_params, prior_params, anchors, obs):
    """``[B, K, 2]`` deterministic actions of the SF library at ``obs [B, o]``.

    Members, in order: each prior (good, degraded, random) commanded with each anchor goal
    (``K_p = J`` per prior), then each frozen actor (competent, incompetent).
    """
    b, j = obs.shape[0], anchors.shape[0]
    og = jnp.concatenate(
        [
            jnp.broadcast_to(obs[:, None, :], (b, j, obs.shape[-1])),
            jnp.broadcast_to(anchors[None], (b, j, 2)),
        ],
        -1,
    )
    acts = [jnp.tanh(prior_net.apply(pp, og).mean) for pp in prior_params]  # [B, J, 2] each
    acts += [jnp.tanh(actor_net.apply(ap, obs).mean)[:, None, :] for ap in actor_params]
    return jnp.concatenate(acts, axis=1)


def _train_all(ctx, cfg, data, gdata, actor_net, prior_net, hid, keys, anchors):
    if cfg.incompetent_steps % cfg.train_chunk or not 0 < cfg.incompetent_steps <= cfg.iql_steps:
        raise ValueError(
            f"incompetent_steps: expected a multiple of train_chunk={cfg.train_chunk} in "
            f"(0, iql_steps={cfg.iql_steps}], got {cfg.incompetent_steps}"
        )
    opt = optax.adam(cfg.lr)
    iql = P.iql(
        actor_net,
        P.TwinCritic(hid),
        P.ValueNet(hid),
        opt,
        opt,
        opt,
        expectile=cfg.expectile,
        temperature=cfg.temperature,
    )
    bs, ch = cfg.batch_size, cfg.train_chunk
    # The incompetent actor is the same IQL run, snapshotted after incompetent_steps updates.
    iql_state, iql_info, weak = _train(
        ctx, iql, data, cfg.iql_steps, keys[0], "iql", bs, ch, cfg.incompetent_steps
    )
    bc = P.bc(prior_net, optax.adam(cfg.lr))
    prior_state, prior_info, _ = _train(ctx, bc, gdata, cfg.bc_steps, keys[1], "gcbc", bs, ch)
    priors = (
        prior_state.params,
        P.degrade_params(keys[2], prior_state.params, cfg.degrade_scale),
        prior_net.init(keys[3], gdata.observations[:1]),
    )
    # The guide: a goal-conditioned IQL critic, reward 1 (and terminal) on reaching the goal.
    o_dim = data.observations.shape[1]
    goal_of = gdata.observations[:, o_dim:]
    reached = jnp.linalg.norm(gdata.next_observations[:, :2] - goal_of, axis=-1) <= 0.5
    reached = reached.astype(jnp.float32)
    gc_data = gdata._replace(
        next_observations=jnp.concatenate([gdata.next_observations, goal_of], -1),
        rewards=reached,
        terminals=reached,
    )
    guide, _, _ = _train(ctx, iql, gc_data, cfg.guide_iql_steps, keys[4], "gc_iql", bs, ch)
    # The CQL-guided baseline: a goal-conditioned CQL critic on the same relabelled data.
    cql = P.cql(prior_net, P.TwinCritic(hid), opt, opt, n_action_samples=cfg.guide_action_samples)
    cql_guide, _, _ = _train(ctx, cql, gc_data, cfg.guide_cql_steps, keys[5], "gc_cql", bs, ch)
    # SF + GPI: successor features of the whole library, learned by TD on the task data.
    actors = (iql_state.actor_params, weak.actor_params)
    sf_net = P.SuccessorFeatures(
        len(PRIORS) * anchors.shape[0] + len(ACTORS), anchors.shape[0] + 1, hid
    )
    sf = P.sf_td(
        sf_net,
        opt,
        lambda s: library_actions(actor_net, prior_net, actors, priors, anchors, s),
        discount=cfg.sf_discount,
    )
    sf_data = P.SFBatch(
        data.observations,
        data.actions,
        sf_features(data.next_observations, anchors),
        data.next_observations,
        data.terminals,
    )
    sf_state, sf_info, _ = _train(
        ctx, sf, sf_data, cfg.sf_steps, keys[6], "sf", cfg.sf_batch_size, ch
    )
    diag = jnp.stack([iql_info.critic_loss[-1], prior_info.loss[-1], sf_info.loss[-1]])
    return {
        "actors": actors,
        "priors": priors,
        "guide": guide.critic_params,
        "cql_guide": cql_guide.critic_params,
        "sf": sf_state.params,
        "diag": diag,
    }


@dataclasses.dataclass(frozen=True)
class Maze:
    """What the diagnostic needs from a maze: its data, geometry, evaluator and scripted oracle.

    ``evaluate`` has :func:`hexad.data.offline_rl.evaluate_pointmaze`'s signature;
    ``oracle(obs, goal) -> actions`` is the data's noiseless scripted oracle (the reference
    row); goals are drawn at least ``goal_margin`` from every wall.
    """

    raw: dict
    geom: D.MazeGeometry
    evaluate: Callable
    oracle: Callable
    goal_margin: float


def pointmaze(cfg: Config, ctx: _runner.Context) -> Maze:
    raw = D.pointmaze_dataset(cfg.n_transitions, seed=ctx.seed, noise_std=cfg.noise_std)
    geom = D.MazeGeometry()
    return Maze(raw, geom, D.evaluate_pointmaze, partial(D.pointmaze_oracle, geom), 0.2)


def run(cfg: Config, ctx: _runner.Context) -> dict:
    return run_maze(cfg, ctx, pointmaze(cfg, ctx))


def run_maze(cfg: Config, ctx: _runner.Context, maze: Maze) -> dict:
    """The whole diagnostic (module docstring) on ``maze``; returns the summary."""
    raw = maze.raw
    data = P.batch_from_dataset(raw)
    goals_data = jnp.asarray(raw["infos/goal"], jnp.float32)
    keys = jax.random.split(ctx.key(), 8)
    hid = (cfg.hidden, cfg.hidden)
    act_dim = data.actions.shape[1]
    actor_net, prior_net = P.GaussianActor(act_dim, hid), P.GaussianActor(act_dim, hid)
    critic_net = P.TwinCritic(hid)
    anchors = jnp.asarray(anchor_goals(maze.geom))
    n_anchor = anchors.shape[0]
    sf_net = P.SuccessorFeatures(len(PRIORS) * n_anchor + len(ACTORS), n_anchor + 1, hid)

    gdata = data._replace(observations=jnp.concatenate([data.observations, goals_data], -1))
    # Frozen actors and priors checkpoint through hexad.cachex; --resume skips the training.
    init = {
        "actors": (actor_net.init(keys[0], data.observations[:1]),) * 2,
        "priors": (prior_net.init(keys[1], gdata.observations[:1]),) * 3,
        "guide": critic_net.init(keys[4], gdata.observations[:1], data.actions[:1]),
        "cql_guide": critic_net.init(keys[5], gdata.observations[:1], data.actions[:1]),
        "sf": sf_net.init(keys[6], data.observations[:1], data.actions[:1]),
        "diag": jnp.zeros(3),
    }
    mngr = cachex.CacheXManager(ctx.checkpoint_dir)
    try:
        start, frozen = cachex.resume(mngr, init, ctx.resume)
        if start == 0:
            frozen = _train_all(ctx, cfg, data, gdata, actor_net, prior_net, hid, keys, anchors)
            mngr.save(0, frozen)
            mngr.wait_until_finished()
    finally:
        mngr.close()
    actor_params, prior_params, guide = frozen["actors"], frozen["priors"], frozen["guide"]
    cql_guide, sf_params = frozen["cql_guide"], frozen["sf"]

    rng = np.random.default_rng(ctx.seed)
    task_goal = raw["task_goal"]
    ep_goals = D.sample_free_goals(
        rng, task_goal, cfg.goal_shift, cfg.n_episodes, maze.goal_margin, maze.geom
    )

    # Global KL-budget alpha per (actor, prior): data states paired with deployment goals.
    idx = rng.choice(data.observations.shape[0], cfg.n_kl_states, replace=False)
    s = data.observations[idx]
    g = jnp.asarray(ep_goals[rng.integers(0, cfg.n_episodes, cfg.n_kl_states)], jnp.float32)
    select = jax.jit(
        lambda ap, pp: P.kl_budget_alpha(
            actor_net.apply(ap, s), prior_net.apply(pp, jnp.concatenate([s, g], -1)), cfg.kl_budget
        )
    )
    kl_alpha = {
        (ai, pi): float(select(ap, pp))
        for ai, ap in enumerate(actor_params)
        for pi, pp in enumerate(prior_params)
    }

    # SF task weights of a goal g: least squares of exp(-|xy(s') - g|) on phi(s') over
    # n_kl_states data transitions, w(g) = M r_g with M = (Phi^T Phi + ridge n I)^-1 Phi^T.
    phi_ls = sf_features(data.next_observations[idx], anchors)  # [n, F]
    n_ls, n_f = phi_ls.shape
    ls_map = jnp.linalg.solve(
        phi_ls.T @ phi_ls + cfg.sf_ridge * n_ls * jnp.eye(n_f), phi_ls.T
    )  # [F, n]
    xy_ls = data.next_observations[idx, :2]

    def goal_rewards(goal):  # [B, 2] -> [B, n]
        return jnp.exp(-jnp.linalg.norm(xy_ls[None] - goal[:, None], axis=-1))

    r_eval = goal_rewards(jnp.asarray(ep_goals, jnp.float32))  # [n_episodes, n]
    fit = r_eval @ ls_map.T @ phi_ls.T
    ls_r2 = 1.0 - jnp.sum(jnp.square(r_eval - fit), 1) / jnp.sum(
        jnp.square(r_eval - r_eval.mean(1, keepdims=True)), 1
    )
    psi_fn = lambda s_, a_: sf_net.apply(sf_params, s_, a_)  # noqa: E731
    n_lib = len(PRIORS) * n_anchor + len(ACTORS)

    @jax.jit
    def composed(obs, goal, spec):
        a_id, p_id, mode, alpha = (
            spec[:, 0].astype(int),
            spec[:, 1].astype(int),
            spec[:, 2].astype(int),
            spec[:, 3],
        )
        a_all = [actor_net.apply(p, obs) for p in actor_params]
        p_all = [prior_net.apply(p, jnp.concatenate([obs, goal], -1)) for p in prior_params]
        pick = lambda ds, i: jax.tree.map(  # noqa: E731
            lambda *xs: jnp.take_along_axis(jnp.stack(xs), i[None, :, None], 0)[0], *ds
        )
        a, p = pick(a_all, a_id), pick(p_all, p_id)
        alpha = jnp.where(mode == KL_STATE, P.kl_budget_alpha_per_state(a, p, cfg.kl_budget), alpha)
        mean = jnp.where(
            (mode == ADDITIVE)[:, None], P.additive(a, p, alpha).mean, P.poe(a, p, alpha).mean
        )
        gobs = jnp.concatenate([obs, goal], -1)
        shift = jnp.where((mode == GUIDED) | (mode == CQL_GUIDED), alpha, 1.0)
        steered = []
        for params in (guide, cql_guide):
            q_fn = lambda s_, a_, p_=params: jnp.minimum(*critic_net.apply(p_, s_, a_))  # noqa: E731
            steered.append(
                P.q_steer(q_fn, gobs, a.mean, cfg.guide_step_size, cfg.guide_steps, shift)
            )
        # GPI over one prior's anchor policies and one actor, with w(goal) per row.
        lib = library_actions(actor_net, prior_net, actor_params, prior_params, anchors, obs)
        w = goal_rewards(goal) @ ls_map.T  # [B, F]
        gpi_act = jnp.zeros_like(mean)
        for ai in range(len(ACTORS)):
            for pi in range(len(PRIORS)):
                members = np.zeros(n_lib, bool)
                members[pi * n_anchor : (pi + 1) * n_anchor] = True
                members[len(PRIORS) * n_anchor + ai] = True
                act_k, _ = P.gpi(psi_fn, obs, lib[:, members], w, policy_mask=members)
                hit = (a_id == ai) & (p_id == pi)
                gpi_act = jnp.where(hit[:, None], act_k, gpi_act)
        out = jnp.tanh(mean)
        out = jnp.where((mode == GUIDED)[:, None], steered[0], out)
        out = jnp.where((mode == CQL_GUIDED)[:, None], steered[1], out)
        return jnp.where((mode == SFGPI)[:, None], gpi_act, out)

    methods = []  # (actor id, prior id, mode, alpha)
    for ai in range(len(ACTORS)):
        methods += [(ai, 0, GUIDED, sh) for sh in cfg.guide_shifts]
        methods += [(ai, 0, CQL_GUIDED, sh) for sh in cfg.guide_shifts]
        for pi in range(len(PRIORS)):
            methods.append((ai, pi, SFGPI, 0.0))
            methods += [(ai, pi, POE, a) for a in cfg.alphas]
            methods += [(ai, pi, ADDITIVE, a) for a in cfg.alphas]
            methods += [
                (ai, pi, POE, kl_alpha[ai, pi]),
                (ai, pi, ADDITIVE, kl_alpha[ai, pi]),
                (ai, pi, KL_STATE, 0.0),
            ]
    specs = np.repeat(np.asarray(methods, np.float32), cfg.n_episodes, axis=0)
    ep = np.tile(np.arange(cfg.n_episodes), len(methods))
    policy = lambda o, gl, sp: composed(  # noqa: E731
        jnp.asarray(o, jnp.float32), jnp.asarray(gl, jnp.float32), jnp.asarray(sp)
    )
    res = maze.evaluate(
        policy,
        ep_goals[ep],
        specs,
        1000 * ctx.seed + ep,
        min(cfg.n_envs, len(ep)),
        cfg.episode_steps,
        progress=ctx.progress,
    )
    ref = maze.evaluate(
        lambda o, gl, sp: maze.oracle(o, gl),
        ep_goals,
        np.zeros((cfg.n_episodes, 1)),
        1000 * ctx.seed + np.arange(cfg.n_episodes),
        min(cfg.n_envs, cfg.n_episodes),
        cfg.episode_steps,
    )

    def stat(key, m):
        rows = np.all(np.isclose(specs, np.asarray(m, np.float32)[None]), axis=1)
        return float(np.mean(res[key][rows]))

    out = {
        "alphas": list(cfg.alphas),
        "kl_budget": cfg.kl_budget,
        "scripted_oracle_success": float(ref["success"].mean()),
        "scripted_oracle_return": float(ref["return"].mean()),
        "dataset_reward_frac": float(raw["rewards"].mean()),
        "iql_final_critic_loss": float(frozen["diag"][0]),
        "prior_final_nll": float(frozen["diag"][1]),
        "sf_final_loss": float(frozen["diag"][2]),
        "sf_reward_fit_r2": float(jnp.mean(ls_r2)),
        "sf_library_size": n_anchor + 1,
        "return_se": _mean_se(res["return"], len(methods)),
        "success_se": _mean_se(res["success"], len(methods)),
    }
    for ai, pre in enumerate(ACTORS):
        out[pre + "actor_success"] = stat("success", (ai, 0, POE, 0.0))
        out[pre + "actor_return"] = stat("return", (ai, 0, POE, 0.0))
        for mode, name in ((GUIDED, "iql_guided"), (CQL_GUIDED, "cql_guided")):
            g_ret = [stat("return", (ai, 0, mode, sh)) for sh in cfg.guide_shifts]
            g_best = int(np.argmax(g_ret))
            out[f"{pre}{name}_return_curve"] = g_ret
            out[f"{pre}{name}_shift"] = cfg.guide_shifts[g_best]
            out[f"{pre}{name}_return"] = g_ret[g_best]
            out[f"{pre}{name}_success"] = stat("success", (ai, 0, mode, cfg.guide_shifts[g_best]))
        for pi, q in enumerate(PRIORS):
            ka = kl_alpha[ai, pi]
            curves = {}
            for mode, name in ((POE, "poe"), (ADDITIVE, "additive")):
                curves[name] = [stat("return", (ai, pi, mode, a)) for a in cfg.alphas]
                curves[name + "_s"] = [stat("success", (ai, pi, mode, a)) for a in cfg.alphas]
            best = int(np.argmax(curves["poe"]))
            best_add = int(np.argmax(curves["additive"]))
            out.update(
                {
                    f"{pre}sfgpi_success_{q}": stat("success", (ai, pi, SFGPI, 0.0)),
                    f"{pre}sfgpi_return_{q}": stat("return", (ai, pi, SFGPI, 0.0)),
                    f"{pre}poe_kl_budget_alpha_{q}": ka,
                    f"{pre}poe_kl_budget_success_{q}": stat("success", (ai, pi, POE, ka)),
                    f"{pre}poe_kl_budget_return_{q}": stat("return", (ai, pi, POE, ka)),
                    f"{pre}poe_kl_state_success_{q}": stat("success", (ai, pi, KL_STATE, 0.0)),
                    f"{pre}poe_kl_state_return_{q}": stat("return", (ai, pi, KL_STATE, 0.0)),
                    f"{pre}oracle_alpha_{q}": cfg.alphas[best],
                    f"{pre}oracle_success_{q}": curves["poe_s"][best],
                    f"{pre}oracle_return_{q}": curves["poe"][best],
                    f"{pre}additive_success_{q}": stat("success", (ai, pi, ADDITIVE, ka)),
                    f"{pre}additive_return_{q}": stat("return", (ai, pi, ADDITIVE, ka)),
                    f"{pre}additive_oracle_alpha_{q}": cfg.alphas[best_add],
                    f"{pre}additive_oracle_success_{q}": curves["additive_s"][best_add],
                    f"{pre}additive_oracle_return_{q}": curves["additive"][best_add],
                    f"{pre}prior_only_success_{q}": stat("success", (ai, pi, POE, 1.0)),
                    f"{pre}prior_only_return_{q}": stat("return", (ai, pi, POE, 1.0)),
                    f"{pre}poe_return_curve_{q}": curves["poe"],
                    f"{pre}poe_success_curve_{q}": curves["poe_s"],
                    f"{pre}additive_return_curve_{q}": curves["additive"],
                }
            )
    _plot(ctx, cfg, out)
    return out


def _mean_se(values: np.ndarray, n_methods: int) -> float | None:
    """Evaluation noise: the standard error of a method's mean over its episodes, averaged over
    the ``n_methods`` method rows (``values`` is method-major); None with a single episode."""
    per = np.asarray(values, np.float64).reshape(n_methods, -1)
    if per.shape[1] < 2:
        return None
    return float(np.mean(per.std(axis=1, ddof=1) / np.sqrt(per.shape[1])))


def _plot(ctx, cfg, out):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PRIORS), figsize=(4.2 * len(PRIORS), 3.4), sharey=True)
    for ax, q in zip(axes, PRIORS, strict=True):
        for pre, style in (("", "-"), ("incompetent_", ":")):
            who = "competent" if not pre else "incompetent"
            ax.plot(
                cfg.alphas,
                out[f"{pre}poe_return_curve_{q}"],
                "o" + style,
                c="C0",
                label=f"PoE, {who}",
            )
            ax.plot(
                cfg.alphas,
                out[f"{pre}additive_return_curve_{q}"],
                "s" + style,
                c="C1",
                label=f"additive, {who}",
            )
        ax.axvline(out[f"poe_kl_budget_alpha_{q}"], c="C2", ls="--", label="KL-budget alpha")
        ax.plot(
            out[f"oracle_alpha_{q}"],
            out[f"oracle_return_{q}"],
            "*",
            c="C3",
            ms=14,
            label="oracle alpha",
        )
        ax.set_title(f"{q} prior")
        ax.set_xlabel("alpha")
    axes[0].set_ylabel("return (sum exp(-distance))")
    axes[-1].legend(fontsize=7)
    ctx.save_plot(fig, "return_vs_alpha")


STUDY = _runner.Study(
    "policy_pointmaze",
    Config,
    run,
    quick={
        "n_transitions": 20_000,
        "hidden": 64,
        "iql_steps": 2000,
        "guide_iql_steps": 2000,
        "guide_cql_steps": 2000,
        "sf_steps": 2000,
        "bc_steps": 2000,
        "alphas": (0.0, 0.25, 0.5, 0.75, 1.0),
        "n_kl_states": 512,
        "n_episodes": 3,
        "n_envs": 32,
    },
    doc=__doc__,
)

if __name__ == "__main__":
    STUDY.main()
