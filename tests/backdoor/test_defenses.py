"""Defenses: NC finds the planted patch, FT lowers BadNets ASR, CLP's closed form, detectors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hexad import backdoor as bd

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
    assert after < before - 0.1, (before, after)
    assert _acc(trained, p) > 0.8


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
    r, c = np.unravel_index(np.argmax(m), m.shape)
    # the reversed mask peaks on the real patch and holds about 3x its area share (4/64 = 6%)
    # of the mask mass there (measured 18-35% across runs; 18% with these keys)
    assert t.row <= r < t.row + h and t.col <= c < t.col + w, np.round(m, 2)
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
    # measured on this model (fixed keys): SS flags poisons at 0.32 vs clean at 0.13, AC at
    # 0.56 vs 0.06; assert they flag poisons at least twice as often as clean samples
    assert ss[ip].mean() > 2 * ss[~ip].mean(), (ss[ip].mean(), ss[~ip].mean())
    assert ac[ip].mean() > 0.4 and ac[~ip].mean() < 0.15, (ac[ip].mean(), ac[~ip].mean())


def test_compose_applies_in_order(trained):
    twice = bd.compose(bd.clp, bd.clp)
    a = twice(jax.random.key(0), trained.model, trained.bad, trained.x_clean, trained.y_clean)
    b = bd.clp(None, trained.model, bd.clp(None, trained.model, trained.bad))
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(u, v)


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


def test_abl_isolates_poisons_far_above_chance(trained):
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
    assert iso.sum() == round(0.05 * len(ip))
    # 10% of the set is poisoned, so random isolation has precision 0.1 (72 picks: sd 0.035);
    # LGA from scratch isolates poisons at 0.60 here (fixed keys); assert 3x chance
    assert ip[iso].mean() > 0.3, ip[iso].mean()
    assert np.asarray(out.losses)[ip].mean() < np.asarray(out.losses)[~ip].mean()
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
