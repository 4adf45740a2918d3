"""PoE / KL composition of frozen offline actors of three competence levels with a
velocity-conditioned prior on MuJoCo locomotion (HalfCheetah, Hopper, Walker2d): the competence
ceiling and the claims of ``experiments.policy_pointmaze``, decided on held-out episodes with
the shared statistics module.

Data (``hexad.policy.locomotion_dataset``, cached npz with D4RL names): one SAC run of
``data_steps`` = 100k online steps on ``env`` per *data seed* (``data_seed``, shared by every
study seed), in checkpointed chunks of ``data_chunk_steps`` so that an interrupted generation
resumes where it stopped (the SAC run's checkpoints lie beside the cached files), gives the
*random*, *medium*, *expert* and *medium-replay* levels (snapshots every
``data_snapshot_every`` steps). Offline, IQL (rewards scaled by 1000 / (max - min trajectory
return), as the IQL reference) trains one frozen actor per level of ``levels``: ``medium``,
``medium_replay`` and ``medium_expert`` (medium and expert together). The good prior is
velocity-conditioned BC on the ``prior_data`` levels together (medium-replay, medium and
expert: a prior that has seen running at the speeds the actors are asked for), its goal the
hindsight mean x velocity over the next ``velocity_horizon`` steps. Priors (``priors``, the
precision-ratio family and the random-perturbation control), likelihood spaces, the
reward-free KL budget, the selection/test split and the driver are those of
``experiments.policy_pointmaze`` (see its docstring), with: the data-corrupted prior trained on
velocity goals shuffled across trajectories; one CQL guide (velocity-conditioned, trained on
the prior's data with the tracking reward of each transition's own goal); selection episodes
reset with seeds ``1000 s + 500 + i``, test episodes with ``1000 s + i`` (other starts).

Shifted objective, one per actor level: the actor of level L tracks ``v*_L =
target_velocity_frac`` times the mean x velocity of its own data (medium-expert: medium and
expert together) or of the ``target_floor`` level's data, whichever is faster; 1.5 asks each
actor to run faster than its data, and the floor (medium) asks the medium-replay actor to run
too. The zero action and the prior alone are scored on each level's task. The reward's
forward term becomes ``-|x_velocity - v*_L|`` (control cost and, for Hopper and Walker2d, the
healthy bonus kept). Metric: the raw shifted return of an ``episode_steps`` episode; the
episode ``length`` (survival, for Hopper and Walker2d) is reported beside it.
``actor_own_task_return``: each actor on its own task (the environment's reward) from the test
starts, with ``zero_return`` (the zero action on each level's shifted task) and the data's
snapshot returns (``data_*_return``) beside it.

Decision rules, stated before any run: those of ``experiments.policy_pointmaze``, per actor
level (the claims' names carry ``_<level>_<space>``), with the practical margin ``delta`` =
``margin_per_step`` x ``episode_steps`` = 50 return points over a 1000-step episode (2.5 at
``--quick``'s 50 steps) on every task, and one more gate on every claim: the data has at least
100k SAC steps (``data_steps``); below that every claim is "not tested" (``data_admissible``).
The competence ceiling reads ``capped_medium_expert_<space>`` (the competent actor: the good
prior at its oracle alpha helps by less than delta, tested only if the good prior alone does
not beat that actor) and ``responsive_medium_replay_<space>`` (the weak actor: it helps,
tested only if the good prior alone decidedly beats it, the precondition that the prior knows
better), both only if the random-perturbation control (the good prior's precision and step in
a random direction, at the same alpha) does not help. Every level gets both claims; the
others are reported. Each env is its own part (``--set env=...``); with ``data_only`` a run
generates (or resumes) its data set and stops, so the long generation can be a sitting of its
own.

Deviations from the references (D4RL: 1M transitions per level; IQL: 1e6 updates, 256-wide,
cosine actor schedule): 100k SAC steps and 20k transitions per level, 128-wide networks, 5000
updates each at a constant learning rate, 3 seeds, 3 selection and 10 test episodes of 1000
steps per row, the priors ``good``, ``param_noise``, ``output_noise_x3``, ``data_corrupted``,
``random_wide``; CQL with 10 action samples but a fixed entropy coefficient.

Command:  python -m experiments.policy_locomotion [--quick] [--out DIR] [--seed N] [--set k=v]
          One env per run (``--set env=Hopper-v5``; the parts of the full study). The data are
          generated once per data seed and cached (``--set data_only=true`` only generates
          them, resumably); each seed's networks are checkpointed through hexad.cachex in
          ``--ckpt``/seed<s>; ``--resume`` restores them.
Runtime:  --quick (3000 SAC steps in chunks of 1000, 64-wide, 1000 updates, 1 seed, 2
          selection and 3 test episodes of 50 steps, ratios 0.25, 1 and 4): 3.3 min wall
          measured from an empty data cache on 2 CPU cores shared with other runs (load about
          5.5; the earlier design's 2 min was on idle cores). Full, per env: the data about
          20 min of CPU per 100k SAC steps (5k steps took about 1 min on 2 cores, linear in
          the steps; not yet run at 100k); the study not yet measured at this design (the
          earlier one took about 44 min for HalfCheetah with 6 test episodes and a similar
          number of rows; with 10, expect about an hour per env).

summary.json keys: those of ``experiments.policy_pointmaze`` with ``_<level>_<space>`` in
place of ``_<space>`` (``verdict_graceful_Q_<level>_<space>``, ...,
``precision_ratio_prediction_<level>_<space>``, ``selector_regret_<level>_<space>``, ...,
``kl_budget_nats_<level>_<space>``, ...), ``actor_length_<level>_<space>``,
``poe_kl_length_Q_<level>_<space>``, ``prior_only_length_Q_<level>_<space>`` in place of the
success keys, and the regrets over every level ``selector_regret_<space>``,
``fixed_regret_<space>``, ``actor_regret_<space>`` (with ``_ci_low``, ``_ci_high``,
``_outcome``); no ``iql`` guide keys (``cql_guided_return_<level>_pretanh``,
``cql_guided_shift_<level>_pretanh``, ``cql_guided_minus_actor_<level>_pretanh``); per level
(the first without a prefix, ``medium_replay_`` / ``medium_expert_`` for the others):
``target_velocity``, ``zero_return`` (test episodes), ``zero_select_return`` (selection
episodes); once: ``env``, ``data_seed``, ``data_steps``, ``data_admissible``,
``data_random_return``, ``data_medium_return``, ``data_expert_return``, ``reward_scale``, and
the shared ``alphas``, ``priors``, ``spaces``, ``levels``, ``precision_ratios``, ``margin``,
``stat_alpha``, ``stat_unit``, ``kl_budget_fraction``, ``kl_budgets_nats``, ``n_seeds``,
``n_select``, ``n_test``, ``claims``, ``precision_ratio_prediction``, ``runtime_s``. With
``data_only``: ``env``, ``data_seed``, ``data_steps``, ``data_admissible``, the
``data_*_return`` keys, ``data_only`` and ``runtime_s`` only.
"""

from __future__ import annotations

import dataclasses

from experiments import _policy, _runner
from hexad import policy
from hexad.data import offline_rl

LEVELS = ("medium", "medium_replay", "medium_expert")
MIN_DATA_STEPS = 100_000  # the SAC steps below which no claim is tested


@dataclasses.dataclass(frozen=True)
class Config(_policy.PolicyConfig):
    env: str = "HalfCheetah-v5"
    levels: tuple[str, ...] = LEVELS
    data_seed: int = 0
    data_only: bool = False
    data_steps: int = 100_000
    data_hidden: int = 64
    data_per_level: int = 20_000
    data_start_steps: int = 2000
    data_snapshot_every: int = 5000
    data_chunk_steps: int = 5000
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
    margin_per_step: float = 0.05
    guides: tuple[str, ...] = ("cql",)
    n_seeds: int = 3
    n_select: int = 3
    n_test: int = 10
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
        _runner.at_least(self, 1, "data_snapshot_every", "data_chunk_steps", "data_eval_steps")
        _runner.at_least(self, 0, "data_start_steps", "data_seed")
        every, chunk, steps = self.data_snapshot_every, self.data_chunk_steps, self.data_steps
        _runner.require(
            chunk % every == 0 and steps % chunk == 0 and every % 4 == 0,
            ("data_chunk_steps", "data_snapshot_every", "data_steps"),
            f"data_chunk_steps must be a multiple of data_snapshot_every (itself a multiple of "
            f"the 4 SAC envs) and divide data_steps, got {chunk}, {every}, {steps}",
        )

    def data(self, level: str, progress=None) -> dict:
        names = ("data_start_steps", "data_snapshot_every", "data_eval_steps", "data_chunk_steps")
        kw = {k.removeprefix("data_"): getattr(self, k) for k in names}
        return policy.locomotion_dataset(
            self.env,
            level,
            self.data_steps,
            seed=self.data_seed,
            n_per_level=self.data_per_level,
            hidden=self.data_hidden,
            progress=progress,
            **kw,
        )


def data_keys(cfg: Config, raw: dict) -> dict:
    """The data's figures: its seed, size, admissibility and snapshot returns."""
    m = raw["medium"]
    return {
        "env": cfg.env,
        "data_seed": cfg.data_seed,
        "data_steps": cfg.data_steps,
        "data_admissible": cfg.data_steps >= MIN_DATA_STEPS,
        "data_random_return": float(m["meta/random_return"]),
        "data_medium_return": float(m["meta/policy_return"]),
        "data_expert_return": float(m["meta/expert_return"]),
    }


def run(cfg: Config, ctx: _runner.Context) -> dict:
    raw = {lv: cfg.data(lv, ctx.progress) for lv in ("medium", "expert", "medium-replay")}
    out = data_keys(cfg, raw)
    if cfg.data_only:
        return out | {"data_only": True}
    failed = [] if out["data_admissible"] else [f"the data is below {MIN_DATA_STEPS} SAC steps"]
    setup_fn = lambda seed, key: _policy.locomotion_setup(cfg, ctx, raw, seed, key)  # noqa: E731
    return _policy.run(cfg, ctx, setup_fn, list(cfg.levels), failed) | out


STUDY = _runner.Study(
    "policy_locomotion",
    Config,
    run,
    quick={
        **_policy.QUICK,
        "data_steps": 3000,
        "data_per_level": 5000,
        "data_start_steps": 1000,
        "data_snapshot_every": 1000,
        "data_chunk_steps": 1000,
        "data_eval_steps": 200,
        "episode_steps": 50,
        "precision_ratios": (0.25, 1.0, 4.0),
    },
    doc=__doc__,
    resume_shared=("target_floor", "data_only"),  # the networks depend on neither
)

if __name__ == "__main__":
    STUDY.main()
