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
diagnostic is ``experiments._policy.run_maze(cfg, ctx, maze)`` on a ``Maze`` (data, geometry,
evaluator, scripted oracle), built on :mod:`hexad.policy`'s composition layer (``Method``,
``Row``, ``ExpertLibrary``, ``compose``); ``experiments.policy_antmaze`` runs it on AntMaze.

Command:  python -m experiments.policy_pointmaze [--quick] [--out DIR] [--seed N] [--set k=v]
          The trained actors, priors and guide critics are checkpointed through hexad.cachex
          in ``--ckpt``/frozen (default ``checkpoints/policy_pointmaze/<run>/frozen/``);
          ``--resume`` restores them and re-runs only the evaluation. The data set is cached
          (hexad.data.offline_rl).
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
from functools import partial

from experiments import _policy, _runner
from hexad.data import offline_rl

PRIORS = _policy.PRIORS


@dataclasses.dataclass(frozen=True)
class Config(_policy.MazeConfig):
    """PointMaze's settings: those of :class:`experiments._policy.MazeConfig`."""


def pointmaze(cfg: Config, ctx: _runner.Context) -> _policy.Maze:
    """The PointMaze data set (cached), geometry, evaluator and scripted oracle."""
    raw = offline_rl.pointmaze_dataset(cfg.n_transitions, seed=ctx.seed, noise_std=cfg.noise_std)
    geom = offline_rl.MazeGeometry()
    oracle = partial(offline_rl.pointmaze_oracle, geom)
    return _policy.Maze(raw, geom, offline_rl.evaluate_pointmaze, oracle, 0.2)


def run(cfg: Config, ctx: _runner.Context) -> dict:
    return _policy.run_maze(cfg, ctx, pointmaze(cfg, ctx))


STUDY = _runner.Study(
    "policy_pointmaze",
    Config,
    run,
    quick=_policy.MAZE_QUICK,
    doc=__doc__,
)

if __name__ == "__main__":
    STUDY.main()
