"""Smoke test of experiments.policy_locomotion at a tiny size: runs, writes every key, resumes."""

import json

import pytest

from experiments import policy_locomotion as study


def _tiny():
    return study.STUDY.make_config(
        True,
        {
            "envs": ("Hopper-v5",),
            "data_steps": 32,  # = conftest.TINY_HOPPER
            "data_hidden": 8,
            "data_per_level": 64,
            "data_start_steps": 16,
            "data_snapshot_every": 16,
            "data_eval_steps": 10,
            "hidden": 8,
            "iql_steps": 20,
            "bc_steps": 10,
            "train_chunk": 10,
            "batch_size": 16,
            "alphas": (0.0, 0.5, 1.0),
            "n_kl_states": 16,
            "n_episodes": 1,
            "episode_steps": 10,
            "n_envs": 4,
            "guide_cql_steps": 10,
            "guide_shifts": (0.5,),
            "sf_velocities": 2,
            "sf_steps": 10,
            "sf_batch_size": 16,
        },
    )


def _smoke(tmp_path, monkeypatch, cache_root):
    # The tiny data set of conftest.tiny_hopper_cache: the same settings, so no SAC run here.
    monkeypatch.setenv("HEXAD_CACHE", str(cache_root))
    cfg = _tiny()
    ckpt = tmp_path / "ckpt"
    summary = study.STUDY.execute(
        cfg, out_dir=tmp_path / "run", checkpoint_dir=ckpt, show_progress=False
    )
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved == summary
    pre = "hopper_"
    for k in (
        "actor_score",
        "actor_return",
        "target_velocity",
        "random_return",
        "ideal_return",
        "cql_guided_score",
        "cql_guided_shift",
        "zero_return",
        "best_method",
        "sf_reward_fit_r2",
        "score_se",
    ):
        assert pre + k in summary
    assert summary[pre + "ideal_return"] == 10.0  # Hopper's healthy bonus x episode_steps
    # 0 = the zero-action policy's shifted return, 100 = the exact-tracking bound.
    gap = summary[pre + "ideal_return"] - summary[pre + "zero_return"]
    want = 100.0 * (summary[pre + "actor_return"] - summary[pre + "zero_return"]) / gap
    assert summary[pre + "actor_score"] == pytest.approx(want, rel=1e-9)
    assert summary[pre + "best_score"] >= summary[pre + "actor_score"]
    for q in study.PRIORS:
        for k in (
            "poe_kl_budget_alpha",
            "poe_kl_budget_score",
            "poe_kl_state_score",
            "oracle_score",
            "oracle_alpha",
            "additive_score",
            "additive_oracle_score",
            "prior_only_score",
            "prior_only_return",
            "sfgpi_score",
            "sfgpi_return",
        ):
            assert f"{pre}{k}_{q}" in summary
        assert len(summary[f"{pre}poe_score_curve_{q}"]) == 3
        assert 0.0 <= summary[f"{pre}poe_kl_budget_alpha_{q}"] <= 1.0
        # The sweep's endpoints are the actor (alpha 0) and the prior alone (alpha 1).
        assert summary[f"{pre}poe_score_curve_{q}"][0] == summary[pre + "actor_score"]
        assert summary[f"{pre}poe_score_curve_{q}"][-1] == summary[f"{pre}prior_only_score_{q}"]
    assert (tmp_path / "run" / "score_vs_alpha.png").is_file()
    return cfg, ckpt, summary


def test_every_task_has_a_healthy_bonus_and_bad_env_raises():
    # The normalisation's 100 (exact tracking) needs each task's healthy bonus.
    bound = {
        e: study.offline_rl.tracking_return_bound(e, 10) for e in study.offline_rl.LOCOMOTION_ENVS
    }
    assert bound == {"HalfCheetah-v5": 0.0, "Hopper-v5": 10.0, "Walker2d-v5": 10.0}
    assert study.Config().envs == study.offline_rl.LOCOMOTION_ENVS  # the full study runs all three
    with pytest.raises(ValueError, match="envs"):
        study.run(study.STUDY.make_config(True, {"envs": ("Walker2d-v4",)}), None)


def test_locomotion_study_smoke(tmp_path, monkeypatch, tiny_hopper_cache, fast_compile):
    _smoke(tmp_path, monkeypatch, tiny_hopper_cache[0])


@pytest.mark.slow  # a second evaluation pass, about 10 s of CPU
def test_locomotion_study_resume(tmp_path, monkeypatch, tiny_hopper_cache):
    cfg, ckpt, summary = _smoke(tmp_path, monkeypatch, tiny_hopper_cache[0])
    # --resume restores the frozen actor and priors through hexad.cachex and skips training.
    again = study.STUDY.execute(
        cfg, out_dir=tmp_path / "run2", checkpoint_dir=ckpt, resume=True, show_progress=False
    )
    summary.pop("runtime_s")
    again.pop("runtime_s")
    assert again == summary
    assert not (tmp_path / "run2" / "metrics.jsonl").exists()
