"""The one statistics module behind every reproduction verdict (studies and the report).

A claim is decided from **paired differences** ``d_i = a_i - b_i``, one per seed (the claimed
method's score minus the baseline's on the same seed, data and noise), ``i = 1..n``, with a
claimed direction (``"less"``: the claim says the true mean difference ``mu < 0``;
``"greater"``: ``mu > 0``) and an **equivalence margin** ``delta > 0`` stated before the run:
the smallest difference the claim cares about, in the units of ``d``.

Statistics (``df = n - 1``, ``T_df`` the Student t distribution, ``t_{q,df}`` its quantile)::

    mean  m  = sum(d_i) / n
    sd    s  = sqrt(sum((d_i - m)^2) / (n - 1))
    SE       = s / sqrt(n)
    CI(1 - alpha)     = m -/+ t_{1 - alpha/2, df} * SE         (the two-sided t interval)
    p (mu = 0)        = 2 * (1 - T_df(|m| / SE))              (two-sided paired t test)
    TOST (mu within +-delta): p_lo = 1 - T_df((m + delta) / SE),  p_hi = T_df((m - delta) / SE),
                      p_eq = max(p_lo, p_hi); equivalent iff p_eq < alpha, which is the same
                      as the (1 - 2 alpha) interval  m -/+ t_{1 - alpha, df} * SE  lying
                      inside (-delta, +delta)

With ``interval="bca"`` or ``"percentile"`` both intervals are instead paired bootstrap
intervals of the mean (``scipy.stats.bootstrap``, 9999 resamples, a fixed seed), for differences
far from normal; the p values stay the t test's. A bootstrap over a handful of seeds has few
distinct resamples: use it from about ten pairs on.

Outcomes, checked in this order:

1. **"not tested"**: a gate or control of the run failed (the caller passes the failed checks;
   the figures are still reported, never decided).
2. **"no advantage"**: equivalent within the margin by TOST. This is checked before the sign:
   a difference confidently smaller than the margin is no advantage even when it is
   confidently non-zero, because the margin *is* the smallest effect that matters.
3. **"reproduced"**: the (1 - alpha) interval lies entirely on the claimed side of 0.
4. **"not reproduced"**: the interval lies entirely on the other side of 0.
5. **"undecided"**: the interval contains 0 and the effect is not shown to be within the margin;
   ``seeds_needed`` is the number of pairs at which a two-sided paired t test at ``alpha``
   would detect the *observed* standardised effect ``d_z = |m| / s`` with probability
   ``power`` (default 0.8). Its power at ``n`` pairs is, with ``lambda = d_z * sqrt(n)`` and
   ``NCT`` the noncentral t distribution::

       power(n) = 1 - NCT_df,lambda(t_{1 - alpha/2, df}) + NCT_df,lambda(-t_{1 - alpha/2, df})

   and ``seeds_needed`` is the smallest ``n >= 2`` with ``power(n) >= power`` (``None`` when
   the observed effect is exactly 0, or needs more than ``MAX_SEEDS``). It answers "how many
   seeds would a real effect of this size need", not "how likely is it real".

Bad input is an error, never a verdict: fewer than two pairs, pairs of different lengths, a
non-finite difference, a margin that is not a finite number > 0, ``alpha`` outside (0, 0.5)
(TOST needs the ``1 - 2 alpha`` interval) or ``power`` outside (0, 1) raise ``ValueError``
naming the argument.

Host-side numpy and scipy only; no JAX.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
from scipy import stats

__all__ = [
    "MARGINS",
    "MAX_SEEDS",
    "OUTCOMES",
    "McNemar",
    "Verdict",
    "decide",
    "decide_stats",
    "mcnemar",
    "noninferior",
    "paired",
    "seeds_needed",
]

OUTCOMES = ("reproduced", "not reproduced", "no advantage", "undecided", "not tested")
#: The largest ``seeds_needed`` reported: an effect that needs more is not one seeds can show.
MAX_SEEDS = 10**6
#: The bootstrap's seed and resamples are fixed so that a verdict renders the same every time.
BOOTSTRAP_SEED = 0
BOOTSTRAP_RESAMPLES = 9999

#: Each claim's equivalence margin, in the units of its paired difference, stated before the
#: runs that decide it (the studies write their verdicts with it; the report decides with it).
#:
#: - ``rwefm``: the EMD 1-NNA's distance from 0.5, RWEFM - baseline, stated with issue 49
#:   before the runs at its new protocol. 0.02 is four quanta of the 1-NNA at 96 + 96 clouds
#:   (1/192 each) and below the metric's own sampling sd at a matched distribution (about 0.024,
#:   the data floors), so a difference within it is one a single test set cannot resolve, while
#:   the S^2 effect (about 0.15) is far beyond it.
#: - ``dtb``: hidden attack success rate after the suppressing defenses, DTB - naive, stated
#:   with issue 49 before the next run: a hidden backdoor waking less than 5 points of attack
#:   success above the naive model's is not one the claim describes.
MARGINS = {"rwefm": 0.02, "dtb": 0.05}

Direction = Literal["less", "greater"]
Interval = Literal["t", "bca", "percentile"]


@dataclass(frozen=True)
class Verdict:
    """One decided claim. ``ci_low``/``ci_high`` bound the (1 - alpha) interval of the mean
    difference, ``eq_low``/``eq_high`` the (1 - 2 alpha) interval TOST compares with the
    margin; ``p_value`` is the two-sided paired t test of a zero mean, ``p_equivalence`` TOST's;
    ``seeds_needed`` is set only for "undecided"."""

    outcome: str
    effect_mean: float
    ci_low: float
    ci_high: float
    eq_low: float
    eq_high: float
    n: int
    sd: float
    margin: float
    alpha: float
    direction: str
    interval: str
    p_value: float
    p_equivalence: float
    seeds_needed: int | None
    reason: str

    def line(self, unit: str = "") -> str:
        """The verdict and its figures in one line (``unit`` names what ``d`` is in)."""
        return f"{self.outcome}: {self.figures(unit)}"

    def figures(self, unit: str = "") -> str:
        """:meth:`line` without the outcome, for a table that shows it in its own column."""
        u = f" {unit}" if unit else ""
        text = (
            f"mean difference {_num(self.effect_mean, sign=True)}{u}, "
            f"{_pct(1 - self.alpha)} {_INTERVAL_NAME[self.interval]} interval "
            f"[{_num(self.ci_low, sign=True)}, {_num(self.ci_high, sign=True)}] "
            f"(n {self.n}, sd {_num(self.sd)}, p {_num(self.p_value)}); "
            f"equivalence margin ±{self.margin:g}{u}, {_pct(1 - 2 * self.alpha)} interval "
            f"[{_num(self.eq_low, sign=True)}, {_num(self.eq_high, sign=True)}] "
            f"(TOST p {_num(self.p_equivalence)})"
        )
        return f"{text}; {self.reason}" if self.reason else text

    def summary_keys(self, prefix: str = "") -> dict[str, Any]:
        """The keys a study's ``summary.json`` carries for this verdict."""
        keys = {
            "verdict": self.outcome,
            "effect_mean": self.effect_mean,
            "effect_ci_low": self.ci_low,
            "effect_ci_high": self.ci_high,
            "n_seeds": self.n,
            "seeds_needed": self.seeds_needed,
            "equivalence_margin": self.margin,
        }
        return {prefix + k: v for k, v in keys.items()}


_INTERVAL_NAME = {"t": "t", "bca": "BCa bootstrap", "percentile": "percentile bootstrap"}


def _num(x: float, sign: bool = False) -> str:
    # three significant digits, trailing zeros kept so that interval ends line up
    if not math.isfinite(x):
        return str(x)
    return (f"{x:+#.3g}" if sign else f"{x:#.3g}").removesuffix(".")


def _pct(level: float) -> str:
    return f"{100 * level:g}%"


def paired(
    a: Sequence[float],
    b: Sequence[float],
    *,
    margin: float,
    direction: Direction,
    alpha: float = 0.05,
    power: float = 0.8,
    interval: Interval = "t",
    failed: Sequence[str] = (),
) -> Verdict:
    """Decides the claim from per-seed scores ``a`` (the claimed method) and ``b`` (the
    baseline), paired by position: the differences are ``a - b``. See :func:`decide`."""
    a_, b_ = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a_.ndim != 1 or b_.ndim != 1 or a_.shape != b_.shape:
        raise ValueError(
            f"a, b: need two flat sequences of the same length (one value per seed, paired "
            f"by position), got shapes {a_.shape} and {b_.shape}"
        )
    return decide(
        a_ - b_,
        margin=margin,
        direction=direction,
        alpha=alpha,
        power=power,
        interval=interval,
        failed=failed,
    )


def decide(
    diffs: Sequence[float],
    *,
    margin: float,
    direction: Direction,
    alpha: float = 0.05,
    power: float = 0.8,
    interval: Interval = "t",
    failed: Sequence[str] = (),
) -> Verdict:
    """Decides the claim from paired differences ``diffs`` (one per seed): the rules of the
    module docstring, at level ``alpha`` against the equivalence ``margin``, with the claim
    that the mean difference is below 0 (``direction="less"``) or above it (``"greater"``).
    ``failed`` lists the run's failed gates or controls (in words); any makes it "not tested".
    """
    d = np.asarray(diffs, np.float64)
    if d.ndim != 1:
        raise ValueError(f"diffs: need a flat sequence, one difference per seed, got {d.shape}")
    if d.size < 2:
        raise ValueError(f"diffs: need at least two pairs (seeds), got {d.size}")
    bad = np.flatnonzero(~np.isfinite(d))
    if bad.size:
        raise ValueError(f"diffs: non-finite difference {d[bad[0]]} at pair {int(bad[0])}")
    if interval not in _INTERVAL_NAME:
        raise ValueError(f"interval: expected 't', 'bca' or 'percentile', got {interval!r}")
    _check_args(margin, direction, alpha, power)
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    bounds = None
    if interval != "t" and sd > 0:
        bounds = (_bootstrap(d, 1 - alpha, interval), _bootstrap(d, 1 - 2 * alpha, interval))
    return _decide(mean, sd, int(d.size), margin, direction, alpha, power, failed, bounds, interval)


def decide_stats(
    mean: float,
    sd: float,
    n: int,
    *,
    margin: float,
    direction: Direction,
    alpha: float = 0.05,
    power: float = 0.8,
    failed: Sequence[str] = (),
) -> Verdict:
    """:func:`decide` from the differences' ``mean``, sample ``sd`` (ddof 1) and count ``n``,
    for a summary that kept only those (t intervals only)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise ValueError(f"n: need an integer number of pairs >= 2, got {n!r}")
    if not math.isfinite(mean):
        raise ValueError(f"mean: need a finite mean difference, got {mean}")
    if not math.isfinite(sd) or sd < 0:
        raise ValueError(f"sd: need a finite standard deviation >= 0, got {sd}")
    return _decide(float(mean), float(sd), int(n), margin, direction, alpha, power, failed)


def seeds_needed(
    effect: float, sd: float, *, alpha: float = 0.05, power: float = 0.8
) -> int | None:
    """The fewest pairs at which a two-sided paired t test at ``alpha`` detects a true mean
    difference ``effect`` with differences' sd ``sd`` with probability ``power`` (the
    noncentral-t power of the module docstring); ``None`` for a zero effect or beyond
    ``MAX_SEEDS``."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha: need 0 < alpha < 1, got {alpha}")
    if not 0 < power < 1:
        raise ValueError(f"power: need 0 < power < 1, got {power}")
    if not (math.isfinite(effect) and math.isfinite(sd)) or sd <= 0:
        raise ValueError(f"effect, sd: need finite values and sd > 0, got {effect}, {sd}")
    dz = abs(effect) / sd
    if dz == 0:
        return None

    def ok(n: int) -> bool:
        return _power(dz, n, alpha) >= power

    # power rises with n at a fixed effect: double until it suffices, then bisect
    lo, hi = 1, 2
    while not ok(hi):
        lo, hi = hi, 2 * hi
        if hi > 2 * MAX_SEEDS:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi if hi <= MAX_SEEDS else None


def _power(dz: float, n: int, alpha: float) -> float:
    df = n - 1
    crit = stats.t.ppf(1 - alpha / 2, df)
    nc = dz * math.sqrt(n)
    return float(stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc))


def _bootstrap(d: np.ndarray, level: float, method: str) -> tuple[float, float]:
    res = stats.bootstrap(
        (d,),
        np.mean,
        confidence_level=level,
        method=method,
        n_resamples=BOOTSTRAP_RESAMPLES,
        rng=np.random.default_rng(BOOTSTRAP_SEED),
    )
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"interval: the {method} bootstrap is degenerate for these differences")
    return lo, hi


def _check_args(margin: float, direction: str, alpha: float, power: float) -> None:
    if isinstance(margin, bool) or not isinstance(margin, (int, float, np.floating)):
        raise ValueError(f"margin: need a finite number > 0, got {margin!r}")
    if not math.isfinite(margin) or margin <= 0:
        raise ValueError(f"margin: need a finite number > 0, got {margin}")
    if direction not in ("less", "greater"):
        raise ValueError(f"direction: expected 'less' or 'greater', got {direction!r}")
    if not (isinstance(alpha, (int, float)) and 0 < alpha < 0.5):
        raise ValueError(
            f"alpha: need 0 < alpha < 0.5 (TOST uses the 1 - 2 alpha interval), got {alpha}"
        )
    if not (isinstance(power, (int, float)) and 0 < power < 1):
        raise ValueError(f"power: need 0 < power < 1, got {power}")


def _decide(
    mean: float,
    sd: float,
    n: int,
    margin: float,
    direction: str,
    alpha: float,
    power: float,
    failed: Sequence[str],
    bounds: tuple[tuple[float, float], tuple[float, float]] | None = None,
    interval: str = "t",
) -> Verdict:
    _check_args(margin, direction, alpha, power)
    if isinstance(failed, str):
        raise ValueError("failed: need a sequence of failed checks, not one string")
    failed = tuple(failed)
    df, se = n - 1, sd / math.sqrt(n)
    if se > 0:
        p_value = float(2 * stats.t.sf(abs(mean) / se, df))
        p_eq = float(
            max(stats.t.sf((mean + margin) / se, df), stats.t.cdf((mean - margin) / se, df))
        )
        half, eq_half = stats.t.ppf(1 - alpha / 2, df) * se, stats.t.ppf(1 - alpha, df) * se
        ci, eq = (mean - half, mean + half), (mean - eq_half, mean + eq_half)
    else:  # identical differences: the interval is the point, the tests are certain
        p_value = 1.0 if mean == 0 else 0.0
        p_eq = 0.0 if abs(mean) < margin else 1.0
        ci = eq = (mean, mean)
    if bounds is not None:
        ci, eq = bounds
    claimed = ci[1] < 0 if direction == "less" else ci[0] > 0
    against = ci[0] > 0 if direction == "less" else ci[1] < 0
    needed = None
    if failed:
        outcome = "not tested"
        reason = "not tested: " + "; ".join(failed)
    elif -margin < eq[0] and eq[1] < margin:
        outcome, reason = "no advantage", ""
    elif claimed:
        outcome, reason = "reproduced", ""
    elif against:
        outcome, reason = "not reproduced", ""
    else:
        outcome = "undecided"
        needed = seeds_needed(mean, sd, alpha=alpha, power=power)
        reason = (
            f"{needed} seeds would give {power:.0%} power at the observed effect"
            if needed is not None
            else f"no number of seeds up to {MAX_SEEDS} gives {power:.0%} power at the "
            "observed effect"
        )
    return Verdict(
        outcome=outcome,
        effect_mean=mean,
        ci_low=float(ci[0]),
        ci_high=float(ci[1]),
        eq_low=float(eq[0]),
        eq_high=float(eq[1]),
        n=n,
        sd=sd,
        margin=float(margin),
        alpha=float(alpha),
        direction=direction,
        interval=interval,
        p_value=p_value,
        p_equivalence=p_eq,
        seeds_needed=needed,
        reason=reason,
    )


@dataclass(frozen=True)
class McNemar:
    """An exact McNemar test of two methods on the same paired trials (:func:`mcnemar`).

    ``b``: the pairs the claimed method gets right and the other wrong; ``c``: the reverse;
    ``p_value``: the exact binomial p value of the ``alternative``; ``rejected``:
    ``p_value < alpha``."""

    b: int
    c: int
    p_value: float
    alpha: float
    alternative: str
    rejected: bool


def mcnemar(
    b: int,
    c: int,
    alpha: float = 0.05,
    *,
    alternative: Literal["greater", "less", "two-sided"] = "greater",
) -> McNemar:
    """The exact McNemar test of paired binary outcomes from its discordant pairs.

    Two methods are scored on the same trials (the same seeds, draws or items), each trial a
    success or a failure for each. Only the discordant pairs carry evidence: ``b`` trials
    where the claimed method succeeds and the other fails, ``c`` where it is the other way
    round. Under the null (both methods succeed equally often, conditionally on the pairs
    being discordant) ``b ~ Binomial(b + c, 1/2)``, so the exact p value is a binomial tail
    (McNemar 1947; the "exact conditional" form, without the chi-square approximation)::

        "greater"   (the claimed method succeeds more often):  P(X >= b)
        "less"      (it succeeds less often):                   P(X <= b)
        "two-sided":  min(1, 2 min(P(X >= b), P(X <= b)))

    with ``X ~ Binomial(b + c, 1/2)``; no discordant pair gives ``p = 1``.

    Args:
      b: discordant pairs in the claimed direction, an int ``>= 0``.
      c: discordant pairs against it, an int ``>= 0``.
      alpha: the level, in ``(0, 1)``; ``rejected`` is ``p_value < alpha``.
      alternative: ``"greater"`` (default), ``"less"`` or ``"two-sided"``.

    Raises:
      ValueError: ``b`` or ``c`` not a non-negative int, ``alpha`` outside ``(0, 1)`` or an
        unknown ``alternative``, naming the argument.

    >>> r = mcnemar(9, 1)
    >>> round(r.p_value, 6), r.rejected  # P(X >= 9), X ~ Bin(10, 1/2) = 11 / 1024
    (0.010742, True)
    """
    for name, v in (("b", b), ("c", c)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{name}: need a count of discordant pairs, an int >= 0, got {v!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise ValueError(f"alpha: need 0 < alpha < 1, got {alpha!r}")
    if alternative not in ("greater", "less", "two-sided"):
        raise ValueError(
            f"alternative: expected 'greater', 'less' or 'two-sided', got {alternative!r}"
        )
    b, c = int(b), int(c)
    m = b + c
    upper = float(stats.binom.sf(b - 1, m, 0.5))  # P(X >= b)
    lower = float(stats.binom.cdf(b, m, 0.5))  # P(X <= b)
    if m == 0:
        p = 1.0
    elif alternative == "greater":
        p = upper
    elif alternative == "less":
        p = lower
    else:
        p = min(1.0, 2.0 * min(upper, lower))
    return McNemar(b, c, p, float(alpha), alternative, p < alpha)


def noninferior(
    diffs: Sequence[float],
    *,
    margin: float,
    direction: Direction,
    alpha: float = 0.05,
    power: float = 0.8,
    interval: Interval = "t",
    failed: Sequence[str] = (),
) -> Verdict:
    """Decides a one-sided bound at the margin from paired differences ``diffs`` (one per
    pair): one half of TOST, for a claim that a method is *not worse* (or *not better*) than
    its reference by the margin or more, rather than that it differs.

    ``direction="greater"`` is **non-inferiority**, the claim ``mu > -margin`` (the method
    loses less than the margin); ``direction="less"`` is **non-superiority**, the claim
    ``mu < +margin`` (it gains less than the margin). With ``[eq_low, eq_high]`` the
    ``(1 - 2 alpha)`` interval of :func:`decide` (each of its ends a one-sided test at level
    ``alpha``), the outcomes are, in this order:

    1. **"not tested"**: a gate or control failed (``failed``);
    2. **"reproduced"**: the bound holds, ``eq_low > -margin`` (``"greater"``) or
       ``eq_high < +margin`` (``"less"``), i.e. the one-sided test at ``alpha`` rejects
       ``mu <= -margin`` (``mu >= +margin``);
    3. **"not reproduced"**: the whole interval lies beyond the bound, ``eq_high < -margin``
       (``"greater"``) or ``eq_low > +margin`` (``"less"``): the method is decidedly worse
       (better) by more than the margin;
    4. **"undecided"**: the interval contains the bound; ``seeds_needed`` is the number of
       pairs at which the one-sided test at ``alpha`` (the two-sided power of the module
       docstring at ``2 alpha``) would detect the observed distance from the bound,
       ``mean + margin`` (``"greater"``) or ``margin - mean`` (``"less"``).

    Everything else (the ``(1 - alpha)`` interval ``ci_low``/``ci_high``, the p value of a
    zero mean, TOST's ``p_equivalence``, the bootstrap option, the errors for bad input) is
    :func:`decide`'s.

    >>> noninferior([1.0, -1.0, 0.5, -0.5, 0.0], margin=2.0, direction="greater").outcome
    'reproduced'
    >>> noninferior([-5.0, -4.0, -6.0], margin=2.0, direction="greater").outcome
    'not reproduced'
    """
    v = decide(
        diffs,
        margin=margin,
        direction=direction,
        alpha=alpha,
        power=power,
        interval=interval,
        failed=failed,
    )
    if v.outcome == "not tested":
        return v
    sign = 1.0 if direction == "greater" else -1.0
    # the bound in the claim's orientation: greater -> eq_low > -margin; less -> -eq_high > -margin
    near, far = (v.eq_low, v.eq_high) if sign > 0 else (-v.eq_high, -v.eq_low)
    needed = None
    if near > -margin:
        outcome, reason = "reproduced", ""
    elif far < -margin:
        outcome, reason = "not reproduced", ""
    else:
        outcome = "undecided"
        distance = sign * v.effect_mean + margin
        if v.sd > 0 and distance > 0:
            needed = seeds_needed(distance, v.sd, alpha=2 * alpha, power=power)
        at = f"{power:.0%} power at the observed distance from the margin"
        if distance <= 0:
            reason = "the observed mean lies beyond the margin: more pairs would not show the bound"
        elif needed is not None:
            reason = f"{needed} pairs would give {at}"
        else:
            reason = f"no number of pairs up to {MAX_SEEDS} gives {at}"
    return replace(v, outcome=outcome, seeds_needed=needed, reason=reason)
