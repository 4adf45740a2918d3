"""Smoke tests of the RWEFM studies at tiny size: they run end to end and report every key."""

import json

import pytest

from experiments import rwefm_singlecell, rwefm_synthetic

TINY = {
    "n_train": 8,
    "n_test": 4,
    "n_points": 6,
    "steps": 2,
    "chunk": 2,
    "batch": 4,
    "width": 8,
    "depth": 1,
    "heads": 1,
    "sampler_steps": 2,
    "ot_pairing": False,
}


@pytest.mark.slow  # ~30 s of CPU: four trainer and sampler compilations
def test_synthetic_study_smoke(tmp_path):
    cfg = rwefm_synthetic.STUDY.make_config(True, {**TINY, "manifolds": ("t2",)})
    summary = rwefm_synthetic.STUDY.execute(cfg, out_dir=tmp_path, show_progress=False)
    for k in ("rwefm_w2", "euclid_w2", "rwefm_1nna", "euclid_1nna", "on_manifold_max_err"):
        assert f"t2_{k}" in summary
    assert summary["t2_on_manifold_max_err"] == 0.0
    assert json.loads((tmp_path / "summary.json").read_text())["t2_rwefm_w2"] >= 0.0


def test_singlecell_study_smoke(tmp_path):
    cfg = rwefm_singlecell.STUDY.make_config(True, {**TINY, "n_pcs": 3})
    summary = rwefm_singlecell.STUDY.execute(cfg, out_dir=tmp_path, show_progress=False)
    for k in ("rwefm_w2", "euclid_w2", "rwefm_1nna", "euclid_1nna", "on_manifold_max_err"):
        assert k in summary
    assert summary["on_manifold_max_err"] < 1e-5
