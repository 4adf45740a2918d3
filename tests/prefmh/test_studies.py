"""Smoke tests of the Pref-MH studies at tiny sizes (seconds): they run and write their keys."""

import json

from experiments import prefmh_mixture


def test_mixture_study_smoke(tmp_path):
    study = prefmh_mixture.STUDY
    cfg = study.make_config(
        True,
        {
            "num_chains": 16,
            "num_steps": 40,
            "burn_in": 20,
            "chunk_size": 20,
            "rules": ("kbudget",),
            "ks": (1,),
            "sliced_points": 200,
        },
    )
    summary = study.execute(cfg, out_dir=tmp_path, show_progress=False)
    for k in ("tv_prefmh_k1", "sw1_prefmh_k1", "acc_prefmh_k1", "ess_per_kcall_k1", "tv_iid"):
        assert k in summary
    assert 0.0 <= summary["tv_prefmh_k1"] <= 1.0 and summary["calls_per_step_prefmh_k1"] == 1.0
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert (tmp_path / "mixture.png").exists()
