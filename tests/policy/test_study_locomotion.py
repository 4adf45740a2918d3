"""Smoke test of experiments.policy_locomotion at a tiny size: runs, writes every key, keeps
Hopper out of the verdicts, resumes."""

import json

import numpy as np
import pytest

from experiments import _runner
from experiments import policy_locomotion as study


def _tiny():
    return study.STUDY.make_config(
        True,
        {
            "env": "Hopper-v5",
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
            "n_seeds": 1,
            "n_select": 1,
            "n_test": 2,
            "episode_steps": 10,
            "n_envs": 4,
            "guide_cql_steps": 10,
            "guide_action_samples": 2,
            "guide_shifts": (0.5,),
            "n_boot": 50,
            "priors": ("good", "random_wide"),
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
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == summary
    assert summary["verdict_admissible"] is False  # 32 SAC steps: Hopper enters no verdict
    for sp in ("", "action_"):
        for lv in ("", "medium_replay_", "medium_expert_"):
            pre = sp + lv
            for k in ("actor_return", "actor_own_task_return", "actor_std_quantiles"):
                assert pre + k in summary
            for q in cfg.priors:
                assert summary[f"{pre}verdict_graceful_{q}"].startswith("excluded")
                assert summary[f"{pre}verdict_selector_{q}"].startswith("excluded")
                for k in ("precision_ratio_median", "kl_budget_alphas", "kl_mean_budget_return"):
                    assert f"{pre}{k}_{q}" in summary
                assert len(summary[f"{pre}poe_select_curve_{q}"]) == 3
    assert summary["cql_guided_shift"] == [0.5] and "cql_guided_minus_actor_ci" in summary
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
    levels = ("medium", "medium_replay", "medium_expert")
    own = _policy.level_targets(raw, levels, 1.5)
    np.testing.assert_allclose(own, [3.0, 0.75, 4.5])  # 1.5 x (2, 0.5, 3)
    floored = _policy.level_targets(raw, levels, 1.5, "medium")
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


def test_bad_env_and_level_raise():
    assert study.Config().env == "HalfCheetah-v5"  # the full study's verdicts: HalfCheetah only
    with pytest.raises(_runner.ConfigError, match="env"):
        study.STUDY.make_config(True, {"env": "Walker2d-v4"})
    with pytest.raises(_runner.ConfigError, match="levels"):
        study.STUDY.make_config(True, {"levels": ("expert",)})
    with pytest.raises(_runner.ConfigError, match="target_floor"):
        study.STUDY.make_config(True, {"target_floor": "expert"})
    for bad in (("random",), ()):
        with pytest.raises(_runner.ConfigError, match="prior_data"):
            study.STUDY.make_config(True, {"prior_data": bad})


def test_locomotion_study_smoke(tmp_path, monkeypatch, tiny_hopper_cache, fast_compile):
    _smoke(tmp_path, monkeypatch, tiny_hopper_cache[0])


@pytest.mark.slow  # a second evaluation pass
def test_locomotion_study_resume(tmp_path, monkeypatch, tiny_hopper_cache):
    cfg, ckpt, summary = _smoke(tmp_path, monkeypatch, tiny_hopper_cache[0])
    # --resume restores the frozen networks through hexad.cachex and skips training.
    again = study.STUDY.execute(
        cfg, out_dir=tmp_path / "run2", checkpoint_dir=ckpt, resume=True, show_progress=False
    )
    summary.pop("runtime_s")
    again.pop("runtime_s")
    assert again == summary
    assert not (tmp_path / "run2" / "metrics.jsonl").exists()
