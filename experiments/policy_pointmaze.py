"""PoE / KL composition of a frozen offline actor with goal-conditioned priors on PointMaze:
graceful degradation and the KL-budget selector, decided on held-out episodes.

Data: a scripted noisy oracle generates a PointMaze-UMaze data set (gymnasium-robotics, cached
npz with D4RL names; data seed = study seed). Offline, IQL trains the frozen *actor* for the
data's task (sparse reward at the task goal (-1, -1)); goal-conditioned BC trains the *good*
prior on (observation, commanded goal). Both are trained in each likelihood space of
``spaces``: ``pretanh`` (tanh-squashed Gaussian, state-dependent std, PoE over pre-tanh
variables, acting with ``tanh(mean)``) and ``action`` (Gaussian over actions with a
state-independent std as in the IQL reference, PoE in action space, acting with
``clip(mean, -1, 1)``). The priors (``priors``, :func:`hexad.policy.make_prior`):

- ``good``; ``param_noise``: weight noise of ``degrade_scale`` times each tensor's std (log-std
  head included); ``output_noise`` / ``output_noise_x3``: ``mu_good(x) + sigma_good(x) eps(x)``
  with a fixed smooth random ``eps``, std ``sigma_good`` kept / tripled;
- ``data_corrupted``: goal-conditioned BC on goals shuffled across trajectories;
- ``random_init``: an untrained network; ``random_wide``: its mean with std = the data's
  marginal action std in that space.

Deployment: the objective shifts to a goal drawn uniformly within ``goal_shift`` of the task
goal (free space). Episodes start in cell (1, 1). *Selection* episodes (``n_select`` per seed,
reset seeds ``1000 s + 500 + i``, their own goals) choose every chosen quantity: the oracle
alpha of PoE and of additive over ``alphas``, and each guide's trust region over
``guide_shifts``; the KL-selection states are data states paired with selection goals. *Test*
episodes (``n_test``, seeds ``1000 s + i``, other goals) report everything; overlapping seeds
are an error. The KL-budget selector picks the largest alpha with mean KL(pi_alpha || pi_A) <=
B over ``n_kl_states`` states, for B in ``kl_budgets`` times d nats, with the full KL and with
its mean-only (Mahalanobis) part; the KL of PoE at every alpha is reported. Guides (pretanh
only): the actor's action moved by gradient ascent on a goal-conditioned IQL or CQL critic
(reward 1 on reaching the commanded goal; CQL with ``guide_action_samples`` = 10 samples).

Metric: return = sum over steps of exp(-distance to the goal) (gymnasium-robotics' dense
reward). ``actor_own_task_return``: the actor on its own task (the task goal) from the test
starts.

Decision rules (stated before the run). Differences are per test episode, paired (same start
and goal), pooled over ``n_seeds`` seeds; intervals are 95% paired bootstrap intervals,
stratified by seed (``n_boot`` resamples); SE is the standard error of a pooled test mean.
PoE-KL is PoE at the full-KL selector's alpha with B = ``kl_budget_verdict`` x d.

- Precondition, per actor and space: the actor's mean return on the selection episodes is
  above the zero action's; otherwise every verdict of that actor is "excluded: ..." (steering an
  actor that standing still beats cannot degrade gracefully from anything).
- Graceful degradation, per prior Q, tested only if the interval of (prior alone - actor) lies
  below ``-2 SE(actor)`` (the prior is decidedly bad; otherwise "not tested: ..."): *holds* if
  the interval of (PoE-KL - actor) lies above ``-2 SE(actor)``; *fails* if it lies below;
  otherwise *undecided*.
- Additive below PoE, per prior Q, tested as graceful degradation: at the common weight
  ``contrast_alpha``, *holds* if the interval of (additive - PoE) lies below 0, *fails* if it
  lies above 0, otherwise *undecided*. (Additive at its own selection-chosen alpha is reported,
  ``additive_minus_actor_ci_Q``, but enters no verdict: a selection that works picks alpha 0
  for a bad prior, which is the actor.)
- Help / Frozen / Hurt, per actor and prior Q (the cell): *help* if the interval of (PoE-KL -
  actor) lies above ``2 SE(actor)``, *hurt* if below ``-2 SE(actor)``, *frozen* otherwise;
  the same with PoE at the selection-chosen oracle alpha in place of PoE-KL
  (``cell_oracle_Q``). Excluded as the verdicts.
- KL selector near the oracle, per prior Q: *holds* if the interval of (PoE-KL - PoE at the
  selection-chosen oracle alpha) lies above ``-max(2 SE(oracle), 5% |oracle|)``; *fails* if it
  lies below; otherwise *undecided*.

Deviations from the references (IQL: 1e6 updates, 256-wide; D4RL maze2d-umaze: 1e6
transitions): 100k transitions, 128-wide networks, 5000 updates each (constant learning rate),
3 seeds, 10 selection and 20 test episodes of 300 steps per row; the paper's shifted objective,
prior construction and budget are not public, so these are our choices.

Command:  python -m experiments.policy_pointmaze [--quick] [--out DIR] [--seed N] [--set k=v]
          Seeds ``N .. N + n_seeds - 1``; each seed's networks are checkpointed through
          hexad.cachex in ``--ckpt``/seed<s>; ``--resume`` restores them.
Runtime:  --quick (20k transitions, 64-wide, 1000 updates, 1 seed, 2 selection and 3 test
          episodes of 100 steps): about 2 min on 2 idle CPU cores. Full (3 seeds): 17 to
          23 min measured on 2 CPU cores shared with one or two other runs; with
          ``--resume`` (evaluation only) 17 min beside two other runs.

summary.json keys, for Q in ``priors``; every key also exists with the prefix ``action_`` for
the second likelihood space (the first space of ``spaces`` has no prefix):
``verdict_graceful_Q``, ``verdict_additive_below_poe_Q``, ``verdict_selector_Q`` ("holds" /
"fails" / "undecided", or "not tested: ..." / "excluded: ..." with the reason);
``additive_minus_poe_ci_Q``, ``poe_contrast_return_Q``, ``additive_contrast_return_Q`` (at
``contrast_alpha``); ``actor_select_return``, ``actor_beats_zero`` (the precondition);
``cells`` ({Q: "help" / "frozen" / "hurt"}), ``cell_counts``, ``cell_oracle_Q``,
``oracle_minus_actor_ci_Q``;
``graceful_ci_Q`` ([mean, lo, hi] of PoE-KL - actor), ``graceful_margin_Q`` (2 SE(actor)),
``additive_minus_actor_ci_Q``, ``prior_only_minus_actor_ci_Q``, ``selector_ci_Q`` (PoE-KL -
oracle), ``selector_margin_Q``; test means ``poe_kl_budget_return_Q``, ``oracle_return_Q``,
``additive_return_Q``, ``prior_only_return_Q``; ``oracle_alpha_Q``, ``additive_alpha_Q`` (per
seed); ``poe_select_curve_Q``, ``additive_select_curve_Q`` (selection means over ``alphas``);
``kl_curve_Q``, ``kl_mean_curve_Q`` (mean full / mean-only KL of PoE at each alpha);
``kl_budget_alphas_Q``, ``kl_mean_budget_alphas_Q`` (selected alpha per budget, mean over
seeds), ``kl_budget_return_Q``, ``kl_mean_budget_return_Q`` (test means per budget);
``precision_ratio_median_Q`` (median of lam_P / lam_A over the KL states), ``prior_std_quantiles_Q``
(10/50/90%); ``actor_return``, ``actor_return_se``, ``actor_own_task_return``,
``actor_own_task_return_se``, ``actor_std_quantiles``; ``iql_guided_return``,
``iql_guided_shift``, ``iql_guided_minus_actor_ci`` and the same for ``cql``; once:
``alphas``, ``kl_budgets_nats``, ``kl_budget_verdict_nats``, ``n_seeds``, ``n_select``,
``n_test``, ``zero_select_return``, ``scripted_oracle_return`` (the data's oracle on the test
goals), ``runtime_s``.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax.numpy as jnp
import numpy as np

from experiments import _policy, _runner
from hexad import policy
from hexad.data import offline_rl

PRIORS = policy.PRIOR_KINDS


@dataclasses.dataclass(frozen=True)
class Config(_policy.DecisiveConfig):
    n_transitions: int = 100_000
    noise_std: float = 0.3
    goal_shift: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        _runner.at_least(self, 1, "n_transitions")
        _runner.at_least(self, 0, "noise_std", "goal_shift")


def setup(cfg: Config, ctx, seed: int, key) -> tuple[_policy.Setup, dict]:
    """One seed's data, episodes and evaluator (data seed = ``seed``)."""
    raw = offline_rl.pointmaze_dataset(cfg.n_transitions, seed=seed, noise_std=cfg.noise_std)
    geom = offline_rl.MazeGeometry()
    data = policy.batch_from_dataset(raw)
    goals = np.asarray(raw["infos/goal"], np.float32)
    ends = policy.trajectory_ends(raw["terminals"], raw["timeouts"])
    bad = policy.shuffle_goals_across_trajectories(key, goals, ends)
    gdata = policy.goal_conditioned(data, goals)
    reached = jnp.linalg.norm(data.next_observations[:, :2] - goals, axis=-1) <= 0.5
    reached = reached.astype(jnp.float32)
    rng = np.random.default_rng(seed)
    ep_goals = {
        sp: offline_rl.sample_free_goals(rng, raw["task_goal"], cfg.goal_shift, n, 0.2, geom)
        for sp, n in (("select", cfg.n_select), ("test", cfg.n_test))
    }
    ep_goals["own"] = np.tile(np.asarray(raw["task_goal"], np.float32), (cfg.n_test, 1))
    seeds = {"select": 1000 * seed + 500 + np.arange(cfg.n_select)}
    seeds["test"] = seeds["own"] = 1000 * seed + np.arange(cfg.n_test)
    policy.check_disjoint(seeds["select"], seeds["test"])
    idx = rng.choice(data.observations.shape[0], cfg.n_kl_states, replace=False)
    s = data.observations[idx]
    g = jnp.asarray(ep_goals["select"][rng.integers(0, cfg.n_select, cfg.n_kl_states)])

    def evaluate(host, specs, episodes, split, levels):  # one actor, one task
        steps, n_envs = cfg.episode_steps, min(cfg.n_envs, len(episodes))
        res = offline_rl.evaluate_pointmaze(
            host,
            ep_goals[split][episodes],
            specs,
            seeds[split][episodes],
            n_envs,
            steps,
            progress=ctx.progress,
        )
        return res["return"]

    st = _policy.Setup(
        actor_data={"task": data},
        gdata=gdata,
        gdata_bad=policy.goal_conditioned(data, bad),
        guide_data=gdata._replace(rewards=reached, terminals=reached),
        kl_obs=s,
        kl_obs_goal=jnp.concatenate([s, g], -1),
        obs_fn=lambda o: o,
        prior_obs=lambda o, goal, level: jnp.concatenate([o, goal], -1),
        evaluate=evaluate,
    )
    oracle = partial(offline_rl.pointmaze_oracle, geom)
    ref = offline_rl.evaluate_pointmaze(
        lambda o, gl, sp: oracle(o, gl),
        ep_goals["test"],
        np.zeros((cfg.n_test, 1)),
        seeds["test"],
        min(cfg.n_envs, cfg.n_test),
        cfg.episode_steps,
    )
    return st, {"scripted_oracle_return": float(ref["return"].mean())}


def run(cfg: Config, ctx: _runner.Context) -> dict:
    runs, extra = _policy.run_seeds(cfg, ctx, lambda seed, key: setup(cfg, ctx, seed, key))
    out = _policy.decide(cfg, runs, ["task"]) | extra
    _policy.plot_decisive(ctx, cfg, out)
    return out


STUDY = _runner.Study(
    "policy_pointmaze",
    Config,
    run,
    quick={**_policy.DECISIVE_QUICK, "n_transitions": 20_000, "episode_steps": 100},
    doc=__doc__,
)

if __name__ == "__main__":
    STUDY.main()
