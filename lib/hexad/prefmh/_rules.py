"""Acceptance rules of Pref-MH: closed forms on arrays.

Notation (Pref-MH, NeurIPS 2026): the chain is at ``x`` and proposes ``y``. A Bradley-Terry
judge prefers ``y`` with probability ``p = pi(y) / (pi(x) + pi(y))``; ``W ~ Binomial(K, p)``
is the number of wins of ``y`` in ``K`` independent comparisons. ``rho`` is everything in the
Metropolis-Hastings ratio that the judge does not see, ``rho = q(y -> x) / q(x -> y)`` times a
known base-measure ratio (each proposal returns it); ``log_rho`` is its logarithm.

An acceptance ``a_rho(k)``, ``k = 0..K``, is exact for every target iff ``a_rho(0) = 0`` and
``(K + 1 - j) a_rho(j) = rho j a_{1/rho}(K + 1 - j)`` for ``j = 1..K`` (coefficients in the
degree-``K+1`` Bernstein basis). Its pointwise largest solution
``a*(k) = min(1, rho k / (K + 1 - k))`` is Peskun-optimal; ``K = 1`` with ``rho = 1`` is
Barker's rule and ``K -> inf`` tends to Metropolis-Hastings.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from hexad._base import check_int, is_traced

__all__ = [
    "RULES",
    "acceptance_probability",
    "barker_acceptance",
    "kbudget_acceptance",
    "majority_acceptance",
    "mh_acceptance",
    "two_coin_acceptance",
]

#: The rule names the kernels accept. ``"mh"`` and ``"barker_oracle"`` need a judge that knows
#: its log-odds (verification only); the others use sampled comparisons only.
RULES = ("mh", "barker_oracle", "kbudget", "majority", "two_coin")


def check_num_comparisons(num_comparisons: int) -> int:
    """Returns ``num_comparisons`` as an int or raises a ValueError naming it."""
    return check_int("num_comparisons", num_comparisons)


def mh_acceptance(log_ratio: jax.Array) -> jax.Array:
    r"""Returns the Metropolis-Hastings acceptance :math:`\min(1, e^{r})`, :math:`r` the
    ``log_ratio``.

    Args:
      log_ratio: ``[...]`` ``log(pi(y) q(y->x) / (pi(x) q(x->y)))``.

    >>> round(float(mh_acceptance(jnp.log(0.25))), 6)
    0.25
    """
    return jnp.exp(jnp.minimum(log_ratio, 0.0))


def barker_acceptance(log_ratio: jax.Array) -> jax.Array:
    r"""Returns Barker's acceptance :math:`e^{r} / (1 + e^{r})`, :math:`r` the ``log_ratio``.

    This is the probability that one comparison by a Bradley-Terry judge prefers ``y`` when
    the proposal is symmetric, and the acceptance the two-coin factory realises exactly.

    Args:
      log_ratio: ``[...]`` ``log(pi(y) q(y->x) / (pi(x) q(x->y)))``.

    >>> round(float(barker_acceptance(jnp.log(3.0))), 4)
    0.75
    """
    return jax.nn.sigmoid(log_ratio)


def kbudget_acceptance(wins: jax.Array, num_comparisons: int, log_rho: jax.Array) -> jax.Array:
    r"""Returns the Peskun-optimal K-budget acceptance
    :math:`a^*(k) = \min(1, \rho k / (K + 1 - k))`.

    Args:
      wins: ``[...]`` integer wins ``k`` of the proposal, ``0 <= k <= K``.
      num_comparisons: ``K`` (static), the comparison budget.
      log_rho: ``[...]`` (broadcast with ``wins``) log proposal/base ratio ``log rho``.

    Returns:
      ``[...]`` acceptance probabilities in ``[0, 1]``; exactly 0 where ``k = 0``. Concrete
      ``wins`` outside ``[0, K]`` raise a ValueError naming ``wins``; traced ones give NaN.

    >>> float(kbudget_acceptance(jnp.array(2), 3, jnp.array(0.0)))
    1.0
    >>> round(float(kbudget_acceptance(jnp.array(1), 3, jnp.array(0.0))), 4)
    0.3333
    """
    num_comparisons = check_num_comparisons(num_comparisons)
    if not is_traced(wins):
        w = np.asarray(wins)
        if w.size and (np.any(np.isnan(w)) or w.min() < 0 or w.max() > num_comparisons):
            raise ValueError(
                f"wins: expected values in [0, num_comparisons = {num_comparisons}], got "
                f"[{w.min()}, {w.max()}]"
            )
    k = jnp.asarray(wins).astype(jnp.result_type(float))
    # rho * (k / (K + 1 - k)) rather than exp(log rho + log k - log(K + 1 - k)): one exp, which
    # folds away for a symmetric proposal's constant log rho = 0; rho = inf gives 1 for k > 0.
    a = jnp.minimum(1.0, jnp.exp(log_rho) * (k / (num_comparisons + 1.0 - k)))
    a = jnp.where(k > 0, a, 0.0)
    # Outside [0, K] the formula gives a negative or > 1 "probability": NaN says so.
    return jnp.where((k < 0) | (k > num_comparisons), jnp.nan, a)


def majority_acceptance(wins: jax.Array, num_comparisons: int) -> jax.Array:
    """Returns the majority-vote acceptance: 1 if :math:`2k > K`, 1/2 on a tie, else 0.

    This is the intuitive baseline; it is *not* exact (its chain does not leave ``pi``
    invariant), which the tests demonstrate on a small state space.

    Args:
      wins: ``[...]`` integer wins ``k``.
      num_comparisons: ``K`` (static).

    >>> float(majority_acceptance(jnp.array(2), 3))
    1.0
    """
    twice = 2 * jnp.asarray(wins)
    return jnp.where(twice > num_comparisons, 1.0, jnp.where(twice == num_comparisons, 0.5, 0.0))


def two_coin_acceptance(
    log_p_win: jax.Array, log_rho: jax.Array, max_rounds: int | None = None
) -> jax.Array:
    r"""Returns the two-coin factory's acceptance probability,
    :math:`\rho p / (\rho p + 1 - p)` untruncated.

    Goncalves, Latuszynski & Roberts (2017), "Barker's algorithm for Bayesian inference with
    intractable likelihoods": with coins :math:`p` (the proposal wins) and :math:`1 - p` and
    weights :math:`\rho` and 1, the factory returns 1 with probability
    :math:`\rho p / (\rho p + 1 - p)`: Barker's rule for an asymmetric proposal.

    A round ends the factory with probability :math:`d = (\rho p + 1 - p) / (1 + \rho)`; a
    factory cut after :math:`N` = ``max_rounds`` rounds (rejecting) accepts with probability

    .. math::

       \frac{\rho p}{\rho p + 1 - p} \big(1 - (1 - d)^N\big).

    Swapping :math:`x` and :math:`y` maps :math:`\rho \mapsto 1 / \rho` and
    :math:`p \mapsto 1 - p` and leaves :math:`d` unchanged, so the cut multiplies Barker's rule
    by a factor symmetric in :math:`x` and :math:`y`: detailed balance, hence exactness, holds
    at every :math:`N` (the cut costs acceptance, not exactness; the tests check
    :math:`\pi P = \pi` for :math:`N = 1, \dots, 5`).

    Args:
      log_p_win: ``[...]`` ``log p``, the log-probability that the judge prefers ``y``.
      log_rho: ``[...]`` log proposal/base ratio.
      max_rounds: (static) the factory's cut ``N >= 1``; ``None``: no cut.

    >>> round(float(two_coin_acceptance(jnp.log(0.5), jnp.log(3.0))), 4)
    0.75
    >>> round(float(two_coin_acceptance(jnp.log(0.5), jnp.log(3.0), max_rounds=1)), 4)
    0.375
    """
    if max_rounds is not None:
        max_rounds = check_int("max_rounds", max_rounds)
    return _two_coin(jnp.asarray(log_p_win), jnp.asarray(log_rho), max_rounds)


def _two_coin(log_p_win, log_rho, max_rounds):
    log_q = jnp.log1p(-jnp.exp(log_p_win))
    barker = jax.nn.sigmoid(log_rho + log_p_win - log_q)
    if max_rounds is None:
        return barker
    # d = P(a round decides) = sigmoid(log_rho) p + sigmoid(-log_rho) (1 - p);
    # 1 - (1 - d)^N = -expm1(N log1p(-d)), accurate for small d.
    d = jax.nn.sigmoid(log_rho) * jnp.exp(log_p_win) + jax.nn.sigmoid(-log_rho) * jnp.exp(log_q)
    return barker * -jnp.expm1(max_rounds * jnp.log1p(-d))


def _log_binom_pmf(num_comparisons: int, log_p: jax.Array, log_q: jax.Array) -> jax.Array:
    """Returns ``[..., K + 1]`` ``log P(W = k)``, ``W ~ Binomial(K, p)``, ``log q = log(1 - p)``."""
    shape = (1,) * log_p.ndim + (num_comparisons + 1,)
    k = jnp.arange(num_comparisons + 1, dtype=log_p.dtype).reshape(shape)
    # log C(K, k) from the static K in float64 on the host: exactly 0 at k = 0 and k = K
    # (float32 gammaln(1) is 5e-7, which made a sure outcome's probability 1 - 5e-7).
    log_coef = jnp.asarray(
        [
            math.lgamma(num_comparisons + 1)
            - math.lgamma(j + 1)
            - math.lgamma(num_comparisons - j + 1)
            for j in range(num_comparisons + 1)
        ],
        log_p.dtype,
    ).reshape(shape)
    # 0 log 0 = 0: at p = 0 or 1 (log_p or log_q = -inf, also float32 underflow of a large
    # score gap) the k = 0 or k = K term is exactly 0, not 0 * (-inf) = NaN.
    wins = jnp.where(k == 0, 0.0, k * log_p[..., None])
    losses = jnp.where(k == num_comparisons, 0.0, (num_comparisons - k) * log_q[..., None])
    return log_coef + wins + losses


def acceptance_probability(
    rule: str,
    log_p_win: jax.Array,
    log_rho: jax.Array,
    num_comparisons: int = 1,
    max_rounds: int | None = None,
) -> jax.Array:
    r"""Returns the expected acceptance of ``rule`` over the judge's random outcomes.

    :math:`\mathbb{E}[a(W)]` with :math:`W \sim \mathrm{Binomial}(K, p)` for the comparison
    rules, the closed form for ``"two_coin"`` (cut after ``max_rounds`` rounds, see
    :func:`two_coin_acceptance`), and :math:`\min(1, \rho p / (1 - p))` for ``"mh"`` (the judge's
    odds :math:`p / (1 - p)` equal :math:`\pi(y) / \pi(x)` under Bradley-Terry). Multiplied by
    the proposal matrix this gives the exact transition matrix of a chain on a finite space.

    Args:
      rule: one of :data:`RULES` (static).
      log_p_win: ``[...]`` log-probability that the judge prefers ``y`` over ``x``.
      log_rho: ``[...]`` log proposal/base ratio (broadcast with ``log_p_win``).
      num_comparisons: ``K`` (static), for ``"kbudget"`` and ``"majority"``.
      max_rounds: (static) the two-coin factory's cut; ``None``: no cut.

    >>> round(float(acceptance_probability("kbudget", jnp.log(0.5), jnp.array(0.0), 1)), 4)
    0.5
    """
    if rule not in RULES:
        raise ValueError(f"rule: expected one of {RULES}, got {rule!r}")
    num_comparisons = check_num_comparisons(num_comparisons)
    if max_rounds is not None:
        max_rounds = check_int("max_rounds", max_rounds)
    return _acceptance_probability(
        rule, jnp.asarray(log_p_win), jnp.asarray(log_rho), num_comparisons, max_rounds
    )


@functools.partial(jax.jit, static_argnums=(0, 3, 4))
def _acceptance_probability(rule, log_p_win, log_rho, num_comparisons, max_rounds):
    log_p_win, log_rho = jnp.broadcast_arrays(log_p_win, log_rho)
    log_q = jnp.log1p(-jnp.exp(log_p_win))
    log_odds = log_p_win - log_q
    if rule == "mh":
        return mh_acceptance(log_odds + log_rho)
    if rule == "two_coin":
        return _two_coin(log_p_win, log_rho, max_rounds)
    if rule == "barker_oracle":
        return barker_acceptance(log_odds + log_rho)
    pmf = jnp.exp(_log_binom_pmf(num_comparisons, log_p_win, log_q))
    k = jnp.broadcast_to(jnp.arange(num_comparisons + 1), pmf.shape)
    if rule == "kbudget":
        a = kbudget_acceptance(k, num_comparisons, log_rho[..., None])
    else:
        a = majority_acceptance(k, num_comparisons)
    return jnp.sum(pmf * a, axis=-1)
