"""The reproduction report's rules and tables on hand-made summaries (docs/render_results.py)."""

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "render_results", ROOT / "docs" / "render_results.py"
)
render = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = render  # dataclasses look their module up while it loads
_spec.loader.exec_module(render)


def _summary(rwefm, euclid, conv=1.0, prefix=""):
    s = {"eval_converged_frac": conv, "rwefm_emd_1nna_seeds": rwefm,
         "euclid_emd_1nna_seeds": euclid, "floor_emd_1nna_mean": 0.55}  # fmt: skip
    return {prefix + k: v for k, v in s.items()}


def _verdict(s, study="rwefm_protein", prefix=""):
    return render._rwefm_setting({study: s}, study, prefix)[0]


def _claim(reads):
    return next(c for c in render.PAPERS_BY_SLUG["rwefm"].claims if c.reads == (reads,))


def test_rwefm_rule_decides_on_the_paired_distance_from_one_half():
    # differences -0.10, -0.13, -0.11: mean -0.1133, sd 0.0153, SE 0.0088; the 95% t interval
    # -0.1133 -/+ 4.303 * 0.0088 = [-0.151, -0.075] lies below 0 and beyond the margin
    assert _verdict(_summary([0.6, 0.62, 0.61], [0.7, 0.75, 0.72])) == "reproduced"
    assert _verdict(_summary([0.7, 0.75, 0.72], [0.6, 0.62, 0.61])) == "not reproduced"
    # differences -0.10, +0.13, -0.11: the interval spans 0 and the margin
    assert _verdict(_summary([0.6, 0.75, 0.61], [0.7, 0.62, 0.72])) == "undecided"
    # 0.40 is as far from 0.5 as 0.60: a model below one half is not rewarded for it, and equal
    # distances are no advantage
    assert _verdict(_summary([0.4, 0.38, 0.39], [0.6, 0.62, 0.61])) == "no advantage"
    s2 = _summary([0.6, 0.62, 0.61], [0.7, 0.75, 0.72], prefix="s2_")
    assert _verdict(s2, "rwefm_synthetic", "s2_") == "reproduced"
    # the reason carries the interval and, when undecided, the seeds it would need
    reason = render._rwefm_setting(
        {"rwefm_protein": _summary([0.6, 0.75, 0.61], [0.7, 0.62, 0.72])}, "rwefm_protein", ""
    )[1]
    assert "95% t interval" in reason and "seeds would give 80% power" in reason


def test_rwefm_rule_needs_converged_evaluation_and_two_seeds(monkeypatch):
    # a setting without a pre-stated seed count (test_render_planned covers those)
    monkeypatch.setattr(render, "RWEFM_PLANNED_SEEDS", {})
    claim = _claim("rwefm_protein")
    assert _claim("rwefm_synthetic/t2").text.startswith("T^2 (mixtures")
    s = _summary([0.6, 0.62, 0.61], [0.7, 0.75, 0.72], conv=0.98)
    run = render.Run("rwefm_protein", "", {}, s)
    verdict, reason = render.decide(claim, {"rwefm_protein": s}, [run])
    assert verdict == "not tested" and "eval_converged_frac" in reason
    assert "95% t interval" in reason  # the figures are still reported
    one = _summary([0.6], [0.7])
    with pytest.raises(ValueError, match="^diffs"):  # bad input is never a verdict
        _verdict(one)
    verdict, reason = render.decide(claim, {"rwefm_protein": one}, [])
    assert verdict == "not measured" and "at least two pairs" in reason


def _write(d, summary, commit="c", **config):
    d.mkdir(parents=True)
    cfg = {"seed": 0, "provenance": {"commit": commit, "date": "2026-01-01T00:00:00Z"}} | config
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "summary.json").write_text(json.dumps(summary))


def test_a_study_run_in_parts_is_read_from_its_part_folders(tmp_path, monkeypatch):
    monkeypatch.setattr(render, "RWEFM_PLANNED_SEEDS", {})  # decided at any count here
    monkeypatch.setattr(render, "RESULTS", tmp_path)
    monkeypatch.setattr(render, "OUT", tmp_path / "out")
    good, bad = [0.6, 0.62, 0.61], [0.7, 0.75, 0.72]
    _write(tmp_path / "rwefm_synthetic" / "s2", _summary(good, bad, prefix="s2_"))
    _write(tmp_path / "rwefm_synthetic" / "t2", _summary(bad, good, prefix="t2_"), commit="d")
    (tmp_path / "rwefm_synthetic" / "notes").mkdir()  # a folder without a run is skipped
    assert [r.part for r in render._runs("rwefm_synthetic")] == ["s2", "t2"]
    page = render.render(next(p for p in render.PAPERS if "rwefm_synthetic" in p.studies))
    assert "### run `s2`" in page and "### run `t2`" in page
    assert "parts from commits whose code differs" in page  # "c" and "d": unknown commits
    rows = [line for line in page.splitlines() if line.startswith("| S^2") or
            line.startswith("| T^2 (mixtures")]  # fmt: skip
    assert "**reproduced**" in rows[0] and "**not reproduced**" in rows[1]
    # a whole-study folder wins over parts
    _write(tmp_path / "rwefm_protein", _summary(good, bad))
    assert [r.part for r in render._runs("rwefm_protein")] == [""]


def _prefmh_summary(rhat_mh=1.02):
    return {"tv_mh": 0.011, "tv_iid": 0.005, "tv_prefmh_k1": 0.012, "tv_prefmh_k3": 0.013,
            "tv_majority_k3": 0.15, "truncated_two_coin": 11, "rhat_mh": rhat_mh}  # fmt: skip


def _prefmh_row(tmp_path, monkeypatch, summary, commit):
    monkeypatch.setattr(render, "RESULTS", tmp_path)
    monkeypatch.setattr(render, "OUT", tmp_path / "out")
    _write(tmp_path / "prefmh_mixture", summary, commit=commit)
    page = render.render(render.PAPERS_BY_SLUG["prefmh"])
    return next(line for line in page.splitlines() if line.startswith("| The K-budget")), page


def _git(*args):
    r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return r.stdout.strip() if r.returncode == 0 else None


# The commit of the committed Pref-MH runs: lib/hexad/prefmh changed after it (0b8fdaa, among
# others), so a run made there is stale.
OLD = "6af8c231940824de8d7e52ca945a927fc1557627"


def test_a_run_older_than_its_methods_code_renders_stale(tmp_path, monkeypatch):
    if _git("cat-file", "-e", f"{OLD}^{{commit}}") is None:
        pytest.skip("git or this repository's history is not available (a shallow clone?)")
    row, page = _prefmh_row(tmp_path, monkeypatch, _prefmh_summary(), OLD)
    assert "**reproduced** (stale: code changed after the run, commits 6af8c23.." in row
    assert "| `prefmh_mixture` | `6af8c23` |" in page and "of them change it" in page
    # a run at HEAD is current (nothing after it touched the code)
    head = _git("rev-parse", "HEAD")
    render._git.cache_clear()
    row, page = _prefmh_row(tmp_path / "head", monkeypatch, _prefmh_summary(), head)
    assert "stale" not in row and "current: no code change since the run" in page


def test_an_unknown_commit_renders_provenance_unknown(tmp_path, monkeypatch):
    row, page = _prefmh_row(tmp_path, monkeypatch, _prefmh_summary(), "0123456" * 5 + "01234")
    assert "**reproduced** (provenance unknown)" in row
    assert "provenance unknown:" in page
    row, _ = _prefmh_row(tmp_path / "b", monkeypatch, _prefmh_summary(), "")
    assert "(provenance unknown)" in row

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    render._git.cache_clear()
    monkeypatch.setattr(render.subprocess, "run", no_git)
    row, page = _prefmh_row(tmp_path / "c", monkeypatch, _prefmh_summary(), OLD)
    render._git.cache_clear()
    assert "(provenance unknown)" in row and "git is unavailable" in page


def test_a_run_failing_its_validity_check_renders_not_tested(tmp_path, monkeypatch):
    # experiments/prefmh_mixture.py: the exact MH reference must have mixed (R-hat <= 1.05);
    # two-coin steps cut at max_rounds (11 here) are exact and fail nothing
    row, page = _prefmh_row(tmp_path, monkeypatch, _prefmh_summary(rhat_mh=1.2), OLD)
    assert "**not tested**" in row and "`rhat_mh` = 1.2, not <= 1.05" in row
    assert "Measured: prefmh_mixture: grid TV" in row  # the figures stay on the page
    assert "- validity checks: `rhat_mh` = 1.2" in page
    ok_row, _ = _prefmh_row(tmp_path / "ok", monkeypatch, _prefmh_summary(), OLD)
    assert "not tested" not in ok_row
    # each rule is stated once, and the verdict table comes first
    assert page.count("- **R1**:") == 1
    assert page.index("## Verdicts") < page.index("## Rules") < page.index("## Runs")


def _dtb_summary(hidden, naive=0.01, **kw):
    n = len(hidden)
    s = {"calibration_admitted": 7, "control_mask_pass": True, "control_oracle_fp_pass": True,
         "control_surrogate_pass": True, "implant_usable": True, "informative_events": n,
         "events_hidden_asr": list(hidden),
         "events_naive_hidden_asr": [naive + 0.001 * i for i in range(n)],
         "verdict_failed": []}  # fmt: skip
    return s | kw


def test_dtb_rule_is_the_studys_pre_stated_rule():
    verdict = lambda s: render._dtb({"backdoor_dtb": s})
    wake = [0.8 + 0.01 * i for i in range(12)]
    assert verdict(_dtb_summary(wake))[0] == "reproduced"
    # woken as often, but no more than the naive model's: only partly
    assert verdict(_dtb_summary(wake, naive=0.85))[0] == "partly"
    assert verdict(_dtb_summary([0.3 + 0.01 * i for i in range(12)]))[0] == "partly"
    assert verdict(_dtb_summary([0.05] * 12))[0] == "not reproduced"
    # every gate is checked, and the reason names the failed one
    for gate, bad in (("calibration_admitted", 5), ("control_mask_pass", False),
                      ("control_oracle_fp_pass", False), ("control_surrogate_pass", False),
                      ("implant_usable", False)):  # fmt: skip
        v, why = verdict(_dtb_summary(wake, **{gate: bad}))
        assert v == "not tested", gate
        assert "failed:" in why, gate
    v, why = verdict(_dtb_summary(wake[:9]))
    assert v == "not tested" and "informative events 9 < 10" in why
    # a run of the protocol before the controls existed is not tested
    old = {"hidden_asr_after_suppressed_mean": 0.6, "n_defenses_suppressed": 2.0}
    assert verdict(old)[0] == "not tested"


def _phase(verdict="reproduced", holm=1, uncertified=()):
    grid = [[[0.9, 0.1], [0.2, 0.0]]]  # [panel][dpq][sep]
    s = {"dpq_grid": [0.3, 0.5], "sep_grid": [2.0, 4.0], "panels": ["K2_d1"], "trials": 15,
         "trials_near": 40, "eps_fixed": 10.0, "synergy_cells_fixed": holm,
         "synergy_cells_fixed_holm": holm, "candidate_cells_fixed": holm,
         "synergy_cells_tuned": 0, "synergy_cell_list_fixed": [["K2_d1", 0.3, 2.0]] * holm,
         "synergy_cell_list_tuned": [], "verdict": verdict, "verdict_exact": "not reproduced",
         "verdict_tuned": "undecided", "uncertified_solves": len(uncertified),
         "uncertified_list": [[p, "K2_d1", 0.3, 2.0, 1.0] for p in uncertified],
         "max_min_eig_violation": 0.0}  # fmt: skip
    for regime in ("fixed", "tuned"):
        for p in render.CVXCLUST_PHASE_PROGRAMS:
            s[f"{regime}_{p}_recovery"] = grid
    return s


def test_cvxclust_claim_is_the_studys_rule_and_table_marks_synergy():
    claim = render.PAPERS_BY_SLUG["cvxclust"].claims[0]

    def verdict(s, panels=("K2_d1", "K2_d5", "K3_d1", "K3_d5")):  # the pre-stated four
        s = {**s, "panels": list(panels)}
        run = render.Run("cvxclust_phase", "", {}, s)
        return render.decide(claim, {"cvxclust_phase": s}, [run])

    assert verdict(_phase())[0] == "reproduced"
    # Holm's family is every cell of the study: a run of fewer panels is an interim
    v, why = verdict(_phase(), panels=("K2_d1",))
    assert v == "undecided" and "interim" in why and "missing K2_d5, K3_d1, K3_d5" in why
    assert verdict(_phase("undecided", holm=0))[0] == "undecided"
    assert verdict(_phase("not tested", holm=0))[0] == "not tested"
    # uncertified solves keep a cell out of the study's own count; the report does not also
    # gate the rebuilt study on them (its count includes the tuning draws' solves)
    assert verdict(_phase(uncertified=("joint",)))[0] == "reproduced"
    assert "McNemar" in verdict(_phase())[1]
    # a run of the earlier protocol is not tested, whatever it found
    old = {k: v for k, v in _phase().items() if k != "synergy_cells_fixed_holm"}
    assert verdict(old)[0] == "not tested"
    rows = [line for line in render._cvxclust_table(_phase()) if line.startswith("| 0.")]
    assert len(rows) == 4  # two regimes x two dpq rows
    bold = "**0.90 / 0.90 / 0.90 / 0.90 / 0.90**"  # five programs, the no-graph joint among them
    assert bold in rows[0] and bold not in rows[2]  # fixed lists the cell, tuned does not
    assert "joint_nograph" in render._cvxclust_table(_phase())[0]


def test_planetoid_table_has_a_row_per_program_and_skips_absent_data_sets():
    s = {"karate_linear_lr_acc": 0.5, "karate_lp_acc": 0.9}
    for p in render.CVXCLUST_PROGRAMS:
        s |= {f"karate_{p}_acc": 0.8, f"karate_{p}_coverage": 0.9, f"karate_{p}_covered_acc": 0.85,
              f"karate_{p}_choice": 1.0, f"karate_{p}_certified": p != "linear"}  # fmt: skip
    lines = render._planetoid_table(s)
    rows = [
        line
        for line in lines
        if line.startswith("| ") and "program" not in line and "---" not in line
    ]
    assert len(rows) == 4 and "| linear | 0.8 | 0.9 | 0.85 | 1 | False | - |" in rows
    assert not any("cora" in line for line in lines)


# The policy studies' paired differences, by rule, that the shared module decides each way at
# the margin 3: the claim shown ("holds"), shown against ("fails"), neither ("undecided").
_POLICY_DIFFS = {
    "bound greater": {"holds": [0.1, -0.2, 0.0, 0.3, -0.1], "fails": [-10, -11, -9.5, -10.5, -10],
                      "undecided": [-3, 0, -6, 1, -7]},
    "difference less": {"holds": [-5, -6, -5.5, -6.5, -5], "fails": [5, 6, 5.5, 6.5, 5],
                        "undecided": [-3, 2, -6, 4, -1]},
}  # fmt: skip
_AS_CLAIM = {"reproduced": "holds", "not reproduced": "fails", "no advantage": "fails",
             "undecided": "undecided"}  # fmt: skip


def _policy_diffs(rule, verdict, margin=3.0):
    """Differences the rule decides as ``verdict`` ("not tested: ..." as "holds", gated)."""
    flip = {"bound less": "bound greater", "difference greater": "difference less"}
    word = "holds" if verdict.startswith("not tested") else verdict
    d = _POLICY_DIFFS[flip.get(rule, rule)][word]
    return [(-x if rule in flip else x) * margin / 3.0 for x in d]


def _pclaim(name, verdict="holds", rule="bound greater", diffs=None, margin=3.0):
    """A claim's keys as experiments/_policy.py's ``Claims.claim`` writes them."""
    kind, direction = rule.split()
    diffs = _policy_diffs(rule, verdict, margin) if diffs is None else diffs
    why = [verdict.partition(": ")[2]] if verdict.startswith("not tested") else []
    fn = render._verdicts.noninferior if kind == "bound" else render._verdicts.decide
    v = fn(diffs, margin=margin, direction=direction, alpha=0.05, failed=why)
    lo, hi = (v.eq_low, v.eq_high) if kind == "bound" else (v.ci_low, v.ci_high)
    keys = {"ci_low": lo, "ci_high": hi, "ci_level": 0.9 if kind == "bound" else 0.95,
            "margin": margin, "mean": v.effect_mean, "outcome": v.outcome,
            "seeds_needed": v.seeds_needed, "diffs": list(diffs), "rule": rule}  # fmt: skip
    verdict = _AS_CLAIM.get(v.outcome) or f"not tested: {why[0]}"
    return {f"verdict_{name}": verdict} | {f"{name}_{k}": x for k, x in keys.items()}


def _pfig(name, diffs=(1.0, 2.0, 1.5, 0.5, 1.0), direction="greater", margin=3.0):
    """A figure's keys as ``Claims.figure`` writes them."""
    v = render._verdicts.decide(list(diffs), margin=margin, direction=direction)
    return {name: v.effect_mean, f"{name}_ci_low": v.ci_low, f"{name}_ci_high": v.ci_high,
            f"{name}_outcome": v.outcome, f"{name}_diffs": list(diffs)}  # fmt: skip


def _pm_summary(verdicts=(), priors=("good", "bad"), spaces=("pretanh", "action"),
                prediction=("holds",) * 3, ratios=(0.5, 1.0, 2.0), **keys):  # fmt: skip
    """A rebuilt policy_pointmaze summary: every claim holds unless ``verdicts`` (claim name ->
    verdict) says otherwise; ``prediction``: the study's precision_ratio_prediction per space,
    then over both."""
    v = dict(verdicts)
    s = {"priors": list(priors), "spaces": list(spaces), "precision_ratios": list(ratios),
         "margin": 3.0, "stat_alpha": 0.05, "stat_unit": "seed", "n_seeds": 5, "n_test": 20,
         "precision_ratio_prediction": prediction[-1]}  # fmt: skip
    for i, sp in enumerate(spaces):
        for q in priors:
            s |= _pclaim(f"graceful_{q}_{sp}", v.get(f"graceful_{q}_{sp}", "holds"))
            name = f"additive_below_poe_{q}_{sp}"
            s |= _pclaim(name, v.get(name, "holds"), "difference less")
        s |= _pclaim(f"selector_{sp}", v.get(f"selector_{sp}", "holds"))
        for k in ("selector_regret", "fixed_regret", "actor_regret", "selector_minus_fixed"):
            s |= _pfig(f"{k}_{sp}")
        for r in ratios:
            d = _policy_diffs("difference less" if r < 1 else "difference greater", "holds")
            name, side = f"precision_contrast_r{r:g}_{sp}", "less" if r < 1 else "greater"
            s |= _pfig(name, d if r != 1 else [0.0] * 5, side)
        s[f"precision_ratio_prediction_{sp}"] = prediction[i]
    return s | keys


def _policy(claim):
    return next(c for c in render.PAPERS_BY_SLUG["policy"].claims if c.text.startswith(claim))


def _pdecide(claim, **summaries):
    return render.decide(_policy(claim), {k.replace("__", "/"): s for k, s in summaries.items()})


GATE = "not tested: the prior alone is not decidedly worse than the actor"


def test_policy_claims_combine_the_studys_cell_verdicts():
    def graceful(**v):
        return _pdecide("Composition degrades", policy_pointmaze=_pm_summary(
            {f"graceful_{k}": x for k, x in v.items()}))  # fmt: skip

    assert graceful()[0] == "reproduced"
    assert graceful(good_pretanh=GATE, bad_action=GATE)[0] == "reproduced"  # untested cells
    assert graceful(good_pretanh="undecided")[0] == "partly"
    both = {f"{q}_{sp}": "undecided" for q in ("good", "bad") for sp in ("pretanh", "action")}
    assert graceful(**both)[0] == "undecided"
    assert graceful(**both | {"bad_action": "fails"})[0] == "not reproduced"
    verdict, reason = graceful(**{k: GATE for k in both})
    assert verdict == "not tested" and "no cell tested" in reason
    assert "not tested (the prior alone is not decidedly worse than the actor): good" in reason
    verdict, reason = graceful(good_pretanh=GATE)
    assert "mean [90% interval]; margin 3 in return; units: per-seed means of 5 seeds" in reason
    assert "bad pretanh holds +0.02 [-0.163, +0.203]" in reason  # the bound's 90% interval
    # additive below PoE: a difference within the margin is "no advantage", which fails it
    tiny = [0.1, -0.1, 0.05, 0.0, -0.05]
    s = _pm_summary() | _pclaim("additive_below_poe_bad_action", rule="difference less", diffs=tiny)
    verdict, reason = _pdecide("Under a bad prior", policy_pointmaze=s)
    assert verdict == "partly" and "bad action fails (no advantage) +0 [-0.0982, +0.0982]" in reason
    assert "good pretanh holds (reproduced) -5.6" in reason


def test_precision_ratio_prediction_reads_the_studys_verdict_and_shows_each_ratio():
    def prediction(*p):
        return _pdecide("PoE beats additive", policy_pointmaze=_pm_summary(prediction=p))

    assert prediction("holds", "holds", "holds")[0] == "reproduced"
    assert prediction("holds", "fails", "fails")[0] == "not reproduced"
    assert prediction("undecided", "holds", "undecided")[0] == "undecided"
    gate = "not tested: the family's mean alone is not decidedly worse than the actor"
    verdict, reason = prediction(gate, gate, "not tested: no space or actor level passed its gates")
    assert verdict == "not tested"
    assert "pretanh not tested (the family's mean alone is not decidedly worse" in reason
    assert "r = 0.5 -5.6 [-6.41, -4.79] reproduced" in reason  # r < 1: additive - PoE < 0
    assert "r = 2 +5.6 [+4.79, +6.41] reproduced" in reason and "r = 1 +0 [+0, +0]" in reason


def test_kl_selector_claim_shows_its_regret_beside_the_rules_without_search():
    def selector(**v):
        s = _pm_summary({f"selector_{k}": x for k, x in v.items()})
        return _pdecide("The KL-budget selector", policy_pointmaze=s)

    verdict, reason = selector()
    assert verdict == "reproduced"
    assert "pretanh holds: PoE-KL - oracle +0.02 [-0.163, +0.203] (90%)" in reason
    regret = "+1.2 [+0.492, +1.91]"
    assert f"regret (95%) of the KL selector {regret}, of fixed alpha {regret}" in reason
    assert f"of the actor alone {regret}, selector - fixed {regret} no advantage" in reason
    gated = "not tested: the actor does not beat the zero action"
    assert selector(action=gated)[0] == "reproduced"
    assert selector(action="fails", pretanh=gated)[0] == "not reproduced"
    assert selector(action="undecided")[0] == "partly"
    assert selector(action=gated, pretanh=gated)[0] == "not tested"


def _loco_summary(env, capped="holds", responsive="holds", admissible=True, **keys):
    s = {"env": env, "spaces": ["pretanh"], "levels": ["medium", "medium_replay", "medium_expert"],
         "margin": 50.0, "stat_alpha": 0.05, "stat_unit": "seed", "n_seeds": 3, "n_test": 10,
         "data_admissible": admissible, "data_steps": 100_000 if admissible else 5000}  # fmt: skip
    s |= _pclaim("capped_medium_expert_pretanh", capped, "bound less", margin=50.0)
    s |= _pclaim("responsive_medium_replay_pretanh", responsive, "difference greater", margin=50)
    for lv in ("medium_expert", "medium_replay"):
        s |= _pfig(f"good_prior_minus_actor_{lv}_pretanh", margin=50.0)
        s |= _pfig(f"control_minus_actor_{lv}_pretanh", margin=50.0)
    return s | keys


def test_competence_ceiling_rule_per_env_and_space():
    cell = render._policy_ceiling_cell
    nt = "not tested: the good prior alone beats the actor: not competent on this task"
    assert cell("holds", "holds") == "reproduced"
    assert cell("holds", "fails") == cell(nt, "holds") == "partly"
    assert cell("fails", "fails") == "not reproduced"
    assert cell(nt, nt) == "not tested"
    assert cell("fails", "undecided") == cell("fails", nt) == cell("undecided", nt) == "undecided"

    def ceiling(*envs):  # one part per env, as the study is run
        return _pdecide("A competent", **{f"policy_locomotion__{s['env']}": s for s in envs})

    verdict, reason = ceiling(_loco_summary("Hopper-v5"))
    assert verdict == "reproduced"
    assert "policy_locomotion Hopper-v5 (" in reason and "margin 50 in return" in reason
    assert "capped (medium-expert) -0.333 [-3.39, +2.72] (90%) holds, responsive" in reason
    assert "preconditions (good prior alone - actor / control - actor): medium_expert " in reason
    # the envs' parts share key names: each is read from its own part
    verdict, reason = ceiling(_loco_summary("Hopper-v5"), _loco_summary("Walker2d-v5", "fails"))
    assert verdict == "partly" and "Walker2d-v5" in reason and "Hopper-v5" in reason
    small = _loco_summary("HalfCheetah-v5", admissible=False)
    verdict, reason = ceiling(_loco_summary("Hopper-v5"), small)
    assert verdict == "reproduced"  # the env with too little data is not tested
    assert "HalfCheetah-v5: not tested (its data has 5000 SAC steps, below 100k)" in reason
    assert ceiling(_loco_summary("Hopper-v5", admissible=False))[0] == "not tested"
    assert ceiling(_loco_summary("Hopper-v5", "fails", "fails"))[0] == "not reproduced"
    # a whole-study folder (one env) is read as it is
    assert _pdecide("A competent", policy_locomotion=_loco_summary("Hopper-v5"))[0] == "reproduced"


def test_policy_runs_of_the_old_protocol_are_not_tested():
    # the committed runs before issue 52: old keys, no stat_unit
    pm = {"verdict_graceful_good": "holds", "action_verdict_graceful_good": "fails",
          "verdict_selector_good": "holds", "margin": 2.1}  # fmt: skip
    loco = {"env": "HalfCheetah-v5", "medium_expert_cell_oracle_good": "help"}
    summaries = {"policy_pointmaze": pm, "policy_locomotion": loco}
    for claim in render.PAPERS_BY_SLUG["policy"].claims:
        verdict, reason = render.decide(claim, summaries)
        assert verdict == "not tested", claim.text
        assert "predates the rebuilt rules (issue 52" in reason and "rerun it" in reason
    # one env rerun, one not: the old one is not tested, the new one decides
    verdict, reason = _pdecide("A competent", policy_locomotion__halfcheetah=loco,
                               policy_locomotion__hopper=_loco_summary("Hopper-v5"))  # fmt: skip
    assert verdict == "reproduced" and "policy_locomotion HalfCheetah-v5: the committed" in reason


def test_policy_seed_parts_are_joined_and_decided_again(tmp_path, monkeypatch):
    # Two seed groups of policy_pointmaze (--seed 0 and --seed 2, n_seeds=2): graceful's
    # per-seed units -1, +0.5 and +1, -1.5 are each undecided at the margin 3 (90% interval
    # -0.25 -/+ 6.31 SE), joined -0.25 -/+ 2.35 * 0.595 = [-1.65, +1.15]: the bound holds.
    one = {"priors": ["good"], "spaces": ["pretanh"], "prediction": ("holds", "holds"),
           "n_seeds": 2}  # fmt: skip
    a = _pm_summary(**one) | _pclaim("graceful_good_pretanh", diffs=[-1.0, 0.5])
    b = _pm_summary(**one) | _pclaim("graceful_good_pretanh", diffs=[1.0, -1.5])
    assert a["verdict_graceful_good_pretanh"] == b["verdict_graceful_good_pretanh"] == "undecided"
    # decided at the seeds stated before the parts ran; one part of two is an interim look
    monkeypatch.setattr(render, "POLICY_PLANNED_SEEDS", {"policy_pointmaze": 4})
    verdict, reason = _pdecide("Composition", policy_pointmaze__seed0=a)
    assert verdict == "undecided" and "interim, 2 of the 4 pre-stated seeds" in reason
    verdict, reason = _pdecide("Composition", policy_pointmaze__seed0=a, policy_pointmaze__seed2=b)
    assert verdict == "reproduced"
    assert "units: per-seed means of 4 seeds joined from 2 parts" in reason
    assert "good pretanh holds -0.25 [-1.65, +1.15]" in reason
    # through the page: each part is kept beside the merged summary
    monkeypatch.setattr(render, "RESULTS", tmp_path)
    monkeypatch.setattr(render, "OUT", tmp_path / "out")
    _write(tmp_path / "policy_pointmaze" / "seed0", a)
    _write(tmp_path / "policy_pointmaze" / "seed2", b)
    page = render.render(render.PAPERS_BY_SLUG["policy"])
    row = next(line for line in page.splitlines() if line.startswith("| Composition degrades"))
    assert "**reproduced**" in row and "joined from 2 parts" in row
    row = next(line for line in page.splitlines() if line.startswith("| PoE beats additive"))
    assert "**reproduced**" in row  # re-derived from the joined contrasts
    row = next(line for line in page.splitlines() if line.startswith("| A competent"))
    assert "**not measured**" in row  # no locomotion run here
    # a cell not tested in one part is not tested joined; a one-seed part is one unit
    gated = a | _pclaim("graceful_good_pretanh", GATE, diffs=[-1.0, 0.5])
    verdict, reason = _pdecide("Composition", policy_pointmaze__seed0=gated,
                               policy_pointmaze__seed2=b)  # fmt: skip
    assert verdict == "not tested" and "not tested (the prior alone is not decidedly" in reason
    parts = [{"stat_unit": "episode", "x_diffs": [1.0, 2.0, 3.0]},
             {"stat_unit": "seed", "x_diffs": [4.0, 5.0]}]  # fmt: skip
    assert render._policy_units(parts, "x") == [2.0, 4.0, 5.0]


def test_rwefm_on_a_torus_is_decided_against_the_periodic_feature_arm():
    # RWEFM beats the raw-angle baseline (differences -0.10, -0.13, -0.11: reproduced) but not
    # the chart flow fed the same (cos, sin) features (-0.10, +0.13, -0.11: undecided): the
    # verdict is the second, and the first is reported beside it.
    s = _summary([0.6, 0.62, 0.61], [0.7, 0.75, 0.72])
    s["euclid_periodic_emd_1nna_seeds"] = [0.7, 0.62, 0.72]
    verdict, reason = render._rwefm_setting({"rwefm_protein": s}, "rwefm_protein", "")
    assert verdict == "undecided"
    assert "(cos, sin) features" in reason and "raw-angle baseline reproduced" in reason


def test_parts_of_one_setting_join_their_seeds(tmp_path, monkeypatch):
    # Two seed groups of T^2 (e.g. --seed 0 and --seed 1 with n_seeds=2): the rule reads all
    # four pairs. Differences -0.10, -0.13 and -0.11, -0.12: reproduced only when joined (two
    # pairs alone give a 95% interval of -0.115 -/+ 12.71 * 0.015 / sqrt(2), across 0).
    monkeypatch.setattr(render, "RWEFM_PLANNED_SEEDS", {})  # decided at any count here
    monkeypatch.setattr(render, "RESULTS", tmp_path)
    monkeypatch.setattr(render, "OUT", tmp_path / "out")
    a = _summary([0.6, 0.62], [0.7, 0.75], prefix="t2_")
    b = _summary([0.61, 0.6], [0.72, 0.72], prefix="t2_")
    assert _verdict(a, "rwefm_synthetic", "t2_") == "undecided"
    _write(tmp_path / "rwefm_synthetic" / "t2-seed0", a)
    _write(tmp_path / "rwefm_synthetic" / "t2-seed1", b)
    merged = render.merge_parts(render.merge_parts({}, a), b)
    assert merged["t2_rwefm_emd_1nna_seeds"] == [0.6, 0.62, 0.61, 0.6]
    assert _verdict(merged, "rwefm_synthetic", "t2_") == "reproduced"
    page = render.render(next(p for p in render.PAPERS if "rwefm_synthetic" in p.studies))
    row = next(line for line in page.splitlines() if line.startswith("| T^2 (mixtures"))
    assert "**reproduced**" in row and "n 4" in row


def test_cachex_stall_rule_is_the_overhead_over_the_copy():
    # 6.65 ms blocked with a 0.72 ms copy: 5.93 ms of overhead, above the 2.5 ms goal
    s = {"stall_ms_cachex": 6.65, "stage_ms_cachex": 0.72, "stall_ratio_vs_orbax": 0.28}
    assert render._cachex({"cachex_bench": s})[0] == "not reproduced"
    s |= {"stall_ms_cachex": 3.0}  # 2.28 ms over the copy
    assert render._cachex({"cachex_bench": s})[0] == "reproduced"


def test_dtb_is_not_tested_when_an_implant_collapsed():
    run = render.Run("backdoor_dtb", "", {}, {"implant_ok": 1})
    assert render._failed_checks(run) == []
    bad = render.Run("backdoor_dtb", "", {}, {"implant_ok": 0.5})
    assert render._failed_checks(bad) == [
        "`implant_ok` = 0.5, not = 1 (every seed's implant kept its clean accuracy >= 0.5)"
    ]


def test_metric_table_builds_arms_by_metrics_from_the_key_names():
    # <setting>_<arm>_<metric>[_mean|_sd]; an arm template of its own (the paired difference);
    # a metric or arm or setting with no key drops out
    s = {"s2_rwefm_emd_1nna_mean": 0.52, "s2_rwefm_emd_1nna_sd": 0.03125,
         "s2_rwefm_emd_1nna_seeds": [0.5, 0.52, 0.54], "s2_euclid_emd_1nna_mean": 0.67,
         "s2_euclid_emd_1nna_sd": 0.04, "s2_emd_1nna_diff_mean": -0.15,
         "s2_emd_1nna_diff_sd": 0.0183, "s2_rwefm_final_loss_mean": 0.33, "s2_n_seeds": 3,
         "t2_rwefm_emd_1nna_mean": 0.6}  # fmt: skip
    table = render.MetricTable(
        (("rwefm", "RWEFM"), ("euclid", "baseline"), ("{setting}_{metric}_diff", "paired"),
         ("floor", "floor")),
        (("emd_1nna", "emd 1nna"), ("final_loss", "loss"), ("chamfer_mm", "chamfer mm")),
        settings=(("s2", "S^2"), ("t2", "T^2"), ("s7", "S^7")),
        note="lower is better",
    )  # fmt: skip
    shown = set()
    assert render.metric_tables([table], s, shown) == [
        "S^2, mean ± sd over 3 seeds (lower is better):",
        "",
        "| method | emd 1nna | loss |",
        "| --- | --- | --- |",
        "| RWEFM | 0.52 ± 0.03125 | 0.33 |",
        "| baseline | 0.67 ± 0.04 | - |",
        "| paired | -0.15 ± 0.0183 | - |",
        "",
        "T^2 (lower is better):",
        "",
        "| method | emd 1nna |",
        "| --- | --- |",
        "| RWEFM | 0.6 |",
        "",
    ]
    assert shown == set(s) - {"s2_rwefm_emd_1nna_seeds", "s2_n_seeds"}
    # an arm named "" is the study's unprefixed one; alternatives: the first present wins
    dtb = render.MetricTable(((("", "dtb"), "DTB"), ("naive", "naive")),
                             (("acc_before", "acc"), ("best_step", "best step")))  # fmt: skip
    s = {"acc_before": 0.97, "naive_acc_before": 0.99, "dtb_best_step": 480, "naive_best_step": 450}
    assert render.metric_tables([dtb], s) == [
        "| method | acc | best step |",
        "| --- | --- | --- |",
        "| DTB | 0.97 | 480 |",
        "| naive | 0.99 | 450 |",
        "",
    ]
    assert render.metric_tables([dtb], {"runtime_s": 1.0}) == []


def test_declared_tables_read_arms_the_summary_lists():
    # cachex_durability: one row per fault kind the summary has, and the totals
    s = {"bit_flip_runs": 5, "bit_flip_exact": 5, "bit_flip_corrupt": 0, "fault_runs": 5,
         "fault_exact_restores": 5, "fault_corrupt_restores": 0, "steps_lost": 0,
         "false_durable_claims": 0, "faults_tried": 1}  # fmt: skip
    lines = render.metric_tables(render.METRIC_TABLES["cachex_durability"], s)
    assert lines[0] == (
        "| fault | runs | exact restores | corrupt restores | steps lost | false durable claims |"
    )
    assert lines[2:4] == ["| bit_flip | 5 | 5 | 0 | - | - |", "| all faults | 5 | 5 | 0 | 0 | 0 |"]
    # policy (experiments/policy_locomotion.py's keys): a table per level and space, a column
    # per prior, a row per method
    s = {"priors": ["good", "bad"], "spaces": ["pretanh"], "levels": ["medium"],
         "actor_return_medium_pretanh": 10.0, "poe_kl_return_good_medium_pretanh": 12.0,
         "poe_kl_return_bad_medium_pretanh": 9.0,
         "prior_only_return_bad_medium_pretanh": 1.5}  # fmt: skip
    lines = render.metric_tables(render.METRIC_TABLES["policy_locomotion"], s)
    assert lines[:4] == ["Test return per prior, medium, pretanh:", "",
                         "| method | good | bad |", "| --- | --- | --- |"]  # fmt: skip
    assert lines[4:7] == ["| actor alone | 10 | 10 |", "| PoE at the KL-budget alpha | 12 | 9 |",
                          "| prior alone | - | 1.5 |"]  # fmt: skip


def test_page_shows_a_method_table_figures_and_the_other_keys_folded(tmp_path, monkeypatch):
    summary = _prefmh_summary() | {"acc_mh": 0.33, "acc_prefmh_k1": 0.22,
                                   "ess_per_kcall_k1": 12.5, "num_samples": 4096}  # fmt: skip
    row, page = _prefmh_row(tmp_path, monkeypatch, summary, "")
    (tmp_path / "prefmh_mixture" / "mixture.png").write_bytes(b"png")
    page = render.render(render.PAPERS_BY_SLUG["prefmh"])
    lines = page.splitlines()
    i = lines.index("| method | grid TV | acceptance | R-hat | ESS / 1000 calls | "
                    "steps cut at max_rounds |")  # fmt: skip
    assert lines[i + 2 : i + 5] == [
        "| exact MH | 0.011 | 0.33 | 1.02 | - | - |",
        "| Pref-MH, K = 1 | 0.012 | 0.22 | - | 12.5 | - |",  # ESS per call names it k1
        "| Pref-MH, K = 3 | 0.013 | - | - | - | - |",
    ]
    assert "| two-coin | - | - | - | - | 11 |" in lines  # the truncated steps, surfaced
    # the keys no table showed, and only they, in a folded block after the figure
    start, end = lines.index("<details>"), lines.index("</details>")
    assert lines[start + 1] == "<summary>The other 1 key of <code>summary.json</code></summary>"
    assert [x for x in lines[start:end] if x.startswith("| `")] == ["| `num_samples` | 4096 |"]
    assert not any(x.startswith("| `tv_mh` |") for x in lines)
    fig = lines.index(":::{figure} _img/prefmh_mixture/mixture.png")
    assert lines[fig + 1] == ":width: 100%" and i < fig < start
    assert (tmp_path / "out" / "_img" / "prefmh_mixture" / "mixture.png").is_file()
    assert page.startswith("# Pref-MH")


def test_each_rule_is_stated_once_and_the_verdicts_come_first(tmp_path, monkeypatch):
    monkeypatch.setattr(render, "RESULTS", tmp_path)
    monkeypatch.setattr(render, "OUT", tmp_path / "out")
    for paper in render.PAPERS:
        page = render.render(paper)
        rules = list(dict.fromkeys(c.rule for c in paper.claims))
        for rule in rules:
            assert page.count(rule.text) == 1, (paper.slug, rule.text[:40])
        heads = [x for x in page.splitlines() if x.startswith("| claim | verdict |")]
        # a rule shared by every claim is named once under the table, not in a column
        assert heads == ["| claim | verdict | rule | measured |" if len(rules) > 1
                         else "| claim | verdict | measured |"], paper.slug  # fmt: skip
        assert ("decided by rule **R1** below" in page) == (len(rules) == 1)
        assert page.index("## Verdicts") < page.index("## Rules") < page.index("## Runs")
    assert len(render.PAPERS_BY_SLUG["rwefm"].claims) == 5  # four settings + the chart control


def test_citations_name_keys_of_the_bibliography():
    bib = ROOT / "docs" / "references.bib"
    if not bib.is_file():
        pytest.skip("docs/references.bib is not there")
    import re

    keys = set(re.findall(r"^@\w+\{([^,\s]+),", bib.read_text(encoding="utf-8"), re.M))
    for paper in render.PAPERS:
        cited = [k for k in (paper.cite, *paper.prior) if k]
        assert set(cited) <= keys, (paper.slug, set(cited) - keys)
        line = render._citations(paper)
        if paper.cite:
            assert line.startswith(f"Paper: {{cite:t}}`{paper.cite}`.")
        if paper.prior:
            assert f"Prior work: {{cite:t}}`{','.join(paper.prior)}`." in line


def test_a_runs_command_names_its_results_folder_not_the_machines():
    def run(command: str, part: str = "") -> render.Run:
        return render.Run("rwefm_synthetic", part, {"provenance": {"command": command}}, {})

    cmd = (
        "python -m experiments.rwefm_synthetic --set manifolds=t2 --seed 4 "
        "--out .../scratch/t2-seed4 --ckpt .../scratch/ckpt-t2-seed4"
    )
    assert render._command(run(cmd, "t2-seed4")) == (
        "python -m experiments.rwefm_synthetic --set manifolds=t2 --seed 4 "
        "--out results/rwefm_synthetic/t2-seed4"
    )
    assert render._command(run("python -m experiments.rwefm_synthetic --out=/x/y")) == (
        "python -m experiments.rwefm_synthetic --out results/rwefm_synthetic"
    )
    assert render._command(render.Run("rwefm_synthetic", "", {}, {})) == "?"


# Two commits of this repository with the same RWEFM code (only docstrings, results and other
# methods changed between them), and one before an RWEFM code change.
RWEFM_SAME = ("b8607bd", "34f99be")
RWEFM_OLDER = "513b7c7"


def test_parts_from_commits_with_the_same_code_are_not_flagged(tmp_path, monkeypatch):
    if any(_git("rev-parse", "--verify", "--quiet", f"{c}^{{commit}}") is None
           for c in (*RWEFM_SAME, RWEFM_OLDER)):  # fmt: skip
        pytest.skip("needs the repository's history")
    monkeypatch.setattr(render, "RESULTS", tmp_path)
    monkeypatch.setattr(render, "OUT", tmp_path / "out")
    good, bad = [0.6, 0.62, 0.61], [0.7, 0.75, 0.72]
    study = tmp_path / "rwefm_synthetic"
    _write(study / "s2", _summary(good, bad, prefix="s2_"), commit=RWEFM_SAME[0])
    _write(study / "t2", _summary(bad, good, prefix="t2_"), commit=RWEFM_SAME[1])
    paper = render.PAPERS_BY_SLUG["rwefm"]
    page = render.render(paper)
    assert "different commits, the same code (no code change between them)." in page
    assert "whose code differs" not in page
    shutil.rmtree(study / "t2")
    _write(study / "t2", _summary(bad, good, prefix="t2_"), commit=RWEFM_OLDER)
    page = render.render(paper)
    assert "parts from commits whose code differs" in page


def test_chart_rotation_parts_are_a_control_of_their_own(tmp_path, monkeypatch):
    # Parts run with the chart rotated are not more seeds of the protein claim: they merge apart
    # and decide the chart-control claim, while the protein claim reads only unrotated parts.
    monkeypatch.setattr(render, "RWEFM_PLANNED_SEEDS", {})  # decided at any count here
    monkeypatch.setattr(render, "RESULTS", tmp_path)
    monkeypatch.setattr(render, "OUT", tmp_path / "out")
    good, bad = [0.6, 0.62, 0.61], [0.7, 0.75, 0.72]
    shifted = {"config": {"chart_shift_deg": [-60.0, 30.0]}}
    _write(tmp_path / "rwefm_protein" / "seed0", _summary(good, bad), config={"n_seeds": 3})
    for k in range(2):  # equal arms when rotated: no advantage, and never joined to seed0
        _write(tmp_path / "rwefm_protein" / f"chart-seed{k}",
               _summary([0.6, 0.7], [0.6, 0.7]), **shifted)  # fmt: skip
    runs = render._runs("rwefm_protein")
    assert [render._control(r) for r in runs] == ["chart", "chart", ""]
    page = render.render(render.PAPERS_BY_SLUG["rwefm"])
    rows = [line for line in page.splitlines() if line.startswith("| T^2 (alanine")]
    assert len(rows) == 2
    assert "**reproduced**" in rows[0] and "n 3" in rows[0]
    assert "rwefm_protein/chart" in rows[1] and "n 4" in rows[1]
    assert "**no advantage**" in rows[1]
    claim = _claim("rwefm_protein")
    assert [r.part for r in render._claim_runs(claim, {"rwefm_protein": runs})] == ["seed0"]
    chart = _claim("rwefm_protein/chart")
    assert [r.part for r in render._claim_runs(chart, {"rwefm_protein": runs})] == [
        "chart-seed0", "chart-seed1"]  # fmt: skip
