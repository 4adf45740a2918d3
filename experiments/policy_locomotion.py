"""PoE / KL composition of frozen offline actors of three competence levels with a
velocity-conditioned prior on MuJoCo locomotion, decided on held-out episodes.

Data (``hexad.policy.locomotion_dataset``, cached npz with D4RL names; data seed = study seed):
an SAC run of ``data_steps`` online steps on ``env`` gives the *random*, *medium*, *expert* and
*medium-replay* levels. Offline, IQL (rewards scaled by 1000 / (max - min trajectory return), as
the IQL reference) trains one frozen actor per level of ``levels``: ``medium``,
``medium_replay`` and ``medium_expert`` (medium and expert together). The good prior is
velocity-conditioned BC on the ``prior_data`` levels together (medium-replay, medium and
expert: a prior that has seen running at the speeds the actors are asked for, which the
mostly slow replay data alone seldom reaches), its goal the hindsight mean x velocity over the
next ``velocity_horizon`` steps. Priors, likelihood
spaces, the KL-budget sweep (full and mean-only KL), the selection/test split and the
decision rules are those of ``experiments.policy_pointmaze`` (see its docstring), with: the
data-corrupted prior trained on velocity goals shuffled across trajectories; one CQL guide
(velocity-conditioned, trained on the prior's data with the tracking reward of each
transition's own goal); selection episodes reset with seeds ``1000 s + 500 + i``, test
episodes with ``1000 s + i`` (other starts).

Shifted objective, one per actor level: the actor of level L tracks ``v*_L =
target_velocity_frac`` times the mean x velocity of its own data (medium-expert: medium and
expert together) or of the ``target_floor`` level's data, whichever is faster; 1.5 asks each
actor to run faster than its data, and the floor (medium) asks the medium-replay actor, whose
data is mostly slow, to run too, so that running is worth something at every level of
competence (at 1.5 times its own data, standing still beats it) and the prior, commanded with
its row's ``v*_L`` (as is the CQL guide), can help or hurt it. The zero action and the
prior alone are scored on each level's task; an actor that the zero action beats at its
``v*_L`` is excluded by the precondition of the decision rules. The reward's forward term
becomes ``-|x_velocity - v*_L|`` (control cost kept). Metric: the raw shifted return of a
``episode_steps`` episode.
``actor_own_task_return``: each actor on its own task (the environment's reward) from the test
starts, with ``zero_return`` (the zero action on the first level's shifted task) and the data's
snapshot returns (``data_*_return``, ``data_eval_steps``-step episodes) beside it.

Hopper and Walker2d: their medium-replay data is the first few thousand SAC steps (half of them
uniform random) until the data is regenerated with at least 100k SAC steps; until then a run with
``env`` = Hopper-v5 or Walker2d-v5 and ``data_steps`` < 100k reports every verdict as
"excluded: ...": they enter no verdict. Regenerating is about 20 min of CPU per task and data
seed (5k SAC steps take about 1 min wall on 2 cores, linear in the steps).

Deviations from the references (D4RL: 1M transitions per level; IQL: 1e6 updates, 256-wide,
cosine actor schedule): 20k SAC steps and 20k transitions per level, 128-wide networks, 5000
updates each at a constant learning rate, 3 seeds, 3 selection and 6 test episodes of 1000 steps
per row, the priors ``good``, ``param_noise``, ``output_noise_x3``, ``data_corrupted``,
``random_wide``; CQL with 10 action samples but a fixed entropy coefficient.

Command:  python -m experiments.policy_locomotion [--quick] [--out DIR] [--seed N] [--set k=v]
          The data are generated once per seed and cached; each seed's networks are
          checkpointed through hexad.cachex in ``--ckpt``/seed<s>; ``--resume`` restores them.
Runtime:  --quick (3000 SAC steps, 64-wide, 1000 updates, 1 seed, 2 selection and 3 test
          episodes of 50 steps, budgets 0.3 and 3 x d only): about 2 min on 2 idle cores.
          Full (3 seeds, HalfCheetah): about 44 min wall on 2 CPU cores shared with other
          work from an empty data cache, 38 min with the data cached beside the test suite
          (results/policy_locomotion); ``--resume`` restores the networks and reruns the
          evaluation only (28 min beside other work).

summary.json keys: those of ``experiments.policy_pointmaze`` (``verdict_graceful_Q``,
``verdict_additive_below_poe_Q``, ``verdict_selector_Q``, ``actor_beats_zero``, their
intervals and margins, ``precision_ratio_median_Q``, the budget sweep,
``actor_own_task_return``, ...), for Q in ``priors``, with the prefix ``action_`` for the
second likelihood space and ``medium_replay_`` / ``medium_expert_`` for the other actors (the
space first: ``action_medium_expert_...``); ``cql_guided_return``, ``cql_guided_shift``,
``cql_guided_minus_actor_ci``; per level (the first without a prefix, ``medium_replay_`` /
``medium_expert_`` for the others): ``target_velocity``, ``zero_return`` (test episodes),
``zero_select_return`` (selection episodes); once: ``env``,
``data_random_return``, ``data_medium_return``, ``data_expert_return``, ``data_steps``,
``verdict_admissible``, ``reward_scale``, and the shared ``alphas``, ``kl_budgets_nats``,
``kl_budget_verdict_nats``, ``n_seeds``, ``n_select``, ``n_test``, ``runtime_s``.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from experiments import _policy, _runner
from hexad import policy
from hexad.data import offline_rl

LEVELS = ("medium", "medium_replay", "medium_expert")


@dataclasses.dataclass(frozen=True)
class Config(_policy.DecisiveConfig):
    env: str = "HalfCheetah-v5"
    levels: tuple[str, ...] = LEVELS
    data_steps: int = 20_000
    data_hidden: int = 64
    data_per_level: int = 20_000
    data_start_steps: int = 2000
    data_snapshot_every: int = 2000
    data_eval_steps: int = 500
    expectile: float = 0.7
    temperature: float = 3.0
    priors: tuple[str, ...] = (
        "good",
        "param_noise",
        "output_noise_x3",
        "data_corrupted",
        "random_wide",
    )
    guides: tuple[str, ...] = ("cql",)
    n_select: int = 3
    n_test: int = 6
    episode_steps: int = 1000
    n_envs: int = 32
    guide_step_size: float = 0.1
    guide_shifts: tuple[float, ...] = (0.25, 0.5, 1.0)
    velocity_horizon: int = 10
    target_velocity_frac: float = 1.5
    target_floor: str = "medium"
    prior_data: tuple[str, ...] = ("medium-replay", "medium", "expert")

    def __post_init__(self):
        super().__post_init__()
        _runner.one_of(self, offline_rl.LOCOMOTION_ENVS, "env")
        _runner.one_of(self, LEVELS, "levels")
        _runner.one_of(self, ("", *LEVELS), "target_floor")
        _runner.one_of(self, ("medium-replay", "medium", "expert"), "prior_data")
        _runner.require(len(self.prior_data) > 0, "prior_data", "expected at least one level")
        _runner.at_least(self, 1, "data_steps", "data_hidden", "data_per_level", "velocity_horizon")
        _runner.at_least(self, 1, "data_snapshot_every", "data_eval_steps")
        _runner.at_least(self, 0, "data_start_steps")

    def data(self, level: str, seed: int, progress=None) -> dict:
        names = ("data_start_steps", "data_snapshot_every", "data_eval_steps")
        kw = {k.removeprefix("data_"): getattr(self, k) for k in names}
        return policy.locomotion_dataset(
            self.env,
            level,
            self.data_steps,
            seed=seed,
            n_per_level=self.data_per_level,
            hidden=self.data_hidden,
            progress=progress,
            **kw,
        )


def setup(cfg: Config, ctx, seed: int, key) -> tuple[_policy.Setup, dict]:
    """One seed's data, actor data per level, prior data, episodes and evaluator."""
    raw = {lv: cfg.data(lv, seed, ctx.progress) for lv in ("medium", "expert", "medium-replay")}
    norm = policy.Normaliser.fit(np.concatenate([r["observations"] for r in raw.values()]))
    b = {lv: norm.batch(policy.batch_from_dataset(r)) for lv, r in raw.items()}
    levels = _policy.locomotion_levels(raw, b)
    rep_raw, rep = _policy.joined_parts(raw, b, cfg.prior_data)  # the priors' and guide's
    vg = policy.velocity_goals(rep_raw, cfg.velocity_horizon)
    ends = policy.trajectory_ends(rep_raw["terminals"], rep_raw["timeouts"])
    bad = policy.shuffle_goals_across_trajectories(key, np.asarray(vg.inputs(vg.goals)), ends)
    own_goal = jnp.asarray(offline_rl.tracking_reward(rep_raw, vg.goals), jnp.float32)
    gdata = policy.goal_conditioned(rep, vg.inputs(vg.goals), own_goal)
    v_star = _policy.level_targets(raw, cfg.levels, cfg.target_velocity_frac, cfg.target_floor)
    g_star = vg.inputs(v_star)  # [levels, 1]

    def prior_obs(o, goal, level):  # a row commands the prior with its actor level's v*
        return jnp.concatenate([o, g_star[level]], -1)

    obs = b["medium"].observations
    s = obs[np.random.default_rng(seed).choice(obs.shape[0], cfg.n_kl_states, replace=False)]
    seeds = {"select": 1000 * seed + 500 + np.arange(cfg.n_select)}
    seeds["test"] = seeds["own"] = 1000 * seed + np.arange(cfg.n_test)
    policy.check_disjoint(seeds["select"], seeds["test"])

    def evaluate(host, specs, episodes, split, levels):
        res = offline_rl.evaluate_locomotion(
            host,
            cfg.env,
            specs,
            seeds[split][episodes],
            min(cfg.n_envs, len(episodes)),
            cfg.episode_steps,
            target_velocity=v_star[levels],
            progress=ctx.progress,
        )
        return res["return" if split == "own" else "shifted_return"]

    st = _policy.Setup(
        actor_data={lv: levels[lv] for lv in cfg.levels},
        gdata=gdata,
        gdata_bad=policy.goal_conditioned(rep, bad, own_goal),
        guide_data=gdata,
        kl_obs=s,
        kl_obs_goal=tuple(prior_obs(s, None, np.full(len(s), li)) for li in range(len(cfg.levels))),
        obs_fn=norm,
        prior_obs=prior_obs,
        evaluate=evaluate,
        task_per_level=True,
    )
    n_lv = len(cfg.levels)
    zero_policy = lambda o, sp: np.zeros((len(o), b["medium"].actions.shape[1]))  # noqa: E731
    rows = np.tile(np.arange(cfg.n_test), n_lv), "test", np.repeat(np.arange(n_lv), cfg.n_test)
    zero = evaluate(zero_policy, np.zeros((cfg.n_test * n_lv, 1)), *rows).reshape(n_lv, -1)
    m = raw["medium"]
    extra = _policy.level_keys(cfg.levels, "target_velocity", v_star)
    extra |= _policy.level_keys(cfg.levels, "zero_return", zero.mean(1))
    extra |= {
        "data_random_return": float(m["meta/random_return"]),
        "data_medium_return": float(m["meta/policy_return"]),
        "data_expert_return": float(m["meta/expert_return"]),
        "reward_scale": policy.return_range_scale(m["rewards"], m["terminals"], m["timeouts"]),
    }
    return st, extra


def run(cfg: Config, ctx: _runner.Context) -> dict:
    runs, extra = _policy.run_seeds(cfg, ctx, lambda seed, key: setup(cfg, ctx, seed, key))
    admissible = cfg.env == "HalfCheetah-v5" or cfg.data_steps >= 100_000
    excluded = None if admissible else "Hopper/Walker2d data below 100k SAC steps"
    out = _policy.decide(cfg, runs, list(cfg.levels), excluded)
    out |= extra
    out |= {"env": cfg.env, "data_steps": cfg.data_steps, "verdict_admissible": admissible}
    _policy.plot_decisive(ctx, cfg, out)
    return out


STUDY = _runner.Study(
    "policy_locomotion",
    Config,
    run,
    quick={
        **_policy.DECISIVE_QUICK,
        "data_steps": 3000,
        "data_per_level": 5000,
        "data_start_steps": 1000,
        "data_snapshot_every": 1000,
        "data_eval_steps": 200,
        "episode_steps": 50,
        "kl_budgets": (0.3, 3.0),
    },
    doc=__doc__,
    resume_shared=("target_floor",),  # the task only: the networks do not depend on it
)

if __name__ == "__main__":
    STUDY.main()
