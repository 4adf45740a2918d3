"""experiments.policy_pointmaze and the one driver it shares (experiments._policy): a tiny run
writes every claim's keys; the claims follow their stated rules on hand-made runs; bad
settings are refused."""

import json
import math

import numpy as np
import pytest

from experiments import _policy
from experiments import policy_pointmaze as study
from hexad.policy import Method

TINY = {
    "n_transitions": 600,
    "hidden": 8,
    "iql_steps": 20,
    "bc_steps": 10,
    "train_chunk": 10,
    "batch_size": 32,
    "alphas": (0.0, 0.5, 1.0),
    "n_kl_states": 64,
    "n_seeds": 1,
    "n_select": 1,
    "n_test": 2,
    "episode_steps": 10,
    "n_envs": 4,
    "guide_iql_steps": 10,
    "guide_cql_steps": 10,
    "guide_action_samples": 2,
    "guide_shifts": (0.5,),
    "priors": ("good", "output_noise", "data_corrupted"),
}
VERDICTS = ("holds", "fails", "undecided", "not tested: ")


def _smoke(tmp_path, monkeypatch):
    monkeypatch.setenv("HEXAD_CACHE", str(tmp_path / "cache"))
    cfg = study.STUDY.make_config(True, TINY)
    ckpt = tmp_path / "ckpt"
    summary = study.STUDY.execute(
        cfg, out_dir=tmp_path / "run", checkpoint_dir=ckpt, show_progress=False
    )
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == summary
    assert summary["stat_unit"] == "episode" and summary["margin"] == pytest.approx(0.1)
    claims = summary["claims"]
    for sp in ("pretanh", "action"):
        want = [f"{c}_{q}_{sp}" for q in cfg.priors for c in ("graceful", "additive_below_poe")]
        assert set(want + [f"{c}_{sp}" for c in ("selector", "capped", "responsive")]) <= set(
            claims
        )
        for k in ("actor_own_task_return", "actor_success", "actor_beats_zero"):
            assert f"{k}_{sp}" in summary
        assert summary[f"precision_ratio_prediction_{sp}"].startswith(VERDICTS)
        for name in ("selector_regret", "fixed_regret", "actor_regret", "selector_minus_fixed"):
            m, lo, hi = (summary[f"{name}_{sp}{s}"] for s in ("", "_ci_low", "_ci_high"))
            assert lo <= m + 1e-9 <= hi + 2e-9
        assert all(b > 0 for b in summary[f"kl_budget_nats_{sp}"])  # calibrated, per space
        # the r = 1 control: PoE and additive are the same policy (float rounding apart)
        assert abs(summary[f"precision_contrast_r1_{sp}"]) < 1e-6
        for r in ("0.25", "0.5", "2", "4"):
            assert f"precision_contrast_r{r}_{sp}_outcome" in summary
        for q in cfg.priors:
            assert 0 <= summary[f"kl_alpha_{q}_{sp}"][0] <= 1
            sweep = summary[f"kl_budget_alphas_{q}_{sp}"]
            assert all(0 <= a <= b <= 1 for a, b in zip(sweep, sweep[1:], strict=False))
            kl, kl_m = summary[f"kl_curve_{q}_{sp}"], summary[f"kl_mean_curve_{q}_{sp}"]
            assert kl[0] == pytest.approx(0.0, abs=1e-6)
            assert all(a <= b + 1e-5 for a, b in zip(kl, kl[1:], strict=False))
            assert all(m <= f + 1e-5 for m, f in zip(kl_m, kl, strict=True))
            assert summary[f"oracle_mid_alpha_{q}_{sp}"] == [0.5]  # the only alpha in range
            assert f"poe_kl_success_{q}_{sp}" in summary
    assert summary["precision_ratio_prediction"].startswith(VERDICTS)
    for c in claims:
        assert summary[f"verdict_{c}"].startswith(VERDICTS), c
        for k in (
            "_ci_low",
            "_ci_high",
            "_ci_level",
            "_mean",
            "_outcome",
            "_seeds_needed",
            "_rule",
        ):
            assert c + k in summary, c + k
        assert summary[f"{c}_margin"] == pytest.approx(0.1)
        assert len(summary[f"{c}_diffs"]) == cfg.n_test  # one seed: the episodes are the units
        lo, hi = summary[f"{c}_ci_low"], summary[f"{c}_ci_high"]
        if lo is not None and hi is not None:
            assert lo <= summary[f"{c}_mean"] + 1e-9 <= hi + 2e-9
    assert not any(k.startswith("verdict_") and k[8:] not in claims for k in summary)
    for g in ("iql", "cql"):
        assert summary[f"{g}_guided_shift_pretanh"] == [0.5]
    assert summary["kl_budgets_nats"] == [2 * b for b in cfg.kl_budgets]  # d = 2
    assert (tmp_path / "run" / "selection_curves.png").is_file()
    return cfg, ckpt, summary


def test_pointmaze_study_smoke(tmp_path, monkeypatch, fast_compile):
    _smoke(tmp_path, monkeypatch)


@pytest.mark.slow  # a second evaluation pass
def test_pointmaze_study_resume(tmp_path, monkeypatch):
    cfg, ckpt, summary = _smoke(tmp_path, monkeypatch)
    # --resume restores every seed's networks through hexad.cachex and skips training: the
    # deterministic evaluation then reproduces every figure.
    again = study.STUDY.execute(
        cfg, out_dir=tmp_path / "run2", checkpoint_dir=ckpt, resume=True, show_progress=False
    )
    summary.pop("runtime_s")
    again.pop("runtime_s")
    assert json.dumps(again, sort_keys=True) == json.dumps(summary, sort_keys=True)
    assert not (tmp_path / "run2" / "metrics.jsonl").exists()


@pytest.mark.parametrize(
    ("bad", "name"),
    [
        ({"priors": ("good", "bogus")}, "priors"),
        ({"spaces": ("logit",)}, "spaces"),
        ({"kl_budgets": (0.0, 1.0)}, "kl_budgets"),
        ({"kl_budget_fraction": 0.0}, "kl_budget_fraction"),  # a budget <= 0
        ({"kl_budget_fraction": -1.0}, "kl_budget_fraction"),
        ({"precision_ratios": (0.5, 0.0)}, "precision_ratios"),  # a precision ratio <= 0
        ({"precision_ratios": (0.5, math.inf)}, "precision_ratios"),  # a non-finite one
        ({"contrast_alpha": 1.0}, "contrast_alpha"),  # alpha outside (0, 1)
        ({"contrast_alpha": 0.0}, "contrast_alpha"),
        ({"fixed_alpha": 1.0}, "fixed_alpha"),
        ({"regret_range": (0.95, 0.99)}, "regret_range"),  # no alpha in it
        ({"margin_per_step": 0.0}, "margin_per_step"),
        ({"stat_alpha": 0.5}, "stat_alpha"),
    ],
)
def test_pointmaze_config_rejects_bad_input(bad, name):
    with pytest.raises(ValueError, match=name):
        study.STUDY.make_config(True, bad)


def test_rows_share_an_evaluation_only_when_they_are_the_same_policy_on_the_same_task():
    from experiments._policy import canon

    # alpha 0 is the actor whatever the prior or mix; alpha 1 is the prior alone, the same for
    # every actor level when the levels share one task and the prior is not built on the
    # actor, and its own per level otherwise.
    assert canon((1, 2, 3, Method.ADDITIVE, 0.0)) == (1, 2, 0, Method.POE, 0.0)
    assert canon((1, 2, 3, Method.ADDITIVE, 1.0)) == canon((1, 0, 3, Method.POE, 1.0))
    assert canon((1, 2, 3, Method.POE, 1.0), True) == (1, 2, 3, Method.POE, 1.0)
    assert canon((1, 2, 3, Method.POE, 1.0), False, (3,)) == (1, 2, 3, Method.POE, 1.0)
    assert canon((1, 2, 3, Method.POE, 0.5), True) == (1, 2, 3, Method.POE, 0.5)


# --------------------------------------------------------------------------------------------
# The claims on hand-made runs: returns are chosen per row, the rules then give known verdicts.
# --------------------------------------------------------------------------------------------

CFG = dict(
    alphas=(0.0, 0.5, 1.0),
    priors=("good", "random_init"),
    precision_ratios=(0.25, 1.0, 4.0),
    spaces=("action",),
    guides=(),
    episode_steps=100,  # margin 0.01 x 100 = 1
    n_test=8,
)


class _Returns(dict):
    """``run["test"]``: the per-episode returns of any row, from ``value(row) + noise``."""

    def __init__(self, value, noise):
        super().__init__()
        self.value, self.noise = value, noise

    def __missing__(self, row):
        return {"return": self.value(row) + self.noise}


def _runs(value, n_seeds=3, chosen_alpha=0.5, seed=0):
    """Hand-made :func:`experiments._policy.run_seed` outputs: ``value(row)`` the mean return
    of a row (the same every episode, plus noise shared by the rows of an episode, so the
    paired differences are exact), and the oracle and KL alphas ``chosen_alpha``."""
    rng = np.random.default_rng(seed)
    nk = len(CFG["priors"])
    runs = []
    for _ in range(n_seeds):
        noise = rng.normal(0, 3, CFG["n_test"])  # common to all rows: cancels in differences
        jitter = rng.normal(0, 0.05)  # a per-seed wobble of every difference
        chosen = {"zero_select": [-100.0], (0, 0, "actor_select"): 0.0}
        stats = {(0, 0, "budget"): 1.0, (0, 0, "actor_std"): [1.0, 1.0, 1.0]}
        for qi in range(nk):
            for name in ("kl", "oracle", "oracle_mid"):
                chosen[0, 0, qi, name] = chosen_alpha
            chosen[0, 0, qi, "curve"] = [0.0, 0.0, 0.0]
            for k in ("sweep", "kl", "kl_mean", "prior_std"):
                stats[0, 0, qi, k] = [0.0] * 3
            stats[0, 0, qi, "precision"] = 1.0

        def val(row, j=jitter):
            return value(row) + (j if row[3] != Method.POE or row[4] != 0.0 else 0.0)

        runs.append(
            {
                "test": _Returns(val, noise),
                "own": _Returns(lambda row: 0.0, noise),
                "chosen": chosen,
                "stats": stats,
                "d": 2,
                "per_level": False,
                "on_actor": tuple(range(nk, nk + 1 + len(CFG["precision_ratios"]))),
            }
        )
    return runs


def _value(prior_alone=None, poe=None, additive=None, family=None, contrast=None):
    """A row's mean return (the actor is 0): PoE at alpha 1 is the prior alone
    (``prior_alone[qi]``), PoE / additive otherwise ``poe[qi]`` / ``additive[qi]``; the
    family (qi >= 3) and the control (qi = 2) as given."""
    nk = len(CFG["priors"])

    def value(row):
        _, _, qi, m, al = row
        if m == Method.POE and al == 0.0:
            return 0.0
        if qi < nk:
            if al == 1.0:
                return prior_alone[qi]
            return (poe if m == Method.POE else additive)[qi]
        if qi == nk:  # the control, at the good prior's oracle alpha
            return contrast.get("control", 0.0)
        if al == 1.0:
            return family
        r = CFG["precision_ratios"][qi - nk - 1]
        return contrast.get((r, int(m)), 0.0)

    return value


def _summary(value, **kw):
    cfg = study.STUDY.make_config(True, CFG)
    return _policy.summarise(cfg, _runs(value, **kw), ["task"])


def test_graceful_and_additive_claims_follow_their_rules():
    # random_init alone is 10 below the actor (decidedly worse than the margin 1): tested.
    # PoE-KL with it loses 0.2 (within the margin): graceful holds. Additive at 0.5 is 5 below
    # PoE: additive-below-PoE holds. The good prior alone is better than the actor: neither
    # claim is tested on it.
    s = _summary(_value(prior_alone=[5.0, -10.0], poe=[3.0, -0.2], additive=[3.0, -5.2],
                        family=0.0, contrast={}))  # fmt: skip
    assert s["stat_unit"] == "seed" and len(s["graceful_random_init_action_diffs"]) == 3
    assert s["verdict_graceful_random_init_action"] == "holds"
    assert s["graceful_random_init_action_ci_level"] == pytest.approx(0.9)
    assert s["graceful_random_init_action_ci_low"] > -1.0
    assert s["graceful_random_init_action_rule"] == "bound greater"
    assert s["additive_below_poe_random_init_action_rule"] == "difference less"
    # the parts' units are kept for every claim and figure, so parts can be joined
    assert len(s["prior_only_minus_actor_random_init_action_diffs"]) == 3
    assert s["verdict_additive_below_poe_random_init_action"] == "holds"
    assert s["verdict_graceful_good_action"].startswith("not tested: the prior alone is not")
    assert s["prior_only_minus_actor_random_init_action_bound_outcome"] == "not reproduced"
    # PoE-KL losing 3 (beyond the margin of 1): graceful fails; additive equal to PoE within
    # the margin: "no advantage", which refutes the claimed difference.
    s = _summary(_value(prior_alone=[5.0, -10.0], poe=[3.0, -3.0], additive=[3.0, -3.1],
                        family=0.0, contrast={}))  # fmt: skip
    assert s["verdict_graceful_random_init_action"] == "fails"
    assert s["verdict_additive_below_poe_random_init_action"] == "fails"
    assert s["additive_below_poe_random_init_action_outcome"] == "no advantage"


def test_the_precision_ratio_prediction_follows_its_rule():
    base = dict(prior_alone=[5.0, -10.0], poe=[3.0, 0.0], additive=[3.0, 0.0], family=-8.0)
    add, poe = int(Method.ADDITIVE), int(Method.POE)
    # additive - PoE: -3 at r = 0.25 and +3 at r = 4 (the predicted sides), 0 at r = 1
    right = {(0.25, add): -3.0, (4.0, add): 3.0}
    s = _summary(_value(**base, contrast=right))
    assert s["precision_ratio_prediction_action"] == "holds"
    assert s["precision_ratio_prediction"] == "holds"
    assert s["precision_contrast_r0.25_action"] == pytest.approx(-3.0, abs=0.2)
    # the wrong side at r = 4: fails
    wrong = {(0.25, add): -3.0, (4.0, add): -3.0}
    assert _summary(_value(**base, contrast=wrong))["precision_ratio_prediction"] == "fails"
    # the r = 1 control differs (PoE and additive must coincide): not tested
    broken = right | {(1.0, poe): -3.0}
    s = _summary(_value(**base, contrast=broken))
    assert s["precision_ratio_prediction"].startswith("not tested")
    assert "r = 1 control" in s["precision_ratio_prediction_action"]
    # a family that is not decidedly bad: not tested
    s = _summary(_value(**(base | {"family": 0.0}), contrast=right))
    assert "family's mean alone" in s["precision_ratio_prediction_action"]
    # the actor does not beat the zero action: every claim is not tested
    runs = _runs(_value(**base, contrast=right))
    for r in runs:
        r["chosen"]["zero_select"] = [1.0]
    cfg = study.STUDY.make_config(True, CFG)
    s = _policy.summarise(cfg, runs, ["task"])
    assert all(s[f"verdict_{c}"].startswith("not tested: the actor does not") for c in s["claims"])
    assert s["precision_ratio_prediction"].startswith("not tested")


def test_the_selector_and_ceiling_claims_follow_their_rules():
    # The selector, the oracle and the fixed rule all pick alpha 0.5 here, so the selector's
    # regret is 0 (near the oracle: holds) and equals the fixed rule's; the actor's regret is
    # the oracle's gain over the actor.
    v = _value(prior_alone=[5.0, -10.0], poe=[3.0, 1.0], additive=[3.0, 1.0], family=-8.0,
               contrast={})  # fmt: skip
    s = _summary(v)
    assert s["verdict_selector_action"] == "holds"
    assert s["selector_regret_action"] == pytest.approx(0.0, abs=1e-9)
    assert s["actor_regret_action"] == pytest.approx(2.0, abs=0.2)  # mean of 3 and 1
    assert s["selector_minus_actor_action"] == pytest.approx(2.0, abs=0.2)
    # The good prior alone beats the actor by 5: responsive is tested, and the good prior at
    # its oracle alpha helps by 3: responsive holds; capped (the actor is not competent here)
    # is not tested. The control does not help.
    assert s["verdict_responsive_action"] == "holds"
    assert s["verdict_capped_action"].startswith("not tested: the good prior alone beats")
    # A control that helps as much makes both not tested.
    v2 = _value(prior_alone=[5.0, -10.0], poe=[3.0, 1.0], additive=[3.0, 1.0], family=-8.0,
                contrast={"control": 3.0})  # fmt: skip
    s = _summary(v2)
    assert "control helps" in s["verdict_responsive_action"]
    assert "control helps" in s["verdict_capped_action"]
    # A competent actor: the good prior alone is worse and the composition gains 0.1 < 1.
    v3 = _value(prior_alone=[-5.0, -10.0], poe=[0.1, 1.0], additive=[0.1, 1.0], family=-8.0,
                contrast={})  # fmt: skip
    s = _summary(v3)
    assert s["verdict_capped_action"] == "holds"
    assert s["capped_action_ci_high"] < 1.0
    assert s["verdict_responsive_action"].startswith("not tested: the good prior alone does not")


def test_one_seed_uses_its_episodes_and_fewer_than_two_units_are_not_tested():
    v = _value(prior_alone=[5.0, -10.0], poe=[3.0, -0.2], additive=[3.0, -5.2], family=-8.0,
               contrast={})  # fmt: skip
    s = _summary(v, n_seeds=1)
    assert s["stat_unit"] == "episode" and len(s["graceful_random_init_action_diffs"]) == 8
    assert s["verdict_graceful_random_init_action"] == "holds"
    cfg = study.STUDY.make_config(True, CFG | {"n_test": 1})
    runs = _runs(v, n_seeds=1)
    for r in runs:
        r["test"].noise = r["test"].noise[:1]
    s = _policy.summarise(cfg, runs, ["task"])
    assert s["verdict_graceful_random_init_action"] == "not tested: fewer than two paired units"
