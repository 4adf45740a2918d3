"""Judges: things that compare two candidates and say which one they prefer.

A :class:`Judge` answers ``judge.compare(key, first, second, num) -> [num] int32`` outcomes (1
where ``second`` is preferred, 0 where ``first`` is), unbatched: vmap over chains. A judge that
follows the Bradley-Terry model prefers ``y`` over ``x`` with probability
``exp(s(y)) / (exp(s(x)) + exp(s(y)))``; its preference odds are the density ratio of
``pi ∝ exp(s)``, which is what makes Pref-MH exact.

Three kinds: :func:`bradley_terry_judge` (a score or log-density, for verification; it also
knows its log-odds, so the oracle rules can use it), :func:`classifier_judge` (a trained
classifier's logits), and :func:`external_judge` (a batched Python callable reached through
``jax.pure_callback``: one host call per step for all chains). :func:`bt_consistency` tests a
judge for position bias from swapped-order comparisons.
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hexad._base import check_int, check_positive
from hexad.prefmh._rules import check_num_comparisons

__all__ = [
    "BTConsistency",
    "Judge",
    "JudgeCounter",
    "bradley_terry_judge",
    "bt_consistency",
    "classifier_judge",
    "external_judge",
    "pullback_judge",
]

#: Outcome code a JAX judge returns for a comparison it could not make (a NaN or ``+inf``
#: score). Kernels flag it in ``Info.valid`` and the chain runner raises on it.
INVALID_OUTCOME = 2


class Judge(NamedTuple):
    """A pairwise judge.

    A judge looks at *features* of a candidate (for a Bradley-Terry judge built from a score,
    the score itself; for an external judge, the candidate). Kernels cache the features of
    the current position in the chain state, as BlackJAX caches a log-density, so each step
    featurises only the proposal; the outcomes are the same as comparing the candidates.

    Attributes:
      compare_features: ``compare_features(key, f_first, f_second, num) -> [num]`` int32
        outcomes, 1 where the second candidate wins; ``num`` is static. Unbatched.
      features: ``features(x) -> f``, or ``None`` for the identity (the judge sees ``x``).
      log_odds_features: ``(f_first, f_second) -> []`` the log-odds ``log P(second wins) /
        P(first wins)``, or ``None`` for a judge that only samples (external judges). Only
        the oracle rules (``"mh"``, ``"barker_oracle"``) use it.
      counter: host-side :class:`JudgeCounter` of an external judge, else ``None``.
      compare_uniforms: ``compare_uniforms(u, f_first, f_second) -> [num]`` the same outcomes
        as ``compare_features`` from ``num`` given uniforms ``u`` in ``[0, 1)`` instead of a key
        (``compare_features(key, ...)`` must equal it at ``u = uniform(key, (num,))``), or
        ``None``. A kernel then draws the comparisons' uniforms with its other random bits in
        one draw rather than deriving a judge key: a judge that samples in-graph (Bradley-Terry)
        has it; an external judge draws on the host and has not.
    """

    compare_features: Callable[..., jax.Array]
    features: Callable[[Any], Any] | None = None
    log_odds_features: Callable[..., jax.Array] | None = None
    counter: JudgeCounter | None = None
    compare_uniforms: Callable[..., jax.Array] | None = None

    def featurize(self, x: Any) -> Any:
        """Returns what the judge looks at for candidate ``x``."""
        return x if self.features is None else self.features(x)

    def compare(self, key: jax.Array, first: Any, second: Any, num: int) -> jax.Array:
        """Returns ``[num]`` int32 outcomes of comparing ``first`` (shown first) and ``second``."""
        return self.compare_features(key, self.featurize(first), self.featurize(second), num)

    def log_odds(self, first: Any, second: Any) -> jax.Array:
        """Returns the known log-odds that ``second`` beats ``first`` (oracle judges only)."""
        if self.log_odds_features is None:
            raise ValueError("judge: this judge only samples outcomes; its log-odds are unknown")
        return self.log_odds_features(self.featurize(first), self.featurize(second))


@dataclasses.dataclass
class JudgeCounter:
    """Host-side counts of an external judge: batched calls and single comparisons."""

    calls: int = 0
    comparisons: int = 0
    _lock: Any = dataclasses.field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, comparisons: int) -> None:
        with self._lock:
            self.calls += 1
            self.comparisons += int(comparisons)

    def reset(self) -> None:
        with self._lock:
            self.calls = 0
            self.comparisons = 0


def _bt_outcomes(u: jax.Array, logit: jax.Array) -> jax.Array:
    # A NaN logit (NaN score, or -inf against -inf) or a +inf score is not a comparison
    # a judge can make: return the INVALID code rather than a silent loss.
    bad = jnp.isnan(logit)
    wins = u < jax.nn.sigmoid(logit)
    return jnp.where(bad, INVALID_OUTCOME, wins.astype(jnp.int32))


def bradley_terry_judge(score_fn: Callable[[Any], jax.Array], position_bias: float = 0.0) -> Judge:
    r"""Returns a judge that samples Bradley-Terry comparisons from a score.

    :math:`P(\text{second wins}) = \sigma(s(\text{second}) - s(\text{first}) + b)`, with
    :math:`\sigma` the logistic function and :math:`b` the ``position_bias``. With
    ``position_bias = 0`` (the default) this is a Bradley-Terry judge of
    :math:`\pi \propto \exp(s)`;
    a non-zero bias models a judge that favours the second-shown candidate (not BT: it
    exists so that :func:`bt_consistency` can be shown to catch it).

    Args:
      score_fn: ``score_fn(x) -> []`` a log-density up to a constant, or any score. A score of
        ``-inf`` means zero density; ``NaN`` or ``+inf`` makes the outcome invalid.
      position_bias: (static) log-odds added in favour of the second-shown candidate.

    Returns:
      A :class:`Judge` with ``log_odds = s(second) - s(first)``.

    >>> judge = bradley_terry_judge(lambda x: -0.5 * jnp.sum(x**2))
    >>> judge.compare(jax.random.key(0), jnp.zeros(2), jnp.ones(2), 3).shape
    (3,)
    """
    if not callable(score_fn):
        raise TypeError(f"score_fn: expected a callable, got {type(score_fn).__name__}")
    bias = float(position_bias)
    if not np.isfinite(bias):
        raise ValueError(f"position_bias: expected a finite float, got {position_bias!r}")

    def _score(x):
        s = jnp.asarray(score_fn(x))
        if s.shape != ():
            raise ValueError(f"score_fn: expected a scalar score, got shape {s.shape}")
        # +inf is not a density value; turn it into NaN so the outcome is flagged invalid.
        return jnp.where(s == jnp.inf, jnp.nan, s)

    def log_odds(s_first, s_second):
        return s_second - s_first

    def compare_uniforms(u, s_first, s_second):
        return _bt_outcomes(u, s_second - s_first + bias)

    def compare(key, s_first, s_second, num):
        num = check_num_comparisons(num)
        u = jax.random.uniform(key, (num,), dtype=jnp.result_type(float))
        return compare_uniforms(u, s_first, s_second)

    return Judge(
        compare_features=compare,
        features=_score,
        log_odds_features=log_odds,
        compare_uniforms=compare_uniforms,
    )


def classifier_judge(
    logits_fn: Callable[[Any], jax.Array], target_class: int, beta: float = 1.0
) -> Judge:
    r"""Returns a Bradley-Terry judge whose score is a classifier's :math:`\beta \log p(c \mid x)`.

    The chains then sample :math:`\pi(x) \propto p_0(x)\, p(c \mid x)^\beta` when proposals come
    from a generator :math:`p_0` (independent or latent-space proposals): the judge prefers the
    candidate that looks more like class :math:`c`.

    Args:
      logits_fn: ``logits_fn(x) -> [num_classes]`` a trained classifier (closed over params).
      target_class: (static) the class ``c`` asked for.
      beta: (static) inverse temperature of the tilt, > 0.

    >>> judge = classifier_judge(lambda x: jnp.stack([x[0], -x[0]]), target_class=0)
    >>> round(float(judge.log_odds(jnp.zeros(1), jnp.ones(1))), 4)  # log(e^1/(e^1+e^-1)) - log(1/2)
    0.5662
    """
    if not callable(logits_fn):
        raise TypeError(f"logits_fn: expected a callable, got {type(logits_fn).__name__}")
    target_class = check_int("target_class", target_class, lo=0)
    beta = check_positive("beta", beta)

    def score(x):
        logits = jnp.asarray(logits_fn(x))
        if logits.ndim != 1 or logits.shape[0] <= target_class:
            raise ValueError(
                f"logits_fn: expected logits of shape [num_classes > {target_class}], "
                f"got {logits.shape}"
            )
        return beta * jax.nn.log_softmax(logits)[target_class]

    return bradley_terry_judge(score)


def pullback_judge(judge: Judge, decode: Callable[[Any], Any]) -> Judge:
    """Returns a judge that compares ``decode(x)`` with ``decode(y)``: chains in a latent space.

    Args:
      judge: the judge of decoded candidates (images, texts).
      decode: ``decode(z) -> x`` a generator's decoder (pure, jittable).

    >>> judge = bradley_terry_judge(lambda x: -jnp.sum(x**2))
    >>> latent = pullback_judge(judge, lambda z: 2.0 * z)
    >>> float(latent.log_odds(jnp.zeros(1), jnp.ones(1)))
    -4.0
    """
    if not isinstance(judge, Judge):
        raise TypeError(f"judge: expected a Judge, got {type(judge).__name__}")
    if not callable(decode):
        raise TypeError(f"decode: expected a callable, got {type(decode).__name__}")

    return judge._replace(features=lambda z: judge.featurize(decode(z)))


def external_judge(fn: Callable[..., Any]) -> Judge:
    """Returns a judge that asks a host-side Python callable, batched over all chains.

    ``fn(first, second, rng) -> outcomes`` receives numpy arrays ``first [n, ...]`` and
    ``second [n, ...]`` (every comparison of every chain of one step, flattened into one
    batch) and a ``numpy.random.Generator`` seeded from the step's JAX key (a simulated judge
    should draw from it, so that runs are reproducible; a person or a remote model may
    ignore it). It must return ``n`` outcomes in ``{0, 1}`` (1: ``second`` preferred);
    anything else raises a ``ValueError`` naming the shape or values received.

    The call goes through ``jax.pure_callback(..., vmap_method="broadcast_all")``, so under
    ``jax.vmap`` over chains (and over ``num`` comparisons) it is one host call per step.
    With chains sharded over a mesh (``run_chains(..., mesh=...)``) it is still one call per
    step, not one per device shard: a ``pure_callback`` without ``sharding=`` is a
    maximal-sharding op (jax's ``_callback_op_sharding``), so XLA gathers every chain's
    operands onto the mesh's first device, calls ``fn`` once with the whole batch in chain
    order and scatters the outcomes back (inside a ``shard_map`` it would instead be one call
    per device, which ``run_chains`` does not use). The batch and
    the numpy seed are then those of the unsharded run, and so are the traces, bit for bit
    (tested on 8 simulated CPU devices). The gather costs one transfer per step.
    The judge's :class:`JudgeCounter` (``judge.counter``) counts calls and comparisons
    the host received. With the ``"two_coin"`` rule under ``jax.vmap`` that is more than
    the sum of ``PrefMHInfo.judge_calls``: the batched loop keeps asking for finished chains
    (``chains * max(rounds)`` per step; their outcomes are discarded).

    Args:
      fn: the batched judge, ``fn(first, second, rng) -> [n]`` binary outcomes.

    >>> judge = external_judge(lambda a, b, rng: (b.sum(-1) > a.sum(-1)).astype(int))
    >>> judge.compare(jax.random.key(0), jnp.zeros(2), jnp.ones(2), 2).tolist()
    [1, 1]
    >>> judge.counter.comparisons
    2
    """
    if not callable(fn):
        raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
    try:
        n_params = len(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        n_params = 3
    counter = JudgeCounter()

    def host(first, second, key_data):
        lead = key_data.shape[:-1]
        n = int(np.prod(lead))
        first = np.asarray(first).reshape((n,) + first.shape[len(lead) :])
        second = np.asarray(second).reshape((n,) + second.shape[len(lead) :])
        rng = np.random.default_rng(np.asarray(key_data, dtype=np.uint32).ravel()[:64])
        out = fn(first, second, rng) if n_params >= 3 else fn(first, second)
        out = np.asarray(out)
        if out.shape not in ((n,), (n, 1)):
            raise ValueError(
                f"external judge: expected {n} outcomes (shape ({n},)), got shape {out.shape}"
            )
        bad = ~np.isin(out, (0, 1))
        if np.any(bad):
            raise ValueError(
                f"external judge: expected binary outcomes in {{0, 1}}, got "
                f"{np.unique(out[bad])[:5].tolist()}"
            )
        counter.add(n)
        return out.reshape(lead).astype(np.int32)

    def compare(key, first, second, num):
        num = check_num_comparisons(num)
        first, second = jnp.asarray(first), jnp.asarray(second)
        firsts = jnp.broadcast_to(first, (num,) + first.shape)
        seconds = jnp.broadcast_to(second, (num,) + second.shape)
        key_data = jax.random.key_data(jax.random.split(key, num))
        return jax.pure_callback(
            host,
            jax.ShapeDtypeStruct((num,), jnp.int32),
            firsts,
            seconds,
            key_data,
            vmap_method="broadcast_all",
        )

    return Judge(compare_features=compare, counter=counter)


class BTConsistency(NamedTuple):
    r"""Result of :func:`bt_consistency` (scalars unless noted).

    Attributes:
      second_win_rate: fraction of all comparisons won by the second-shown candidate; exactly
        1/2 in expectation for any Bradley-Terry judge and any pairs.
      position_bias: ``logit(second_win_rate)``, a rough estimate of the bias log-odds.
      z: :math:`(\text{wins} - N/2) / \sqrt{N/4}`, :math:`N` the comparisons; conservative
        (the variance under BT is at most :math:`N/4`).
      p_value: two-sided p-value of ``z``.
      pair_deviation: ``[n]`` per pair, ``P(y wins | x, y) + P(x wins | y, x) - 1`` estimated;
        0 under Bradley-Terry for every pair.
      num_comparisons: total comparisons made, ``2 n num``.
    """

    second_win_rate: jax.Array
    position_bias: jax.Array
    z: jax.Array
    p_value: jax.Array
    pair_deviation: jax.Array
    num_comparisons: jax.Array


def bt_consistency(
    key: jax.Array, judge: Judge, first: jax.Array, second: jax.Array, num: int
) -> BTConsistency:
    """Tests a judge for Bradley-Terry consistency from swapped-order comparisons.

    Each pair ``(x_i, y_i)`` is shown ``num`` times as ``(x, y)`` and ``num`` times as
    ``(y, x)``. A Bradley-Terry judge depends only on the candidates, so the second-shown
    candidate wins with total probability ``p + (1 - p) = 1`` per swapped couple, whatever the
    scores: the second-shown win rate is 1/2 in expectation. A judge with a position bias
    (e.g. an LLM that favours the last option) moves it away from 1/2.

    Args:
      key: PRNG key.
      judge: the judge to test.
      first: ``[n, ...]`` candidates ``x_i``.
      second: ``[n, ...]`` candidates ``y_i``, same shape as ``first``.
      num: (static) comparisons per pair and order.

    >>> judge = bradley_terry_judge(lambda x: jnp.sum(x), position_bias=1.0)
    >>> out = bt_consistency(jax.random.key(0), judge, jnp.zeros((50, 1)), jnp.ones((50, 1)), 20)
    >>> bool(out.p_value < 1e-3)
    True
    """
    if not isinstance(judge, Judge):
        raise TypeError(f"judge: expected a Judge, got {type(judge).__name__}")
    num = check_num_comparisons(num)
    first, second = jnp.asarray(first), jnp.asarray(second)
    if first.shape != second.shape or first.ndim < 1:
        raise ValueError(
            f"first, second: expected equal shapes [n, ...], got {first.shape} and {second.shape}"
        )
    n = first.shape[0]
    k_fwd, k_bwd = jax.random.split(key)
    fwd = jax.vmap(lambda k, a, b: judge.compare(k, a, b, num))(
        jax.random.split(k_fwd, n), first, second
    )
    bwd = jax.vmap(lambda k, a, b: judge.compare(k, a, b, num))(
        jax.random.split(k_bwd, n), second, first
    )
    fwd_rate = jnp.mean(fwd.astype(jnp.result_type(float)), axis=1)
    bwd_rate = jnp.mean(bwd.astype(jnp.result_type(float)), axis=1)
    total = 2.0 * n * num
    rate = (jnp.sum(fwd_rate) + jnp.sum(bwd_rate)) * num / total
    z = (rate - 0.5) * total / jnp.sqrt(total / 4.0)
    p_value = jax.scipy.special.erfc(jnp.abs(z) / jnp.sqrt(2.0))
    return BTConsistency(
        second_win_rate=rate,
        position_bias=jnp.log(rate) - jnp.log1p(-rate),
        z=z,
        p_value=p_value,
        pair_deviation=fwd_rate + bwd_rate - 1.0,
        num_comparisons=jnp.asarray(total),
    )
