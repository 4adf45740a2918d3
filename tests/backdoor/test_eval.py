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


def test_evaluate_is_the_four_metrics_and_compiles_once(trained):
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
        assert float(got.clean_to_hidden) == float(bd.target_rate(f, params, xt, yt, 3))
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
    metrics = ("clean_acc", "decoy_asr", "hidden_asr", "clean_to_hidden")  # the last NaN here
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


def test_surrogate_defense_is_the_single_member_surrogate(trained):
    pr = _problem(trained)
    cfg = bd.DTBConfig(inner_steps=2, inner_batch=8)
    data = bd.DefenseData(trained.x_clean, trained.y_clean)
    k = jax.random.key(3)
    got = bd.surrogate_defense(cfg, pr, "ft2")(k, trained.model, trained.bad, data).params
    one = dataclasses.replace(cfg, family=("ft2",))
    want = jax.jit(lambda p: bd.sanitise_surrogate(k, trained.model, one, p, pr, *data[:2], 0))(
        trained.bad
    )
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="member: expected one of"):
        bd.surrogate_defense(cfg, pr, "nope")


def test_benchmark_reports_each_defense_flags_and_displacement(trained):
    pr = _problem(trained)
    n = 300
    data = bd.DefenseData(
        trained.x_clean, trained.y_clean, trained.poisoned.x[:n], trained.poisoned.y[:n]
    )
    defs = {"clp": bd.make_defense("clp", 1), "ss": bd.make_defense("ss", 2)}
    test = (trained.x_test, trained.y_test)
    seen = []
    t = bd.benchmark_defenses(
        jax.random.key(1),
        trained.model,
        trained.bad,
        pr,
        test,
        defs,
        data,
        is_poison=trained.poisoned.is_poison[:n],
        callback=lambda name, m, s: seen.append(name),
    )
    assert seen == ["clp", "ss"]
    out = bd.make_defense("clp", 1)(jax.random.key(1), trained.model, trained.bad, data)
    want = bd.evaluate(trained.model, out.params, *test, pr)
    assert t["hidden_asr_after_clp"] == float(want.hidden_asr)
    assert t["displacement_clp"] == pytest.approx(
        float(bd.weight_displacement(trained.bad, out.params))
    )
    assert 0.0 <= t["ss_tpr"] <= 1.0 and 0.0 <= t["ss_fpr"] <= 1.0
    with pytest.raises(ValueError, match="defenses: expected at least one"):
        bd.benchmark_defenses(jax.random.key(1), trained.model, trained.bad, pr, test, {}, data)
    with pytest.raises(TypeError, match="data: expected a DefenseData"):
        bd.benchmark_defenses(
            jax.random.key(1), trained.model, trained.bad, pr, test, defs, data[:2]
        )


def test_benchmark_continues_a_composition_from_its_standalone_first_round(trained):
    # "ft+clp" beside "ft": round 0 is the standalone FT run (same key, same object from
    # make_defense), so FT runs once and the composition's figures are those it has alone
    pr = _problem(trained)
    data = bd.DefenseData(trained.x_clean, trained.y_clean)
    test = (trained.x_test, trained.y_test)
    ft, both = bd.make_defense("ft", 2), bd.make_defense("ft+clp", 2)
    assert both.rounds[0] is ft and bd.make_defense("ft", 2, lrs=(0.01,)) is not ft
    calls = []

    def counted(k, m, p, d):
        calls.append(1)
        return ft(k, m, p, d)

    comp = bd.compose(counted, both.rounds[1])
    k = jax.random.key(4)
    t = bd.benchmark_defenses(
        k, trained.model, trained.bad, pr, test, {"ft": counted, "c": comp}, data
    )
    assert len(calls) == 1
    alone = both(k, trained.model, trained.bad, data)
    want = bd.evaluate(trained.model, alone.params, *test, pr)
    assert t["clean_acc_after_c"] == float(want.clean_acc)
    assert t["decoy_asr_after_c"] == float(want.decoy_asr)
    # the composition alone (no standalone first round in the suite) runs both rounds
    t1 = bd.benchmark_defenses(k, trained.model, trained.bad, pr, test, {"c": comp}, data)
    assert len(calls) == 2 and t1["clean_acc_after_c"] == t["clean_acc_after_c"]


def test_finetune_trajectory_is_one_run(trained):
    pr = _problem(trained)
    data = bd.DefenseData(trained.x_clean, trained.y_clean)
    test = (trained.x_test, trained.y_test)
    t = bd.finetune_trajectory(
        jax.random.key(2), trained.model, trained.bad, data, test, pr, n_steps=20, every=10
    )
    assert t["step"].tolist() == [0, 10, 20]
    before = bd.evaluate(trained.model, trained.bad, *test, pr)
    assert t["decoy_asr"][0] == float(before.decoy_asr)
    # the end of the trajectory is the real FT defense at the same budget and key
    ft = bd.make_defense("ft", 20)(jax.random.key(2), trained.model, trained.bad, data)
    end = bd.evaluate(trained.model, ft.params, *test, pr)
    # the same one-step compile and the same steps: the same model, figure for figure
    assert t["clean_acc"][-1] == float(end.clean_acc)
    assert t["hidden_asr"][-1] == float(end.hidden_asr)
    t = bd.finetune_trajectory(
        jax.random.key(2), trained.model, trained.bad, data, test, pr, n_steps=5, every=2
    )
    assert t["step"].tolist() == [0, 2, 4, 5]  # and at the end, when every does not divide it


def test_targets_outside_the_models_classes_are_rejected(trained):
    # the conftest model has 10 classes
    test = (trained.x_test, trained.y_test)
    data = bd.DefenseData(trained.x_clean, trained.y_clean)
    hidden = bd.blend_trigger(jax.random.key(7), (8, 8, 1), 0.15)
    ran = []

    def defense(k, m, p, d):
        ran.append(1)
        return bd.DefenseOutput(p, {})

    for decoy_t, hidden_t, name in ((0, 10, "hidden_target"), (-1, 3, "decoy_target")):
        pr = bd.DTBProblem(trained.trigger, hidden, decoy_t, hidden_t)
        msg = rf"problem.{name}: expected a class of the model, in \[0, 10\)"
        with pytest.raises(ValueError, match=msg):
            bd.evaluate(trained.model, trained.bad, *test, pr)
        with pytest.raises(ValueError, match=msg):  # before any defense runs
            bd.benchmark_defenses(
                jax.random.key(0), trained.model, trained.bad, pr, test, {"d": defense}, data
            )
        with pytest.raises(ValueError, match=msg):  # before any fine-tuning step
            bd.finetune_trajectory(
                jax.random.key(0), trained.model, trained.bad, data, test, pr, 2, 1
            )
    assert not ran
    # a model without num_classes: the class count is its logits' width
    apply_only = dataclasses.make_dataclass("M", [])
    apply_only.apply = lambda self, p, x, *a, **k: trained.model.apply(p, x)
    pr = bd.DTBProblem(trained.trigger, hidden, 0, 10)
    with pytest.raises(ValueError, match=r"problem.hidden_target: .* in \[0, 10\)"):
        bd.evaluate(apply_only(), trained.bad, *test, pr)
