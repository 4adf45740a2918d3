"""PoE / KL composition of a frozen offline actor with goal-conditioned priors on AntMaze:
the claims of ``experiments.policy_pointmaze`` on an 8-d torque action space.

The one driver of the policy studies (``experiments._policy``) on gymnasium-robotics'
``AntMaze_UMaze-v5``: a 29-d observation (x, y, then ``Ant-v5``'s 27, D4RL's ant layout), where
the offline actor must learn locomotion as well as navigation. Data
(``hexad.policy.antmaze_dataset``, cached; data seed = study seed): a scripted noisy oracle, in
the manner of D4RL's antmaze, i.e. a direction-commanded SAC ant trained online here
(``train_ant_controller``, cached) driven towards the next waypoint of the maze's shortest path,
with Gaussian action noise ``noise_std``; the task goal is the centre of cell (3, 1), the far
end of the U. At deployment each episode starts in cell (1, 1) and must reach a new goal drawn
uniformly within ``goal_shift`` (one cell) of the task goal, in free space at least 0.8 from a
wall. The return is the sum of exp(-distance) over the ``episode_steps`` = 700 steps and
decides; success, D4RL's antmaze criterion (within 0.45 of the goal at any step), is reported.

Priors, likelihood spaces, the reward-free KL budget, the selection/test split and the decision
rules are those of ``experiments.policy_pointmaze`` (see its docstring), with the practical
margin ``delta`` = ``margin_per_step`` x ``episode_steps`` = 7 return points over a 700-step
episode (1.5 at ``--quick``'s 150 steps), one seed by default (so the paired units are the test
episodes), and the guides of the driver (IQL and CQL). At this offline budget neither the
actor nor the prior learns to walk the ant, so the actor seldom beats the zero action and the
claims are expected to be "not tested": AntMaze shows the paper's zero-success diagnostic (a
frozen actor that solves nothing), not where the regime boundary lies. (The earlier design's
SF + GPI rows and incompetent-snapshot actor are not part of the one driver.)

Command:  python -m experiments.policy_antmaze [--quick] [--out DIR] [--seed N] [--set k=v]
          The first full run trains the ant controller (``controller_steps`` = 400k SAC steps,
          about half an hour on 2 CPU cores; the ``controller_*`` fields are
          ``train_ant_controller``'s settings) and generates the data set (200k transitions);
          both are cached (named by every setting), so later full runs only train the offline
          networks. ``--quick`` needs nothing cached: it trains a tiny, untrained controller
          (64 SAC steps, 8 wide; seconds) and a small data set of its own, so its scripted
          oracle is a flailing ant, not the real controller.
          ``--resume`` restores the frozen networks through hexad.cachex.
Runtime:  --quick (10k transitions, 64-wide networks, 1000 updates each, the priors good,
          param_noise and random_init, ratios 0.25, 1 and 4, 2 selection and 3 test episodes
          of 150 steps per row) on an empty cache, the tiny controller and data included:
          3.2 min wall measured on 2 CPU cores shared with other runs (load about 5.5).
          Full (5000 updates for IQL, the priors and the guides; 10 selection and 20 test
          episodes of 700 steps per row; one seed): not yet measured at this design (the
          earlier diagnostic took about 20 min with 10 episodes per row); expect about an
          hour, excluding the cached controller and data set.

summary.json keys: those of ``experiments.policy_pointmaze`` (one actor level, so the claims
end in ``_<space>``), the scripted oracle's ``scripted_oracle_return`` and
``scripted_oracle_success`` on the test goals, ``dataset_reward_frac`` (the share of rewarded
transitions in the data) and ``runtime_s``.
"""

from __future__ import annotations

import dataclasses
from functools import partial

from experiments import _policy, _runner
from hexad import policy
from hexad.data import offline_rl


@dataclasses.dataclass(frozen=True)
class Config(_policy.PolicyConfig):
    n_transitions: int = 200_000
    noise_std: float = 0.2
    goal_shift: float = 4.0
    episode_steps: int = 700
    n_seeds: int = 1
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
        _runner.at_least(self, 1, "n_transitions")
        _runner.at_least(self, 0, "noise_std", "goal_shift")
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
    "episode_steps": 150,
    "priors": ("good", "param_noise", "random_init"),
    "precision_ratios": (0.25, 1.0, 4.0),
}


def setup(cfg: Config, ctx, seed: int, key) -> tuple[_policy.Setup, dict]:
    """One seed's AntMaze data (the controller trained and cached on first use), episodes and
    evaluator."""
    ckw = cfg.controller_kwargs()
    raw = policy.antmaze_dataset(
        cfg.n_transitions,
        seed=seed,
        noise_std=cfg.noise_std,
        controller_kwargs=ckw,
        progress=ctx.progress,
    )
    controller = policy.train_ant_controller(progress=ctx.progress, **ckw)  # cached: a load
    geom = offline_rl.antmaze_geometry()
    oracle = partial(offline_rl.antmaze_oracle, controller, geom=geom)
    evaluate, margin = offline_rl.evaluate_antmaze, 0.2 * geom.scaling
    st, extra = _policy.maze_setup(cfg, ctx, seed, key, raw, geom, evaluate, oracle, margin)
    return st, extra | {"dataset_reward_frac": float(raw["rewards"].mean())}


def run(cfg: Config, ctx: _runner.Context) -> dict:
    return _policy.run(cfg, ctx, lambda seed, key: setup(cfg, ctx, seed, key), ["task"])


STUDY = _runner.Study(
    "policy_antmaze",
    Config,
    run,
    # The ant's simulation is the cost: the shared --quick sizes with 150-step episodes, three
    # priors and three ratios, the tiny controller and a small data set of its own, so --quick
    # needs nothing cached.
    quick={**_policy.QUICK, **QUICK_CONTROLLER, **QUICK_SIZES},
    doc=__doc__,
)

if __name__ == "__main__":
    STUDY.main()
