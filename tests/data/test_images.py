"""Image loaders: digits, procedural classes, CIFAR-10 binary and GTSRB PPM/CSV on tiny files;
the PPM reader's checks in front of Pillow."""

import io
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from hexad.data import images


def test_digits_upsampled_range_and_labels():
    d = images.load_digits(16)
    assert d.x.shape == (1797, 16, 16, 1) and d.x.dtype == np.float32
    assert d.x.min() >= 0 and d.x.max() <= 1
    assert set(np.unique(d.y)) == set(range(10))
    d8 = images.load_digits(8)
    # aligned centres: output pixel (2i, 2j) sits at source (i - 1/4, j - 1/4), so bilinear
    # weights are 9/16, 3/16, 3/16, 1/16 on (i, j), (i-1, j), (i, j-1), (i-1, j-1)
    s = d8.x[:, :, :, 0]
    i, j = 3, 5
    want = (9 * s[:, i, j] + 3 * s[:, i - 1, j] + 3 * s[:, i, j - 1] + s[:, i - 1, j - 1]) / 16
    np.testing.assert_allclose(d.x[:, 2 * i, 2 * j, 0], want, atol=1e-6)


def test_resize_identity_and_constant():
    img = np.random.default_rng(0).random((5, 7, 3))
    np.testing.assert_allclose(images.resize_bilinear(img, (5, 7)), img)
    np.testing.assert_allclose(images.resize_bilinear(np.full((3, 3, 1), 0.4), (9, 4)), 0.4)


def test_procedural_is_deterministic_and_balanced():
    a = images.make_procedural(3, n_per_class=4, size=12, num_classes=5)
    b = images.make_procedural(3, n_per_class=4, size=12, num_classes=5)
    np.testing.assert_array_equal(a.x, b.x)
    assert a.x.shape == (20, 12, 12, 1)
    assert np.bincount(a.y).tolist() == [4] * 5
    with pytest.raises(ValueError, match="num_classes"):
        images.make_procedural(0, 2, 12, 11)


def test_cifar10_binary_roundtrip(tmp_path):
    rng = np.random.default_rng(0)
    pix = rng.integers(0, 256, (3, 3, 32, 32), dtype=np.uint8)  # [n, C, H, W] as on disk
    labels = np.array([7, 0, 9], np.uint8)
    rec = np.concatenate([labels[:, None], pix.reshape(3, -1)], axis=1)
    rec.tofile(tmp_path / "test_batch.bin")
    rec[:2].tofile(tmp_path / "data_batch_1.bin")
    te = images.load_cifar10(tmp_path, "test")
    assert te.x.shape == (3, 32, 32, 3)
    np.testing.assert_array_equal(te.y, [7, 0, 9])
    np.testing.assert_allclose(te.x[1, 4, 5], pix[1, :, 4, 5] / 255.0)
    assert images.load_cifar10(tmp_path, "train").x.shape == (2, 32, 32, 3)
    (tmp_path / "test_batch.bin").write_bytes(b"\x00" * 100)
    with pytest.raises(ValueError, match="3073"):
        images.load_cifar10(tmp_path, "test")
    with pytest.raises(ValueError, match="split"):
        images.load_cifar10(tmp_path, "val")


def test_gtsrb_ppm_csv(tmp_path):
    folder = tmp_path / "00003"
    folder.mkdir()
    img = np.zeros((6, 5, 3), np.uint8)
    img[1:5, 1:4] = [255, 0, 0]  # a red ROI inside a black border
    images.write_ppm(folder / "00000_00000.ppm", img)
    # a header comment must be skipped
    (folder / "00000_00001.ppm").write_bytes(b"P6\n# gimp\n2 1\n255\n" + bytes([0, 255, 0] * 2))
    (folder / "GT-00003.csv").write_text(
        "Filename;Width;Height;Roi.X1;Roi.Y1;Roi.X2;Roi.Y2;ClassId\n"
        "00000_00000.ppm;5;6;1;1;3;4;3\n"
        "00000_00001.ppm;2;1;0;0;1;0;3\n"
    )
    np.testing.assert_array_equal(images.read_ppm(folder / "00000_00000.ppm"), img)
    d = images.load_gtsrb(tmp_path, size=4)
    assert d.x.shape == (2, 4, 4, 3) and d.num_classes == 43
    np.testing.assert_array_equal(d.y, [3, 3])
    np.testing.assert_allclose(d.x[0], np.broadcast_to([1.0, 0.0, 0.0], (4, 4, 3)))
    np.testing.assert_allclose(d.x[1], np.broadcast_to([0.0, 1.0, 0.0], (4, 4, 3)))
    (folder / "bad.ppm").write_bytes(b"P5\n1 1\n255\n\x00")
    with pytest.raises(ValueError, match="PPM"):
        images.read_ppm(folder / "bad.ppm")


def test_shapes_rgb_is_deterministic_balanced_and_cached(tmp_path, monkeypatch):
    a = images.make_shapes_rgb(2, n_per_class=3, size=12)
    b = images.make_shapes_rgb(2, n_per_class=3, size=12)
    np.testing.assert_array_equal(a.x, b.x)
    assert a.x.shape == (30, 12, 12, 3) and a.x.dtype == np.float32
    assert a.x.min() >= 0 and a.x.max() <= 1
    assert np.bincount(a.y).tolist() == [3] * 10
    assert not np.array_equal(a.x, images.make_shapes_rgb(3, n_per_class=3, size=12).x)
    monkeypatch.setenv("HEXAD_CACHE", str(tmp_path))
    first = images.load_shapes_rgb(2, n_per_class=3, size=12)
    path = tmp_path / "images" / "shapes_rgb_s2_n3_12.npz"
    assert path.is_file()
    again = images.load_shapes_rgb(2, n_per_class=3, size=12)  # read back from the cache
    np.testing.assert_array_equal(first.x, again.x)
    # the cached set is the generated one quantised to 8 bits
    np.testing.assert_allclose(first.x, np.round(a.x * 255) / 255, atol=1e-6)
    nocache = images.load_shapes_rgb(2, n_per_class=3, size=12, cache=False)
    np.testing.assert_array_equal(nocache.x, first.x)
    # a cache file of the wrong shape is regenerated, not trusted
    np.savez(path, x=np.zeros((2, 2, 2, 3), np.uint8), y=np.zeros(2, np.int32))
    np.testing.assert_array_equal(images.load_shapes_rgb(2, 3, 12).x, first.x)
    with pytest.raises(ValueError, match="n_per_class"):
        images.make_shapes_rgb(0, n_per_class=0)


def _gtsrb_one(root, body, header):
    folder = root / "00001"
    folder.mkdir(parents=True)
    (folder / "a.ppm").write_bytes(header + body)
    (folder / "GT-00001.csv").write_text(
        "Filename;Width;Height;Roi.X1;Roi.Y1;Roi.X2;Roi.Y2;ClassId\na.ppm;2;1;0;0;1;0;1\n"
    )
    return folder / "a.ppm"


def test_gtsrb_scales_by_the_ppm_maxval(tmp_path):
    # 8-bit samples with maxval 15: 15 is full intensity, 5 a third of it
    _gtsrb_one(tmp_path / "m15", bytes([15, 5, 0, 0, 15, 5]), b"P6\n2 1\n15\n")
    d = images.load_gtsrb(tmp_path / "m15", size=1, crop_roi=False)
    np.testing.assert_allclose(d.x[0, 0, 0], [7.5 / 15, 10 / 15, 2.5 / 15], rtol=1e-6)
    # 16-bit samples with maxval 1000 whose values stay below 256: 200 is 0.2, not 200 / 255
    body = np.array([200, 1000, 0, 0, 500, 200], ">u2").tobytes()
    path = _gtsrb_one(tmp_path / "m1000", body, b"P6\n2 1\n1000\n")
    np.testing.assert_array_equal(images.read_ppm(path)[0, 0], [200, 1000, 0])
    x = images.load_gtsrb(tmp_path / "m1000", size=2).x
    assert x.shape == (1, 2, 2, 3)
    np.testing.assert_allclose(x[0, 0, 0], [0.2, 1.0, 0.0], rtol=1e-6)
    np.testing.assert_allclose(x[0, 0, 1], [0.0, 0.5, 0.2], rtol=1e-6)


@pytest.mark.parametrize(
    "header, body",
    [
        (b"P6\n2 1\n15\n", bytes([15, 5, 0, 0, 16, 5])),
        (b"P6\n2 1\n1000\n", np.array([200, 1000, 0, 0, 1001, 200], ">u2").tobytes()),
    ],
    ids=["8bit", "16bit"],
)
def test_gtsrb_rejects_a_sample_above_maxval(tmp_path, header, body):
    path = _gtsrb_one(tmp_path, body, header)
    with pytest.raises(ValueError, match=r"a\.ppm.*maxval"):
        images.load_gtsrb(tmp_path, size=2)
    with pytest.raises(ValueError, match=r"a\.ppm.*maxval"):
        images.read_ppm(path)


@pytest.mark.parametrize(
    "y",
    [
        np.arange(5, dtype=np.int32),  # wrong length
        np.zeros((30, 1), np.int32),  # wrong rank
        np.full(30, 77, np.int32),  # past the ten classes
        np.full(30, -1, np.int32),  # negative
        np.full(30, 0.5),  # float labels
    ],
    ids=["short", "2d", "too_large", "negative", "float"],
)
def test_shapes_rgb_cache_with_bad_labels_is_regenerated(tmp_path, monkeypatch, y):
    monkeypatch.setenv("HEXAD_CACHE", str(tmp_path))
    good = images.load_shapes_rgb(2, n_per_class=3, size=12, cache=False)
    path = tmp_path / "images" / "shapes_rgb_s2_n3_12.npz"
    path.parent.mkdir()
    np.savez(path, x=np.round(good.x * 255).astype(np.uint8), y=y)
    d = images.load_shapes_rgb(2, n_per_class=3, size=12)
    np.testing.assert_array_equal(d.y, good.y)
    np.testing.assert_array_equal(d.x, good.x)
    assert d.y.dtype == np.int32
    with np.load(path, allow_pickle=False) as f:  # the cache now holds the regenerated labels
        np.testing.assert_array_equal(f["y"], good.y)


_RGB = bytes([255, 0, 0, 0, 0, 255])


def test_write_ppm_writes_the_netpbm_layout_with_pillow(tmp_path):
    img = np.random.default_rng(0).integers(0, 256, (3, 10, 3), dtype=np.uint8)[:, ::2]
    images.write_ppm(tmp_path / "a.ppm", img)  # a strided view: written in row-major order
    assert (tmp_path / "a.ppm").read_bytes() == b"P6\n5 3\n255\n" + np.ascontiguousarray(
        img
    ).tobytes()
    np.testing.assert_array_equal(images.read_ppm(tmp_path / "a.ppm"), img)
    for bad in (img.astype(np.float32), img[..., :2], np.zeros((0, 4, 3), np.uint8)):
        with pytest.raises(ValueError, match="img: expected a"):
            images.write_ppm(tmp_path / "b.ppm", bad)


@pytest.mark.parametrize(
    "data, expected",
    [
        (b"P6\n2 1\n255\n" + _RGB, [255, 0, 0, 0, 0, 255]),
        (b"P6\t2\r1\x0b255\n" + _RGB + b"trailing", [255, 0, 0, 0, 0, 255]),
        (b"P6\n# a\n2 # b\n# c\n 1\n255\n" + _RGB, [255, 0, 0, 0, 0, 255]),
        (b"P6\n2 1\n15\n" + bytes([15, 5, 0, 0, 15, 5]), [15, 5, 0, 0, 15, 5]),
        # as stored: Pillow alone would give round(1000 / 65535 * 255) = 4
        (b"P6\n1 1\n65535\n" + np.array([1000, 65535, 0], ">u2").tobytes(), [1000, 65535, 0]),
    ],
    ids=["plain", "whitespace", "comments", "maxval15", "16bit"],
)
def test_read_ppm_returns_the_samples_as_stored(tmp_path, data, expected):
    (tmp_path / "a.ppm").write_bytes(data)
    img = images.read_ppm(tmp_path / "a.ppm")
    assert img.dtype == (np.uint16 if max(expected) > 255 else np.uint8)
    assert img.reshape(-1).tolist() == expected


BAD_PPMS = {
    "plus_sign": (b"P6\n+2 1\n255\n" + _RGB, "malformed PPM header"),
    "underscore": (b"P6\n2 1\n2_55\n" + _RGB, "malformed PPM header"),
    "comment_inside_a_number": (b"P6\n2#c\n1\n255\n" + _RGB, "malformed PPM header"),  # Pillow: 21
    "comment_after_magic": (b"P6#c\n2 1\n255\n" + _RGB, "malformed PPM header"),
    "comment_after_maxval": (b"P6\n2 1\n255#c\n" + _RGB, "malformed PPM header"),
    "eleven_digits": (b"P6\n00000000002 1\n255\n" + _RGB, "malformed PPM header"),
    "no_raster_gap": (b"P6 2 1 255" + _RGB, "malformed PPM header"),
    "header_cut": (b"P6\n2 1\n", "malformed PPM header"),
    "plain_P3": (b"P3\n2 1\n255\n255 0 0 0 0 255\n", "not a binary PPM"),
    "png": (b"\x89PNG\r\n\x1a\n" + bytes(16), "not a binary PPM"),
    "maxval_0": (b"P6\n2 1\n0\n" + _RGB, "bad PPM header"),
    "maxval_65536": (b"P6\n1 1\n65536\n" + bytes(6), "bad PPM header"),
    "width_0": (b"P6\n0 1\n255\n", "bad PPM header"),
    "truncated": (b"P6\n2 1\n255\n" + _RGB[:5], r"truncated \(5 raster bytes, expected 6\)"),
    "truncated_16bit": (b"P6\n1 1\n1000\n" + bytes(5), r"truncated \(5 raster bytes, expected 6\)"),
    # a size far beyond the file: refused before anything is allocated for it
    "huge_size": (b"P6\n9999999 9999999\n255\n" + _RGB, "truncated"),
    "above_maxval": (b"P6\n2 1\n15\n" + bytes([15, 5, 0, 0, 16, 5]), "above its PPM maxval 15"),
}


@pytest.mark.parametrize("name", list(BAD_PPMS))
def test_read_ppm_checks_the_file_before_pillow_sees_it(tmp_path, monkeypatch, name):
    import PIL.Image

    seen = []
    real_open = PIL.Image.open

    def spy(fp, *args, **kwargs):
        seen.append((fp, kwargs.get("formats")))
        return real_open(fp, *args, **kwargs)

    monkeypatch.setattr(PIL.Image, "open", spy)
    data, match = BAD_PPMS[name]
    (tmp_path / "bad.ppm").write_bytes(data)
    with pytest.raises(ValueError, match=match):
        images.read_ppm(tmp_path / "bad.ppm")
    assert seen == []
    # a good file reaches Pillow as bytes, never as a path, and only its PPM plugin is tried
    images.write_ppm(tmp_path / "good.ppm", np.zeros((2, 2, 3), np.uint8))
    images.read_ppm(tmp_path / "good.ppm")
    assert len(seen) == 1 and isinstance(seen[0][0], io.BytesIO) and seen[0][1] == ["PPM"]


def test_read_ppm_refuses_what_is_not_a_regular_file(tmp_path):
    with pytest.raises(ValueError, match="not a regular file"):
        images.read_ppm(tmp_path)
    with pytest.raises(FileNotFoundError):
        images.read_ppm(tmp_path / "missing.ppm")
    if Path("/dev/null").exists():  # a device: refused as such, not read
        with pytest.raises(ValueError, match="not a regular file"):
            images.read_ppm("/dev/null")
    if hasattr(os, "mkfifo"):  # opening a FIFO with no writer would block
        os.mkfifo(tmp_path / "fifo.ppm")
        errors = []

        def read():
            try:
                images.read_ppm(tmp_path / "fifo.ppm")
            except ValueError as e:
                errors.append(str(e))

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(timeout=10)
        assert not t.is_alive(), "read_ppm blocked on a FIFO"
        assert len(errors) == 1 and "not a regular file" in errors[0]


def test_reading_images_never_unpickles(tmp_path, monkeypatch):
    import pickle

    def refuse(*args, **kwargs):
        raise AssertionError("unpickling")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    folder = tmp_path / "00001"
    folder.mkdir()
    images.write_ppm(folder / "a.ppm", np.full((2, 2, 3), 7, np.uint8))
    (folder / "GT-00001.csv").write_text(
        "Filename;Width;Height;Roi.X1;Roi.Y1;Roi.X2;Roi.Y2;ClassId\na.ppm;2;2;0;0;1;1;1\n"
    )
    assert images.read_ppm(folder / "a.ppm").sum() == 7 * 12
    np.testing.assert_allclose(images.load_gtsrb(tmp_path, size=2).x, 7 / 255, rtol=1e-6)
