"""Smoke test of experiments.policy_pointmaze at a tiny size: runs, writes every key, and the
selectors' invariants hold on the summary."""

import json

import pytest

from experiments import _runner
from experiments import policy_pointmaze as study

TINY = {
    "n_transitions": 600,
    "hidden": 8,
    "iql_steps": 20,
    "bc_steps": 10,
    "train_chunk": 10,
    "batch_size": 32,
    "alphas": (0.0, 0.5, 1.0),
    "n_kl_states": 64,
    "n_seeds": 1,
    "n_select": 1,
    "n_test": 2,
    "episode_steps": 10,
    "n_envs": 4,
    "guide_iql_steps": 10,
    "guide_cql_steps": 10,
    "guide_action_samples": 2,
    "guide_shifts": (0.5,),
    "n_boot": 50,
    "priors": ("good", "output_noise", "data_corrupted"),
}
VERDICTS = ("holds", "fails", "undecided", "not tested: ", "excluded: ")


def _smoke(tmp_path, monkeypatch):
    monkeypatch.setenv("HEXAD_CACHE", str(tmp_path / "cache"))
    cfg = study.STUDY.make_config(True, TINY)
    ckpt = tmp_path / "ckpt"
    summary = study.STUDY.execute(
        cfg, out_dir=tmp_path / "run", checkpoint_dir=ckpt, show_progress=False
    )
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == summary
    n_b = len(cfg.kl_budgets)
    for pre in ("", "action_"):
        assert pre + "actor_own_task_return" in summary
        assert len(summary[pre + "actor_std_quantiles"]) == 3
        assert summary[pre + "actor_beats_zero"] in (True, False)
        cells = summary[pre + "cells"]
        assert set(cells) == set(cfg.priors) and sum(summary[pre + "cell_counts"].values()) in (
            0,
            len(cfg.priors),
        )
        for q in cfg.priors:
            for c in (cells[q], summary[f"{pre}cell_oracle_{q}"]):
                assert c in ("help", "frozen", "hurt") or c.startswith("excluded: ")
        for q in cfg.priors:
            for v in ("graceful", "additive_below_poe", "selector"):
                assert summary[f"{pre}verdict_{v}_{q}"].startswith(VERDICTS)
            for k in (
                "graceful_ci",
                "selector_ci",
                "additive_minus_actor_ci",
                "additive_minus_poe_ci",
            ):
                m, lo, hi = summary[f"{pre}{k}_{q}"]
                assert lo <= m + 1e-9 and m <= hi + 1e-9
            assert summary[f"{pre}precision_ratio_median_{q}"] > 0
            full, mean = (
                summary[f"{pre}kl_budget_alphas_{q}"],
                summary[f"{pre}kl_mean_budget_alphas_{q}"],
            )
            assert len(full) == len(mean) == n_b == len(summary[f"{pre}kl_budget_return_{q}"])
            # Larger budgets allow larger alphas; the mean-only KL is part of the full KL, so
            # its budget is looser at every budget.
            assert all(0 <= a <= b <= 1 for a, b in zip(full, full[1:], strict=False))
            assert all(f <= m + 1e-6 for f, m in zip(full, mean, strict=True))
            kl, kl_m = summary[f"{pre}kl_curve_{q}"], summary[f"{pre}kl_mean_curve_{q}"]
            assert kl[0] == pytest.approx(0.0, abs=1e-6)
            assert all(a <= b + 1e-5 for a, b in zip(kl, kl[1:], strict=False))
            assert all(m <= f + 1e-5 for m, f in zip(kl_m, kl, strict=True))
    for g in ("iql", "cql"):
        assert summary[f"{g}_guided_shift"] == [0.5]
    assert summary["kl_budgets_nats"] == [2 * b for b in cfg.kl_budgets]  # d = 2
    assert (tmp_path / "run" / "selection_curves.png").is_file()
    return cfg, ckpt, summary


def test_pointmaze_study_smoke(tmp_path, monkeypatch, fast_compile):
    _smoke(tmp_path, monkeypatch)


def test_pointmaze_config_rejects_bad_input():
    for bad, name in (
        ({"priors": ("good", "bogus")}, "priors"),
        ({"spaces": ("logit",)}, "spaces"),
        ({"kl_budgets": (0.0, 1.0), "kl_budget_verdict": 1.0}, "kl_budgets"),
        ({"kl_budget_verdict": 0.5}, "kl_budget_verdict"),
    ):
        with pytest.raises(_runner.ConfigError, match=name):
            study.STUDY.make_config(True, bad)


@pytest.mark.slow  # a second evaluation pass
def test_pointmaze_study_resume(tmp_path, monkeypatch):
    cfg, ckpt, summary = _smoke(tmp_path, monkeypatch)
    # --resume restores every seed's networks through hexad.cachex and skips training: the
    # deterministic evaluation then reproduces every figure.
    again = study.STUDY.execute(
        cfg, out_dir=tmp_path / "run2", checkpoint_dir=ckpt, resume=True, show_progress=False
    )
    summary.pop("runtime_s")
    again.pop("runtime_s")
    assert again == summary
    assert not (tmp_path / "run2" / "metrics.jsonl").exists()


def test_decision_rules_follow_their_statement():
    # The rules of the docstring on hand-made intervals (mean, lo, hi), margin 2.
    from experiments._policy import NOT_TESTED, cell, verdicts

    assert [cell(c, 2.0) for c in ((0, 2.5, 3), (0, -3, -2.5), (0, 1, 3), (0, -3, -1))] == [
        "help",
        "hurt",
        "frozen",
        "frozen",
    ]
    assert cell((0, 3, 4), 2.0, worth=False).startswith("excluded")

    bad, fine = (-9.0, -10.0, -8.0), (0.0, -1.0, 1.0)
    below, above, straddle = (-3.0, -4.0, -2.0), (3.0, 2.0, 4.0), (0.0, -3.0, 1.0)
    assert verdicts(fine, bad, below, 2.0, fine, 2.0) == ("holds", "holds", "holds")
    assert verdicts(bad, bad, above, 2.0, bad, 2.0) == ("fails", "fails", "fails")
    assert verdicts(straddle, bad, straddle, 2.0, straddle, 2.0) == ("undecided",) * 3
    # A prior that is not decidedly worse than the actor tests neither claim about bad priors.
    assert verdicts(fine, straddle, below, 2.0, fine, 2.0) == (NOT_TESTED, NOT_TESTED, "holds")
    assert verdicts(fine, fine, below, 2.0, fine, 2.0)[:2] == (NOT_TESTED, NOT_TESTED)
    # The zero-action precondition and an outer exclusion replace every verdict.
    assert all(v.startswith("excluded") for v in verdicts(fine, bad, below, 2.0, fine, 2.0, False))
    out = verdicts(fine, bad, below, 2.0, fine, 2.0, True, "data too small")
    assert out == ("excluded: data too small",) * 3


def test_rows_share_an_evaluation_only_when_they_are_the_same_policy_on_the_same_task():
    from experiments._policy import canon
    from hexad.policy import Method

    # alpha 0 is the actor whatever the prior or mix; alpha 1 is the prior alone, the same for
    # every actor level when the levels share one task, and its own per level otherwise.
    assert canon((1, 2, 3, Method.ADDITIVE, 0.0)) == (1, 2, 0, Method.POE, 0.0)
    assert canon((1, 2, 3, Method.ADDITIVE, 1.0)) == canon((1, 0, 3, Method.POE, 1.0))
    assert canon((1, 2, 3, Method.POE, 1.0), True) == (1, 2, 3, Method.POE, 1.0)
    assert canon((1, 2, 3, Method.POE, 1.0), True) != canon((1, 0, 3, Method.POE, 1.0), True)
    assert canon((1, 2, 3, Method.POE, 0.5), True) == (1, 2, 3, Method.POE, 0.5)
