"""``--images FILE.npz``: the user's images are read and checked like every other input."""

import numpy as np
import pytest

from sarjax.data.images import check_images, load_images


def _write(path, **arrays):
    np.savez(path, **arrays)
    return path


def _good(n=5):
    rng = np.random.default_rng(0)
    return rng.random((n, 4, 4, 1), dtype=np.float32), rng.integers(0, 3, n)


def test_reads_x_y_and_default_ids(tmp_path):
    x, y = _good()
    got = load_images(_write(tmp_path / "a.npz", x=x, y=y), input_shape=(4, 4, 1), num_classes=3)
    np.testing.assert_array_equal(got.x, x)
    np.testing.assert_array_equal(got.y, y)
    assert got.x.dtype == np.float32 and got.y.dtype == np.int32
    np.testing.assert_array_equal(got.ids, np.arange(5))
    assert "5 images" in got.source and "a.npz" in got.source
    # the digest follows the content: one pixel changed, another source
    x2 = x.copy()
    x2[0, 0, 0, 0] = 0.5 if x2[0, 0, 0, 0] != 0.5 else 0.25
    assert load_images(_write(tmp_path / "b.npz", x=x2, y=y)).source.split("sha256")[1] != got.source.split("sha256")[1]
    ids = np.array([10, 3, 7, 0, 99])
    np.testing.assert_array_equal(load_images(_write(tmp_path / "c.npz", x=x, y=y, ids=ids)).ids, ids)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda x, y: (x[..., 0], y), r"x has images of shape \[4, 4\], the pool takes \[4, 4, 1\]"),
        (lambda x, y: (x * 255, y), r"in \[0, 1\].*divide 8-bit images by 255"),
        (
            lambda x, y: (np.where(np.arange(5)[:, None, None, None] == 2, np.nan, x), y),
            r"non-finite values \(first in image 2\)",
        ),
        (lambda x, y: (x, y.astype(np.float32)), "integer class labels"),
        (lambda x, y: (x, y[:4]), r"\[N\] = \[5\] labels"),
        (lambda x, y: (x, np.array([0, 1, 2, 3, 0])), r"label y\[3\] = 3 is not a class of the pool \(0 .. 2\)"),
        (lambda x, y: (x, np.array([0, -1, 2, 1, 0])), r"label y\[1\] = -1"),
        (lambda x, y: (x[:, :3], y), r"shape \[3, 4, 1\], the pool takes \[4, 4, 1\]"),
        (lambda x, y: (x[:0], y[:0]), "N >= 1"),
    ],
)
def test_bad_arrays_raise_one_line(tmp_path, change, message):
    x, y = change(*_good())
    f = _write(tmp_path / "bad.npz", x=x, y=y)
    with pytest.raises(ValueError, match=message) as e:
        load_images(f, input_shape=(4, 4, 1), num_classes=3)
    assert "\n" not in str(e.value) and "bad.npz" in str(e.value)


def test_bad_files_and_ids(tmp_path):
    x, y = _good()
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_images(tmp_path / "missing.npz")
    with pytest.raises(ValueError, match=r"expected arrays x, y and optionally ids, got \['x'\]"):
        load_images(_write(tmp_path / "a.npz", x=x))
    with pytest.raises(ValueError, match=r"got \['label', 'x', 'y'\]"):
        load_images(_write(tmp_path / "b.npz", x=x, y=y, label=y))
    np.save(tmp_path / "c.npy", x)
    with pytest.raises(ValueError, match="single array"):
        load_images(tmp_path / "c.npy")
    (tmp_path / "d.npz").write_text("not a zip")
    with pytest.raises(ValueError, match="not a numpy .npz"):
        load_images(tmp_path / "d.npz")
    with pytest.raises(ValueError, match="id 3 repeats"):
        load_images(_write(tmp_path / "e.npz", x=x, y=y, ids=np.array([0, 3, 3, 1, 2])))
    with pytest.raises(ValueError, match=r"ids must be in \[0, 2\*\*31 - 1\].*got 2147483648"):
        load_images(_write(tmp_path / "g.npz", x=x, y=y, ids=np.array([0, 1, 2, 3, 2**31])))
    with pytest.raises(ValueError, match=r"got -1"):
        load_images(_write(tmp_path / "h.npz", x=x, y=y, ids=np.array([0, 1, 2, 3, -1])))
    with pytest.raises(ValueError, match=r"ids must be \[N\] = \[5\] integers"):
        load_images(_write(tmp_path / "f.npz", x=x, y=y, ids=np.arange(4)))


def test_check_images_in_memory_names_what():
    x, y = _good()
    xf, yi = check_images(x.astype(np.float64), y, input_shape=(4, 4, 1), num_classes=3)
    assert xf.dtype == np.float32 and yi.dtype == np.int32
    with pytest.raises(ValueError, match=r"^my batch: label y\[0\]"):
        check_images(x, np.full(5, 7), num_classes=3, what="my batch")
