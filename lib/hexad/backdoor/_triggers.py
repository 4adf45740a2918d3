"""Backdoor triggers (patch, blend, warping) and all-to-one poisoning, as pure functions.

Images are ``[..., H, W, C]`` floating arrays in ``[0, 1]``. A trigger is a
``flax.struct.dataclass`` holding its arrays as leaves and its geometry as static fields, so
it flows through ``jit``/``vmap``/``grad`` and :func:`apply_trigger` is jittable.
"""

from __future__ import annotations

from typing import NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "BlendTrigger",
    "PatchTrigger",
    "Poisoned",
    "WarpTrigger",
    "apply_trigger",
    "blend_trigger",
    "check_images",
    "patch_trigger",
    "poison",
    "warp_trigger",
]


def check_images(x, name: str = "x", image_shape: tuple[int, ...] | None = None) -> None:
    """Raises ValueError/TypeError unless ``x`` is a floating ``[..., H, W, C]`` image batch."""
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{name}: expected an array, got {type(x).__name__}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{name}: expected a floating dtype (images in [0, 1]), got {x.dtype}")
    if x.ndim < 3:
        raise ValueError(f"{name}: expected shape [..., H, W, C], got {tuple(x.shape)}")
    if image_shape is not None and tuple(x.shape[-3:]) != tuple(image_shape):
        raise ValueError(
            f"{name}: expected images of shape {tuple(image_shape)}, got {tuple(x.shape[-3:])}"
        )


@flax.struct.dataclass
class PatchTrigger:
    """A BadNets patch: the ``[h, w, C]`` ``pattern`` pasted at ``(row, col)`` (Gu et al.,
    arXiv 1708.06733). Pixels outside the patch are unchanged.

    Attributes:
      pattern: ``[h, w, C]`` pixel values in [0, 1].
      row, col: top-left corner (static).
      image_shape: ``(H, W, C)`` the trigger is made for (static).
    """

    pattern: jax.Array
    row: int = flax.struct.field(pytree_node=False)
    col: int = flax.struct.field(pytree_node=False)
    image_shape: tuple[int, int, int] = flax.struct.field(pytree_node=False)


@flax.struct.dataclass
class BlendTrigger:
    r"""A blended trigger :math:`x' = (1 - \alpha) x + \alpha\, \text{pattern}` over the whole
    image (Chen et al., arXiv 1712.05526).

    Attributes:
      pattern: ``[H, W, C]`` in [0, 1].
      alpha: blend ratio in [0, 1] (static).
      image_shape: ``(H, W, C)`` (static).
    """

    pattern: jax.Array
    alpha: float = flax.struct.field(pytree_node=False)
    image_shape: tuple[int, int, int] = flax.struct.field(pytree_node=False)


@flax.struct.dataclass
class WarpTrigger:
    """A WaNet warping trigger (Nguyen & Tran, arXiv 2102.10369): the image is resampled
    bilinearly at ``p + flow[p]`` (pixel units, rows then columns), with border clamping.

    Attributes:
      flow: ``[H, W, 2]`` displacement field in pixels.
      image_shape: ``(H, W, C)`` (static).
    """

    flow: jax.Array
    image_shape: tuple[int, int, int] = flax.struct.field(pytree_node=False)


def _check_shape(image_shape) -> tuple[int, int, int]:
    if len(image_shape) != 3 or any(int(s) < 1 for s in image_shape):
        raise ValueError(f"image_shape: expected (H, W, C) positive ints, got {image_shape!r}")
    return tuple(int(s) for s in image_shape)


def patch_trigger(
    image_shape: tuple[int, int, int],
    size: int = 3,
    loc: tuple[int, int] | None = None,
    pattern: str | np.ndarray = "checker",
) -> PatchTrigger:
    """Returns a BadNets patch trigger.

    Args:
      image_shape: ``(H, W, C)``.
      size: side of the square patch (ignored when ``pattern`` is an array).
      loc: top-left ``(row, col)``; default the bottom-right corner.
      pattern: ``"checker"`` (black/white checkerboard), ``"white"``, or an ``[h, w, C]`` array.

    >>> patch_trigger((16, 16, 1), size=3).row
    13
    """
    H, W, C = _check_shape(image_shape)
    if isinstance(pattern, str):
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"size: expected a positive int, got {size!r}")
        if pattern == "checker":
            ii, jj = np.mgrid[0:size, 0:size]
            pat = ((ii + jj) % 2 == 0).astype(np.float32)
        elif pattern == "white":
            pat = np.ones((size, size), np.float32)
        else:
            raise ValueError(f"pattern: expected 'checker', 'white' or an array, got {pattern!r}")
        pat = np.repeat(pat[:, :, None], C, axis=2)
    else:
        pat = np.asarray(pattern, np.float32)
        if pat.ndim != 3 or pat.shape[2] != C:
            raise ValueError(f"pattern: expected shape [h, w, {C}], got {pat.shape}")
    h, w = pat.shape[:2]
    if h > H or w > W:
        name = "size" if isinstance(pattern, str) else "pattern"
        raise ValueError(f"{name}: the trigger ({h}x{w}) is larger than the image ({H}x{W})")
    row, col = (H - h, W - w) if loc is None else (int(loc[0]), int(loc[1]))
    if not (0 <= row <= H - h and 0 <= col <= W - w):
        raise ValueError(
            f"loc: expected the {h}x{w} patch inside the {H}x{W} image, got (row, col)={loc}"
        )
    if pat.min() < 0 or pat.max() > 1:
        raise ValueError("pattern: expected values in [0, 1]")
    return PatchTrigger(jnp.asarray(pat), row, col, (H, W, C))


def blend_trigger(key, image_shape: tuple[int, int, int], alpha: float = 0.1) -> BlendTrigger:
    """Returns a blend trigger with a uniform-noise pattern drawn from ``key``.

    >>> blend_trigger(jax.random.key(0), (8, 8, 1), 0.2).pattern.shape
    (8, 8, 1)
    """
    shape = _check_shape(image_shape)
    if not 0.0 <= float(alpha) <= 1.0:
        raise ValueError(f"alpha: expected a number in [0, 1], got {alpha!r}")
    return BlendTrigger(jax.random.uniform(key, shape), float(alpha), shape)


def warp_trigger(
    key, image_shape: tuple[int, int, int], grid: int = 4, strength: float = 0.5
) -> WarpTrigger:
    """Returns a WaNet warp: a random ``grid x grid`` control field upsampled to ``[H, W, 2]``.

    Following WaNet (arXiv 2102.10369, eq. 5), the control field is uniform in [-1, 1],
    normalised by its mean absolute value, upsampled bicubically and scaled by
    ``strength`` pixels.

    Args:
      key: PRNG key.
      image_shape: ``(H, W, C)``.
      grid: control grid size ``k`` (static).
      strength: warp magnitude ``s`` in pixels.

    >>> warp_trigger(jax.random.key(0), (8, 8, 1)).flow.shape
    (8, 8, 2)
    """
    H, W, C = _check_shape(image_shape)
    if not isinstance(grid, int) or not 2 <= grid <= min(H, W):
        raise ValueError(f"grid: expected an int in [2, {min(H, W)}], got {grid!r}")
    if not float(strength) >= 0:
        raise ValueError(f"strength: expected a non-negative number, got {strength!r}")
    ctrl = jax.random.uniform(key, (grid, grid, 2), minval=-1.0, maxval=1.0)
    ctrl = ctrl / jnp.mean(jnp.abs(ctrl))
    flow = jax.image.resize(ctrl, (H, W, 2), method="cubic") * float(strength)
    return WarpTrigger(flow, (H, W, C))


def _warp(x, flow):
    """Bilinear resampling of ``x`` ``[H, W, C]`` at ``grid + flow`` with border clamping."""
    H, W = x.shape[0], x.shape[1]
    ii, jj = jnp.meshgrid(jnp.arange(H), jnp.arange(W), indexing="ij")
    r = jnp.clip(ii + flow[..., 0], 0.0, H - 1)
    c = jnp.clip(jj + flow[..., 1], 0.0, W - 1)
    r0 = jnp.floor(r).astype(jnp.int32)
    c0 = jnp.floor(c).astype(jnp.int32)
    r1 = jnp.minimum(r0 + 1, H - 1)
    c1 = jnp.minimum(c0 + 1, W - 1)
    fr = (r - r0)[..., None].astype(x.dtype)
    fc = (c - c0)[..., None].astype(x.dtype)
    top = x[r0, c0] * (1 - fc) + x[r0, c1] * fc
    bot = x[r1, c0] * (1 - fc) + x[r1, c1] * fc
    return top * (1 - fr) + bot * fr


def _check_fits(trigger) -> None:
    """Raises ValueError unless ``trigger``'s arrays fit the images it is made for (a
    trigger built directly, not by :func:`patch_trigger` / :func:`blend_trigger` /
    :func:`warp_trigger`, may not)."""
    H, W, C = _check_shape(trigger.image_shape)
    if isinstance(trigger, PatchTrigger):
        shape = tuple(trigger.pattern.shape)
        if len(shape) != 3 or shape[2] != C:
            raise ValueError(f"trigger: expected a patch pattern of shape [h, w, {C}], got {shape}")
        h, w = shape[:2]
        if h > H or w > W:
            raise ValueError(f"trigger: the patch ({h}x{w}) is larger than the image ({H}x{W})")
        row, col = int(trigger.row), int(trigger.col)
        if not (0 <= row <= H - h and 0 <= col <= W - w):
            raise ValueError(
                f"trigger: the {h}x{w} patch at (row, col)=({row}, {col}) does not fit "
                f"inside the {H}x{W} image"
            )
    elif isinstance(trigger, BlendTrigger):
        if tuple(trigger.pattern.shape) != (H, W, C):
            raise ValueError(
                f"trigger: expected a blend pattern of the image's shape {(H, W, C)}, got "
                f"{tuple(trigger.pattern.shape)}"
            )
    elif tuple(trigger.flow.shape) != (H, W, 2):
        raise ValueError(
            f"trigger: expected a warp flow of shape {(H, W, 2)}, got {tuple(trigger.flow.shape)}"
        )


def apply_trigger(trigger, x: jax.Array) -> jax.Array:
    """Returns ``x`` (``[..., H, W, C]``, floating) with ``trigger`` applied to every image.

    Patch: the patch region is overwritten, everything else is untouched. Blend: convex
    combination with the pattern. Warp: bilinear resampling along the flow. Raises
    ValueError when the images are not of the trigger's ``image_shape`` or the trigger does
    not fit them (a patch larger than the image or outside it, a pattern or flow of another
    shape).

    >>> t = patch_trigger((8, 8, 1), size=2)
    >>> apply_trigger(t, jnp.zeros((4, 8, 8, 1)))[:, 6:, 6:, 0].sum()
    Array(8., dtype=float32)
    """
    if not isinstance(trigger, (PatchTrigger, BlendTrigger, WarpTrigger)):
        raise TypeError(
            f"trigger: expected a PatchTrigger, BlendTrigger or WarpTrigger, got {type(trigger)}"
        )
    check_images(x, "x", trigger.image_shape)
    _check_fits(trigger)
    if isinstance(trigger, PatchTrigger):
        h, w = trigger.pattern.shape[:2]
        pat = jnp.broadcast_to(trigger.pattern.astype(x.dtype), x.shape[:-3] + (h, w, x.shape[-1]))
        rows = slice(trigger.row, trigger.row + h)
        idx = (Ellipsis, rows, slice(trigger.col, trigger.col + w), slice(None))
        return x.at[idx].set(pat)
    if isinstance(trigger, BlendTrigger):
        a = trigger.alpha
        return (1.0 - a) * x + a * jnp.broadcast_to(trigger.pattern.astype(x.dtype), x.shape)
    batch = x.shape[:-3]  # a WarpTrigger
    flat = x.reshape((-1,) + x.shape[-3:])
    out = jax.vmap(_warp, in_axes=(0, None))(flat, trigger.flow.astype(x.dtype))
    return out.reshape(batch + x.shape[-3:])


def shift(key, x: jax.Array, pad: int) -> jax.Array:
    """Returns ``x`` (``[n, H, W, C]``) translated by up to ``pad`` pixels per axis with zero
    fill (torchvision's ``RandomCrop(size, padding=pad)`` of the images' own size), an offset
    drawn independently per image from ``key``; ``pad`` <= 0 (static): ``x`` itself, no draw.

    The random-shift augmentation shared by training (:func:`hexad.backdoor.fit`, the DTB
    implant) and the fine-tuning defenses. Apply triggers first: BackdoorBench stamps the
    trigger on the stored image and augments at load time, so the trigger moves with it.

    >>> x = jnp.ones((2, 4, 4, 1))
    >>> float(shift(jax.random.key(0), x, 1).sum()) <= 32.0
    True
    """
    if pad <= 0:
        return x
    n, h, w, c = x.shape
    xp = jnp.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    off = jax.random.randint(key, (n, 2), 0, 2 * pad + 1)
    crop = lambda im, o: jax.lax.dynamic_slice(im, (o[0], o[1], 0), (h, w, c))
    return jax.vmap(crop)(xp, off)


class Poisoned(NamedTuple):
    """A poisoned data set.

    Attributes:
      x: ``[n, H, W, C]`` images, the poisoned ones with the trigger applied.
      y: ``[n]`` int32 labels, the poisoned ones set to the target.
      is_poison: ``[n]`` bool, which samples were poisoned.
    """

    x: jax.Array
    y: jax.Array
    is_poison: jax.Array


def poison(key, x, y, trigger, rate: float, target: int, num_classes: int) -> Poisoned:
    """Returns an all-to-one poisoned copy of ``(x, y)``.

    ``round(rate * m)`` samples, drawn uniformly among the ``m`` samples whose label is not
    ``target``, get the trigger and the label ``target`` (BadNets' all-to-one protocol,
    arXiv 1708.06733; BackdoorBench, arXiv 2206.12654). ``rate``, ``target`` and
    ``num_classes`` are validated here, on the host; the label count ``m`` is read from ``y``,
    so call this outside ``jit``.

    Args:
      key: PRNG key.
      x: ``[n, H, W, C]`` floating images.
      y: ``[n]`` integer labels.
      trigger: a trigger for images of shape ``(H, W, C)``.
      rate: poisoning rate in [0, 1] (fraction of the non-target samples).
      target: the attack's target label.
      num_classes: number of classes.

    >>> t = patch_trigger((8, 8, 1), 2)
    >>> p = poison(jax.random.key(0), jnp.zeros((10, 8, 8, 1)), jnp.arange(10) % 2, t, 0.4, 0, 2)
    >>> int(p.is_poison.sum())
    2
    """
    check_images(x, "x", getattr(trigger, "image_shape", None))
    if x.ndim != 4:
        raise ValueError(f"x: expected shape [n, H, W, C], got {tuple(x.shape)}")
    y = jnp.asarray(y)
    if y.shape != (x.shape[0],) or not jnp.issubdtype(y.dtype, jnp.integer):
        raise ValueError(f"y: expected integer labels of shape [{x.shape[0]}], got {y.shape}")
    if not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"num_classes: expected an int >= 2, got {num_classes!r}")
    if not 0.0 <= float(rate) <= 1.0:
        raise ValueError(f"rate: expected a poisoning rate in [0, 1], got {rate!r}")
    if not isinstance(target, (int, np.integer)) or not 0 <= int(target) < num_classes:
        raise ValueError(f"target: expected a label in [0, {num_classes}), got {target!r}")
    y_np = np.asarray(y)
    if y_np.min() < 0 or y_np.max() >= num_classes:
        raise ValueError(
            f"y: expected labels in [0, {num_classes}), got [{y_np.min()}, {y_np.max()}]"
        )
    eligible = y_np != int(target)
    n_poison = int(round(float(rate) * int(eligible.sum())))
    # Eligible samples first in a random order; the first n_poison of them are poisoned.
    score = jax.random.uniform(key, (x.shape[0],)) + jnp.where(jnp.asarray(eligible), 0.0, 2.0)
    chosen = jnp.argsort(score)[:n_poison]
    is_poison = jnp.zeros(x.shape[0], bool).at[chosen].set(True)
    xt = apply_trigger(trigger, x)
    x_out = jnp.where(is_poison[:, None, None, None], xt, x)
    y_out = jnp.where(is_poison, jnp.asarray(int(target), y.dtype), y)
    return Poisoned(x_out, y_out.astype(jnp.int32), is_poison)
