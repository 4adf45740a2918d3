"""Triggers are applied exactly where they claim; poisoning counts and validation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hexad import backdoor as bd

SHAPE = (8, 8, 1)


def _x(key, n=5, shape=SHAPE):
    # drawn flat: XLA:CPU compiles the threefry sampler on 4-D shapes ~10x slower
    return jax.random.uniform(key, (n * int(np.prod(shape)),)).reshape((n,) + shape)


def test_patch_writes_only_the_patch(key):
    x = _x(key)
    t = bd.patch_trigger(SHAPE, size=3, loc=(2, 4))
    out = np.asarray(bd.apply_trigger(t, x))
    inside = np.zeros(SHAPE, bool)
    inside[2:5, 4:7] = True
    np.testing.assert_array_equal(
        out[:, inside], np.broadcast_to(np.asarray(t.pattern)[:, :, 0].ravel(), (5, 9))
    )
    np.testing.assert_array_equal(out[:, ~inside], np.asarray(x)[:, ~inside])


def test_patch_default_corner_and_rgb(key):
    t = bd.patch_trigger((6, 6, 3), size=2, pattern="white")
    assert (t.row, t.col) == (4, 4)
    out = bd.apply_trigger(t, jnp.zeros((2, 6, 6, 3)))
    assert float(out.sum()) == 2 * 4 * 3  # exactly the 2x2x3 patch is white


def test_blend_is_the_convex_combination(key):
    k1, k2 = jax.random.split(key)
    x = _x(k1)
    t = bd.blend_trigger(k2, SHAPE, alpha=0.2)
    np.testing.assert_allclose(bd.apply_trigger(t, x), 0.8 * x + 0.2 * t.pattern[None], atol=1e-6)


def test_warp_zero_flow_is_identity_and_integer_flow_shifts(key):
    x = _x(key)
    zero = bd.WarpTrigger(jnp.zeros((8, 8, 2)), SHAPE)
    np.testing.assert_array_equal(bd.apply_trigger(zero, x), x)
    shift = bd.WarpTrigger(jnp.zeros((8, 8, 2)).at[..., 1].set(1.0), SHAPE)
    out = np.asarray(bd.apply_trigger(shift, x))
    xn = np.asarray(x)
    # pixel (i, j) reads (i, j + 1); the last column clamps to the border
    np.testing.assert_allclose(out[:, :, :-1], xn[:, :, 1:], atol=1e-6)
    np.testing.assert_allclose(out[:, :, -1], xn[:, :, -1], atol=1e-6)


def test_warp_trigger_changes_image_but_keeps_range(key):
    k1, k2 = jax.random.split(key)
    x = _x(k1)
    t = bd.warp_trigger(k2, SHAPE, grid=4, strength=1.0)
    out = bd.apply_trigger(t, x)
    assert float(jnp.abs(out - x).max()) > 1e-3
    assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0


def test_poison_counts_labels_and_untouched_rest(key):
    k1, k2 = jax.random.split(key)
    x = _x(k1, 40)
    y = jnp.arange(40) % 4
    t = bd.patch_trigger(SHAPE, 2)
    p = bd.poison(k2, x, y, t, rate=0.5, target=1, num_classes=4)
    mask = np.asarray(p.is_poison)
    assert mask.sum() == 15  # round(0.5 * 30 non-target samples)
    assert not np.any(mask & (np.asarray(y) == 1))
    np.testing.assert_array_equal(np.asarray(p.y)[mask], 1)
    np.testing.assert_array_equal(np.asarray(p.y)[~mask], np.asarray(y)[~mask])
    np.testing.assert_array_equal(np.asarray(p.x)[~mask], np.asarray(x)[~mask])
    np.testing.assert_array_equal(np.asarray(p.x)[mask], np.asarray(bd.apply_trigger(t, x))[mask])


@pytest.mark.parametrize(
    "kwargs, exc, word",
    [
        ({"rate": -0.1}, ValueError, "rate"),
        ({"rate": 1.5}, ValueError, "rate"),
        ({"target": 4}, ValueError, "target"),
        ({"target": -1}, ValueError, "target"),
    ],
)
def test_poison_rejects_bad_arguments(key, kwargs, exc, word):
    args = {"rate": 0.1, "target": 0, "num_classes": 4}
    args.update(kwargs)
    x = _x(key, 8)
    with pytest.raises(exc, match=word):
        bd.poison(key, x, jnp.arange(8) % 4, bd.patch_trigger(SHAPE, 2), **args)


def test_bad_images_and_oversized_triggers(key):
    t = bd.patch_trigger(SHAPE, 2)
    with pytest.raises(ValueError, match="size"):
        bd.patch_trigger(SHAPE, size=9)
    with pytest.raises(ValueError, match="pattern: the trigger"):  # size is ignored here
        bd.patch_trigger(SHAPE, size=2, pattern=np.ones((9, 2, 1), np.float32))
    with pytest.raises(ValueError, match="loc"):
        bd.patch_trigger(SHAPE, size=3, loc=(6, 0))
    with pytest.raises(TypeError, match="floating"):
        bd.apply_trigger(t, jnp.zeros((2, 8, 8, 1), jnp.uint8))
    with pytest.raises(ValueError, match="shape"):
        bd.apply_trigger(t, jnp.zeros((2, 6, 6, 1)))
    with pytest.raises(ValueError, match="x"):
        bd.poison(key, jnp.zeros((8, 8, 1)), jnp.zeros(8, int), t, 0.1, 0, 2)
    with pytest.raises(ValueError, match="alpha"):
        bd.blend_trigger(key, SHAPE, alpha=1.5)
    with pytest.raises(TypeError, match="trigger"):
        bd.apply_trigger("patch", jnp.zeros((2, 8, 8, 1)))


def test_triggers_that_do_not_fit_the_image_are_rejected_naming_the_argument(key):
    x = _x(key, 2)
    with pytest.raises(ValueError, match=r"size: the trigger \(9x9\) is larger than the image"):
        bd.patch_trigger(SHAPE, size=9)
    # built directly, past the factories' checks: apply_trigger (and poison) reject them
    cases = [
        (bd.PatchTrigger(jnp.ones((9, 9, 1)), 0, 0, SHAPE), r"trigger: the patch \(9x9\) is "
         r"larger than the image \(8x8\)"),
        (bd.PatchTrigger(jnp.ones((3, 3, 1)), 6, 0, SHAPE), r"trigger: the 3x3 patch at "
         r"\(row, col\)=\(6, 0\) does not fit"),
        (bd.PatchTrigger(jnp.ones((3, 3, 1)), 0, -1, SHAPE), "does not fit"),
        (bd.PatchTrigger(jnp.ones((3, 3, 2)), 0, 0, SHAPE), r"trigger: expected a patch pattern"),
        (bd.BlendTrigger(jnp.ones((9, 9, 1)), 0.1, SHAPE), r"trigger: expected a blend pattern "
         r"of the image's shape \(8, 8, 1\), got \(9, 9, 1\)"),
        (bd.WarpTrigger(jnp.zeros((9, 9, 2)), SHAPE), r"trigger: expected a warp flow"),
    ]  # fmt: skip
    for t, msg in cases:
        with pytest.raises(ValueError, match=msg):
            bd.apply_trigger(t, x)
        with pytest.raises(ValueError, match="trigger"):
            jax.jit(bd.apply_trigger)(t, x)  # the shapes are static: checked under jit too
    with pytest.raises(ValueError, match="trigger: the patch"):
        bd.poison(key, _x(key, 8), jnp.arange(8) % 2, cases[0][0], 0.5, 0, 2)
    # a patch as large as the image fits
    full = bd.patch_trigger(SHAPE, size=8)
    np.testing.assert_array_equal(
        bd.apply_trigger(full, x), jnp.broadcast_to(full.pattern, x.shape)
    )
