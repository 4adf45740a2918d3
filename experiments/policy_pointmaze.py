"""PoE / KL composition of a frozen offline actor with goal-conditioned priors on PointMaze:
graceful degradation, additive against PoE, priors of known precision, the KL-budget selector's
regret, decided on held-out episodes with the shared statistics module.

Data: a scripted noisy oracle generates a PointMaze-UMaze data set (gymnasium-robotics, cached
npz with D4RL names; data seed = study seed). Offline, IQL trains the frozen *actor* for the
data's task (sparse reward at the task goal (-1, -1)); goal-conditioned BC trains the *good*
prior on (observation, commanded goal). Both are trained in each likelihood space of
``spaces``: ``pretanh`` (tanh-squashed Gaussian, state-dependent std, PoE over pre-tanh
variables, acting with ``tanh(mean)``) and ``action`` (Gaussian over actions with a
state-independent std as in the IQL reference, PoE in action space, acting with
``clip(mean, -1, 1)``). Every claim is decided in each space; neither is the headline.

Priors (the study's one driver is ``experiments._policy``; the priors are
:func:`hexad.policy.make_prior` and the two families below):

- ``priors``: ``good``; ``param_noise`` (weight noise of ``degrade_scale`` times each tensor's
  std, log-std head included); ``output_noise`` / ``output_noise_x3`` (``mu_good(x) +
  sigma_good(x) eps(x)``, std kept / tripled); ``data_corrupted`` (BC on goals shuffled across
  trajectories); ``random_init`` (an untrained network); ``random_wide`` (its mean, the data's
  marginal action std);
- the *precision-ratio family* ``r<r>`` for ``r`` in ``precision_ratios`` = 0.25, 0.5, 1, 2, 4
  (:func:`hexad.policy.precision_prior`): the actor's mean moved by ``precision_error`` = 2
  actor stds along one fixed smooth random direction, with precision exactly ``r`` times the
  actor's at every state, the same mean error for every ``r``;
- the *random-perturbation control* (:func:`hexad.policy.perturbation_prior`): the good
  prior's precision and step size at every state, in a random direction.

Deployment: the objective shifts to a goal drawn uniformly within ``goal_shift`` of the task
goal (free space). Episodes start in cell (1, 1). *Selection* episodes (``n_select`` per seed,
reset seeds ``1000 s + 500 + i``, their own goals) choose every chosen quantity: each prior's
oracle alpha of PoE over ``alphas`` and over the ``alphas`` in ``regret_range`` = [0.1, 0.9],
and each guide's trust region over ``guide_shifts``. *Test* episodes (``n_test``, seeds
``1000 s + i``, other goals) report everything; overlapping seeds are an error. The KL budget
is calibrated per likelihood space without reward (:func:`hexad.policy.calibrate_kl_budget`):
``kl_budget_fraction`` = 0.5 of the actor's own median KL between two of the KL states
(``n_kl_states`` data states paired with selection goals); *PoE-KL* is PoE at the largest
alpha whose mean KL(pi_alpha || pi_A) over those states stays within it. Guides (pretanh
only): the actor's action moved by gradient ascent on a goal-conditioned IQL or CQL critic
(reward 1 on reaching the commanded goal); reported, in no claim.

Metric: return = sum over steps of exp(-distance to the goal) (gymnasium-robotics' dense
reward); ``success`` (reaching the goal) is reported beside it.

Decision rules, stated before any run. The practical margin is ``delta`` = ``margin_per_step``
x ``episode_steps`` = 3 return points over the full study's 300-step episodes (1 point at
``--quick``'s 100 steps): 1% of the return of staying at the goal for the whole episode. A
paired difference is taken per test episode (same seed, start and goal under both arms); with
two or more seeds the *units* are the per-seed means of those differences, so the intervals
carry the seed-to-seed variation as well as the episodes' (with one seed, as at ``--quick``,
the units are its episodes). Everything is decided by ``experiments._verdicts`` at level
``stat_alpha`` = 0.05: a *bound* by ``noninferior`` (one half of TOST: the 90% interval's
end beyond the bound), a *difference* by ``decide`` (the 95% t interval beyond 0, after TOST at
the margin: "no advantage", a difference within the margin, refutes a claimed difference).
"holds" = the shared module's "reproduced"; "fails" = "not reproduced" or "no advantage";
"undecided"; "not tested: <why>" when a gate below fails (the figures are still reported).

- Gates of every claim in a space: the actor's mean return on the selection episodes is above
  the zero action's (``actor_beats_zero_<space>``).
- ``graceful_Q_<space>``, per prior Q of ``priors``, tested only where the prior alone is
  decidedly worse than the actor (the bound of (prior alone - actor) at ``-delta`` shown not
  to hold): holds if (PoE-KL - actor) > -delta (a bound, non-inferiority).
- ``additive_below_poe_Q_<space>``, gated as graceful: holds if (additive - PoE) at
  ``contrast_alpha`` = 0.5 < 0 (a difference).
- ``precision_ratio_prediction_<space>``: on the precision-ratio family, (additive - PoE) at
  ``contrast_alpha`` is a difference claimed below 0 for every r < 1 (PoE trusts a less
  precise bad prior less than additive does) and above 0 for every r > 1. holds if every
  r != 1 is shown on its predicted side; fails if any is shown on the other side; undecided
  otherwise. Gates: the family's mean alone is decidedly worse than the actor (as graceful),
  and the r = 1 control, where PoE and additive coincide, is not decidedly non-zero.
  ``precision_ratio_prediction``: over both spaces, fails if one fails, holds if every tested
  one holds, undecided otherwise.
- ``selector_<space>`` (the KL selector is near the oracle): with regret = (PoE at the oracle
  alpha over ``regret_range``) - (the rule), averaged over the priors of ``priors``, holds if
  the selector's regret < delta (a bound on PoE-KL - oracle). Its regrets against the
  non-search rules are reported with intervals: ``fixed_alpha`` = 0.5 PoE and the actor alone.
- ``capped_<space>`` (the good prior at its oracle alpha over all of ``alphas`` helps by less
  than delta: a bound, non-superiority, the upper half of TOST) and ``responsive_<space>`` (it
  helps: a difference > 0), each gated on the random-perturbation control at the same alpha
  not helping (its difference from the actor not shown above 0 beyond the margin); capped
  also needs the good prior alone not to beat the actor (a competent actor), responsive needs
  it to beat it (the precondition that the prior knows better).

Deviations from the references (IQL: 1e6 updates, 256-wide; D4RL maze2d-umaze: 1e6
transitions): 100k transitions, 128-wide networks, 5000 updates each (constant learning rate),
5 seeds, 10 selection and 20 test episodes of 300 steps per row; the paper's shifted objective,
prior construction and budget are not public, so these are our choices.

Command:  python -m experiments.policy_pointmaze [--quick] [--out DIR] [--seed N] [--set k=v]
          Seeds ``N .. N + n_seeds - 1``; each seed's networks are checkpointed through
          hexad.cachex in ``--ckpt``/seed<s>; ``--resume`` restores them. A seed is a part:
          ``--seed N --set n_seeds=1`` runs one, and its summary keeps every claim's paired
          units (``<claim>_diffs``) for the parts to be joined.
Runtime:  --quick (20k transitions, 64-wide, 1000 updates, 1 seed, 2 selection and 3 test
          episodes of 100 steps): 2.4 min wall measured from an empty data cache on 2 CPU
          cores shared with other runs (load about 6). Full (5 seeds): run as five one-seed
          parts (``--seed k --set n_seeds=1``), 8.0-8.3 min each on 2 cores shared with
          one other study, about 41 min in all.

summary.json keys (Q in ``priors``; ``<space>`` in ``spaces``; each claim ``C`` has
``verdict_C`` with ``C_ci_low``, ``C_ci_high`` (the interval its rule reads), ``C_ci_level``,
``C_margin`` (delta), ``C_mean``, ``C_outcome`` (the shared module's word), ``C_seeds_needed``,
``C_diffs`` (the paired units) and ``C_rule`` ("bound greater" / "bound less": ``noninferior``;
"difference greater" / "difference less": ``decide``); each figure ``F`` has ``F`` (mean of
its units), ``F_ci_low``, ``F_ci_high`` (95% t interval), ``F_outcome`` and ``F_diffs``):
claims ``graceful_Q_<space>``, ``additive_below_poe_Q_<space>``, ``selector_<space>``,
``capped_<space>``, ``responsive_<space>`` (listed in ``claims``); ``precision_ratio_prediction``
and ``precision_ratio_prediction_<space>``; figures ``selector_regret_<space>``,
``fixed_regret_<space>``, ``actor_regret_<space>``, ``selector_minus_fixed_<space>``,
``selector_minus_actor_<space>`` (positive: the selector's return is higher),
``prior_only_minus_actor_Q_<space>`` (and ``_bound_outcome``),
``precision_family_minus_actor_<space>`` (and ``_bound_outcome``),
``precision_contrast_r<r>_<space>`` (additive - PoE), ``good_prior_minus_actor_<space>``,
``control_minus_actor_<space>``, ``iql_guided_minus_actor_pretanh``,
``cql_guided_minus_actor_pretanh``; test means ``actor_return_<space>``,
``actor_success_<space>``, ``actor_own_task_return_<space>`` (the actor on its own task from
the test starts), ``control_return_<space>`` (the control at the good prior's oracle alpha),
and per Q
``poe_kl_return_Q_<space>``, ``oracle_return_Q_<space>``, ``oracle_mid_return_Q_<space>``,
``fixed_return_Q_<space>``, ``prior_only_return_Q_<space>``, ``poe_contrast_return_Q_<space>``,
``additive_contrast_return_Q_<space>``, ``poe_kl_success_Q_<space>``,
``prior_only_success_Q_<space>``; per seed ``oracle_alpha_Q_<space>``,
``oracle_mid_alpha_Q_<space>``, ``kl_alpha_Q_<space>``, ``kl_budget_nats_<space>`` (the
calibrated budget); seed means ``poe_select_curve_Q_<space>`` (selection means over
``alphas``), ``kl_curve_Q_<space>``, ``kl_mean_curve_Q_<space>`` (mean full / mean-only KL of
PoE at each alpha), ``kl_budget_alphas_Q_<space>`` (the alphas of the fixed budgets
``kl_budgets_nats``, reported only), ``precision_ratio_median_Q_<space>``,
``prior_std_quantiles_Q_<space>``, ``actor_std_quantiles_<space>`` (10/50/90%);
``actor_select_return_<space>``, ``actor_beats_zero_<space>``; ``iql_guided_return_pretanh``,
``iql_guided_shift_pretanh`` and the same for ``cql``; once: ``alphas``, ``priors``,
``spaces``, ``levels``, ``precision_ratios``, ``margin``, ``stat_alpha``, ``stat_unit``
("seed" or "episode"), ``kl_budget_fraction``, ``kl_budgets_nats``, ``n_seeds``,
``n_select``, ``n_test``, ``zero_select_return``, ``scripted_oracle_return``,
``scripted_oracle_success`` (the data's oracle on the test goals), ``claims``,
``runtime_s``.
"""

from __future__ import annotations

import dataclasses
from functools import partial

from experiments import _policy, _runner
from hexad.data import offline_rl


@dataclasses.dataclass(frozen=True)
class Config(_policy.PolicyConfig):
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
    oracle = partial(offline_rl.pointmaze_oracle, geom)
    evaluate = offline_rl.evaluate_pointmaze
    return _policy.maze_setup(cfg, ctx, seed, key, raw, geom, evaluate, oracle, 0.2)


def run(cfg: Config, ctx: _runner.Context) -> dict:
    return _policy.run(cfg, ctx, lambda seed, key: setup(cfg, ctx, seed, key), ["task"])


STUDY = _runner.Study(
    "policy_pointmaze",
    Config,
    run,
    quick={**_policy.QUICK, "n_transitions": 20_000, "episode_steps": 100},
    doc=__doc__,
)

if __name__ == "__main__":
    STUDY.main()
