"""Product-of-experts / KL-regularised composition of frozen offline-RL actors.

Closed forms (diagonal-Gaussian PoE, KL-regularised solution, KL, additive and prior-only
adaptation, KL-budget selectors) and the offline-RL stack they compose (BC, IQL, CQL,
goal-conditioned priors, successor features + GPI) in the init/step shape, and online SAC for
the behaviour policies.
"""

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
    BCState,
    CQLState,
    IQLState,
    OfflineAlgorithm,
    batch_from_dataset,
    bc,
    cql,
    expectile_loss,
    iql,
    make_train,
)
from hexad.policy._online import SACInfo, SACState, sac, soft_td_target
from hexad.policy._priors import degrade_params, future_goal_indices, trajectory_ends
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
    "MLP",
    "BCState",
    "Batch",
    "CQLState",
    "GaussianActor",
    "IQLState",
    "OfflineAlgorithm",
    "TwinCritic",
    "ValueNet",
    "batch_from_dataset",
    "bc",
    "cql",
    "expectile_loss",
    "gaussian_log_prob",
    "iql",
    "make_train",
    "sample_action",
    "degrade_params",
    "future_goal_indices",
    "trajectory_ends",
    "q_steer",
    "SFBatch",
    "SFInfo",
    "SFState",
    "SuccessorFeatures",
    "gpi",
    "sf_td",
    "task_weights",
    "SACInfo",
    "SACState",
    "sac",
    "soft_td_target",
    "DiagGaussian",
    "additive",
    "kl_budget_alpha",
    "kl_budget_alpha_per_state",
    "kl_diag_gaussian",
    "kl_regularised",
    "poe",
    "poe_kl_to_actor",
    "prior_only",
    "squash",
]
