"""Product-of-experts / KL-regularised composition of frozen offline-RL actors.

Closed forms (diagonal-Gaussian PoE, KL-regularised solution, KL, additive and prior-only
adaptation, KL-budget selectors) and the offline-RL stack they compose (BC, IQL, CQL,
goal-conditioned priors) in the init/step shape.
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

__all__ = [
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
