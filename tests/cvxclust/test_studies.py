"""Smoke tests of the cvxclust studies (tiny overrides, a few seconds each)."""

from experiments import cvxclust_phase


def test_phase_study_smoke(tmp_path):
    study = cvxclust_phase.STUDY
    cfg = study.make_config(True, {"n": 16, "dpq": (0.0, 0.8), "sep": (0.0, 6.0), "trials": 2})
    ckpt = tmp_path / "ckpt"
    s = study.execute(cfg, out_dir=tmp_path / "a", checkpoint_dir=ckpt, show_progress=False)
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
        "devices",
    ):
        assert k in s
    # 2 trials on the 8 simulated test devices: each cell's batch is split over a 2-device mesh.
    assert s["devices"] == 2
    assert len(s["joint_recovery"]) == 2 and len(s["joint_recovery"][0]) == 2
    # Graph strength 0.8 (p = 0.9, q = 0.1) on 16 nodes: the graph program recovers.
    assert s["graph_recovery"][1][0] == 1.0 and s["graph_recovery"][0][0] == 0.0
    assert (tmp_path / "a" / "phase.png").exists()
    # --resume: every grid row is restored from the per-row checkpoints, none re-solved.
    again = study.execute(
        cfg, out_dir=tmp_path / "b", checkpoint_dir=ckpt, resume=True, show_progress=False
    )
    for k in ("graph_recovery", "features_recovery", "joint_recovery", "not_converged"):
        assert again[k] == s[k]
    assert (tmp_path / "b" / "metrics.jsonl").read_text().count('"resumed": true') == 2


def test_planetoid_study_smoke_karate(tmp_path):
    from experiments import cvxclust_planetoid

    study = cvxclust_planetoid.STUDY
    s = study.execute(study.make_config(True), out_dir=tmp_path, show_progress=False)
    assert set(s) >= {
        "karate_acc",
        "karate_lp_acc",
        "karate_converged",
        "karate_rel_gap",
        "karate_certified",
    }
    # Two labelled members (0 and 33) classify most of the club; measured 31/32 (convex
    # program, mu = sqrt(n) / 2) and 29/32 (label propagation).
    assert s["karate_acc"] >= 0.8 and s["karate_lp_acc"] >= 0.8
    # Full eigh at n = 34, tol 1e-5: the duality gap closes (measured 3.8e-6 relative).
    assert s["karate_converged"] and s["karate_certified"] and s["karate_rel_gap"] <= 1e-4
