"""Smoke test of experiments.policy_antmaze at a tiny size: the loader, the shared diagnostic on
8-d actions, and every key. A tiny untrained SAC ant stands in for the 30-minute controller."""

import json

from experiments import policy_antmaze as study
from hexad.data import _antmaze as A

TINY_ANT = dict(chunk_steps=32, n_envs=4, start_steps=16, batch_size=8, hidden=8, episode_steps=20)


def test_antmaze_study_smoke(tmp_path, monkeypatch, fast_compile, tiny_maze_study):
    monkeypatch.setenv("HEXAD_CACHE", str(tmp_path / "cache"))
    real = A.train_ant_controller
    monkeypatch.setattr(
        A, "train_ant_controller", lambda total_steps, progress=None: real(64, **TINY_ANT)
    )
    cfg = study.STUDY.make_config(
        True,
        {"n_transitions": 400, **tiny_maze_study},
    )
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
