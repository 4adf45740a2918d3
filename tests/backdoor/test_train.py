"""Training and metrics: clean ASR at chance, BadNets works, one trace per step, DER."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from hexad import backdoor as bd

TARGET = 0  # the attack target of the conftest models


def _acc_asr(t, params):
    acc = float(bd.accuracy(t.model.apply, params, t.x_test, t.y_test))
    asr = float(
        bd.attack_success_rate(t.model.apply, params, t.x_test, t.y_test, t.trigger, TARGET)
    )
    return acc, asr


def test_clean_model_accurate_and_asr_at_chance(trained):
    acc, asr = _acc_asr(trained, trained.clean)
    # measured over 20 keys (data split, poison, init, training) under SSE4_2: accuracy mean
    # 0.955, sd 0.008, min 0.942; ASR mean 0.003, max 0.009. Bounds kept: 0.9 and 0.1
    assert acc > 0.9
    # chance for a 10-class model is 0.1; a clean model puts a patched digit in class 0 about
    # as often as it errs
    assert asr < 0.1


def test_badnets_high_asr_clean_accuracy_kept(trained):
    acc_c, _ = _acc_asr(trained, trained.clean)
    acc, asr = _acc_asr(trained, trained.bad)
    # measured over 20 keys (data split, poison, init, training) under SSE4_2: ASR mean 0.94,
    # sd 0.059, min 0.76 (the former bound 0.9 failed in 3/20 keys); threshold 0.6 (the clean
    # model's ASR is below 0.01). Accuracy minus the clean model's: mean -0.005, sd 0.011,
    # min -0.025; bound -0.05 kept
    assert asr > 0.6
    assert acc > acc_c - 0.05
    ra = float(
        bd.robust_accuracy(
            trained.model.apply,
            trained.bad,
            trained.x_test,
            trained.y_test,
            trained.trigger,
            TARGET,
        )
    )
    assert ra <= 1.0 - asr + 1e-6  # a sample cannot be both hijacked and correct


def test_trainer_step_traces_once(trained):
    tr = bd.make_trainer(trained.model, optax.sgd(0.01), params=trained.clean)
    step = jax.jit(chex.assert_max_traces(tr.step, n=1))
    batch = (trained.x[:16], trained.y[:16])
    state = tr.init(None, batch)  # params given: no key needed
    for i in range(3):
        state, info = step(jax.random.key(i), state, batch)
    assert int(state.step) == 3 and bool(jnp.isfinite(info.loss))


def test_trainer_init_from_a_key_and_on_a_mesh(trained):
    batch = (trained.x[:16], trained.y[:16])
    mesh = jax.make_mesh((8,), ("batch",))
    plain = bd.make_trainer(trained.model, optax.sgd(0.01))
    sharded = bd.make_trainer(trained.model, optax.sgd(0.01), mesh=mesh, axis="batch")
    s0 = plain.init(jax.random.key(0), batch)
    want = trained.model.init(jax.random.key(0), batch[0])
    for a, b in zip(jax.tree.leaves(s0.params), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(a, b)
    # data parallelism changes where the batch lives, not the update (up to float rounding)
    p1 = jax.jit(plain.step)(None, s0, batch)[0].params
    p8 = jax.jit(sharded.step)(None, s0, batch)[0].params
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p8), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="axis: expected one of the mesh axes"):
        bd.make_trainer(trained.model, optax.sgd(0.01), mesh=mesh)  # default axis "data"
    with pytest.raises(ValueError, match="batch"):
        jax.jit(sharded.step)(None, s0, (trained.x[:12], trained.y[:12]))


def test_step_counts_must_be_ints():
    loss = lambda p, k, b: jnp.sum(p * b)
    for bad in (True, 0, 2.0):
        with pytest.raises(ValueError, match="n_steps: expected an int >= 1"):
            bd.minimize(jax.random.key(0), jnp.ones(2), loss, jnp.ones(4), optax.sgd(0.1), bad, 2)


def test_fit_on_a_mesh(trained):
    # jax.make_mesh's default Explicit axes are converted to Auto (hexad.sharding.auto_axes)
    mesh = jax.make_mesh((8,), ("data",))
    p, losses = bd.fit(
        jax.random.key(0),
        trained.clean,
        trained.x,
        trained.y,
        trained.model.apply,
        optax.sgd(0.01),
        n_steps=2,
        batch_size=16,
        mesh=mesh,
    )
    assert losses.shape == (2,)
    with pytest.raises(ValueError, match="batch_size"):
        bd.fit(
            jax.random.key(0),
            trained.clean,
            trained.x,
            trained.y,
            trained.model.apply,
            optax.sgd(0.01),
            n_steps=2,
            batch_size=12,
            mesh=mesh,
        )


def test_asr_ignores_target_class_samples():
    t = bd.patch_trigger((4, 4, 1), 2)
    always_target = lambda p, x: jnp.zeros((x.shape[0], 3)).at[:, 2].set(1.0)
    y = jnp.array([2, 2, 0, 1])
    asr = bd.attack_success_rate(always_target, None, jnp.zeros((4, 4, 4, 1)), y, t, 2)
    ra = bd.robust_accuracy(always_target, None, jnp.zeros((4, 4, 4, 1)), y, t, 2)
    assert float(asr) == 1.0 and float(ra) == 0.0


def test_der_closed_form():
    assert bd.defense_effectiveness_rating(0.9, 0.9, 1.0, 0.0) == 1.0
    assert bd.defense_effectiveness_rating(0.9, 0.8, 1.0, 1.0) == pytest.approx(0.45)
    assert bd.defense_effectiveness_rating(0.9, 0.95, 0.5, 0.7) == 0.5


def _small_fit_problem():
    model = bd.SmallCNN(num_classes=3, widths=(2,), hidden=4)
    x = jax.random.uniform(jax.random.key(1), (24 * 64,)).reshape(24, 8, 8, 1)
    y = jnp.arange(24) % 3
    return model, model.init(jax.random.key(0), x[:1]), x, y


def test_fit_without_pad_is_the_unaugmented_run_bit_for_bit():
    # pad 0 draws nothing from the step key: the run is minimize on plain cross-entropy (what
    # fit ran before it had augmentation), the same keys, the same rows, the same floats
    model, p0, x, y = _small_fit_problem()
    opt = optax.sgd(0.1, momentum=0.9)
    got, lg = bd.fit(jax.random.key(2), p0, x, y, model.apply, opt, 4, 8, pad=0)

    def plain(p, k, batch):
        del k
        return bd.cross_entropy(model.apply(p, batch[0]), batch[1])

    want, lw = bd.minimize(jax.random.key(2), p0, plain, (x, y), opt, 4, 8)
    np.testing.assert_array_equal(lg, lw)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(a, b)
    shifted = bd.fit(jax.random.key(2), p0, x, y, model.apply, opt, 4, 8, pad=1)[1]
    assert not np.array_equal(shifted, lw)  # pad 1 does change the batches


def _offset(seen, image, pad):
    """The ``(dy, dx)`` with ``seen == image`` translated by it (zero fill), or None."""
    h, w = image.shape[:2]
    for dy in range(-pad, pad + 1):
        for dx in range(-pad, pad + 1):
            want = np.zeros_like(image)
            src = image[max(dy, 0) : h + min(dy, 0), max(dx, 0) : w + min(dx, 0)]
            want[max(-dy, 0) : h + min(-dy, 0), max(-dx, 0) : w + min(-dx, 0)] = src
            if np.array_equal(seen, want):
                return dy, dx
    return None


@pytest.mark.parametrize("pad", [0, 1])
def test_fit_trains_on_shifted_copies_and_the_trigger_moves_with_the_image(pad):
    # A linear model whose one-step SGD update from zero is the batch itself: with the loss
    # the mean over b rows and per-row weights p [b, d, 2], lr b, the update of row r is
    # x_r (e_1 - e_0) / 2, so x_r = p1[r, :, 1] - p1[r, :, 0] exactly. The data set is one
    # BadNets-stamped image (values in [0.2, 1], so zero fill is visible), drawn b times.
    b, shape = 16, (6, 6, 1)
    trig = bd.patch_trigger(shape, size=2)
    x0 = jax.random.uniform(jax.random.key(3), (36,), minval=0.2).reshape((1,) + shape)
    image = bd.apply_trigger(trig, x0)
    apply = lambda p, x: jnp.einsum("nd,ndk->nk", x.reshape(x.shape[0], -1), p)
    p0 = jnp.zeros((b, 36, 2))
    p1, _ = bd.fit(jax.random.key(4), p0, image, jnp.ones(1, int), apply, optax.sgd(float(b)),
                   n_steps=1, batch_size=b, pad=pad)  # fmt: skip
    seen = np.asarray(p1[..., 1] - p1[..., 0]).reshape((b,) + shape)
    offsets = [_offset(s, np.asarray(image[0]), pad) for s in seen]
    assert None not in offsets, offsets  # each row: the stamped image, translated, zero fill
    if pad == 0:
        assert set(offsets) == {(0, 0)}
    else:
        # independent offsets per row: all 16 draws of 9 equal with probability 9^-15
        assert len(set(offsets)) > 1, offsets


def test_fit_rejects_a_negative_pad():
    model, p0, x, y = _small_fit_problem()
    for bad in (-1, 1.5):
        with pytest.raises(ValueError, match="pad: expected an int >= 0"):
            bd.fit(jax.random.key(0), p0, x, y, model.apply, optax.sgd(0.1), 1, 4, pad=bad)
