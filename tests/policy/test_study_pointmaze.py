"""Smoke test of experiments.policy_pointmaze at a tiny size: runs and writes every key."""

import json

import pytest

from experiments import policy_pointmaze as study


def _smoke(tmp_path, monkeypatch, tiny):
    monkeypatch.setenv("HEXAD_CACHE", str(tmp_path / "cache"))
    cfg = study.STUDY.make_config(
        True,
        {"n_transitions": 600, **tiny},
    )
    ckpt = tmp_path / "ckpt"
    summary = study.STUDY.execute(
        cfg, out_dir=tmp_path / "run", checkpoint_dir=ckpt, show_progress=False
    )
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved == summary
    for pre in ("", "incompetent_"):
        assert 0.0 <= summary[pre + "actor_success"] <= 1.0
        assert 0.0 <= summary[pre + "iql_guided_success"] <= 1.0
        assert 0.0 <= summary[pre + "cql_guided_success"] <= 1.0
        for q in study.PRIORS:
            for k in (
                "poe_kl_budget_success",
                "poe_kl_budget_alpha",
                "poe_kl_state_success",
                "oracle_success",
                "oracle_alpha",
                "additive_success",
                "additive_oracle_success",
                "prior_only_success",
                "sfgpi_success",
                "sfgpi_return",
            ):
                assert f"{pre}{k}_{q}" in summary
            assert len(summary[f"{pre}poe_return_curve_{q}"]) == 3
            assert 0.0 <= summary[f"{pre}poe_kl_budget_alpha_{q}"] <= 1.0
    assert (tmp_path / "run" / "return_vs_alpha.png").is_file()
    assert "scripted_oracle_success" in summary
    assert summary["sf_library_size"] == 8  # UMaze's 7 free cells + the actor
    assert summary["sf_reward_fit_r2"] <= 1.0
    assert summary["return_se"] is None  # one episode per method: no standard error
    return cfg, ckpt, summary


def test_pointmaze_study_smoke(tmp_path, monkeypatch, fast_compile, tiny_maze_study):
    _smoke(tmp_path, monkeypatch, tiny_maze_study)


@pytest.mark.slow  # a second evaluation pass; keeps the folder's default run near its budget
def test_pointmaze_study_resume(tmp_path, monkeypatch, tiny_maze_study):
    cfg, ckpt, summary = _smoke(tmp_path, monkeypatch, tiny_maze_study)
    # --resume restores the frozen actors and priors through hexad.cachex and skips training:
    # the deterministic evaluation then reproduces every figure.
    again = study.STUDY.execute(
        cfg, out_dir=tmp_path / "run2", checkpoint_dir=ckpt, resume=True, show_progress=False
    )
    summary.pop("runtime_s")
    again.pop("runtime_s")
    assert again == summary
    assert not (tmp_path / "run2" / "metrics.jsonl").exists()  # no training chunks logged
