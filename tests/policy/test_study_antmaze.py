"""Smoke test of experiments.policy_antmaze at a tiny size: the loader, the one driver on 8-d
actions, and every key. --quick's tiny untrained SAC ant (64 steps) stands in for the
30-minute controller, trained here into an empty cache as a fresh user's --quick does."""

import json

import pytest

from experiments import _runner
from experiments import policy_antmaze as study
from hexad import policy

TINY = {
    "n_transitions": 400,
    "hidden": 8,
    "iql_steps": 20,
    "bc_steps": 10,
    "train_chunk": 10,
    "batch_size": 32,
    "alphas": (0.0, 0.5, 1.0),
    "n_kl_states": 64,
    "n_select": 1,
    "n_test": 2,
    "episode_steps": 10,
    "n_envs": 4,
    "guide_iql_steps": 10,
    "guide_cql_steps": 10,
    "guide_action_samples": 2,
    "guide_shifts": (0.5,),
    "priors": ("good", "random_init"),
    "precision_ratios": (0.5, 1.0, 2.0),
}


def test_quick_trains_a_tiny_controller_and_the_full_study_the_real_one():
    quick = study.STUDY.make_config(True).controller_kwargs()
    assert quick["total_steps"] == 64 and quick["hidden"] == 8
    # The full study's settings are train_ant_controller's defaults (its cache folder).
    full = study.Config().controller_kwargs()
    assert all(policy.ANT_CONTROLLER_DEFAULTS[k] == v for k, v in full.items())
    assert policy.ant_controller_spec(**quick) != policy.ant_controller_spec(**full)  # two names
    assert study.Config().margin() == pytest.approx(7.0)  # 0.01 per step over 700 steps
    with pytest.raises(_runner.ConfigError, match="controller_chunk_steps"):
        study.STUDY.make_config(True, {"controller_chunk_steps": "30"})


def test_antmaze_study_smoke(tmp_path, monkeypatch, fast_compile):
    monkeypatch.setenv("HEXAD_CACHE", str(tmp_path / "cache"))
    cfg = study.STUDY.make_config(True, TINY)
    assert cfg.controller_steps == 64  # --quick's tiny controller, trained into the cache
    summary = study.STUDY.execute(
        cfg, out_dir=tmp_path / "run", checkpoint_dir=tmp_path / "ckpt", show_progress=False
    )
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == summary
    for sp in ("pretanh", "action"):
        for q in cfg.priors:
            assert 0.0 <= summary[f"kl_alpha_{q}_{sp}"][0] <= 1.0
            assert len(summary[f"poe_select_curve_{q}_{sp}"]) == 3
            assert 0.0 <= summary[f"poe_kl_success_{q}_{sp}"] <= 1.0
            assert f"verdict_graceful_{q}_{sp}" in summary
        assert f"selector_regret_{sp}_ci_low" in summary
        assert summary[f"precision_ratio_prediction_{sp}"].startswith(
            ("holds", "fails", "undecided", "not tested")
        )
        # Ten steps from cell (1, 1) cannot reach goals near cell (3, 1), 8 away.
        assert summary[f"actor_success_{sp}"] == 0.0
    assert summary["scripted_oracle_success"] == 0.0
    assert 0.0 <= summary["dataset_reward_frac"] <= 1.0
    assert (tmp_path / "run" / "selection_curves.png").is_file()
    assert any((tmp_path / "cache").rglob("spec.json"))  # the controller it trained
