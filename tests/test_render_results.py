"""The reproduction report's rules and tables on hand-made summaries (docs/render_results.py)."""

import importlib.util
import json
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


def test_rwefm_rule_needs_converged_evaluation_and_two_seeds():
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
    monkeypatch.setattr(render, "RESULTS", tmp_path)
    monkeypatch.setattr(render, "OUT", tmp_path / "out")
    good, bad = [0.6, 0.62, 0.61], [0.7, 0.75, 0.72]
    _write(tmp_path / "rwefm_synthetic" / "s2", _summary(good, bad, prefix="s2_"))
    _write(tmp_path / "rwefm_synthetic" / "t2", _summary(bad, good, prefix="t2_"), commit="d")
    (tmp_path / "rwefm_synthetic" / "notes").mkdir()  # a folder without a run is skipped
    assert [r.part for r in render._runs("rwefm_synthetic")] == ["s2", "t2"]
    page = render.render(next(p for p in render.PAPERS if "rwefm_synthetic" in p.studies))
    assert "### run `s2`" in page and "### run `t2`" in page
    assert "parts from different commits" in page
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
    assert "| `prefmh_mixture` | `6af8c23` |" in page and "of them touch it" in page
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


def test_dtb_rule_bounds_the_spread_of_the_difference_and_needs_a_suppressing_defense():
    def verdict(ours, naive, sd=0.01, n_sup=1.0, seeds=3):
        k = "hidden_asr_after_suppressed_mean"
        s = {k: ours, f"{k}_sd": sd, f"naive_{k}": naive, f"naive_{k}_sd": sd,
             "n_defenses_suppressed": n_sup, "n_seeds_run": seeds}  # fmt: skip
        return render._dtb({"backdoor_dtb": s})[0]

    # difference 0.6, sd bound 0.02, n 3: 95% interval 0.6 -/+ 4.303 * 0.02 / sqrt(3)
    assert verdict(0.61, 0.01) == "reproduced"
    assert verdict(0.21, 0.01) == "partly"
    assert verdict(0.2, 0.19) == "no advantage"  # within +-0.05 of the naive model
    assert verdict(0.011, 0.01) == "not reproduced"  # it does not wake (below 0.1)
    assert verdict(0.09, 0.01, sd=0.001) == "not reproduced"  # decided above, but below 0.1
    assert verdict(0.2, 0.6) == "not reproduced"  # decided below the naive model
    assert verdict(0.3, 0.01, sd=0.5) == "undecided"
    assert verdict(float("nan"), 0.01, n_sup=0.0) == "not measured"


def _phase(tuned=1, uncertified=(), eig=0.0, count=None):
    grid = [[[0.9, 0.1], [0.2, 0.0]]]  # [panel][dpq][sep]
    s = {"dpq_grid": [0.3, 0.5], "sep_grid": [2.0, 4.0], "panels": ["K2_d1"], "trials": 20,
         "synergy_cells_tuned": tuned, "synergy_cells_fixed": 0,
         "synergy_cell_list_tuned": [["K2_d1", 0.3, 2.0]] * tuned, "synergy_cell_list_fixed": [],
         "uncertified_solves": len(uncertified) if count is None else count,
         "uncertified_list": [[p, "K2_d1", 0.3, 2.0, 1.0] for p in uncertified],
         "max_min_eig_violation": eig}  # fmt: skip
    for regime in ("fixed", "tuned"):
        for p in render.CVXCLUST_PROGRAMS:
            s[f"{regime}_{p}_recovery"] = grid
            s[f"{regime}_{p}_lo"] = [[[0.7, 0.0], [0.05, 0.0]]]
            s[f"{regime}_{p}_hi"] = [[[0.97, 0.3], [0.4, 0.16]]]
    return s


def test_cvxclust_rule_needs_certified_solves_and_table_marks_synergy():
    claim = render.PAPERS_BY_SLUG["cvxclust"].claims[0]

    def verdict(s):
        run = render.Run("cvxclust_phase", "", {}, s)
        return render.decide(claim, {"cvxclust_phase": s}, [run])[0]

    assert verdict(_phase()) == "reproduced"
    assert verdict(_phase(tuned=0)) == "not reproduced"
    assert verdict(_phase(uncertified=("joint",))) == "not tested"
    assert verdict(_phase(uncertified=("linear",), count=21)) == "not tested"  # not all listed
    full = _phase(uncertified=("linear",), count=29)
    full["uncertified_by_program"] = {"linear": 29, "joint": 0}  # the complete count
    assert verdict(full) == "reproduced"
    full["uncertified_by_program"]["joint"] = 1
    assert verdict(full) == "not tested"
    # the surrogate is not one of the compared programs; the eigenvalue is reported
    assert verdict(_phase(uncertified=("linear", "linear"), eig=-1e-5)) == "reproduced"
    # the same rule with another joint program: every program has the same grid here, so the
    # singles are at 0.9 too and no cell qualifies; with low singles the 0.9 cell does
    s = _phase()
    assert render._cvxclust_synergy(s, "tuned", "linear") == 0
    for p in ("graph", "node"):
        s[f"tuned_{p}_recovery"] = [[[0.1, 0.1], [0.2, 0.0]]]
        s[f"tuned_{p}_hi"] = [[[0.3, 0.3], [0.4, 0.16]]]
    assert render._cvxclust_synergy(s, "tuned", "linear") == 1
    rows = [line for line in render._cvxclust_table(_phase()) if line.startswith("| 0.")]
    assert len(rows) == 4  # two regimes x two dpq rows
    bold = "**0.90 / 0.90 / 0.90 / 0.90**"
    assert bold in rows[2] and bold not in rows[0]  # tuned lists the cell, fixed does not


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


def test_policy_rules_read_the_studys_own_cell_verdicts():
    def verdict(**cells):
        s = {f"verdict_graceful_{k}": v for k, v in cells.items()}
        return render._verdict_keys(
            {"policy_pointmaze": s}, "policy_pointmaze", "verdict_graceful_"
        )[0]

    assert verdict(a="holds", b="holds", c="not tested: the prior is not worse") == "reproduced"
    assert verdict(a="holds", b="undecided") == "partly"
    assert verdict(a="undecided", b="undecided") == "undecided"  # nothing decided either way
    assert verdict(a="fails", b="undecided") == "not reproduced"
    assert verdict(a="not tested: x", b="excluded: y") == "not tested"


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


def test_dtb_is_not_tested_when_its_oracle_control_does_not_wake():
    ok = {"implant_ok": 1, "n_defenses_effective": 2, "oracle_hidden_asr_after_fp": 0.6}
    run = render.Run("backdoor_dtb", "", {}, ok)
    assert render._failed_checks(run) == []
    bad = render.Run("backdoor_dtb", "", {}, ok | {"oracle_hidden_asr_after_fp": 0.0045})
    assert render._failed_checks(bad) == [
        "`oracle_hidden_asr_after_fp` = 0.0045, not >= 0.1 (the positive control: the oracle "
        "DTB's hidden backdoor wakes under fine-pruning)"
    ]
