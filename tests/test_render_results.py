"""The reproduction report's rules and tables on hand-made summaries (docs/render_results.py)."""

import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "render_results", Path(__file__).resolve().parents[1] / "docs" / "render_results.py"
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


def test_rwefm_rule_decides_on_the_paired_distance_from_one_half():
    # differences -0.10, -0.13, -0.11: mean -0.113, sd 0.015, so below 0 by more than 2 sd
    assert _verdict(_summary([0.6, 0.62, 0.61], [0.7, 0.75, 0.72])) == "reproduced"
    assert _verdict(_summary([0.7, 0.75, 0.72], [0.6, 0.62, 0.61])) == "not reproduced"
    assert _verdict(_summary([0.6, 0.75, 0.61], [0.7, 0.62, 0.72])) == "undecided"
    # 0.40 is as far from 0.5 as 0.60: a model below one half is not rewarded for it
    assert _verdict(_summary([0.4, 0.38, 0.39], [0.6, 0.62, 0.61])) == "undecided"
    s2 = _summary([0.6, 0.62, 0.61], [0.7, 0.75, 0.72], prefix="s2_")
    assert _verdict(s2, "rwefm_synthetic", "s2_") == "reproduced"


def test_rwefm_rule_needs_converged_evaluation_and_two_seeds():
    assert _verdict(_summary([0.6, 0.62, 0.61], [0.7, 0.75, 0.72], conv=0.98)) == "not measured"
    assert _verdict(_summary([0.6], [0.7])) == "not measured"


def test_a_study_run_in_parts_is_read_from_its_part_folders(tmp_path, monkeypatch):
    import json

    def write(d, summary):
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps({"seed": 0, "provenance": {"commit": "c"}}))
        (d / "summary.json").write_text(json.dumps(summary))

    monkeypatch.setattr(render, "RESULTS", tmp_path)
    monkeypatch.setattr(render, "OUT", tmp_path / "out")
    good, bad = [0.6, 0.62, 0.61], [0.7, 0.75, 0.72]
    write(tmp_path / "rwefm_synthetic" / "s2", _summary(good, bad, prefix="s2_"))
    write(tmp_path / "rwefm_synthetic" / "t2", _summary(bad, good, prefix="t2_"))
    (tmp_path / "rwefm_synthetic" / "notes").mkdir()  # a folder without a run is skipped
    assert [part for part, _, _ in render._runs("rwefm_synthetic")] == ["s2", "t2"]
    page = render.render(next(p for p in render.PAPERS if "rwefm_synthetic" in p.studies))
    assert "### run `s2`" in page and "### run `t2`" in page
    rows = [line for line in page.splitlines() if line.startswith("| S^2") or
            line.startswith("| T^2 (mixtures")]  # fmt: skip
    assert "**reproduced**" in rows[0] and "**not reproduced**" in rows[1]
    # a whole-study folder wins over parts
    write(tmp_path / "rwefm_protein", _summary(good, bad))
    assert [part for part, _, _ in render._runs("rwefm_protein")] == [""]


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
    def verdict(s):
        return render._cvxclust({"cvxclust_phase": s})[0]

    assert verdict(_phase()) == "reproduced"
    assert verdict(_phase(tuned=0)) == "not reproduced"
    assert verdict(_phase(uncertified=("joint",))) == "not measured"
    assert verdict(_phase(uncertified=("linear",), count=21)) == "not measured"  # not all listed
    full = _phase(uncertified=("linear",), count=29)
    full["uncertified_by_program"] = {"linear": 29, "joint": 0}  # the complete count
    assert verdict(full) == "reproduced"
    full["uncertified_by_program"]["joint"] = 1
    assert verdict(full) == "not measured"
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
