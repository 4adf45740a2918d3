"""Smoke test of experiments.backdoor_dtb at a tiny size: it runs and writes every key; and
(slow) ``--resume`` restores the three trained PreAct-ResNets through hexad.cachex instead of
retraining, reproducing the summary."""

import json

import pytest

from experiments import backdoor_dtb

TINY = {
    "widths": (4,),
    "hidden": 8,
    "train_steps": 2,
    "dtb_steps": 1,
    "inner_steps": 1,
    "hypergrad": "first_order",
    "defenses": ("clp",),
    "compositions": ("clp+clp",),
    "detectors": ("ss",),
    "defense_steps": 1,
}


def test_backdoor_dtb_smoke(tmp_path):
    cfg = backdoor_dtb.STUDY.make_config(True, TINY)
    s = backdoor_dtb.STUDY.execute(
        cfg, out_dir=tmp_path, checkpoint_dir=tmp_path / "ckpt", show_progress=False
    )
    for k in (
        "clean_acc",
        "decoy_asr_before",
        "hidden_asr_before",
        "hidden_asr_after_mean",
        "naive_hidden_asr_after_mean",
        "badnets_asr_after_mean",
        "defense_eval_s",
        "ss_tpr",
        "naive_ss_fpr",
        "badnets_ss_tpr",
        "surrogate_clean_acc",
        "surrogate_decoy_asr",
        "surrogate_hidden_asr",
        "surrogate_hidden_asr_mae",
    ):
        assert k in s
    for d in ("clp", "clp+clp"):
        for k in (
            f"decoy_asr_after_{d}",
            f"hidden_asr_after_{d}",
            f"clean_acc_after_{d}",
            f"naive_hidden_asr_after_{d}",
            f"badnets_asr_after_{d}",
        ):
            assert 0.0 <= s[k] <= 1.0
    assert (tmp_path / "asr.png").is_file()


@pytest.mark.slow
def test_backdoor_dtb_resume_skips_training(tmp_path):
    cfg = backdoor_dtb.STUDY.make_config(True, {**TINY, "model": "preact", "groups": 2})
    ckpt = tmp_path / "ckpt"
    s = backdoor_dtb.STUDY.execute(
        cfg, out_dir=tmp_path / "run1", checkpoint_dir=ckpt, show_progress=False
    )
    s2 = backdoor_dtb.STUDY.execute(
        cfg, out_dir=tmp_path / "run2", checkpoint_dir=ckpt, resume=True, show_progress=False
    )
    logged = [json.loads(line) for line in open(tmp_path / "run2" / "metrics.jsonl")]
    assert not any("step" in r for r in logged)  # no training step was logged: restored
    assert any("step" in json.loads(line) for line in open(tmp_path / "run1" / "metrics.jsonl"))
    skip = {"runtime_s", "defense_eval_s"}
    assert {k: v for k, v in s2.items() if k not in skip} == {
        k: v for k, v in s.items() if k not in skip
    }
