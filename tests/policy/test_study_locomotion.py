"""Smoke test of experiments.policy_locomotion at a tiny size: runs, writes every key per actor
level, keeps data below 100k SAC steps out of every claim, resumes; the data-only mode."""

import json

import numpy as np
import pytest

from experiments import _runner
from experiments import policy_locomotion as study

LEVELS = ("medium", "medium_replay", "medium_expert")


def _tiny(**kw):
    return study.STUDY.make_config(
        True,
        {
            "env": "Hopper-v5",
            "data_steps": 32,  # = conftest.TINY_HOPPER
            "data_hidden": 8,
            "data_per_level": 64,
            "data_start_steps": 16,
            "data_snapshot_every": 16,
            "data_chunk_steps": 16,
            "data_eval_steps": 10,
            "hidden": 8,
            "iql_steps": 20,
            "bc_steps": 10,
            "train_chunk": 10,
            "batch_size": 16,
            "alphas": (0.0, 0.5, 1.0),
            "n_kl_states": 16,
            "n_seeds": 1,
            "n_select": 1,
            "n_test": 2,
            "episode_steps": 10,
            "n_envs": 4,
            "guide_cql_steps": 10,
            "guide_action_samples": 2,
            "guide_shifts": (0.5,),
            "priors": ("good", "random_wide"),
        }
        | kw,
    )


def _smoke(tmp_path, monkeypatch, cache_root):
    # The tiny data set of conftest.tiny_hopper_cache: the same settings, so no SAC run here.
    monkeypatch.setenv("HEXAD_CACHE", str(cache_root))
    cfg = _tiny()
    ckpt = tmp_path / "ckpt"
    summary = study.STUDY.execute(
        cfg, out_dir=tmp_path / "run", checkpoint_dir=ckpt, show_progress=False
    )
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == summary
    assert summary["data_admissible"] is False  # 32 SAC steps: no claim is tested
    assert summary["levels"] == list(LEVELS) and summary["margin"] == pytest.approx(0.5)
    for c in summary["claims"]:
        assert summary[f"verdict_{c}"].startswith("not tested: the data is below 100000"), c
    assert summary["precision_ratio_prediction"].startswith("not tested")
    for sp in ("pretanh", "action"):
        for lv in LEVELS:
            sfx = f"_{lv}_{sp}"
            for k in ("actor_return", "actor_own_task_return", "actor_length", "kl_budget_nats"):
                assert k + sfx in summary
            for c in ("selector", "capped", "responsive"):
                assert f"verdict_{c}{sfx}" in summary and f"{c}{sfx}_ci_low" in summary
            for q in cfg.priors:
                for k in ("graceful", "additive_below_poe"):
                    assert f"verdict_{k}_{q}{sfx}" in summary
                assert f"prior_only_length_{q}{sfx}" in summary
                assert len(summary[f"poe_select_curve_{q}{sfx}"]) == 3
            assert summary[f"precision_ratio_prediction{sfx}"].startswith("not tested")
            assert f"selector_regret{sfx}_ci_low" in summary
        # the regrets over every actor level
        for k in ("selector_regret", "fixed_regret", "actor_regret"):
            assert f"{k}_{sp}_ci_high" in summary
    assert summary["cql_guided_shift_medium_pretanh"] == [0.5]
    for k in ("target_velocity", "zero_return", "data_medium_return", "reward_scale"):
        assert k in summary
    # Each actor level has its own task: v* from its own data, the zero action scored on it.
    for lv in ("medium_replay_", "medium_expert_"):
        for k in ("target_velocity", "zero_return", "zero_select_return"):
            assert lv + k in summary
    # The floor (medium) lifts a slower level's v* to medium's.
    assert summary["medium_replay_target_velocity"] >= summary["target_velocity"]
    assert (tmp_path / "run" / "selection_curves.png").is_file()
    return cfg, ckpt, summary


def test_level_targets_floor():
    from experiments import _policy

    raw = {
        lv: {"infos/x_velocity": np.asarray(v)}
        for lv, v in (("medium", [1.0, 3.0]), ("expert", [5.0]), ("medium-replay", [0.5]))
    }
    own = _policy.level_targets(raw, LEVELS, 1.5)
    np.testing.assert_allclose(own, [3.0, 0.75, 4.5])  # 1.5 x (2, 0.5, 3)
    floored = _policy.level_targets(raw, LEVELS, 1.5, "medium")
    np.testing.assert_allclose(floored, [3.0, 3.0, 4.5])  # replay lifted to medium's 2


def test_joined_parts_keep_trajectories_apart():
    from experiments import _policy
    from hexad import policy

    def part(v, timeouts):
        n = len(v)
        return {"infos/x_velocity": np.asarray(v), "rewards": np.zeros(n), "meta/x": 1.0,
                "terminals": np.zeros(n), "timeouts": np.asarray(timeouts, float)}  # fmt: skip

    raw = {"a": part([1.0, 3.0], [0, 0]), "b": part([5.0, 7.0, 9.0], [0, 1, 0])}
    batches = {"a": np.zeros((2, 1)), "b": np.ones((3, 1))}
    joined, batch = _policy.joined_parts(raw, batches, ("a", "b"))
    assert "meta/x" not in joined and batch.shape == (5, 1) and batch[2:].all()
    np.testing.assert_array_equal(joined["timeouts"], [0, 1, 0, 1, 1])
    # a's window does not run into b: hindsight means over 2 steps within each trajectory
    goals = policy.velocity_goals(joined, 2, eps=0.0).goals
    np.testing.assert_allclose(goals, [2.0, 3.0, 6.0, 7.0, 9.0])


def test_bad_env_level_and_data_settings_raise():
    full = study.Config()
    assert full.env == "HalfCheetah-v5" and full.data_steps >= study.MIN_DATA_STEPS
    assert full.margin() == pytest.approx(50.0)  # 0.05 per step over 1000 steps
    with pytest.raises(_runner.ConfigError, match="env"):
        study.STUDY.make_config(True, {"env": "Walker2d-v4"})
    with pytest.raises(_runner.ConfigError, match="levels"):
        study.STUDY.make_config(True, {"levels": ("expert",)})
    with pytest.raises(_runner.ConfigError, match="target_floor"):
        study.STUDY.make_config(True, {"target_floor": "expert"})
    for bad in (("random",), ()):
        with pytest.raises(_runner.ConfigError, match="prior_data"):
            study.STUDY.make_config(True, {"prior_data": bad})
    with pytest.raises(_runner.ConfigError, match="data_chunk_steps"):
        study.STUDY.make_config(True, {"data_chunk_steps": 1500})  # not a multiple of 1000


def test_locomotion_study_smoke(tmp_path, monkeypatch, tiny_hopper_cache, fast_compile):
    _smoke(tmp_path, monkeypatch, tiny_hopper_cache[0])


def test_data_only_generates_the_data_and_stops(tmp_path, monkeypatch, tiny_hopper_cache):
    monkeypatch.setenv("HEXAD_CACHE", str(tiny_hopper_cache[0]))
    summary = study.STUDY.execute(
        _tiny(data_only=True), out_dir=tmp_path / "run", show_progress=False
    )
    assert summary["data_only"] is True and summary["data_steps"] == 32
    assert summary["data_admissible"] is False and "claims" not in summary
    assert summary["data_expert_return"] == tiny_hopper_cache[1]["expert"]["meta/expert_return"]


@pytest.mark.slow  # a second evaluation pass
def test_locomotion_study_resume(tmp_path, monkeypatch, tiny_hopper_cache):
    cfg, ckpt, summary = _smoke(tmp_path, monkeypatch, tiny_hopper_cache[0])
    # --resume restores the frozen networks through hexad.cachex and skips training.
    again = study.STUDY.execute(
        cfg, out_dir=tmp_path / "run2", checkpoint_dir=ckpt, resume=True, show_progress=False
    )
    summary.pop("runtime_s")
    again.pop("runtime_s")
    assert json.dumps(again, sort_keys=True) == json.dumps(summary, sort_keys=True)
    assert not (tmp_path / "run2" / "metrics.jsonl").exists()
