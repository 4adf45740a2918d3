"""Image data sets for the backdoor studies: digits, procedural classes, CIFAR-10, GTSRB.

Everything here runs offline and never unpickles:

- :func:`load_digits`: scikit-learn's bundled 8x8 handwritten digits (1797 images, 10 classes),
  bilinearly upsampled to ``size x size`` and scaled to ``[0, 1]``.
- :func:`make_procedural`: generated classes of simple shapes (bars, crosses, rings, ...) at
  random positions and scales with pixel noise; any size, no files.
- :func:`make_shapes_rgb` / :func:`load_shapes_rgb`: a larger RGB set (default 12,000 images
  of 32x32x3): the same ten shape classes drawn in random colours with a stroke texture on
  random smooth coloured backgrounds, so that the class is the shape, not a colour. Generated
  deterministically from a seed and cached as ``.npz`` (uint8) under
  ``hexad.data.cache_dir("images")``.
- :func:`load_cifar10`: CIFAR-10 from its *binary* distribution (``cifar-10-batches-bin/``:
  ``data_batch_{1..5}.bin``, ``test_batch.bin``; each record is one label byte then 3072 bytes,
  the 32x32 red, green and blue planes in row-major order), never the python-pickle batches.
- :func:`load_gtsrb`: GTSRB in its released layout (``GT-*.csv`` files, semicolon-separated
  ``Filename;Width;Height;Roi.X1;Roi.Y1;Roi.X2;Roi.Y2;ClassId``, and binary PPM (P6) images
  next to them), cropped to the ROI and resized to ``size x size``.

All loaders return an :class:`ImageSet` with ``x`` of shape ``[n, H, W, C]`` (float32 in
``[0, 1]``) and ``y`` of shape ``[n]`` (int32).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import re
import stat
from pathlib import Path

import numpy as np

from hexad._base import check_int
from hexad.data._optional import require

__all__ = [
    "ImageSet",
    "load_cifar10",
    "load_digits",
    "load_gtsrb",
    "load_shapes_rgb",
    "make_procedural",
    "make_shapes_rgb",
    "read_ppm",
    "resize_bilinear",
    "train_test_split",
    "write_ppm",
]

CIFAR10_CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
PROCEDURAL_CLASSES = (
    "hbar",
    "vbar",
    "diag",
    "antidiag",
    "cross",
    "square",
    "ring",
    "dot",
    "checker",
    "corner",
)


@dataclasses.dataclass(frozen=True)
class ImageSet:
    """A labelled image set.

    Attributes:
      x: ``[n, H, W, C]`` float32 images in ``[0, 1]``.
      y: ``[n]`` int32 labels in ``[0, num_classes)``.
      num_classes: number of classes.
      class_names: one name per class.
    """

    x: np.ndarray
    y: np.ndarray
    num_classes: int
    class_names: tuple[str, ...]

    def __post_init__(self):
        if self.x.ndim != 4:
            raise ValueError(f"x: expected shape [n, H, W, C], got {self.x.shape}")
        if self.y.shape != (self.x.shape[0],):
            raise ValueError(f"y: expected shape [{self.x.shape[0]}], got {self.y.shape}")


def resize_bilinear(img: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Returns ``img`` (``[H, W, C]``) resized to ``size = (h, w)`` by bilinear interpolation.

    Pixel centres are aligned (the convention of ``jax.image.resize``'s "linear" method), so
    resizing to the same size is the identity.

    >>> resize_bilinear(np.ones((2, 2, 1)), (4, 4)).shape
    (4, 4, 1)
    """
    img = np.asarray(img, dtype=np.float64)
    if img.ndim != 3:
        raise ValueError(f"img: expected shape [H, W, C], got {img.shape}")
    h_out, w_out = int(size[0]), int(size[1])
    if h_out < 1 or w_out < 1:
        raise ValueError(f"size: expected positive sizes, got {size}")

    def coords(n_in, n_out):
        c = (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5
        c = np.clip(c, 0.0, n_in - 1)
        lo = np.floor(c).astype(np.int64)
        hi = np.minimum(lo + 1, n_in - 1)
        return lo, hi, c - lo

    r0, r1, fr = coords(img.shape[0], h_out)
    c0, c1, fc = coords(img.shape[1], w_out)
    top = img[r0][:, c0] * (1 - fc)[None, :, None] + img[r0][:, c1] * fc[None, :, None]
    bot = img[r1][:, c0] * (1 - fc)[None, :, None] + img[r1][:, c1] * fc[None, :, None]
    return top * (1 - fr)[:, None, None] + bot * fr[:, None, None]


def load_digits(size: int = 16) -> ImageSet:
    """Returns scikit-learn's bundled digits, upsampled to ``[1797, size, size, 1]`` in [0, 1].

    Args:
      size: output side length (8 keeps the original resolution).

    >>> load_digits(8).x.shape
    (1797, 8, 8, 1)
    """
    check_int("size", size, 8)
    d = require("sklearn.datasets", "images").load_digits()
    imgs = d.images.astype(np.float64) / 16.0
    if size != 8:
        imgs = np.stack([resize_bilinear(im[:, :, None], (size, size))[:, :, 0] for im in imgs])
    x = np.clip(imgs, 0.0, 1.0).astype(np.float32)[..., None]
    return ImageSet(x, d.target.astype(np.int32), 10, tuple(str(i) for i in range(10)))


def _shape(name: str, size: int, cy: float, cx: float, s: float, t: float) -> np.ndarray:
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    dy, dx = yy - cy, xx - cx
    if name == "hbar":
        m = (np.abs(dy) <= t) & (np.abs(dx) <= s)
    elif name == "vbar":
        m = (np.abs(dx) <= t) & (np.abs(dy) <= s)
    elif name == "diag":
        m = (np.abs(dy - dx) <= t * 1.4) & (np.abs(dx) <= s)
    elif name == "antidiag":
        m = (np.abs(dy + dx) <= t * 1.4) & (np.abs(dx) <= s)
    elif name == "cross":
        m = ((np.abs(dy) <= t) & (np.abs(dx) <= s)) | ((np.abs(dx) <= t) & (np.abs(dy) <= s))
    elif name == "square":
        inside = (np.abs(dy) <= s) & (np.abs(dx) <= s)
        m = inside & ~((np.abs(dy) <= s - 2 * t) & (np.abs(dx) <= s - 2 * t))
    elif name == "ring":
        r = np.sqrt(dy**2 + dx**2)
        m = np.abs(r - s) <= t
    elif name == "dot":
        m = np.sqrt(dy**2 + dx**2) <= np.maximum(t * 1.5, s * 0.45)
    elif name == "checker":
        inside = (np.abs(dy) <= s) & (np.abs(dx) <= s)
        m = inside & (((np.floor(dy / (t * 2)) + np.floor(dx / (t * 2))) % 2) == 0)
    else:  # corner: an L shape
        m = ((np.abs(dy - s) <= t) & (dx >= -s) & (dx <= s)) | (
            (np.abs(dx + s) <= t) & (dy >= -s) & (dy <= s)
        )
    return m.astype(np.float64)


def make_procedural(
    seed: int = 0, n_per_class: int = 100, size: int = 16, num_classes: int = 10
) -> ImageSet:
    """Returns generated classes of shapes at random positions, scales and pixel noise.

    Class ``k`` is the shape ``PROCEDURAL_CLASSES[k]`` (bars, diagonals, cross, square, ring,
    dot, checker, corner), drawn with a random centre, half-size, stroke width and brightness,
    plus Gaussian pixel noise (std 0.05), clipped to ``[0, 1]``. Deterministic in ``seed``.

    Args:
      seed: numpy seed.
      n_per_class: images per class.
      size: side length (>= 8).
      num_classes: number of classes, 2 to 10.

    >>> make_procedural(0, n_per_class=3, size=8, num_classes=2).x.shape
    (6, 8, 8, 1)
    """
    check_int("size", size, 8)
    check_int("num_classes", num_classes, 2, len(PROCEDURAL_CLASSES))
    check_int("n_per_class", n_per_class)
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for k in range(num_classes):
        for _ in range(n_per_class):
            s = rng.uniform(0.22, 0.38) * size
            t = rng.uniform(0.05, 0.09) * size
            cy, cx = rng.uniform(s, size - 1 - s, size=2)
            img = _shape(PROCEDURAL_CLASSES[k], size, cy, cx, s, t) * rng.uniform(0.6, 1.0)
            img = img + rng.normal(0.0, 0.05, img.shape)
            xs.append(np.clip(img, 0.0, 1.0))
            ys.append(k)
    x = np.stack(xs).astype(np.float32)[..., None]
    perm = rng.permutation(len(ys))
    return ImageSet(
        x[perm], np.asarray(ys, np.int32)[perm], num_classes, PROCEDURAL_CLASSES[:num_classes]
    )


def make_shapes_rgb(seed: int = 0, n_per_class: int = 1200, size: int = 32) -> ImageSet:
    """Returns ten RGB classes of shapes on textured backgrounds, ``[10 n_per_class, size,
    size, 3]`` in [0, 1], deterministic in ``seed``.

    Class ``k`` is the shape ``PROCEDURAL_CLASSES[k]`` with a random centre, half-size and
    stroke width. Each image has a random background colour with a smooth random field (a
    4x4 grid of colour offsets, upsampled bilinearly) and a random foreground colour at least
    0.35 away from the background's in mean intensity (so the shape stays visible in every
    channel mix), a sinusoidal stroke texture of random phase and frequency, and Gaussian
    pixel noise (std 0.04); clipped to [0, 1]. Images are in a random order.

    Args:
      seed: numpy seed.
      n_per_class: images per class (>= 1).
      size: side length (>= 8).

    >>> d = make_shapes_rgb(0, n_per_class=2, size=8)
    >>> d.x.shape, d.num_classes, bool(d.x.min() >= 0 and d.x.max() <= 1)
    ((20, 8, 8, 3), 10, True)
    """
    check_int("size", size, 8)
    check_int("n_per_class", n_per_class)
    rng = np.random.default_rng(seed)
    k_cls = len(PROCEDURAL_CLASSES)
    n = k_cls * n_per_class
    y = np.repeat(np.arange(k_cls), n_per_class)
    col = lambda a: a[:, None, None]
    s = rng.uniform(0.22, 0.38, n) * size
    t = rng.uniform(0.05, 0.09, n) * size
    cy = rng.uniform(s, size - 1 - s)
    cx = rng.uniform(s, size - 1 - s)
    masks = np.empty((n, size, size))
    for k in range(k_cls):
        i = y == k
        masks[i] = _shape(PROCEDURAL_CLASSES[k], size, col(cy[i]), col(cx[i]), col(s[i]), col(t[i]))
    bg = rng.uniform(0.0, 1.0, (n, 3))
    fg = rng.uniform(0.0, 1.0, (n, 3))
    # keep the shape visible: push the foreground's mean intensity 0.35 away from the background's
    gap = fg.mean(1) - bg.mean(1)
    sign = np.where(gap >= 0, 1.0, -1.0)
    sign = np.where(bg.mean(1) > 0.65, -1.0, np.where(bg.mean(1) < 0.35, 1.0, sign))
    fg = np.clip(fg + (sign * np.maximum(0.0, 0.35 - np.abs(gap)))[:, None], 0.0, 1.0)
    grid = rng.normal(0.0, 0.12, (n, 4, 4, 3))
    field = np.stack([resize_bilinear(g, (size, size)) for g in grid])
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    freq = col(rng.uniform(0.5, 1.5, n))
    phase = col(rng.uniform(0.0, 2 * np.pi, n))
    stroke = 0.85 + 0.15 * np.sin(freq * (yy + xx) + phase)
    m = (masks * stroke)[..., None]
    img = (1.0 - masks[..., None]) * (bg[:, None, None] + field) + m * fg[:, None, None]
    img = img + rng.normal(0.0, 0.04, img.shape)
    x = np.clip(img, 0.0, 1.0).astype(np.float32)
    perm = rng.permutation(n)
    return ImageSet(x[perm], y[perm].astype(np.int32), k_cls, PROCEDURAL_CLASSES)


def load_shapes_rgb(
    seed: int = 0, n_per_class: int = 1200, size: int = 32, cache: bool = True
) -> ImageSet:
    """Returns :func:`make_shapes_rgb` ``(seed, n_per_class, size)``, quantised to uint8
    levels (``round(255 x) / 255``), read from its cache file when present.

    The cache is ``cache_dir("images")/shapes_rgb_s{seed}_n{n_per_class}_{size}.npz``
    (``x`` uint8 ``[n, size, size, 3]``, ``y`` int32), read without pickle; a file of the
    wrong shape or dtype, or with labels outside ``[0, 10)``, is regenerated, never trusted.
    ``cache=False`` generates without touching the disk (the same values).

    >>> d = load_shapes_rgb(0, n_per_class=2, size=8, cache=False)
    >>> d.x.shape, d.x.dtype
    ((20, 8, 8, 3), dtype('float32'))
    """
    from hexad.data._bundled import cache_dir, load_npz

    check_int("size", size, 8)
    check_int("n_per_class", n_per_class)
    n = len(PROCEDURAL_CLASSES) * n_per_class
    path = cache_dir("images") / f"shapes_rgb_s{int(seed)}_n{n_per_class}_{size}.npz"
    x8 = y = None
    if cache and path.is_file():
        try:
            f = load_npz(path, ("x", "y"))
            fx, fy = f["x"], f["y"]
            if (
                fx.shape == (n, size, size, 3)
                and fx.dtype == np.uint8
                and fy.shape == (n,)
                and np.issubdtype(fy.dtype, np.integer)
                and fy.min() >= 0
                and fy.max() < len(PROCEDURAL_CLASSES)
            ):
                x8, y = fx, fy.astype(np.int32)
        except ValueError:
            x8 = None
    if x8 is None:
        d = make_shapes_rgb(seed, n_per_class, size)
        x8, y = np.round(d.x * 255.0).astype(np.uint8), d.y
        if cache:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.stem + f".tmp{os.getpid()}.npz")
            np.savez_compressed(tmp, x=x8, y=y)
            os.replace(tmp, path)
    x = x8.astype(np.float32) / 255.0
    return ImageSet(x, y, len(PROCEDURAL_CLASSES), PROCEDURAL_CLASSES)


def train_test_split(data: ImageSet, test_frac: float, seed: int = 0) -> tuple[ImageSet, ImageSet]:
    """Returns a stratified-by-shuffle ``(train, test)`` split of ``data``.

    >>> tr, te = train_test_split(make_procedural(0, 5, 8, 2), 0.2)
    >>> (len(tr.y), len(te.y))
    (8, 2)
    """
    if not 0.0 < test_frac < 1.0:
        raise ValueError(f"test_frac: expected a number in (0, 1), got {test_frac!r}")
    n = len(data.y)
    perm = np.random.default_rng(seed).permutation(n)
    n_test = int(round(test_frac * n))
    te, tr = perm[:n_test], perm[n_test:]
    mk = lambda idx: ImageSet(data.x[idx], data.y[idx], data.num_classes, data.class_names)
    return mk(tr), mk(te)


# --------------------------------------------------------------------------------------------
# CIFAR-10, binary version
# --------------------------------------------------------------------------------------------

_CIFAR_RECORD = 1 + 3 * 32 * 32


def _read_cifar_bin(path: Path) -> tuple[np.ndarray, np.ndarray]:
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size == 0 or raw.size % _CIFAR_RECORD:
        raise ValueError(
            f"path: {path.name} has {raw.size} bytes; expected a positive multiple of "
            f"{_CIFAR_RECORD} (CIFAR-10 binary records)"
        )
    rec = raw.reshape(-1, _CIFAR_RECORD)
    y = rec[:, 0].astype(np.int32)
    if y.max() > 9:
        raise ValueError(f"path: {path.name} has label {int(y.max())}; expected 0..9")
    x = rec[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return x, y


def load_cifar10(path: str | os.PathLike, split: str = "train") -> ImageSet:
    """Reads CIFAR-10 from its binary distribution (never the pickled python batches).

    Args:
      path: the folder holding ``data_batch_1.bin`` ... ``data_batch_5.bin`` and
        ``test_batch.bin`` (usually ``cifar-10-batches-bin``). Batches that are absent from
        the train split are skipped; at least one must exist.
      split: ``"train"`` or ``"test"``.

    Returns:
      ``x`` of shape ``[n, 32, 32, 3]`` float32 in [0, 1], ``y`` of shape ``[n]``.

    A one-image test batch written in the binary format (a label byte, then 3072 pixel bytes
    in channel-major order) reads back as one image:

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> record = bytes([3]) + bytes(range(256)) * 12
    >>> _ = (root / "test_batch.bin").write_bytes(record)
    >>> d = load_cifar10(root, "test")
    >>> d.x.shape, d.y.tolist(), d.class_names[3]
    ((1, 32, 32, 3), [3], 'cat')
    """
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"path: no such folder {str(root)!r}")
    if split == "train":
        files = [root / f"data_batch_{i}.bin" for i in range(1, 6)]
        files = [f for f in files if f.is_file()]
    elif split == "test":
        files = [root / "test_batch.bin"] if (root / "test_batch.bin").is_file() else []
    else:
        raise ValueError(f"split: expected 'train' or 'test', got {split!r}")
    if not files:
        raise FileNotFoundError(f"path: no CIFAR-10 binary batches for split {split!r} in it")
    parts = [_read_cifar_bin(f) for f in files]
    x = np.concatenate([p[0] for p in parts]).astype(np.float32) / 255.0
    y = np.concatenate([p[1] for p in parts])
    return ImageSet(x, y, 10, CIFAR10_CLASSES)


# --------------------------------------------------------------------------------------------
# GTSRB: PPM images + semicolon CSV annotations
# --------------------------------------------------------------------------------------------


# A binary PPM (P6) header: the magic, then width, height and maxval in decimal (at most ten
# digits, Pillow's limit), each gap starting with whitespace and holding any more whitespace and
# '#' comments that run to the end of their line, then exactly one whitespace byte before the
# raster. Checked before Pillow sees a byte: Pillow's own parser also takes "+2" or "2_55" as
# numbers, reads "2#c<newline>1" as 21, and opens P1-P5 and other variants.
_PPM_GAP = rb"\s(?:\s|#[^\r\n]*[\r\n])*"
_PPM_HEADER = re.compile(
    rb"P6" + _PPM_GAP + rb"(\d{1,10})" + _PPM_GAP + rb"(\d{1,10})" + _PPM_GAP + rb"(\d{1,10})\s"
)


def _read_regular_file(path: str | os.PathLike) -> bytes:
    """The bytes of ``path``, which must be a regular file (not a FIFO, device or folder)."""
    # O_NONBLOCK: opening a FIFO must not wait for a writer before fstat can refuse it.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"path: {str(path)!r} is not a regular file")
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        return f.read()


def read_ppm(path: str | os.PathLike) -> np.ndarray:
    """Reads a binary PPM (P6) file into a ``[H, W, 3]`` uint8 (or uint16) array.

    The samples are returned as stored, not scaled by the header's ``maxval``: uint8 when
    ``maxval < 256``, uint16 otherwise. Pillow parses the header and decodes the usual 8-bit
    files (``maxval`` 255, GTSRB's and what :func:`write_ppm` writes); for any other ``maxval``
    Pillow would rescale the samples to 0..255 (and clip those above ``maxval``), so they are
    taken as stored from the raster at the offset Pillow found.

    Before Pillow is given the bytes (never the path), the file must be a regular file whose
    header follows the format strictly, whose raster is complete and whose samples are at most
    ``maxval``; otherwise a ValueError names the file. Nothing is unpickled.

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "00000_00000.ppm"
    >>> _ = path.write_bytes(b"P6\\n# a comment\\n2 1\\n255\\n" + bytes([255, 0, 0, 0, 0, 255]))
    >>> read_ppm(path).tolist()
    [[[255, 0, 0], [0, 0, 255]]]
    """
    return _read_ppm(path)[0]


def _read_ppm(path: str | os.PathLike) -> tuple[np.ndarray, int]:
    """:func:`read_ppm`'s array and the header's ``maxval``."""
    name = Path(path).name
    data = _read_regular_file(path)
    header = _PPM_HEADER.match(data)
    if header is None:
        if data[:2] != b"P6":
            raise ValueError(f"path: {name} is not a binary PPM (magic {data[:2]!r})")
        raise ValueError(f"path: {name} has a malformed PPM header")
    w, h, maxval = (int(v) for v in header.groups())
    if not 0 < maxval < 65536 or w < 1 or h < 1:
        raise ValueError(f"path: {name} has bad PPM header w={w} h={h} max={maxval}")
    offset = header.end()
    dtype = np.dtype(np.uint8) if maxval < 256 else np.dtype(">u2")
    size = w * h * 3 * dtype.itemsize
    if len(data) - offset < size:
        raise ValueError(
            f"path: {name} is truncated ({len(data) - offset} raster bytes, expected {size})"
        )
    raw = np.frombuffer(data, dtype=dtype, count=w * h * 3, offset=offset)
    if maxval != 255 and int(raw.max()) > maxval:
        raise ValueError(
            f"path: {str(path)!r} has a sample {int(raw.max())} above its PPM maxval {maxval}"
        )

    Image = require("PIL.Image", "images")
    try:
        with Image.open(io.BytesIO(data), formats=["PPM"]) as im:
            codec, _, pil_offset, args = im.tile[0]
            pil_maxval = 255 if codec == "raw" else args[-1]
            agree = (im.mode, im.size, pil_offset, pil_maxval) == ("RGB", (w, h), offset, maxval)
            img = np.array(im) if agree and maxval == 255 else None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise ValueError(f"path: {name}: Pillow cannot read this PPM ({e})") from e
    if not agree:
        raise ValueError(f"path: {name} has a PPM header that Pillow reads differently")
    if img is None:
        img = raw.reshape(h, w, 3).astype(np.uint16 if maxval >= 256 else np.uint8)
    return img, maxval


def write_ppm(path: str | os.PathLike, img: np.ndarray) -> None:
    """Writes a ``[H, W, 3]`` uint8 array as a binary PPM (P6) file with Pillow (maxval 255).

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "x.ppm"
    >>> img = np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
    >>> write_ppm(path, img)
    >>> path.read_bytes()[:11]
    b'P6\\n2 2\\n255\\n'
    >>> bool((read_ppm(path) == img).all())
    True
    """
    img = np.asarray(img)
    if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8 or 0 in img.shape:
        raise ValueError(
            f"img: expected a [H >= 1, W >= 1, 3] uint8 array, got {img.shape} {img.dtype}"
        )
    require("PIL.Image", "images").fromarray(img).save(path, format="PPM")


def load_gtsrb(path: str | os.PathLike, size: int = 32, crop_roi: bool = True) -> ImageSet:
    """Reads GTSRB from its released layout under ``path`` (PPM images + ``GT-*.csv``).

    Every ``GT-*.csv`` below ``path`` is read (the training set has one per class folder, the
    test set one ``GT-final_test.csv``); each row's image is found next to its CSV, cropped to
    its ``Roi`` box when ``crop_roi`` (the box is inclusive, as in the released annotations),
    and resized bilinearly to ``size x size``.

    Args:
      path: root folder.
      size: output side length.
      crop_roi: crop to the annotated region of interest.

    Returns:
      ``x`` of shape ``[n, size, size, 3]`` float32 in [0, 1] (each image's samples divided by
      its PPM header's ``maxval``), ``y`` of shape ``[n]``; ``num_classes`` is 43 (the GTSRB
      classes).

    Raises:
      ValueError: a PPM with a sample above its header's ``maxval`` (naming the file), a
        malformed or truncated PPM, missing CSV columns, an empty ROI or a ClassId past 42.

    One class folder with one 4 x 4 image whose annotated box is its top-left 2 x 2 corner:

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp()) / "00014"
    >>> folder.mkdir()
    >>> write_ppm(folder / "00000_00000.ppm", np.full((4, 4, 3), 255, np.uint8))
    >>> header = "Filename;Width;Height;Roi.X1;Roi.Y1;Roi.X2;Roi.Y2;ClassId"
    >>> row = "00000_00000.ppm;4;4;0;0;1;1;14"
    >>> _ = (folder / "GT-00014.csv").write_text(header + "\\n" + row + "\\n")
    >>> d = load_gtsrb(folder.parent, size=8)
    >>> d.x.shape, d.y.tolist(), float(d.x.min()), d.num_classes
    ((1, 8, 8, 3), [14], 1.0, 43)
    """
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"path: no such folder {str(root)!r}")
    check_int("size", size)
    csvs = sorted(root.rglob("GT-*.csv"))
    if not csvs:
        raise FileNotFoundError("path: no GT-*.csv annotation files below it")
    xs, ys = [], []
    need = {"Filename", "Roi.X1", "Roi.Y1", "Roi.X2", "Roi.Y2", "ClassId"}
    for c in csvs:
        with open(c, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f, delimiter=";")
            missing = need - set(reader.fieldnames or ())
            if missing:
                raise ValueError(f"path: {c.name} lacks the columns {sorted(missing)}")
            for row in reader:
                img, maxval = _read_ppm(c.parent / row["Filename"])
                img = img.astype(np.float64) / maxval
                if crop_roi:
                    x1, y1 = int(row["Roi.X1"]), int(row["Roi.Y1"])
                    x2, y2 = int(row["Roi.X2"]), int(row["Roi.Y2"])
                    img = img[y1 : y2 + 1, x1 : x2 + 1]
                    if img.size == 0:
                        raise ValueError(f"path: empty ROI for {row['Filename']} in {c.name}")
                xs.append(resize_bilinear(img, (size, size)))
                label = int(row["ClassId"])
                if not 0 <= label < 43:
                    raise ValueError(f"path: ClassId {label} in {c.name}; expected 0..42")
                ys.append(label)
    x = np.clip(np.stack(xs), 0.0, 1.0).astype(np.float32)
    return ImageSet(x, np.asarray(ys, np.int32), 43, tuple(str(i) for i in range(43)))
