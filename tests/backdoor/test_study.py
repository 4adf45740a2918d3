"""Smoke test of experiments.backdoor_dtb at a tiny size: it runs and writes every key."""

from experiments import backdoor_dtb


def test_backdoor_dtb_smoke(tmp_path):
    cfg = backdoor_dtb.STUDY.make_config(
        True,
        {
            "widths": (4,),
            "hidden": 8,
            "train_steps": 2,
            "dtb_steps": 1,
            "inner_steps": 1,
            "hypergrad": "first_order",
            "defenses": ("clp",),
            "compositions": ("clp+clp",),
            "defense_steps": 1,
        },
    )
    s = backdoor_dtb.STUDY.execute(cfg, out_dir=tmp_path, show_progress=False)
    for k in (
        "clean_acc",
        "decoy_asr_before",
        "hidden_asr_before",
        "hidden_asr_after_mean",
        "naive_hidden_asr_after_mean",
        "badnets_asr_after_mean",
        "defense_eval_s",
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
    assert (tmp_path / "asr.png").is_file() and (tmp_path / "summary.json").is_file()
