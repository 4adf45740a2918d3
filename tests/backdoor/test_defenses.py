"""Defenses: NC finds the planted patch, FT lowers BadNets ASR, CLP's closed form, detectors."""

import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hexad import backdoor as bd
from hexad.backdoor._defenses import _budget

TARGET = 0  # the attack target of the conftest models


def _asr(t, params):
    return float(
        bd.attack_success_rate(t.model.apply, params, t.x_test, t.y_test, t.trigger, TARGET)
    )


def _acc(t, params):
    return float(bd.accuracy(t.model.apply, params, t.x_test, t.y_test))


def test_ft_lowers_badnets_asr(trained):
    before = _asr(trained, trained.bad)
    p = bd.finetune(
        jax.random.key(0),
        trained.model,
        trained.bad,
        trained.x_clean,
        trained.y_clean,
        n_steps=100,
        lr=0.05,
    )
    after = _asr(trained, p)
    # measured over 20 keys (data split, poison, init, training, FT) under SSE4_2: ASR drop
    # mean 0.67, sd 0.17, min 0.33; accuracy after FT mean 0.90, sd 0.036, min 0.82 (the
    # former bound 0.8 was 2.8 sd below the mean); thresholds 0.1 and 0.75 (chance 0.1)
    assert after < before - 0.1, (before, after)
    assert _acc(trained, p) > 0.75


def test_nc_recovers_the_patch_location_and_unlearns(trained):
    out = bd.neural_cleanse(
        jax.random.key(0),
        trained.model,
        trained.bad,
        trained.x_clean,
        trained.y_clean,
        n_steps=200,
        unlearn_steps=60,
    )
    assert bool(out.flagged[TARGET]), np.asarray(out.anomaly)
    assert int(jnp.argmin(out.norms)) == TARGET
    m = np.asarray(out.masks[TARGET])
    t = trained.trigger
    h, w = t.pattern.shape[:2]
    inside = m[t.row : t.row + h, t.col : t.col + w].sum() / m.sum()
    # measured over 20 keys (data split, poison, init, training, NC) under SSE4_2: the target
    # is flagged and has the smallest mask norm in 20/20 (anomaly index mean 5.6, sd 2.3, min
    # 2.35 against the threshold 2); the reversed mask holds mean 0.22, sd 0.022, min 0.175 of
    # its mass on the patch (area share 4/64 = 0.0625; threshold 0.12, ~2x the area share);
    # ASR after unlearning mean 0.010, max 0.025. Its argmax lay on the patch in only 19/20
    # keys, so the peak's position is no longer asserted
    assert inside > 0.12, np.round(m, 2)
    assert _asr(trained, out.params) < 0.2


def test_clp_prunes_exactly_the_planted_high_lipschitz_channel(trained):
    p = jax.tree.map(lambda a: a, trained.clean)
    k = p["params"]["conv1"]["kernel"]
    p["params"]["conv1"] = {"kernel": k.at[..., 5].multiply(100.0)}
    out = bd.clp(None, trained.model, p)
    k_out = out["params"]["conv1"]["kernel"]
    dead = np.flatnonzero(np.all(np.asarray(k_out) == 0, axis=(0, 1, 2)))
    assert dead.tolist() == [5]
    # with 8 channels no channel can exceed mean + 3 std ((n-1)/sqrt(n) < 3): conv0 untouched
    np.testing.assert_array_equal(out["params"]["conv0"]["kernel"], p["params"]["conv0"]["kernel"])


@pytest.mark.slow
def test_spectral_signatures_and_ac_find_poisons(trained):
    pois = trained.poisoned
    ip = np.asarray(pois.is_poison)
    ss = bd.spectral_signatures(trained.model, trained.bad, pois.x, pois.y, eps=0.1)
    ac = bd.activation_clustering(trained.model, trained.bad, pois.x, pois.y)
    # measured over 20 keys (data split, poison, init, training) under SSE4_2: SS flags
    # poisons at a rate mean 2.09x, sd 0.17, min 1.74x that of clean samples (former bound 2x
    # failed in 5/20 keys; chance 1x, 143 poisons: sd ~0.2); threshold 1.4x
    assert ss[ip].mean() > 1.4 * ss[~ip].mean(), (ss[ip].mean(), ss[~ip].mean())
    # AC flags poisons at mean 0.35, sd 0.23, but 0.0 in 5/20 keys (the target class is not
    # split), so only its false-positive rate is asserted: mean 0.086, sd 0.035, max 0.146
    # (former bounds > 0.4 on poisons and < 0.15 on clean failed in 9/20 keys); bound 0.25
    assert ac[~ip].mean() < 0.25, (ac[ip].mean(), ac[~ip].mean())


def test_compose_applies_in_order(trained):
    twice = bd.compose(bd.clp, bd.clp)
    a = twice(jax.random.key(0), trained.model, trained.bad, trained.x_clean, trained.y_clean)
    b = bd.clp(None, trained.model, bd.clp(None, trained.model, trained.bad))
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(u, v)


def test_compose_hands_params_on_through_abl_and_nc(trained):
    # ABL and NC return their parameters inside an output tuple: compose unwraps them in any
    # round, so both orders return a plain parameter tree
    abl = functools.partial(bd.abl, lga_steps=2, finetune_steps=0, unlearn_steps=1)
    ft = functools.partial(bd.finetune, n_steps=2)
    nc = functools.partial(bd.neural_cleanse, n_steps=1, unlearn_steps=1)
    pois, want = trained.poisoned, jax.tree.structure(trained.bad)
    for rounds in ((abl, ft), (ft, abl), (nc, abl)):
        out = bd.compose(*rounds)(jax.random.key(0), trained.model, trained.bad, pois.x, pois.y)
        assert isinstance(out, dict) and jax.tree.structure(out) == want
    with pytest.raises(ValueError, match="defenses"):
        bd.compose()
    with pytest.raises(TypeError, match="defenses\\[1\\]"):
        bd.compose(ft, "ft")


def test_make_defense_budget_is_each_defense_s_defaults_at_100(trained):
    # the one budget reproduces every defense's own step counts at its default, 100
    for name in bd.DEFENSES:
        f = {"nc": bd.neural_cleanse, "abl": bd.abl}.get(name, bd.DEFENSES[name])
        defaults = inspect.signature(f).parameters
        for arg, v in _budget(name, 100).items():
            assert defaults[arg].default == v, (name, arg)
    # and a budgeted defense is that defense called with the derived step counts
    args = (trained.model, trained.bad, trained.x_clean, trained.y_clean)
    a = bd.make_defense("ft", 3)(jax.random.key(0), *args)
    b = bd.finetune(jax.random.key(0), *args, n_steps=3)
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(u, v)
    with pytest.raises(ValueError, match="name: expected one of"):
        bd.make_defense("strip")
    with pytest.raises(ValueError, match="n_steps"):
        bd.make_defense("ft", 0)


def test_make_defense_composes_joined_names(trained):
    # "a+b" is compose of the budgeted rounds: round i gets fold_in(key, i)
    args = (trained.model, trained.bad, trained.x_clean, trained.y_clean)
    got = bd.make_defense("ft+clp", 2)(jax.random.key(0), *args)
    want = bd.compose(bd.make_defense("ft", 2), bd.make_defense("clp", 2))(jax.random.key(0), *args)
    for u, v in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(u, v)
    # a second FT round moves the parameters on from the first round's
    one = jax.tree.leaves(bd.make_defense("ft", 2)(jax.random.fold_in(jax.random.key(0), 0), *args))
    two = jax.tree.leaves(bd.make_defense("ft+ft", 2)(jax.random.key(0), *args))
    assert not all(np.array_equal(u, v) for u, v in zip(one, two, strict=True))
    with pytest.raises(ValueError, match="name: expected no 'abl' in a composition"):
        bd.make_defense("ft+abl")
    with pytest.raises(ValueError, match="'\\+'-joined ones, got 'ft\\+strip'"):
        bd.make_defense("ft+strip")


def test_defense_input_validation(trained):
    with pytest.raises(ValueError, match="x_clean"):
        bd.finetune(
            jax.random.key(0), trained.model, trained.bad, trained.x_clean[0], trained.y_clean
        )
    with pytest.raises(ValueError, match="y_clean"):
        bd.finetune(
            jax.random.key(0), trained.model, trained.bad, trained.x_clean, trained.y_clean[:3]
        )
    with pytest.raises(ValueError, match="eps"):
        bd.spectral_signatures(trained.model, trained.bad, trained.x, trained.y, eps=1.5)


def test_abl_lga_holds_the_loss_near_gamma_and_isolates_the_lowest_losses(trained):
    pois = trained.poisoned
    ip = np.asarray(pois.is_poison)
    p0 = jax.jit(trained.model.init)(jax.random.key(0), trained.x[:1])
    out = bd.abl(
        jax.random.key(3),
        trained.model,
        p0,
        pois.x,
        pois.y,
        lga_steps=400,
        isolation_ratio=0.05,
        finetune_steps=0,
        unlearn_steps=5,
    )
    iso = np.asarray(out.isolated)
    losses = np.asarray(out.losses)
    assert iso.sum() == round(0.05 * len(ip))
    assert losses[iso].max() <= losses[~iso].min()  # the isolated are the lowest losses
    # LGA holds the training loss near gamma = 0.5 (plain descent, gamma = 0, drives it to
    # 0.011 with these keys; no training leaves it near log 10 = 2.3). Measured over 20 keys
    # (data split, poison, init, ABL) under SSE4_2: mean loss mean 0.49, sd 0.083, min 0.34,
    # max 0.64 (0.47 and 0.48 with these keys under default/AVX2 and SSE4_2); band (0.15, 1.0).
    # Poison isolation itself is not asserted: at this size it fails for some keys. Over the
    # same 20 keys the precision of the 5% isolated was mean 0.43, sd 0.32, min 0.0 (former
    # bound 0.3 failed in 8/20; chance 0.1), the poisons' mean loss rank mean 0.24, max 0.71
    # (chance 0.5), and their mean loss exceeded the clean samples' in 1/20 keys (as with the
    # fixed keys on an AVX-512 host, 0.518 vs 0.459: the former assertion)
    assert 0.15 < losses.mean() < 1.0, losses.mean()
    assert jax.tree.structure(out.params) == jax.tree.structure(p0)
    with pytest.raises(ValueError, match="isolation_ratio"):
        bd.abl(jax.random.key(0), trained.model, p0, pois.x, pois.y, isolation_ratio=1.0)


@pytest.mark.slow
def test_sau_lowers_badnets_asr(trained):
    before = _asr(trained, trained.bad)
    p = bd.sau(
        jax.random.key(4), trained.model, trained.bad, trained.x_clean, trained.y_clean, n_steps=50
    )
    # measured 0.976 -> 0.776 with accuracy 0.958 -> 0.953 (fixed keys)
    assert _asr(trained, p) < before - 0.1, (before, _asr(trained, p))
    assert _acc(trained, p) > 0.9


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fp", "nad", "anp", "ibau", "ftsam", "rnp", "mcr", "sau"])
def test_every_defense_keeps_accuracy_and_lowers_asr(trained, name):
    before = _asr(trained, trained.bad)
    p = bd.DEFENSES[name](
        jax.random.key(0), trained.model, trained.bad, trained.x_clean, trained.y_clean
    )
    assert jax.tree.structure(p) == jax.tree.structure(trained.bad)
    assert _acc(trained, p) > 0.7
    if name != "rnp":  # RNP measured 0.976 -> 0.985 here: it does not remove this patch
        assert _asr(trained, p) <= before
