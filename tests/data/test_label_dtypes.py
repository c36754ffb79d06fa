"""Class labels must have an integer dtype in every loader: CIFAR batches, ``--images`` files and
``check_images`` refuse float labels, even integral ones (3.0), with a ValueError naming the dtype.

CIFAR batches used to accept ``np.array([3.0, 0.0, 9.0])`` as classes 3, 0, 9 while ``--images``
refused the same labels; a float label column is a sign of a mixed-up file (a regression target,
probabilities), so both refuse it now. Integer dtypes of any width load unchanged.
"""

import pickle

import numpy as np
import pytest

from sarjax.data.cifar import load_cifar10, load_cifar100
from sarjax.data.images import check_images, load_images


def _batch(n, seed, key=b"labels", classes=10):
    rng = np.random.default_rng(seed)
    d = {b"batch_label": b"synthetic", b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8)}
    d[key] = [int(v) for v in rng.integers(0, classes, n)]
    return d


def _write(path, obj):
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def _cifar10(root, test_labels):
    d = root / "cifar-10-batches-py"
    d.mkdir()
    for i in range(1, 6):
        _write(d / f"data_batch_{i}", _batch(2, i))
    _write(d / "test_batch", {**_batch(3, 9), b"labels": test_labels})
    return d


FLOATS = [
    (np.array([3.0, 0.0, 9.0]), "float64"),
    (np.array([3.0, 0.0, 9.0], np.float32), "float32"),
    ([3.0, 0.0, 9.0], "float64"),  # a pickled list of floats
    ([3, 0, 9.0], "float64"),  # one float among ints
]


@pytest.mark.parametrize("labels, dtype", FLOATS)
def test_cifar10_refuses_integral_float_labels(tmp_path, labels, dtype):
    d = _cifar10(tmp_path, labels)
    with pytest.raises(ValueError, match=rf"test_batch: 'labels' must be integer class labels, got dtype {dtype}"):
        load_cifar10(d)


def test_cifar100_refuses_integral_float_labels(tmp_path):
    d = tmp_path / "cifar-100-python"
    d.mkdir()
    for name, seed in (("train", 1), ("test", 2)):
        b = _batch(3, seed, b"fine_labels", 100)
        b[b"coarse_labels"] = np.array([1.0, 2.0, 3.0])
        _write(d / name, b)
    assert load_cifar100(d).y_test.dtype == np.int32  # fine labels are ints
    with pytest.raises(ValueError, match=r"train: 'coarse_labels' must be integer class labels, got dtype float64"):
        load_cifar100(d, labels="coarse")


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.int32, np.int64, np.uint64])
def test_integer_labels_of_any_width_load(tmp_path, dtype):
    d = _cifar10(tmp_path, np.array([3, 0, 9], dtype))
    y = load_cifar10(d).y_test
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, [3, 0, 9])


@pytest.mark.parametrize("labels, dtype", FLOATS)
def test_images_refuse_integral_float_labels_alike(tmp_path, labels, dtype):
    x = np.random.default_rng(0).random((3, 4, 4, 1), dtype=np.float32)
    y = np.asarray(labels)
    with pytest.raises(ValueError, match=rf"y must be integer class labels, got dtype {dtype}"):
        check_images(x, y, num_classes=10)
    np.savez(tmp_path / "f.npz", x=x, y=y)
    with pytest.raises(ValueError, match=rf"f\.npz: y must be integer class labels, got dtype {dtype}"):
        load_images(tmp_path / "f.npz")
    np.savez(tmp_path / "i.npz", x=x, y=y.astype(np.uint8))
    np.testing.assert_array_equal(load_images(tmp_path / "i.npz").y, [3, 0, 9])
