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


# McNemar's exact test, by hand: with b = 9 and c = 1 the 10 discordant pairs give
# X ~ Bin(10, 1/2); P(X >= 9) = (C(10,9) + C(10,10)) / 2^10 = 11 / 1024 = 0.0107421875 and
# P(X <= 9) = 1 - 1/1024; two-sided 2 * 11/1024 = 0.021484375.
def test_mcnemar_matches_the_binomial_tail_by_hand():
    r = v.mcnemar(9, 1)
    assert (r.b, r.c, r.alternative) == (9, 1, "greater")
    assert r.p_value == pytest.approx(11 / 1024, rel=1e-12) and r.rejected
    assert v.mcnemar(9, 1, alternative="less").p_value == pytest.approx(1023 / 1024, rel=1e-12)
    two = v.mcnemar(9, 1, alternative="two-sided")
    assert two.p_value == pytest.approx(22 / 1024, rel=1e-12)
    assert not v.mcnemar(9, 1, alpha=0.01).rejected  # 0.0107 is not below 0.01
    # b = 5, c = 0: P(X >= 5) = 1 / 32 for X ~ Bin(5, 1/2)
    assert v.mcnemar(5, 0).p_value == pytest.approx(1 / 32, rel=1e-12)
    # no discordant pair: no evidence either way
    for alt in ("greater", "less", "two-sided"):
        assert v.mcnemar(0, 0, alternative=alt).p_value == 1.0
    # a balanced split is never rejected, and the two-sided p is capped at 1
    assert v.mcnemar(4, 4, alternative="two-sided").p_value == 1.0


@pytest.mark.parametrize("b", range(0, 13))
@pytest.mark.parametrize("c", range(0, 9))
def test_mcnemar_agrees_with_scipy_binomtest(b, c):
    from scipy.stats import binomtest

    for alt in ("greater", "less", "two-sided"):
        r = v.mcnemar(b, c, alternative=alt)
        want = 1.0 if b + c == 0 else binomtest(b, b + c, 0.5, alternative=alt).pvalue
        # scipy's two-sided test sums the outcomes no likelier than b's, which for p = 1/2
        # (a symmetric distribution) is the doubled smaller tail
        assert r.p_value == pytest.approx(want, rel=1e-9, abs=1e-15)
        assert r.rejected == (r.p_value < 0.05)
    # the tests are mirror images: b against c "greater" is c against b "less"
    assert v.mcnemar(b, c).p_value == pytest.approx(
        v.mcnemar(c, b, alternative="less").p_value, rel=1e-12
    )


def test_mcnemar_holds_its_level_under_the_null():
    # Paired trials where both methods succeed with probability 0.5 independently: the
    # one-sided exact test is conservative, so its rejection rate at alpha = 0.05 is at most
    # 0.05 up to Monte-Carlo error (2000 draws of 30 pairs: SE sqrt(0.05 * 0.95 / 2000) =
    # 0.0049; we allow 0.05 + 3 SE = 0.065).
    rng = np.random.default_rng(4)
    a, o = rng.random((2, 2000, 30)) < 0.5
    b, c = (a & ~o).sum(1), (~a & o).sum(1)
    rate = np.mean([v.mcnemar(int(x), int(y)).rejected for x, y in zip(b, c, strict=True)])
    assert rate <= 0.065


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"b": -1, "c": 0}, "b"),
        ({"b": 1.5, "c": 0}, "b"),
        ({"b": True, "c": 0}, "b"),
        ({"b": 1, "c": -2}, "c"),
        ({"b": 1, "c": 1, "alpha": 0.0}, "alpha"),
        ({"b": 1, "c": 1, "alpha": 1.0}, "alpha"),
        ({"b": 1, "c": 1, "alternative": "up"}, "alternative"),
    ],
)
def test_mcnemar_bad_input_names_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name}"):
        v.mcnemar(**kwargs)


def test_noninferior_bounds_match_the_tost_interval_of_the_hand_example():
    # d = 2 3 1 4 5 (A - B above): the 90% interval is [1.492557, 4.507443], each end a
    # one-sided test at 5%.
    d = np.subtract(A, B)
    # non-inferiority at margin 1: 1.49 > -1
    r = v.noninferior(d, margin=1, direction="greater")
    assert r.outcome == "reproduced" and r.seeds_needed is None
    assert (r.eq_low, r.eq_high) == pytest.approx((1.492557, 4.507443), abs=1e-6)
    assert (r.ci_low, r.ci_high) == pytest.approx((1.036757, 4.963243), abs=1e-6)
    # non-superiority: within +5 (4.51 < 5); decidedly above +1 (1.49 > 1); undecided at +4
    assert v.noninferior(d, margin=5, direction="less").outcome == "reproduced"
    assert v.noninferior(d, margin=1, direction="less").outcome == "not reproduced"
    u = v.noninferior(d, margin=4, direction="less")
    assert u.outcome == "undecided"
    # the distance from the bound is 4 - 3 = 1 with sd 1.581139 (d_z 0.632): a one-sided
    # paired t test at 5% needs 17 pairs for 80% power (G*Power: d_z 0.632, one tail -> 17)
    assert u.seeds_needed == 17 and "17 pairs" in u.reason
    # the mirror image of the differences against the mirror claim
    assert v.noninferior(-d, margin=1, direction="greater").outcome == "not reproduced"
    assert v.noninferior(-d, margin=5, direction="greater").outcome == "reproduced"
    # a mean beyond the margin whose interval still reaches it: no number of pairs helps
    w = v.noninferior([-3.0, 1.0, -6.0], margin=2, direction="greater")
    assert w.outcome == "undecided" and w.seeds_needed is None and "beyond" in w.reason
    nt = v.noninferior(d, margin=1, direction="greater", failed=["control failed"])
    assert nt.outcome == "not tested" and "control failed" in nt.reason


def test_noninferior_holds_its_level_at_the_margin():
    # True mean exactly at the bound (-margin) with normal differences: the one-sided t test
    # rejects (outcome "reproduced") with probability alpha = 0.05 exactly; over 2000 draws
    # the rate's SE is sqrt(0.05 * 0.95 / 2000) = 0.0049, so +-0.015 is 3 SE.
    rng = np.random.default_rng(7)
    d = rng.normal(-1.0, 2.0, (2000, 10))
    rate = np.mean([v.noninferior(x, margin=1.0, direction="greater").outcome == "reproduced"
                    for x in d])  # fmt: skip
    assert abs(rate - 0.05) < 0.015


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"diffs": [1.0], "margin": 1.0, "direction": "greater"}, "diffs"),
        ({"diffs": [1.0, np.nan], "margin": 1.0, "direction": "greater"}, "diffs"),
        ({"diffs": [1.0, 2.0], "margin": 0.0, "direction": "greater"}, "margin"),
        ({"diffs": [1.0, 2.0], "margin": 1.0, "direction": "up"}, "direction"),
        ({"diffs": [1.0, 2.0], "margin": 1.0, "direction": "less", "alpha": 0.5}, "alpha"),
    ],
)
def test_noninferior_bad_input_names_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name}"):
        v.noninferior(**kwargs)
