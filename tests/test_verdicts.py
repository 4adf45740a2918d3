"""The verdict statistics (experiments/_verdicts.py) against textbook values and simulation."""

import math

import numpy as np
import pytest

from experiments import _verdicts as v

# A 5-pair example worked by hand. a = 12 15 11 18 14, b = 10 12 10 14 9, so d = 2 3 1 4 5:
#   mean 3; sum of squared deviations 1 + 0 + 4 + 1 + 4 = 10, sd = sqrt(10 / 4) = 1.581139;
#   SE = 1.581139 / sqrt(5) = 0.707107; df 4.
#   95% CI: t_{0.975,4} = 2.776445, half-width 2.776445 * 0.707107 = 1.963243 -> [1.036757,
#   4.963243]. t = 3 / 0.707107 = 4.242641, two-sided p = 0.013236 (t table: between 0.01 and
#   0.02 for 4 df).
#   TOST at margin 4: 90% CI with t_{0.95,4} = 2.131847, half-width 1.507443 -> [1.492557,
#   4.507443], which crosses +4. p_hi = T_4((3 - 4) / 0.707107) = T_4(-1.414214) = 0.115100;
#   p_lo = 1 - T_4((3 + 4) / 0.707107) is tiny; p_eq = 0.115100 > 0.05: not equivalent.
#   At margin 5: p_hi = T_4(-2.828427) = 0.023710 < 0.05: equivalent within +-5.
A = [12, 15, 11, 18, 14]
B = [10, 12, 10, 14, 9]


def test_paired_t_interval_and_tost_match_hand_computed_values():
    r = v.paired(A, B, margin=4, direction="greater")
    assert r.outcome == "reproduced"
    assert r.n == 5 and r.effect_mean == pytest.approx(3.0)
    assert r.sd == pytest.approx(1.581139, abs=1e-6)
    assert (r.ci_low, r.ci_high) == pytest.approx((1.036757, 4.963243), abs=1e-6)
    assert (r.eq_low, r.eq_high) == pytest.approx((1.492557, 4.507443), abs=1e-6)
    assert r.p_value == pytest.approx(0.013236, abs=1e-6)
    assert r.p_equivalence == pytest.approx(0.115100, abs=1e-6)
    assert r.seeds_needed is None
    # the same interval against the opposite claim
    assert v.paired(A, B, margin=4, direction="less").outcome == "not reproduced"
    # within +-5 the difference is confidently smaller than what matters: no advantage, even
    # though the 95% interval excludes 0 (the margin is checked first)
    eq = v.paired(A, B, margin=5, direction="greater")
    assert eq.outcome == "no advantage"
    assert eq.p_equivalence == pytest.approx(0.023710, abs=1e-6)
    # b - a is the mirror image
    m = v.paired(B, A, margin=4, direction="less")
    assert m.outcome == "reproduced" and m.ci_high == pytest.approx(-1.036757, abs=1e-6)


def test_undecided_reports_the_seeds_its_effect_needs():
    # d = -0.120 -0.125 +0.021 (RWEFM on T^2 at three seeds): mean -0.074667, sd 0.082887,
    # d_z = 0.9008; the 95% CI [-0.2806, +0.1312] contains 0 and crosses the margin
    r = v.decide([-0.120, -0.125, 0.021], margin=0.02, direction="less")
    assert r.outcome == "undecided"
    assert (r.ci_low, r.ci_high) == pytest.approx((-0.2806, 0.1312), abs=1e-4)
    assert r.seeds_needed == v.seeds_needed(r.effect_mean, r.sd) == 12
    assert "12 seeds" in r.line()
    # a zero observed effect gives no finite number of seeds
    z = v.decide([0.5, -0.5, 0.001, -0.001], margin=0.1, direction="greater")
    assert z.outcome == "undecided" and z.seeds_needed is None


def test_seeds_needed_matches_the_paired_t_power_tables():
    # Two-sided paired t at alpha 0.05, 80% power (Cohen 1988; G*Power): d_z = 0.5 needs 34
    # pairs (power 0.808; 33 give 0.795), d_z = 1 needs 10 (power 0.803; 9 give 0.748),
    # d_z = 0.8 needs 15
    assert v.seeds_needed(0.5, 1.0) == 34
    assert v.seeds_needed(-1.0, 1.0) == 10
    assert v.seeds_needed(0.8, 1.0) == 15
    assert v.seeds_needed(100.0, 1.0) == 2  # the fewest a paired t test can use
    assert v.seeds_needed(0.0, 1.0) is None
    assert v._power(1.0, 10, 0.05) == pytest.approx(0.803097, abs=1e-5)


def _outcomes(rng, mean, n, draws, margin, direction):
    diffs = rng.normal(mean, 1.0, size=(draws, n))
    return [v.decide(d, margin=margin, direction=direction).outcome for d in diffs]


def test_a_true_effect_of_one_sd_is_reproduced_at_ten_seeds_at_the_stated_power():
    # d_z = 1 at n = 10: the two-sided test decides the claimed side with probability
    # P(T_9(lambda = sqrt(10)) > t_{0.975,9}) = 0.8031 (the wrong side ~1e-6). Over 2000 draws
    # the fraction has binomial SE sqrt(0.8 * 0.2 / 2000) = 0.0089; we allow 4 SE = 0.036.
    # The margin (0.1 sd) is far below the effect, so equivalence never intervenes.
    out = _outcomes(np.random.default_rng(0), -1.0, 10, 2000, 0.1, "less")
    frac = out.count("reproduced") / len(out)
    assert abs(frac - 0.8031) < 0.036
    assert set(out) <= {"reproduced", "undecided"}


def test_a_zero_effect_is_no_advantage_within_one_sd_at_twenty_seeds():
    # d_z = 0, margin 1 sd, n = 20: TOST's power is P(|mean| + t_{0.95,19} s / sqrt(20) < 1),
    # integrated over the chi distribution of s: 0.9922. Binomial SE over 2000 draws
    # sqrt(0.9922 * 0.0078 / 2000) = 0.002; we ask for at least 0.9922 - 4 SE = 0.984.
    out = _outcomes(np.random.default_rng(1), 0.0, 20, 2000, 1.0, "greater")
    assert out.count("no advantage") / len(out) >= 0.984


def test_failed_checks_make_it_not_tested_with_the_figures_kept():
    r = v.paired(A, B, margin=4, direction="greater", failed=["truncated_two_coin = 11 != 0"])
    assert r.outcome == "not tested" and "truncated_two_coin = 11" in r.reason
    assert r.ci_low == pytest.approx(1.036757, abs=1e-6)


def test_summary_keys_and_decide_stats_agree_with_the_data_path():
    r = v.paired(A, B, margin=4, direction="greater")
    s = v.decide_stats(3.0, math.sqrt(2.5), 5, margin=4, direction="greater")
    assert (s.outcome, s.ci_low, s.ci_high) == (r.outcome, r.ci_low, r.ci_high)
    keys = r.summary_keys("t2_")
    assert keys == {
        "t2_verdict": "reproduced",
        "t2_effect_mean": r.effect_mean,
        "t2_effect_ci_low": r.ci_low,
        "t2_effect_ci_high": r.ci_high,
        "t2_n_seeds": 5,
        "t2_seeds_needed": None,
        "t2_equivalence_margin": 4.0,
    }


def test_identical_differences_give_a_point_interval():
    assert v.decide([0.3, 0.3, 0.3], margin=0.1, direction="greater").outcome == "reproduced"
    assert v.decide([0.0, 0.0], margin=0.1, direction="greater").outcome == "no advantage"


def test_bootstrap_interval_is_reproducible_and_close_to_t_for_normal_differences():
    d = np.random.default_rng(2).normal(1.0, 1.0, 30)
    b1 = v.decide(d, margin=0.1, direction="greater", interval="bca")
    b2 = v.decide(d, margin=0.1, direction="greater", interval="bca")
    t = v.decide(d, margin=0.1, direction="greater")
    assert (b1.ci_low, b1.ci_high) == (b2.ci_low, b2.ci_high)  # a fixed seed
    assert b1.ci_low == pytest.approx(t.ci_low, abs=0.1)
    assert b1.ci_high == pytest.approx(t.ci_high, abs=0.1)
    p = v.decide(d, margin=0.1, direction="greater", interval="percentile")
    assert p.outcome == b1.outcome == "reproduced" and "percentile bootstrap" in p.line()


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: v.decide([0.1], margin=0.1, direction="less"), "diffs"),
        (lambda: v.decide([], margin=0.1, direction="less"), "diffs"),
        (lambda: v.paired([1, 2, 3], [1, 2], margin=0.1, direction="less"), "a, b"),
        (lambda: v.decide([0.1, float("nan")], margin=0.1, direction="less"), "diffs"),
        (lambda: v.paired([1, float("inf")], [1, 2], margin=0.1, direction="less"), "diffs"),
        (lambda: v.decide([0.1, 0.2], margin=0.0, direction="less"), "margin"),
        (lambda: v.decide([0.1, 0.2], margin=-1.0, direction="less"), "margin"),
        (lambda: v.decide([0.1, 0.2], margin=float("inf"), direction="less"), "margin"),
        (lambda: v.decide([0.1, 0.2], margin=float("nan"), direction="less"), "margin"),
        (lambda: v.decide([0.1, 0.2], margin=0.1, direction="up"), "direction"),
        (lambda: v.decide([0.1, 0.2], margin=0.1, direction="less", alpha=0.0), "alpha"),
        (lambda: v.decide([0.1, 0.2], margin=0.1, direction="less", alpha=1.0), "alpha"),
        (lambda: v.decide([0.1, 0.2], margin=0.1, direction="less", power=1.0), "power"),
        (lambda: v.decide([0.1, 0.2], margin=0.1, direction="less", interval="z"), "interval"),
        (lambda: v.decide([0.1, 0.2], margin=0.1, direction="less", failed="x"), "failed"),
        (lambda: v.decide_stats(0.1, 0.2, 1, margin=0.1, direction="less"), "n"),
        (lambda: v.decide_stats(0.1, -0.2, 3, margin=0.1, direction="less"), "sd"),
        (lambda: v.decide_stats(float("nan"), 0.2, 3, margin=0.1, direction="less"), "mean"),
        (lambda: v.seeds_needed(0.1, 0.0), "effect, sd"),
    ],
)
def test_bad_input_is_an_error_naming_the_argument_never_a_verdict(call, name):
    with pytest.raises(ValueError, match=f"^{name}"):
        call()
