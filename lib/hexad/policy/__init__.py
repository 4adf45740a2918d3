"""Product-of-experts / KL-regularised composition of frozen offline-RL actors.

Closed forms (diagonal-Gaussian PoE, KL-regularised solution, KL, additive and prior-only
adaptation, KL-budget selectors) and the offline-RL stack they compose (BC, IQL, CQL,
goal-conditioned priors, successor features + GPI) in the init/step shape of
:class:`hexad._base.Algorithm`, online SAC for the behaviour policies, and the deployment-time
composition layer: :class:`Method`, a table's :class:`Row` s, an :class:`ExpertLibrary` and
:func:`compose`, which acts for a batch of rows that may each use another method.
"""

from hexad.policy._behaviour import (
    ANT_CONTROLLER_DEFAULTS,
    REPLAY_FIELDS,
    AntController,
    OnlineEnv,
    OnlineResult,
    ant_controller_spec,
    antmaze_dataset,
    generate_locomotion,
    locomotion_dataset,
    train_ant_controller,
    train_online,
)
from hexad.policy._compose import ExpertLibrary, Method, Row, compose, stack_rows
from hexad.policy._gaussian import (
    DiagGaussian,
    additive,
    kl_budget_alpha,
    kl_budget_alpha_per_state,
    kl_diag_gaussian,
    kl_regularised,
    poe,
    poe_kl_to_actor,
    prior_only,
    squash,
)
from hexad.policy._networks import (
    MLP,
    GaussianActor,
    TwinCritic,
    ValueNet,
    gaussian_log_prob,
    sample_action,
)
from hexad.policy._offline import (
    Batch,
    BCInfo,
    CQLInfo,
    CQLState,
    IQLInfo,
    IQLState,
    batch_from_dataset,
    bc,
    cql,
    expectile_loss,
    iql,
    make_train,
)
from hexad.policy._online import SACInfo, SACState, sac, soft_td_target
from hexad.policy._priors import (
    degrade_params,
    future_goal_indices,
    hindsight_mean,
    trajectory_ends,
)
from hexad.policy._sf import (
    SFBatch,
    SFInfo,
    SFState,
    SuccessorFeatures,
    gpi,
    sf_td,
    task_weights,
)
from hexad.policy._steering import q_steer

__all__ = [
    "ANT_CONTROLLER_DEFAULTS",
    "MLP",
    "REPLAY_FIELDS",
    "AntController",
    "BCInfo",
    "Batch",
    "CQLInfo",
    "CQLState",
    "DiagGaussian",
    "ExpertLibrary",
    "GaussianActor",
    "IQLInfo",
    "IQLState",
    "Method",
    "OnlineEnv",
    "OnlineResult",
    "Row",
    "SACInfo",
    "SACState",
    "SFBatch",
    "SFInfo",
    "SFState",
    "SuccessorFeatures",
    "TwinCritic",
    "ValueNet",
    "additive",
    "ant_controller_spec",
    "antmaze_dataset",
    "batch_from_dataset",
    "bc",
    "compose",
    "cql",
    "degrade_params",
    "expectile_loss",
    "future_goal_indices",
    "gaussian_log_prob",
    "generate_locomotion",
    "gpi",
    "hindsight_mean",
    "iql",
    "kl_budget_alpha",
    "kl_budget_alpha_per_state",
    "kl_diag_gaussian",
    "kl_regularised",
    "locomotion_dataset",
    "make_train",
    "poe",
    "poe_kl_to_actor",
    "prior_only",
    "q_steer",
    "sac",
    "sample_action",
    "sf_td",
    "soft_td_target",
    "squash",
    "stack_rows",
    "task_weights",
    "train_ant_controller",
    "train_online",
    "trajectory_ends",
]
