"""Smoke test of experiments.policy_antmaze at a tiny size: the loader, the shared diagnostic on
8-d actions, and every key. --quick's tiny untrained SAC ant (64 steps) stands in for the
30-minute controller, trained here into an empty cache as a fresh user's --quick does."""

import json

import pytest

from experiments import _runner
from experiments import policy_antmaze as study
from hexad import policy


def test_quick_trains_a_tiny_controller_and_the_full_study_the_real_one():
    quick = study.STUDY.make_config(True).controller_kwargs()
    assert quick["total_steps"] == 64 and quick["hidden"] == 8
    # The full study's settings are train_ant_controller's defaults (its cache folder).
    full = study.Config().controller_kwargs()
    assert all(policy.ANT_CONTROLLER_DEFAULTS[k] == v for k, v in full.items())
    assert policy.ant_controller_spec(**quick) != policy.ant_controller_spec(**full)  # two names
    with pytest.raises(_runner.ConfigError, match="controller_chunk_steps"):
        study.STUDY.make_config(True, {"controller_chunk_steps": "30"})


def test_antmaze_study_smoke(tmp_path, monkeypatch, fast_compile, tiny_maze_study):
    monkeypatch.setenv("HEXAD_CACHE", str(tmp_path / "cache"))
    cfg = study.STUDY.make_config(
        True,
        {"n_transitions": 400, **tiny_maze_study},
    )
    assert cfg.controller_steps == 64  # --quick's tiny controller, trained into the cache
    summary = study.STUDY.execute(
        cfg, out_dir=tmp_path / "run", checkpoint_dir=tmp_path / "ckpt", show_progress=False
    )
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == summary
    for pre in ("", "incompetent_"):
        for q in study.PRIORS:
            assert 0.0 <= summary[f"{pre}poe_kl_budget_alpha_{q}"] <= 1.0
            assert len(summary[f"{pre}poe_return_curve_{q}"]) == 3
            assert 0.0 <= summary[f"{pre}oracle_success_{q}"] <= 1.0
    assert summary["sf_library_size"] == 8
    # Ten steps from cell (1, 1) cannot reach goals near cell (3, 1), 8 away.
    assert summary["scripted_oracle_success"] == 0.0 and summary["actor_success"] == 0.0
    assert (tmp_path / "run" / "return_vs_alpha.png").is_file()
    assert any((tmp_path / "cache").rglob("spec.json"))  # the controller it trained
