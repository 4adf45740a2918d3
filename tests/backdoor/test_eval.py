"""The evaluation protocol: evaluate, defense_table, detection_rates, benchmark_defenses, and
the surrogate as a defense."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hexad import backdoor as bd
from hexad.backdoor._eval import _evaluate

TARGET = 0  # the attack target of the conftest models


def _problem(trained):
    hidden = bd.blend_trigger(jax.random.key(7), (8, 8, 1), 0.15)
    return bd.DTBProblem(trained.trigger, hidden, TARGET, 3)


def _m(acc, decoy, hidden):
    return bd.BackdoorMetrics(*map(np.float32, (acc, decoy, hidden)))


def test_evaluate_is_the_three_metrics_and_compiles_once(trained):
    pr = _problem(trained)
    f, xt, yt = trained.model.apply, trained.x_test, trained.y_test
    n0 = _evaluate._cache_size()
    for params in (trained.clean, trained.bad):
        got = bd.evaluate(trained.model, params, xt, yt, pr)
        assert float(got.clean_acc) == float(bd.accuracy(f, params, xt, yt))
        want = bd.attack_success_rate(f, params, xt, yt, pr.decoy, TARGET)
        assert float(got.decoy_asr) == float(want)
        want = bd.attack_success_rate(f, params, xt, yt, pr.hidden, 3)
        assert float(got.hidden_asr) == float(want)
    assert _evaluate._cache_size() - n0 <= 1  # a second parameter set reuses the compile
    # the BadNets model is backdoored, the clean one is not
    bad = bd.evaluate(trained.model, trained.bad, xt, yt, pr)
    clean = bd.evaluate(trained.model, trained.clean, xt, yt, pr)
    assert float(bad.decoy_asr) > 0.8 > 0.2 > float(clean.decoy_asr)


def test_evaluate_input_validation(trained):
    pr = _problem(trained)
    xt, yt = trained.x_test, trained.y_test
    with pytest.raises(TypeError, match="problem: expected a DTBProblem"):
        bd.evaluate(trained.model, trained.bad, xt, yt, (pr.decoy, TARGET))
    with pytest.raises(ValueError, match="x: expected images of shape"):
        bd.evaluate(trained.model, trained.bad, jnp.zeros((4, 9, 9, 1)), yt[:4], pr)
    with pytest.raises(ValueError, match=r"y: expected shape \[4\]"):
        bd.evaluate(trained.model, trained.bad, xt[:4], yt[:5], pr)


def test_defense_table_closed_forms():
    before = _m(0.9, 1.0, 0.0)
    after = {"ft": _m(0.8, 0.4, 0.2), "nc": _m(0.9, 0.0, 0.6), "ft+ft": _m(0.7, 0.8, 0.1)}
    t = bd.defense_table(before, after, surrogate=_m(0.85, 0.5, 0.3))
    f32 = lambda v: float(np.float32(v))  # the figures are float32 values
    assert t["clean_acc_before"] == f32(0.9) and t["hidden_asr_after_ft+ft"] == f32(0.1)
    assert t["decoy_asr_after_mean"] == pytest.approx((0.4 + 0.0 + 0.8) / 3)
    assert t["surrogate_hidden_asr"] == f32(0.3)
    assert t["surrogate_clean_acc_mae"] == pytest.approx((0.05 + 0.05 + 0.15) / 3)
    # DER = (max(0, dASR) - max(0, dACC) + 1) / 2 per defense, then the mean
    ders = [(0.6 - 0.1 + 1) / 2, (1.0 - 0.0 + 1) / 2, (0.2 - 0.2 + 1) / 2]
    assert t["der_decoy_mean"] == pytest.approx(np.mean(ders), abs=1e-6)
    metrics = ("clean_acc", "decoy_asr", "hidden_asr")
    kinds = ("before", "after_ft", "after_nc", "after_ft+ft", "after_mean")
    want = {f"{m}_{k}" for m in metrics for k in kinds}
    want |= {f"surrogate_{m}{e}" for m in metrics for e in ("", "_mae")} | {"der_decoy_mean"}
    assert set(t) == want
    assert not any(k.startswith("surrogate") for k in bd.defense_table(before, after))


def test_defense_table_bad_input():
    with pytest.raises(ValueError, match="after: expected the figures after at least one"):
        bd.defense_table(_m(1, 1, 0), {})
    with pytest.raises(TypeError, match=r"after\['ft'\]: expected BackdoorMetrics"):
        bd.defense_table(_m(1, 1, 0), {"ft": (1.0, 1.0, 0.0)})
    with pytest.raises(TypeError, match="surrogate: expected BackdoorMetrics"):
        bd.defense_table(_m(1, 1, 0), {"ft": _m(1, 0, 0)}, surrogate={"clean_acc": 1.0})


def test_detection_rates():
    flags = np.array([True, False, True, True, False, False])
    is_poison = np.array([True, True, False, False, False, False])
    assert bd.detection_rates(flags, is_poison) == (0.5, 0.5)
    with pytest.raises(ValueError, match="flags: expected a \\[n\\] bool array"):
        bd.detection_rates(flags.astype(int), is_poison)
    with pytest.raises(ValueError, match="flags: expected shape"):
        bd.detection_rates(flags[:4], is_poison)


def test_surrogate_defense_is_the_last_surrogate_round(trained):
    pr = _problem(trained)
    cfg = bd.DTBConfig(inner_steps=2, inner_batch=8, rounds=2)
    xc, yc = trained.x_clean, trained.y_clean
    k = jax.random.key(3)
    got = bd.surrogate_defense(cfg, pr)(k, trained.model, trained.bad, xc, yc)
    want = bd.sanitise_surrogate(k, trained.model, cfg, trained.bad, pr, xc, yc)[-1]
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    with pytest.raises(TypeError, match="config: expected a DTBConfig"):
        bd.surrogate_defense(dataclasses.asdict(cfg), pr)


def test_benchmark_routes_data_logs_and_matches_its_parts(trained):
    pr = _problem(trained)
    seen = {}

    def spy(name):  # a "defense" that records the rows it was given and returns the model
        def run(key, model, params, x, y):
            seen[name] = x.shape[0]
            return params

        return run

    ft = bd.make_defense("ft", 3)
    logged = []
    t = bd.benchmark_defenses(
        jax.random.key(0),
        trained.model,
        trained.bad,
        pr,
        (trained.x_test, trained.y_test),
        {"ft": ft, "abl": spy("abl"), "clp": spy("clp")},
        (trained.x_clean, trained.y_clean),
        train=trained.poisoned,
        detectors={"ss": bd.spectral_signatures},
        callback=lambda n, m: logged.append((n, float(m.decoy_asr))),
    )
    # ABL gets the training set the defender holds, every other defense the clean split
    assert seen == {"abl": trained.poisoned.x.shape[0], "clp": trained.x_clean.shape[0]}
    assert [n for n, _ in logged] == ["ft", "abl", "clp"]
    # the identity "defenses" leave the figures before defense unchanged
    assert t["decoy_asr_after_abl"] == t["decoy_asr_before"] == t["decoy_asr_after_clp"]
    repaired = ft(jax.random.key(0), trained.model, trained.bad, trained.x_clean, trained.y_clean)
    want = bd.evaluate(trained.model, repaired, trained.x_test, trained.y_test, pr)
    assert t["decoy_asr_after_ft"] == float(want.decoy_asr) == logged[0][1]
    flags = bd.spectral_signatures(trained.model, trained.bad, *trained.poisoned[:2])
    assert (t["ss_tpr"], t["ss_fpr"]) == bd.detection_rates(flags, trained.poisoned.is_poison)
    assert t["ss_tpr"] > t["ss_fpr"]  # SS finds BadNets poisons better than chance


def test_benchmark_bad_input(trained):
    args = (jax.random.key(0), trained.model, trained.bad, _problem(trained))
    test, clean = (trained.x_test, trained.y_test), (trained.x_clean, trained.y_clean)
    with pytest.raises(ValueError, match="defenses: expected at least one"):
        bd.benchmark_defenses(*args, test, {}, clean)
    with pytest.raises(ValueError, match="train: expected the defender's Poisoned training"):
        bd.benchmark_defenses(*args, test, {"abl": bd.make_defense("abl", 1)}, clean)
    with pytest.raises(ValueError, match="train: expected"):
        bd.benchmark_defenses(*args, test, {"clp": bd.clp}, clean, detectors={"ss": None})
