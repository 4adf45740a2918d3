r"""Pref-MH: exact Metropolis-Hastings chains driven only by pairwise comparisons.

A judge that follows the Bradley-Terry model prefers :math:`y` over :math:`x` with probability
:math:`\pi(y) / (\pi(x) + \pi(y))`: its odds are the MH density ratio. Pref-MH turns its
sampled binary outcomes into an exact reversible chain; with a budget of :math:`K` comparisons,
of which the proposal wins :math:`k`, the rule

.. math::

   a^*(k) = \min\Big(1, \frac{\rho\, k}{K + 1 - k}\Big)

is Peskun-optimal (:math:`\rho` is the part of the MH ratio the judge does not see).

Judges, proposals, acceptance rules, the kernel
(:func:`prefmh`: ``(init, step)`` in the BlackJAX shape), the chain runner
(:func:`run_chains`), diagnostics (ESS, R-hat, sliced W1, grid TV) and two small generators
to tilt (:func:`fit_ppca`, :func:`fit_trigram`).

>>> import jax, jax.numpy as jnp
>>> from hexad import prefmh
>>> judge = prefmh.bradley_terry_judge(lambda x: -0.5 * jnp.sum(x**2))
>>> algo = prefmh.prefmh(judge, prefmh.random_walk(1.0), rule="kbudget", num_comparisons=3)
>>> out = prefmh.run_chains(jax.random.key(0), algo, jnp.zeros((8, 2)), 200, burn_in=100)
"""

from hexad.prefmh._diagnostics import (
    effective_sample_size,
    grid_tv,
    potential_scale_reduction,
    sliced_w1,
)
from hexad.prefmh._generators import PPCA, Trigram, fit_ppca, fit_trigram, trigram_sampler
from hexad.prefmh._judges import (
    BTConsistency,
    Judge,
    JudgeCounter,
    bradley_terry_judge,
    bt_consistency,
    classifier_judge,
    external_judge,
    pullback_judge,
)
from hexad.prefmh._kernels import (
    PrefMHInfo,
    PrefMHState,
    SamplingAlgorithm,
    build_kernel,
    init,
    prefmh,
)
from hexad.prefmh._proposals import autoregressive, independent, latent_random_walk, random_walk
from hexad.prefmh._rules import (
    RULES,
    acceptance_probability,
    barker_acceptance,
    kbudget_acceptance,
    majority_acceptance,
    mh_acceptance,
    two_coin_acceptance,
)
from hexad.prefmh._runner import ChainResult, run_chains

__all__ = [
    "PPCA",
    "RULES",
    "BTConsistency",
    "ChainResult",
    "Judge",
    "JudgeCounter",
    "PrefMHInfo",
    "PrefMHState",
    "SamplingAlgorithm",
    "Trigram",
    "acceptance_probability",
    "autoregressive",
    "barker_acceptance",
    "bradley_terry_judge",
    "bt_consistency",
    "build_kernel",
    "classifier_judge",
    "effective_sample_size",
    "external_judge",
    "fit_ppca",
    "fit_trigram",
    "grid_tv",
    "independent",
    "init",
    "kbudget_acceptance",
    "latent_random_walk",
    "majority_acceptance",
    "mh_acceptance",
    "potential_scale_reduction",
    "prefmh",
    "pullback_judge",
    "random_walk",
    "run_chains",
    "sliced_w1",
    "trigram_sampler",
    "two_coin_acceptance",
]
