"""PoE / KL composition of a frozen offline actor with a velocity-conditioned prior on locomotion.

The locomotion half of issue 6 at our scale, on gymnasium MuJoCo ``HalfCheetah-v5`` and
``Hopper-v5``. Data: SAC behaviour policies trained online here (``hexad.data.offline_rl``,
cached npz with D4RL names): *medium* and *medium-replay* levels; the snapshot returns that
define them are reported. Offline, IQL trains the frozen *actor* on the medium data (the
environment's own reward: run forward fast). A *good* prior is velocity-conditioned BC on the
medium-replay data: its input is (observation, v), where v is the hindsight goal, the mean x
velocity over the next ``velocity_horizon`` steps of the same trajectory. The *degraded* prior
is the good one with parameter noise (``degrade_scale`` times each weight tensor's std); the
*random* prior is an untrained network.

Shifted objective: track a target velocity ``v* = target_velocity_frac`` times the medium data's
mean x velocity. The shifted reward replaces the environment's forward term by
``-|x_velocity - v*|`` (keeping the control cost and Hopper's healthy bonus). All methods act
deterministically (tanh of the composed pre-tanh mean), the prior commanded with ``v*``:

- actor: the frozen actor (alpha = 0);
- PoE over the alpha sweep ``alphas`` (alpha = 1 is the prior alone, "prior-only");
- PoE at the global KL-budget alpha (largest alpha with mean KL(pi_alpha || pi_actor) <=
  ``kl_budget`` over ``n_kl_states`` medium-data states) and with the per-state KL-budget alpha;
- oracle alpha: the sweep's alpha with the best mean shifted return (chosen on the evaluation
  episodes themselves: an upper reference, not a method);
- additive: ``(1 - alpha) mu_actor + alpha mu_prior`` at the KL-budget alpha and at its own
  best sweep alpha;
- CQL-guided steering (no prior): the frozen actor's action moved by ``guide_steps`` steps of
  gradient ascent on a velocity-conditioned CQL critic, trained offline on the medium-replay data
  with the hindsight goal v in the input and the shifted reward for v (``r - reward_forward -
  |x_velocity - v|``), within a trust region swept over ``guide_shifts``; the best shift is
  reported (swept like the oracle alpha, so also an upper reference).

Normalised score: ``100 (R - R_random) / (R_ideal - R_random)`` on the shifted return, where
``R_random`` is a uniform-random policy on the same episodes (score 0) and ``R_ideal`` is the
shifted objective's upper bound (score 100): exact tracking with zero control cost for every
step of the episode, i.e. 0 for HalfCheetah and ``episode_steps`` (the healthy bonus) for Hopper.
No policy was trained online for the shifted objective, so 100 is a bound, not an achieved
expert.

Command:  python -m experiments.policy_locomotion [--quick] [--out DIR] [--seed N] [--set k=v]
          The data are generated once (``python -m hexad.data.offline_rl locomotion --env E``
          gives the full-size sets) and cached. The frozen actors and priors are checkpointed
          through hexad.cachex in ``--ckpt``; ``--resume`` restores them and re-runs only the
          evaluation.
Runtime:  --quick (tiny SAC data: 3000 online steps, 64-wide networks, 1000 updates each, 2
          episodes of 200 steps per method): see the measured figure in the closing report;
          the first run generates the tiny data (cached afterwards).
          Full (60k SAC steps per task, 256-wide networks, 10000 updates each, 5 episodes of
          1000 steps per method): see the closing report.

summary.json keys, for E in ``halfcheetah`` / ``hopper`` and Q in good / degraded / random:
``E_actor_score``, ``E_actor_return`` (shifted), ``E_actor_velocity``;
``E_poe_kl_budget_alpha_Q``, ``E_poe_kl_budget_score_Q``; ``E_poe_kl_state_score_Q``;
``E_oracle_alpha_Q``, ``E_oracle_score_Q``; ``E_additive_score_Q`` (at the KL-budget alpha);
``E_additive_oracle_alpha_Q``, ``E_additive_oracle_score_Q``; ``E_prior_only_score_Q``,
``E_prior_only_velocity_Q``; ``E_poe_score_curve_Q``, ``E_additive_score_curve_Q``,
``E_poe_velocity_curve_Q`` (lists over ``alphas``); ``E_target_velocity``,
``E_random_return``, ``E_ideal_return``, ``E_data_expert_return``, ``E_data_medium_return``,
``E_data_random_return`` (the SAC snapshots' own returns on the original reward),
``E_medium_velocity``, ``E_replay_velocity_range`` ([min, max] of the prior's hindsight goals),
``E_iql_final_critic_loss``, ``E_prior_final_nll``; ``E_cql_guided_score``,
``E_cql_guided_shift``, ``E_cql_guided_score_curve`` (over ``guide_shifts``); and once
``alphas``, ``runtime_s``.
"""

from __future__ import annotations

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments import _runner
from hexad import cachex
from hexad import policy as P
from hexad.data import offline_rl as D

PRIORS = ("good", "degraded", "random")
POE, ADDITIVE, KL_STATE, RANDOM, GUIDED = 0, 1, 2, 3, 4
HEALTHY_BONUS = {"HalfCheetah-v5": 0.0, "Hopper-v5": 1.0}


@dataclasses.dataclass(frozen=True)
class Config:
    envs: tuple[str, ...] = ("HalfCheetah-v5", "Hopper-v5")
    data_steps: int = 20_000
    data_hidden: int = 64
    data_per_level: int = 20_000
    data_seed: int = 0
    data_start_steps: int = 2000
    data_snapshot_every: int = 2000
    data_eval_steps: int = 500
    hidden: int = 128
    iql_steps: int = 5000
    bc_steps: int = 5000
    train_chunk: int = 500
    batch_size: int = 256
    lr: float = 3e-4
    expectile: float = 0.7
    temperature: float = 3.0
    velocity_horizon: int = 10
    target_velocity_frac: float = 0.5
    alphas: tuple[float, ...] = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
    kl_budget: float = 1.0
    n_kl_states: int = 2048
    degrade_scale: float = 1.0
    n_episodes: int = 5
    episode_steps: int = 1000
    n_envs: int = 32
    guide_cql_steps: int = 5000
    guide_action_samples: int = 4
    guide_steps: int = 10
    guide_step_size: float = 0.1
    guide_shifts: tuple[float, ...] = (0.25, 0.5, 1.0)


def _data(cfg: Config, env_id: str, level: str, ctx) -> dict:
    kw = {
        "start_steps": cfg.data_start_steps,
        "snapshot_every": cfg.data_snapshot_every,
        "eval_steps": cfg.data_eval_steps,
    }
    # Only settings that differ from the generator's defaults name the cache file, so the
    # full study reads the files that `python -m hexad.data.offline_rl locomotion` writes.
    defaults = inspect.signature(D.generate_locomotion).parameters
    kw = {k: v for k, v in kw.items() if v != defaults[k].default}
    return D.locomotion_dataset(
        env_id,
        level,
        cfg.data_steps,
        seed=cfg.data_seed,
        n_per_level=cfg.data_per_level,
        hidden=cfg.data_hidden,
        progress=ctx.progress,
        **kw,
    )


def hindsight_velocity(raw: dict, horizon: int) -> np.ndarray:
    """``[N]`` mean ``infos/x_velocity`` over the next ``horizon`` steps of each trajectory."""
    ends = P.trajectory_ends(raw["terminals"], raw["timeouts"])
    v = raw["infos/x_velocity"].astype(np.float64)
    cs = np.concatenate([[0.0], np.cumsum(v)])
    i = np.arange(v.shape[0])
    j = np.minimum(i + horizon, ends + 1)
    return ((cs[j] - cs[i]) / (j - i)).astype(np.float32)


def _train(ctx, algo, data, n_steps, key, desc, batch_size, chunk):
    state = algo.init(key, data)
    train = jax.jit(P.make_train(algo, min(chunk, n_steps), batch_size))
    infos = None
    for i in ctx.progress(range(max(n_steps // chunk, 1)), desc=desc):
        state, infos = train(jax.random.fold_in(key, i), state, data)
        ctx.log(stage=desc, chunk=i, **{k: float(v[-1]) for k, v in infos._asdict().items()})
    return state, infos


def _run_env(cfg: Config, ctx, env_id: str, key) -> dict:
    name = env_id.split("-")[0].lower()
    med_raw = _data(cfg, env_id, "medium", ctx)
    rep_raw = _data(cfg, env_id, "medium-replay", ctx)
    med, rep = P.batch_from_dataset(med_raw), P.batch_from_dataset(rep_raw)
    # One observation normaliser (from the union of both sets) for every network.
    allobs = np.concatenate([med_raw["observations"], rep_raw["observations"]])
    mu = jnp.asarray(allobs.mean(0, keepdims=True), jnp.float32)  # [1, o]
    sd = jnp.asarray(allobs.std(0, keepdims=True) + 1e-3, jnp.float32)
    norm = lambda o: (o - mu) / sd  # noqa: E731
    med = med._replace(
        observations=norm(med.observations), next_observations=norm(med.next_observations)
    )
    goals = hindsight_velocity(rep_raw, cfg.velocity_horizon)
    v_scale = float(np.std(goals) + 1e-3)
    g_in = jnp.asarray(goals / v_scale, jnp.float32)[:, None]
    gdata = rep._replace(observations=jnp.concatenate([norm(rep.observations), g_in], -1))
    # The guide's data: goal in both observations, the shifted reward for that goal.
    shifted = rep_raw["rewards"] - rep_raw["infos/reward_forward"]
    shifted = shifted - np.abs(rep_raw["infos/x_velocity"] - goals)
    guide_data = gdata._replace(
        next_observations=jnp.concatenate([norm(rep.next_observations), g_in], -1),
        rewards=jnp.asarray(shifted, jnp.float32),
    )

    act_dim = med.actions.shape[1]
    hid = (cfg.hidden, cfg.hidden)
    actor_net, prior_net = P.GaussianActor(act_dim, hid), P.GaussianActor(act_dim, hid)
    critic_net = P.TwinCritic(hid)
    keys = jax.random.split(key, 6)
    init = {
        "actor": actor_net.init(keys[0], med.observations[:1]),
        "priors": (prior_net.init(keys[1], gdata.observations[:1]),) * 3,
        "guide": critic_net.init(keys[4], gdata.observations[:1], med.actions[:1]),
        "diag": jnp.zeros(2),
    }
    mngr = cachex.CacheXManager(ctx.checkpoint_dir / name)
    try:
        start, frozen = cachex.resume(mngr, init, ctx.resume)
        if start == 0:
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
            iql_state, iql_info = _train(
                ctx, iql, med, cfg.iql_steps, keys[0], f"{name}_iql", bs, ch
            )
            bc = P.bc(prior_net, optax.adam(cfg.lr))
            pstate, pinfo = _train(ctx, bc, gdata, cfg.bc_steps, keys[1], f"{name}_vcbc", bs, ch)
            cql = P.cql(
                prior_net,
                critic_net,
                opt,
                opt,
                n_action_samples=cfg.guide_action_samples,
            )
            guide, _ = _train(
                ctx, cql, guide_data, cfg.guide_cql_steps, keys[4], f"{name}_cql", bs, ch
            )
            frozen = {
                "actor": iql_state.actor_params,
                "guide": guide.critic_params,
                "priors": (
                    pstate.params,
                    P.degrade_params(keys[2], pstate.params, cfg.degrade_scale),
                    prior_net.init(keys[3], gdata.observations[:1]),
                ),
                "diag": jnp.stack([iql_info.critic_loss[-1], pinfo.loss[-1]]),
            }
            mngr.save(0, frozen)
            mngr.wait_until_finished()
    finally:
        mngr.close()
    actor_params, prior_params, guide = frozen["actor"], frozen["priors"], frozen["guide"]

    v_med = float(med_raw["infos/x_velocity"].mean())
    v_star = cfg.target_velocity_frac * v_med
    g_star = jnp.float32(v_star / v_scale)

    rng = np.random.default_rng(ctx.seed)
    idx = rng.choice(med.observations.shape[0], cfg.n_kl_states, replace=False)
    s = med.observations[idx]
    s_g = jnp.concatenate([s, jnp.full((s.shape[0], 1), g_star)], -1)
    select = jax.jit(
        lambda pp: P.kl_budget_alpha(
            actor_net.apply(actor_params, s), prior_net.apply(pp, s_g), cfg.kl_budget
        )
    )
    kl_alpha = [float(select(pp)) for pp in prior_params]

    @jax.jit
    def composed(obs, spec):
        p_id, mode, alpha = spec[:, 0].astype(int), spec[:, 1].astype(int), spec[:, 2]
        o = norm(obs)
        a = actor_net.apply(actor_params, o)
        og = jnp.concatenate([o, jnp.full((o.shape[0], 1), g_star)], -1)
        p_all = [prior_net.apply(pp, og) for pp in prior_params]
        p = jax.tree.map(
            lambda *xs: jnp.take_along_axis(jnp.stack(xs), p_id[None, :, None], 0)[0], *p_all
        )
        alpha = jnp.where(mode == KL_STATE, P.kl_budget_alpha_per_state(a, p, cfg.kl_budget), alpha)
        mean = jnp.where(
            (mode == ADDITIVE)[:, None], P.additive(a, p, alpha).mean, P.poe(a, p, alpha).mean
        )
        q_fn = lambda s_, a_: jnp.minimum(*critic_net.apply(guide, s_, a_))  # noqa: E731
        shift = jnp.where(mode == GUIDED, alpha, 1.0)
        steered = P.q_steer(q_fn, og, a.mean, cfg.guide_step_size, cfg.guide_steps, shift)
        return jnp.where((mode == GUIDED)[:, None], steered, jnp.tanh(mean))

    methods = [(0, RANDOM, 0.0)]  # (prior id, mode, alpha or trust-region shift)
    methods += [(0, GUIDED, sh) for sh in cfg.guide_shifts]
    for pi in range(len(PRIORS)):
        methods += [(pi, POE, a) for a in cfg.alphas]
        methods += [(pi, ADDITIVE, a) for a in cfg.alphas]
        methods += [(pi, POE, kl_alpha[pi]), (pi, ADDITIVE, kl_alpha[pi]), (pi, KL_STATE, 0.0)]
    methods = list(dict.fromkeys(methods))
    specs = np.repeat(np.asarray(methods, np.float32), cfg.n_episodes, axis=0)
    ep = np.tile(np.arange(cfg.n_episodes), len(methods))
    act_rng = np.random.default_rng(ctx.seed + 1)

    def policy(o, sp):
        a = np.asarray(composed(jnp.asarray(o, jnp.float32), jnp.asarray(sp)))
        rand = sp[:, 1] == RANDOM
        if rand.any():
            a = np.where(rand[:, None], act_rng.uniform(-1, 1, a.shape), a)
        return a

    res = D.evaluate_locomotion(
        policy,
        env_id,
        specs,
        1000 * ctx.seed + ep,
        min(cfg.n_envs, len(ep)),
        cfg.episode_steps,
        target_velocity=v_star,
        progress=ctx.progress,
    )

    def stat(key, m):
        rows = np.all(np.isclose(specs, np.asarray(m, np.float32)[None]), axis=1)
        return float(np.mean(res[key][rows]))

    r_rand = stat("shifted_return", (0, RANDOM, 0.0))
    r_ideal = HEALTHY_BONUS[env_id] * cfg.episode_steps
    score = lambda m: 100.0 * (stat("shifted_return", m) - r_rand) / (r_ideal - r_rand)  # noqa: E731

    pre = name + "_"
    out = {
        pre + "target_velocity": v_star,
        pre + "medium_velocity": v_med,
        pre + "replay_velocity_range": [float(goals.min()), float(goals.max())],
        pre + "random_return": r_rand,
        pre + "ideal_return": r_ideal,
        pre + "data_expert_return": float(med_raw["meta/expert_return"]),
        pre + "data_medium_return": float(med_raw["meta/policy_return"]),
        pre + "data_random_return": float(med_raw["meta/random_return"]),
        pre + "iql_final_critic_loss": float(frozen["diag"][0]),
        pre + "prior_final_nll": float(frozen["diag"][1]),
        pre + "actor_score": score((0, POE, 0.0)),
        pre + "actor_return": stat("shifted_return", (0, POE, 0.0)),
        pre + "actor_velocity": stat("velocity", (0, POE, 0.0)),
    }
    g_sc = [score((0, GUIDED, sh)) for sh in cfg.guide_shifts]
    g_best = int(np.argmax(g_sc))
    out[pre + "cql_guided_score_curve"] = g_sc
    out[pre + "cql_guided_shift"] = cfg.guide_shifts[g_best]
    out[pre + "cql_guided_score"] = g_sc[g_best]
    for pi, q in enumerate(PRIORS):
        ka = kl_alpha[pi]
        poe_c = [score((pi, POE, a)) for a in cfg.alphas]
        add_c = [score((pi, ADDITIVE, a)) for a in cfg.alphas]
        best, best_add = int(np.argmax(poe_c)), int(np.argmax(add_c))
        out.update(
            {
                f"{pre}poe_kl_budget_alpha_{q}": ka,
                f"{pre}poe_kl_budget_score_{q}": score((pi, POE, ka)),
                f"{pre}poe_kl_state_score_{q}": score((pi, KL_STATE, 0.0)),
                f"{pre}oracle_alpha_{q}": cfg.alphas[best],
                f"{pre}oracle_score_{q}": poe_c[best],
                f"{pre}additive_score_{q}": score((pi, ADDITIVE, ka)),
                f"{pre}additive_oracle_alpha_{q}": cfg.alphas[best_add],
                f"{pre}additive_oracle_score_{q}": add_c[best_add],
                f"{pre}prior_only_score_{q}": score((pi, POE, 1.0)),
                f"{pre}prior_only_velocity_{q}": stat("velocity", (pi, POE, 1.0)),
                f"{pre}poe_score_curve_{q}": poe_c,
                f"{pre}additive_score_curve_{q}": add_c,
                f"{pre}poe_velocity_curve_{q}": [
                    stat("velocity", (pi, POE, a)) for a in cfg.alphas
                ],
            }
        )
    return out


def run(cfg: Config, ctx: _runner.Context) -> dict:
    for e in cfg.envs:
        if e not in D.LOCOMOTION_ENVS:
            raise ValueError(f"envs: expected names in {D.LOCOMOTION_ENVS}, got {e!r}")
    if 1.0 not in cfg.alphas or 0.0 not in cfg.alphas:
        raise ValueError(f"alphas: expected a sweep containing 0.0 and 1.0, got {cfg.alphas}")
    out = {"alphas": list(cfg.alphas)}
    keys = jax.random.split(ctx.key(), len(cfg.envs))
    for e, k in zip(cfg.envs, keys, strict=True):
        out.update(_run_env(cfg, ctx, e, k))
    _plot(ctx, cfg, out)
    return out


def _plot(ctx, cfg, out):
    import matplotlib.pyplot as plt

    names = [e.split("-")[0].lower() for e in cfg.envs]
    fig, axes = plt.subplots(
        len(names), len(PRIORS), figsize=(4.2 * len(PRIORS), 3.2 * len(names)), squeeze=False
    )
    for row, name in zip(axes, names, strict=True):
        pre = name + "_"
        for ax, q in zip(row, PRIORS, strict=True):
            ax.plot(cfg.alphas, out[f"{pre}poe_score_curve_{q}"], "o-", c="C0", label="PoE")
            ax.plot(
                cfg.alphas, out[f"{pre}additive_score_curve_{q}"], "s-", c="C1", label="additive"
            )
            ax.axvline(
                out[f"{pre}poe_kl_budget_alpha_{q}"], c="C2", ls="--", label="KL-budget alpha"
            )
            ax.plot(
                out[f"{pre}oracle_alpha_{q}"],
                out[f"{pre}oracle_score_{q}"],
                "*",
                c="C3",
                ms=14,
                label="oracle alpha",
            )
            ax.set_title(f"{name}, {q} prior")
            ax.set_xlabel("alpha")
        row[0].set_ylabel("normalised shifted score")
    axes[0, -1].legend(fontsize=7)
    ctx.save_plot(fig, "score_vs_alpha")


STUDY = _runner.Study(
    "policy_locomotion",
    Config,
    run,
    quick={
        "data_steps": 3000,
        "data_hidden": 64,
        "data_per_level": 5000,
        "data_start_steps": 1000,
        "data_snapshot_every": 1000,
        "data_eval_steps": 200,
        "hidden": 64,
        "iql_steps": 1000,
        "bc_steps": 1000,
        "train_chunk": 250,
        "alphas": (0.0, 0.25, 0.5, 0.75, 1.0),
        "n_kl_states": 512,
        "n_episodes": 2,
        "episode_steps": 200,
        "guide_cql_steps": 1000,
    },
    doc=__doc__,
)

if __name__ == "__main__":
    STUDY.main()
