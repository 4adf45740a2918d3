"""Smoke tests of the cvxclust studies (tiny overrides, a few seconds each)."""

from experiments import cvxclust_phase


def test_phase_study_smoke(tmp_path):
    study = cvxclust_phase.STUDY
    cfg = study.make_config(True, {"n": 16, "dpq": (0.0, 0.8), "sep": (0.0, 6.0), "trials": 2})
    s = study.execute(cfg, out_dir=tmp_path, show_progress=False)
    for k in (
        "graph_recovery",
        "features_recovery",
        "joint_recovery",
        "synergy_cells",
        "synergy_cell_list",
        "dpq_grid",
        "sep_grid",
        "joint_ge_both_frac",
        "not_converged",
    ):
        assert k in s
    assert len(s["joint_recovery"]) == 2 and len(s["joint_recovery"][0]) == 2
    # Graph strength 0.8 (p = 0.9, q = 0.1) on 16 nodes: the graph program recovers.
    assert s["graph_recovery"][1][0] == 1.0 and s["graph_recovery"][0][0] == 0.0
    assert (tmp_path / "phase.png").exists()
