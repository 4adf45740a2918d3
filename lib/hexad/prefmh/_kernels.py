"""Pref-MH kernels in the BlackJAX shape: ``init``, ``build_kernel`` and the factory ``prefmh``.

One step: propose ``y`` from ``x`` (with ``log_rho``), ask the judge, accept with the rule's
probability. Rules (see :mod:`hexad.prefmh._rules`):

- ``"kbudget"``: ``K`` comparisons, accept with ``a*(W) = min(1, rho W / (K + 1 - W))``
  (Pref-MH's Peskun-optimal exact rule; ``K = 1``, ``rho = 1``: accept iff ``y`` wins, Barker).
- ``"two_coin"``: the two-coin Bernoulli factory (Goncalves, Latuszynski & Roberts 2017),
  exact Barker-type acceptance ``rho p / (rho p + 1 - p)`` for asymmetric proposals with a
  random number of comparisons (at most ``max_rounds``; a step cut there rejects and is
  flagged in ``Info``; the cut keeps detailed balance, see
  :func:`~hexad.prefmh.two_coin_acceptance`, so it lowers acceptance, not exactness).
- ``"majority"``: accept iff most of ``K`` comparisons prefer ``y`` (inexact baseline).
- ``"mh"`` / ``"barker_oracle"``: the exact-density rules from the judge's known log-odds
  (verification; no comparisons).

The returned :class:`SamplingAlgorithm` has the fields of ``blackjax.base.SamplingAlgorithm``,
so ``blackjax.util.run_inference_algorithm`` runs it unchanged. Kernels are pure; jit them
and vmap over chains.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from hexad._base import check_int
from hexad.prefmh._judges import Judge
from hexad.prefmh._rules import (
    RULES,
    barker_acceptance,
    check_num_comparisons,
    kbudget_acceptance,
    majority_acceptance,
    mh_acceptance,
)

__all__ = ["PrefMHInfo", "PrefMHState", "SamplingAlgorithm", "build_kernel", "init", "prefmh"]


class PrefMHState(NamedTuple):
    """State of one chain.

    Attributes:
      position: ``[...]`` the current candidate (an array; latent code for latent moves).
      features: the judge's features of ``position`` (``Judge.features``), cached so that a
        step featurises only the proposal; ``None`` for a judge that sees the candidate.
    """

    position: jax.Array
    features: Any = None


class PrefMHInfo(NamedTuple):
    """What one step did.

    Attributes:
      acceptance_rate: ``[]`` float, the acceptance probability given the outcomes (``a(W)``;
        for ``"two_coin"`` the factory's 0/1 output).
      is_accepted: ``[]`` bool.
      wins: ``[]`` int32, comparisons won by the proposal.
      judge_calls: ``[]`` int32, comparisons this chain's step used. For ``"two_coin"``
        under ``jax.vmap`` a host judge (:func:`~hexad.prefmh.external_judge`) sees more:
        the vmapped ``while_loop`` runs every chain's round until the slowest chain is done,
        so its counter grows by ``chains * max(rounds)`` per step, not ``sum(judge_calls)``
        (the finished chains' extra outcomes are discarded; the chains are unaffected).
      valid: ``[]`` bool, False if an outcome was not binary or ``log_rho`` was NaN / ``+inf``.
      truncated: ``[]`` bool, the two-coin factory hit ``max_rounds`` (step rejected; exact
        all the same, see :func:`~hexad.prefmh.two_coin_acceptance`).
      proposal: ``[...]`` the proposed candidate.
    """

    acceptance_rate: jax.Array
    is_accepted: jax.Array
    wins: jax.Array
    judge_calls: jax.Array
    valid: jax.Array
    truncated: jax.Array
    proposal: jax.Array


class SamplingAlgorithm(NamedTuple):
    """``(init, step)``, field-compatible with ``blackjax.base.SamplingAlgorithm``."""

    init: Callable[..., PrefMHState]
    step: Callable[..., tuple[PrefMHState, PrefMHInfo]]


def init(position: jax.Array, judge: Judge) -> PrefMHState:
    """Returns the initial state at ``position`` with the judge's features cached.

    Args:
      position: ``[...]`` the initial candidate.
      judge: the chain's judge.

    >>> from hexad.prefmh import bradley_terry_judge
    >>> judge = bradley_terry_judge(lambda x: -0.5 * jnp.sum(x**2))
    >>> init(jnp.zeros(2), judge).features.shape
    ()
    """
    if not isinstance(judge, Judge):
        raise TypeError(f"judge: expected a hexad.prefmh.Judge, got {type(judge).__name__}")
    position = jnp.asarray(position)
    features = None if judge.features is None else judge.features(position)
    return PrefMHState(position=position, features=features)


def _check_outcomes(outcomes: jax.Array, num: int) -> jax.Array:
    outcomes = jnp.asarray(outcomes)
    if outcomes.shape != (num,):
        raise ValueError(
            f"judge.compare: expected outcomes of shape ({num},), got shape {outcomes.shape}"
        )
    if not (jnp.issubdtype(outcomes.dtype, jnp.integer) or outcomes.dtype == jnp.bool_):
        raise TypeError(
            f"judge.compare: expected integer or bool outcomes in {{0, 1}}, got {outcomes.dtype}"
        )
    return outcomes.astype(jnp.int32)


def _uniforms(words: jax.Array, wide: bool) -> jax.Array:
    """Uniforms in ``[0, 1)`` from 32-bit words: one word each in float32, two in float64."""
    if wide:
        pairs = words.reshape(-1, 2).astype(jnp.uint64)
        w = (pairs[:, 0] << 32) | pairs[:, 1]
        one = jnp.uint64(0x3FF0000000000000)
        return jax.lax.bitcast_convert_type((w >> 12) | one, jnp.float64) - 1.0
    one = jnp.uint32(0x3F800000)
    return jax.lax.bitcast_convert_type((words >> 9) | one, jnp.float32) - 1.0


def _step_randomness(key: jax.Array, ftype, num_uniforms: int):
    """Returns ``(proposal key, judge key, acceptance uniform, comparison uniforms)``.

    All from one draw of random bits: ``m`` words per key and one word per uniform (two in
    float64). ``jax.random.split(key, 3)`` and a uniform from the third key cost four draws;
    one ``random_bits`` of the same words gives the same independent streams in one, which is
    most of a small-target step's cost (the random-walk MH step it is measured against makes
    three draws). With ``num_uniforms > 0`` (a judge with ``compare_uniforms``) the
    comparisons' uniforms come from the same draw and the judge key is ``None``; with 0 the
    judge key is drawn and the uniforms are ``None``.
    """
    typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    if not typed:
        key = jax.random.wrap_key_data(key)
    impl = jax.random.key_impl(key)
    m = jax.random.key_data(key).shape[-1]
    wide = jnp.dtype(ftype).itemsize == 8
    per = 2 if wide else 1
    n_keys = 1 if num_uniforms else 2
    words = jax.random.bits(key, (n_keys * m + per * (1 + num_uniforms),), jnp.uint32)
    k_prop = jax.random.wrap_key_data(words[:m], impl=impl)
    k_judge = None if num_uniforms else jax.random.wrap_key_data(words[m : 2 * m], impl=impl)
    u = _uniforms(words[n_keys * m :], wide).astype(ftype)
    return k_prop, k_judge, u[0], (u[1:] if num_uniforms else None)


def _validate(judge, proposal, rule, num_comparisons, max_rounds):
    if not isinstance(judge, Judge):
        raise TypeError(f"judge: expected a hexad.prefmh.Judge, got {type(judge).__name__}")
    if not callable(proposal):
        raise TypeError(f"proposal: expected a callable, got {type(proposal).__name__}")
    if rule not in RULES:
        raise ValueError(f"rule: expected one of {RULES}, got {rule!r}")
    num_comparisons = check_num_comparisons(num_comparisons)
    if rule in ("mh", "barker_oracle") and judge.log_odds_features is None:
        raise ValueError(f"rule={rule!r} needs a judge with known log_odds; this judge has none")
    return num_comparisons, check_int("max_rounds", max_rounds)


def build_kernel(
    judge: Judge,
    proposal: Callable[[jax.Array, Any], tuple[jax.Array, jax.Array]],
    rule: str = "kbudget",
    num_comparisons: int = 1,
    max_rounds: int = 1000,
) -> Callable[[jax.Array, PrefMHState], tuple[PrefMHState, PrefMHInfo]]:
    """Returns ``kernel(key, state) -> (state, info)``, one Pref-MH step.

    Args:
      judge: a :class:`~hexad.prefmh.Judge`.
      proposal: ``propose(key, x) -> (y, log_rho)``, such as :func:`~hexad.prefmh.random_walk`.
      rule: (static) one of ``"kbudget"``, ``"two_coin"``, ``"majority"``, ``"mh"``,
        ``"barker_oracle"``.
      num_comparisons: (static) the budget ``K >= 1`` (``"kbudget"``, ``"majority"``).
      max_rounds: (static) bound on the two-coin factory's rounds; a step that reaches it
        rejects, which keeps the chain exact (the acceptance is
        ``acceptance_probability("two_coin", ..., max_rounds=max_rounds)``). Vmapped over chains,
        every chain makes a comparison in each round until all are done: a host judge is
        asked ``chains * max(rounds)`` comparisons a step, more than the sum of
        ``info.judge_calls`` (which counts each chain's own rounds).

    >>> from hexad.prefmh import bradley_terry_judge, random_walk
    >>> judge = bradley_terry_judge(lambda x: -0.5 * jnp.sum(x**2))
    >>> kernel = build_kernel(judge, random_walk(1.0), "kbudget", 3)
    >>> state, info = kernel(jax.random.key(0), init(jnp.zeros(2), judge))
    >>> int(info.judge_calls)
    3
    """
    num_comparisons, max_rounds = _validate(judge, proposal, rule, num_comparisons, max_rounds)
    # The K comparisons' uniforms come with the step's other random bits when the judge can
    # take them; the two-coin factory draws per round, so it keeps a judge key.
    in_graph = judge.compare_uniforms is not None and rule in ("kbudget", "majority")

    def kernel(key, state):
        ftype = jnp.result_type(float)
        n_u = num_comparisons if in_graph else 0
        k_prop, k_judge, u_acc, u_cmp = _step_randomness(key, ftype, n_u)
        x = state.position
        y, log_rho = proposal(k_prop, x)
        y = jnp.asarray(y)
        if y.shape != x.shape:
            raise ValueError(f"proposal: expected y of shape {x.shape}, got {y.shape}")
        cached = judge.features is not None
        fx = state.features if cached else x
        fy = judge.features(y) if cached else y
        log_rho = jnp.asarray(log_rho)
        if log_rho.shape != ():
            raise ValueError(f"proposal: expected a scalar log_rho, got shape {log_rho.shape}")
        valid = ~jnp.isnan(log_rho) & (log_rho < jnp.inf)
        truncated = jnp.zeros((), jnp.bool_)
        if rule in ("mh", "barker_oracle"):
            log_ratio = jnp.asarray(judge.log_odds_features(fx, fy)) + log_rho
            valid = valid & ~jnp.isnan(log_ratio)
            fn = mh_acceptance if rule == "mh" else barker_acceptance
            a = fn(log_ratio).astype(ftype)
            wins = jnp.zeros((), jnp.int32)
            calls = jnp.zeros((), jnp.int32)
            accept = u_acc < a
        elif rule in ("kbudget", "majority"):
            if in_graph:
                outcomes = judge.compare_uniforms(u_cmp, fx, fy)
            else:
                outcomes = judge.compare_features(k_judge, fx, fy, num_comparisons)
            outcomes = _check_outcomes(outcomes, num_comparisons)
            valid = valid & jnp.all((outcomes == 0) | (outcomes == 1))
            wins = jnp.sum(outcomes).astype(jnp.int32)
            if rule == "kbudget":
                a = kbudget_acceptance(wins, num_comparisons, log_rho).astype(ftype)
            else:
                a = majority_acceptance(wins, num_comparisons).astype(ftype)
            calls = jnp.asarray(num_comparisons, jnp.int32)
            accept = u_acc < a
        else:  # two_coin
            # Coin 1 ("y wins", weight rho) vs coin 2 ("x wins", weight 1): pick coin 1 with
            # probability rho / (1 + rho), make one comparison; y wins on coin 1 -> accept,
            # x wins on coin 2 -> reject, otherwise repeat (Goncalves et al. 2017).
            p_coin1 = jax.nn.sigmoid(log_rho)

            def cond(carry):
                _, done, _, rounds, _, _ = carry
                return ~done & (rounds < max_rounds)

            def body(carry):
                k, _, _, rounds, wins, ok = carry
                k, k_coin, k_cmp = jax.random.split(k, 3)
                outcome = _check_outcomes(judge.compare_features(k_cmp, fx, fy, 1), 1)[0]
                ok = ok & ((outcome == 0) | (outcome == 1))
                coin1 = jax.random.uniform(k_coin, (), ftype) < p_coin1
                done = jnp.where(coin1, outcome == 1, outcome == 0) | ~ok
                acc = coin1 & (outcome == 1) & ok
                return k, done, acc, rounds + 1, wins + (outcome == 1).astype(jnp.int32), ok

            carry = (
                k_judge,
                jnp.zeros((), jnp.bool_),
                jnp.zeros((), jnp.bool_),
                jnp.zeros((), jnp.int32),
                jnp.zeros((), jnp.int32),
                valid,
            )
            _, done, accept, calls, wins, valid = jax.lax.while_loop(cond, body, carry)
            truncated = ~done
            a = accept.astype(ftype)
        accept = accept & valid
        new_position = jnp.where(accept, y, x)
        new_features = None
        if cached:
            new_features = jax.tree.map(lambda a, b: jnp.where(accept, a, b), fy, fx)
        info = PrefMHInfo(
            acceptance_rate=a,
            is_accepted=accept,
            wins=wins,
            judge_calls=calls,
            valid=valid,
            truncated=truncated,
            proposal=y,
        )
        return PrefMHState(new_position, new_features), info

    return kernel


def prefmh(
    judge: Judge,
    proposal: Callable,
    rule: str = "kbudget",
    num_comparisons: int = 1,
    max_rounds: int = 1000,
) -> SamplingAlgorithm:
    """Returns the Pref-MH sampling algorithm ``(init, step)`` (BlackJAX top-level shape).

    Args:
      judge: a :class:`~hexad.prefmh.Judge`.
      proposal: ``propose(key, x) -> (y, log_rho)``.
      rule: (static) acceptance rule, see :func:`build_kernel`.
      num_comparisons: (static) comparison budget ``K``.
      max_rounds: (static) bound on the two-coin factory's rounds.

    >>> from hexad.prefmh import bradley_terry_judge, random_walk
    >>> algo = prefmh(bradley_terry_judge(lambda x: -0.5 * jnp.sum(x**2)), random_walk(1.0))
    >>> state, info = jax.jit(algo.step)(jax.random.key(0), algo.init(jnp.zeros(2)))
    >>> info.is_accepted.dtype
    dtype('bool')
    """
    kernel = build_kernel(judge, proposal, rule, num_comparisons, max_rounds)

    def init_fn(position, rng_key=None):
        del rng_key  # BlackJAX's init signature; Pref-MH's init is deterministic
        return init(position, judge)

    def step(rng_key, state):
        return kernel(rng_key, state)

    return SamplingAlgorithm(init=init_fn, step=step)
