"""PoE / KL composition of frozen offline actors with goal-conditioned priors on AntMaze.

The maze diagnostic (``experiments._policy.run_maze``) on gymnasium-robotics'
``AntMaze_UMaze-v5``: an 8-d torque action space and a 29-d observation (x, y, then ``Ant-v5``'s
27, D4RL's ant layout), where the offline actor must learn locomotion as well as navigation.
Data (``hexad.policy.antmaze_dataset``, cached): a scripted noisy oracle, in the manner of
D4RL's antmaze, i.e. a direction-commanded SAC ant trained online here
(``train_ant_controller``, cached) driven towards the next waypoint of the maze's shortest path,
with Gaussian action noise ``noise_std``; the task goal is the centre of cell (3, 1), the far
end of the U. At deployment each episode starts in cell (1, 1) and must reach a new goal drawn
uniformly within ``goal_shift`` (one cell) of the task goal, in free space at least 0.8 from a
wall. Success is D4RL's antmaze criterion, coming within 0.45 of the goal at any step of the
``episode_steps`` = 700-step episode; the return is the sum of exp(-distance) over the steps.

Command:  python -m experiments.policy_antmaze [--quick] [--out DIR] [--seed N] [--set k=v]
          The first full run trains the ant controller (``controller_steps`` = 400k SAC steps,
          about half an hour on 2 CPU cores; the ``controller_*`` fields are
          ``train_ant_controller``'s settings) and generates the data set (200k transitions);
          both are cached (named by every setting), so later full runs only train the offline
          networks. ``--quick`` needs nothing cached: it trains a tiny, untrained controller
          (64 SAC steps, 8 wide; seconds) and a small data set of its own, so its scripted
          oracle is a flailing ant, not the real controller.
          ``--resume`` restores the frozen networks through hexad.cachex.
Runtime:  --quick (10k transitions, 64-wide networks, 1000 updates each, 2 episodes of 300
          steps per method) on an empty cache, the tiny controller and data included: about
          2.5 min wall on 2 idle CPU cores. Full (10k updates for IQL, the prior and the IQL
          guide, 10 episodes per method): about 20 min on 2 CPU cores, excluding the cached
          controller and data set.

This study keeps the earlier diagnostic design (``experiments._policy.run_maze``: priors good /
degraded / random, selection on the evaluation episodes, SF + GPI); the decisive design with
held-out selection and bootstrap verdicts (``experiments._policy.run_decisive_seed``) is run by
``experiments.policy_pointmaze`` and ``experiments.policy_locomotion``. At this offline budget
neither the actor nor the prior learns to walk the ant, so AntMaze can show the paper's
zero-success diagnostic (a frozen actor that solves nothing) but not where the regime boundary
lies.

summary.json keys: those of the diagnostic (``_policy.actor_summary`` for the competent actor
and, prefixed ``incompetent_``, the incompetent one): ``actor_success``, ``actor_return``,
``poe_kl_budget_{success,return,alpha}_Q``, ``poe_kl_state_{success,return}_Q``,
``oracle_{success,return,alpha}_Q``, ``additive_{success,return}_Q``,
``additive_oracle_{success,return,alpha}_Q``, ``prior_only_{success,return}_Q``,
``sfgpi_{success,return}_Q``, ``poe_return_curve_Q``, ``poe_success_curve_Q``,
``additive_return_curve_Q``, ``iql_guided_*``, ``cql_guided_*`` (Q in good / degraded /
random); once ``alphas``, ``kl_budget``, ``scripted_oracle_{success,return}``,
``dataset_reward_frac``, ``iql_final_critic_loss``, ``prior_final_nll``, ``sf_final_loss``,
``sf_reward_fit_r2``, ``sf_library_size``, ``return_se``, ``success_se``, ``runtime_s``.
"""

from __future__ import annotations

import dataclasses
from functools import partial

from experiments import _policy, _runner
from hexad import policy
from hexad.data import offline_rl

PRIORS = _policy.PRIORS


@dataclasses.dataclass(frozen=True)
class Config(_policy.MazeConfig):
    n_transitions: int = 200_000
    noise_std: float = 0.2
    goal_shift: float = 4.0
    episode_steps: int = 700
    # The SAC ant controller (hexad.policy.train_ant_controller's settings; the
    # defaults are its own, the real controller; its cache folder is named by all of them).
    controller_steps: int = 400_000
    controller_chunk_steps: int = 50_000
    controller_n_envs: int = 4
    controller_hidden: int = 128
    controller_batch_size: int = 256
    controller_start_steps: int = 5000
    controller_episode_steps: int = 200

    def __post_init__(self):
        super().__post_init__()
        _runner.at_least(self, 1, "controller_steps", "controller_chunk_steps")
        _runner.at_least(self, 1, "controller_n_envs", "controller_hidden")
        _runner.at_least(self, 1, "controller_batch_size", "controller_episode_steps")
        _runner.at_least(self, 0, "controller_start_steps")
        steps, chunk, n = self.controller_steps, self.controller_chunk_steps, self.controller_n_envs
        _runner.require(
            chunk % n == 0 and steps % chunk == 0,
            ("controller_chunk_steps", "controller_steps", "controller_n_envs"),
            f"controller_chunk_steps must be a multiple of controller_n_envs={n} and "
            f"controller_steps a multiple of controller_chunk_steps, got {chunk}, {steps}",
        )

    def controller_kwargs(self) -> dict:
        """The keyword arguments of :func:`hexad.policy.train_ant_controller`."""
        return {
            "total_steps": self.controller_steps,
            "chunk_steps": self.controller_chunk_steps,
            "n_envs": self.controller_n_envs,
            "hidden": self.controller_hidden,
            "batch_size": self.controller_batch_size,
            "start_steps": self.controller_start_steps,
            "episode_steps": self.controller_episode_steps,
        }


# --quick: a tiny, untrained controller (64 SAC steps, 8-wide; the tests' sizes) that trains in
# seconds instead of the real one's 28 minutes, so --quick needs nothing cached.
QUICK_CONTROLLER = {
    "controller_steps": 64,
    "controller_chunk_steps": 32,
    "controller_n_envs": 4,
    "controller_hidden": 8,
    "controller_batch_size": 8,
    "controller_start_steps": 16,
    "controller_episode_steps": 20,
}


QUICK_SIZES = {
    "n_transitions": 10_000,
    "iql_steps": 1000,
    "bc_steps": 1000,
    "guide_iql_steps": 1000,
    "guide_cql_steps": 1000,
    "sf_steps": 1000,
    "n_episodes": 2,
    "episode_steps": 300,
}


def antmaze(cfg: Config, ctx: _runner.Context) -> _policy.Maze:
    """The AntMaze data set, geometry, evaluator and scripted oracle (trained and cached on
    first use)."""
    ckw = cfg.controller_kwargs()
    raw = policy.antmaze_dataset(
        cfg.n_transitions,
        seed=ctx.seed,
        noise_std=cfg.noise_std,
        controller_kwargs=ckw,
        progress=ctx.progress,
    )
    controller = policy.train_ant_controller(progress=ctx.progress, **ckw)  # cached: a load
    geom = offline_rl.antmaze_geometry()
    oracle = partial(offline_rl.antmaze_oracle, controller, geom=geom)
    return _policy.Maze(raw, geom, offline_rl.evaluate_antmaze, oracle, 0.2 * geom.scaling)


def run(cfg: Config, ctx: _runner.Context) -> dict:
    return _policy.run_maze(cfg, ctx, antmaze(cfg, ctx))


STUDY = _runner.Study(
    "policy_antmaze",
    Config,
    run,
    # Smaller than the maze diagnostic's --quick (the ant's simulation is the cost), with the tiny
    # controller and a small data set of its own, so --quick needs nothing cached.
    quick={**_policy.MAZE_QUICK, **QUICK_CONTROLLER, **QUICK_SIZES},
    doc=__doc__,
)

if __name__ == "__main__":
    STUDY.main()
