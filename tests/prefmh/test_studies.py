"""Smoke tests of the Pref-MH studies at tiny sizes (seconds): they run and write their keys."""

import json
import shutil

import pytest

from experiments import _runner, prefmh_mixture


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
    summary = study.execute(
        cfg, out_dir=tmp_path, checkpoint_dir=tmp_path / "ckpt", show_progress=False
    )
    for k in ("tv_prefmh_k1", "sw1_prefmh_k1", "acc_prefmh_k1", "ess_per_kcall_k1", "tv_iid"):
        assert k in summary
    assert 0.0 <= summary["tv_prefmh_k1"] <= 1.0 and summary["calls_per_step_prefmh_k1"] == 1.0
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert (tmp_path / "mixture.png").exists()


def test_text_study_smoke(tmp_path):
    from experiments import prefmh_text

    study = prefmh_text.STUDY
    overrides = {"num_chains": 8, "num_steps": 20, "burn_in": 10, "chunk_size": 10}
    overrides.update({"pool": 2000, "methods": ("prefmh_k1",)})
    summary = study.execute(
        study.make_config(True, overrides),
        out_dir=tmp_path,
        checkpoint_dir=tmp_path / "ckpt",
        show_progress=False,
    )
    for k in ("base_rate", "exact_rate", "rate_prefmh_k1", "tv_count_prefmh_k1", "examples"):
        assert k in summary
    assert 0.0 <= summary["rate_prefmh_k1"] <= 1.0 and len(summary["examples"]) == 3
    assert all(len(s) == 40 for s in summary["examples"])


def test_digits_study_smoke(tmp_path):
    from experiments import prefmh_digits

    study = prefmh_digits.STUDY
    overrides = {"num_chains": 8, "num_steps": 20, "burn_in": 10, "chunk_size": 10}
    overrides.update({"train_steps": 20, "methods": ("prefmh_k1_latent",)})
    summary = study.execute(
        study.make_config(True, overrides),
        out_dir=tmp_path,
        checkpoint_dir=tmp_path / "ckpt",
        show_progress=False,
    )
    for k in (
        "classifier_test_acc",
        "base_rate",
        "rate_prefmh_k1_latent",
        "diversity_prefmh_k1_latent",
    ):
        assert k in summary
    assert 0.0 <= summary["rate_prefmh_k1_latent"] <= 1.0
    assert (tmp_path / "samples.png").exists()


def _resume_after_losing_the_last_rule(study, overrides, tmp_path):
    """Runs ``study``, drops its newest checkpoint (a run killed before its last rule was
    checkpointed), resumes, and returns both summaries and the resumed run's metrics lines."""
    cfg = study.make_config(True, overrides)
    ckpt = tmp_path / "ckpt"
    full = study.execute(cfg, out_dir=tmp_path / "a", checkpoint_dir=ckpt, show_progress=False)
    rules = ckpt / _runner.settings_stamp(cfg, 0, study.resume_shared) / "rules"
    steps = sorted(int(p.name) for p in (rules / "steps").iterdir() if p.name.isdigit())
    shutil.rmtree(rules / "steps" / str(steps[-1]))
    again = study.execute(
        cfg, out_dir=tmp_path / "b", checkpoint_dir=ckpt, resume=True, show_progress=False
    )
    lines = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    full.pop("runtime_s"), again.pop("runtime_s")
    return full, again, lines


def test_mixture_study_resume_skips_finished_rules_and_gives_the_same_summary(tmp_path):
    overrides = {
        "num_chains": 16,
        "num_steps": 40,
        "burn_in": 20,
        "chunk_size": 20,
        "rules": ("mh", "kbudget"),
        "ks": (1,),
        "sliced_points": 200,
    }
    full, again, lines = _resume_after_losing_the_last_rule(
        prefmh_mixture.STUDY, overrides, tmp_path
    )
    assert again == full  # bit-for-bit the same numbers (JSON floats round-trip exactly)
    assert [(x["method"], x.get("resumed", False)) for x in lines] == [
        ("mh", True),
        ("prefmh_k1", False),
    ]


@pytest.mark.slow
def test_digits_study_resume_restores_the_mh_reference(tmp_path):
    from experiments import prefmh_digits

    overrides = {"num_chains": 8, "num_steps": 20, "burn_in": 10, "chunk_size": 10}
    overrides.update({"train_steps": 20, "methods": ("mh_latent", "prefmh_k1_latent")})
    full, again, lines = _resume_after_losing_the_last_rule(
        prefmh_digits.STUDY, overrides, tmp_path
    )
    assert again == full and "sw1_to_mh_prefmh_k1_latent" in again
    assert [x.get("resumed", False) for x in lines if "method" in x] == [True, False]


def test_run_rules_checkpoints_each_seed_and_setting_apart(tmp_path):
    # Runs of seed 0, then seed 1, into one --ckpt: each keeps its own rules checkpoint, so
    # --resume of the seed-0 run restores its rules (it failed as "written by a different run").
    import dataclasses

    import jax

    from experiments import _prefmh

    @dataclasses.dataclass(frozen=True)
    class Cfg:
        num_steps: int = 10

    def go(seed, resume, **over):
        cfg = Cfg(**over)
        settings = _runner.settings_stamp(cfg, seed)
        ctx = _runner.Context("p", tmp_path / f"out{seed}", seed=seed, resume=resume,
                              checkpoint_dir=tmp_path / "ckpt", show_progress=False,
                              settings=settings)  # fmt: skip
        ctx.out_dir.mkdir(exist_ok=True)
        calls = []

        def rule(i, name, key, arrays):
            calls.append(name)
            return {f"{name}_x": float(seed + cfg.num_steps)}

        try:
            summary, _ = _prefmh.run_rules(ctx, cfg, ["a", "b"], jax.random.key(seed), rule)
        finally:
            ctx.close()
        return calls, summary

    assert go(0, False) == (["a", "b"], {"a_x": 10.0, "b_x": 10.0})
    assert go(1, False) == (["a", "b"], {"a_x": 11.0, "b_x": 11.0})
    assert go(0, True) == ([], {"a_x": 10.0, "b_x": 10.0})  # restored, nothing recomputed
    assert go(1, True) == ([], {"a_x": 11.0, "b_x": 11.0})
    assert go(0, True, num_steps=5) == (["a", "b"], {"a_x": 5.0, "b_x": 5.0})  # other settings
    # each in checkpoint_dir / settings / "rules", nothing straight in --ckpt
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == sorted(
        _runner.settings_stamp(Cfg(num_steps=n), seed) for n, seed in ((10, 0), (10, 1), (5, 0))
    )
    assert (tmp_path / "ckpt" / _runner.settings_stamp(Cfg(), 0) / "rules" / "steps").is_dir()
