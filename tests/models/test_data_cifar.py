"""CIFAR-10 / CIFAR-100 python-pickle batches from a local directory (tiny synthetic files)."""

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from sarjax.data.cifar import cifar_kind, load_cifar, load_cifar10, load_cifar100, read_batch


def _batch(n, seed, label_keys=(("labels", 10),)):
    rng = np.random.default_rng(seed)
    d = {b"batch_label": b"synthetic", b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8)}
    for key, classes in label_keys:
        d[key.encode()] = [int(v) for v in rng.integers(0, classes, n)]
    return d


def _write(path, obj):
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)  # the official files are python-2 pickles with bytes keys


@pytest.fixture
def cifar10(tmp_path):
    d = tmp_path / "cifar-10-batches-py"
    d.mkdir()
    batches = {f"data_batch_{i}": _batch(2, i) for i in range(1, 6)}
    batches["test_batch"] = _batch(3, 9)
    for name, b in batches.items():
        _write(d / name, b)
    _write(d / "batches.meta", {b"label_names": [f"c{i}".encode() for i in range(10)]})
    return tmp_path, d, batches


def test_cifar10_layout_is_nhwc_in_unit_range(cifar10):
    root, d, batches = cifar10
    for where in (root, d):  # the extracted folder or its parent
        s = load_cifar10(where)
        assert s.x_train.shape == (10, 32, 32, 3) and s.x_test.shape == (3, 32, 32, 3)
        assert s.x_train.dtype == np.float32 and s.y_train.dtype == np.int32
        assert s.label_names == tuple(f"c{i}" for i in range(10))
    raw = batches["data_batch_2"][b"data"][1]  # train image 3: the second image of batch 2
    # pixel (row i, column j, channel c) is value c*1024 + i*32 + j of the row-major CHW record
    for i, j, c in [(0, 0, 0), (5, 7, 1), (31, 30, 2), (12, 0, 2)]:
        assert s.x_train[3, i, j, c] == np.float32(raw[c * 1024 + i * 32 + j]) / np.float32(255.0)
    np.testing.assert_array_equal(s.y_test, batches["test_batch"][b"labels"])
    assert cifar_kind(root) == "cifar10" and load_cifar(root).x_test.shape == (3, 32, 32, 3)


def test_cifar100_fine_and_coarse_labels(tmp_path):
    keys = (("fine_labels", 100), ("coarse_labels", 20))
    train, test = _batch(4, 1, keys), _batch(2, 2, keys)
    _write(tmp_path / "train", train)
    _write(tmp_path / "test", test)
    _write(tmp_path / "meta", {b"fine_label_names": [b"f"] * 100, b"coarse_label_names": [b"k"] * 20})
    fine = load_cifar100(tmp_path)
    np.testing.assert_array_equal(fine.y_train, train[b"fine_labels"])
    coarse = load_cifar(tmp_path, labels="coarse")
    np.testing.assert_array_equal(coarse.y_test, test[b"coarse_labels"])
    assert len(fine.label_names) == 100 and len(coarse.label_names) == 20 and cifar_kind(tmp_path) == "cifar100"
    with pytest.raises(ValueError, match="labels must be 'fine' or 'coarse'"):
        load_cifar100(tmp_path, labels="medium")


def test_errors_name_the_file(cifar10, tmp_path):
    _, d, batches = cifar10
    (d / "data_batch_3").unlink()
    with pytest.raises(ValueError, match=r"missing data_batch_3 in .*expects files \['data_batch_1'"):
        load_cifar10(d)
    _write(d / "data_batch_3", batches["data_batch_3"])
    whole = (d / "test_batch").read_bytes()
    (d / "test_batch").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match=r"cannot read CIFAR file .*test_batch.*truncated"):
        load_cifar10(d)
    bad = {**batches["test_batch"], b"data": np.zeros((3, 3000), np.uint8)}
    _write(d / "test_batch", bad)
    with pytest.raises(ValueError, match=r"test_batch: 'data' must be \[N, 3072\].*got shape \[3, 3000\]"):
        load_cifar10(d)
    bad = {**batches["test_batch"], b"labels": [0, 10, 1]}
    _write(d / "test_batch", bad)
    with pytest.raises(ValueError, match=r"test_batch: 'labels' must be in \[0, 10\), found 10 at index 1"):
        load_cifar10(d)
    bad = {**batches["test_batch"], b"labels": [0, 1]}
    _write(d / "test_batch", bad)
    with pytest.raises(ValueError, match=r"test_batch: 3 images but 2 'labels'"):
        load_cifar10(d)
    bad = {**batches["test_batch"], b"data": np.zeros((3, 3072), np.float32)}
    _write(d / "test_batch", bad)
    with pytest.raises(ValueError, match=r"test_batch: 'data' must be uint8"):
        load_cifar10(d)
    with pytest.raises(ValueError, match="holds neither CIFAR-10"):
        load_cifar(tmp_path / "nowhere")


class _Evil:
    def __reduce__(self):
        import os

        return (os.getcwd, ())


def test_pickles_that_build_other_objects_are_refused(tmp_path):
    _write(tmp_path / "test_batch", {b"data": _Evil()})
    with pytest.raises(ValueError, match=r"test_batch: refuses to unpickle posix.getcwd|refuses to unpickle"):
        read_batch(tmp_path / "test_batch")


@pytest.mark.skipif(os.environ.get("SARJAX_MODELS_FULL") != "1", reason="trains a pool: SARJAX_MODELS_FULL=1")
def test_train_pool_cli_on_cifar_files(cifar10, tmp_path):
    from sarjax.models.checkpoint import load_pool

    root, _, _ = cifar10
    out = tmp_path / "pool"
    cmd = [sys.executable, "-m", "sarjax.cli", "train-pool", "--preset", "low", "--members", "2", "--epochs", "1"]
    r = subprocess.run([*cmd, "--data-dir", str(root), "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "CIFAR-10 batches" in r.stdout
    pool, config = load_pool(out)
    assert pool.input_shape == (32, 32, 3) and pool.num_classes == 10 and "CIFAR-10" in config["data"]


def test_sar_reads_cifar_batches_from_data_dir(cifar10, tmp_path):
    """``sarjax sar --data-dir`` takes CIFAR batches: the loader it uses picks CIFAR, and a pool of
    another input shape is refused naming both shapes."""
    from sarjax.experiments import sar
    from sarjax.models.checkpoint import save_pool
    from sarjax.models.pool import Pool
    from sarjax.models.zoo import mlp

    root, _, batches = cifar10
    data = sar._load_data(str(root))
    assert data.x_test.shape == (3, 32, 32, 3) and "CIFAR-10" in data.source
    np.testing.assert_array_equal(data.y_test, batches["test_batch"][b"labels"])
    import jax

    pool = Pool.from_members([(mlp((8,)), mlp((8,)).init(jax.random.PRNGKey(0)))], ["m0"])  # MNIST-shaped
    save_pool(pool, tmp_path / "p", {"preset": "test"})
    with pytest.raises(ValueError, match=r"inputs of shape \(28, 28, 1\), the data has \(32, 32, 3\)"):
        sar.run_sar_on_saved_pool(
            str(tmp_path / "p"), 0.05, 0.2, samples=2, out=str(tmp_path / "o"), data_dir=str(root)
        )


@pytest.mark.parametrize(
    "labels, message",
    [
        ([1.7, 2.0, 3.0], r"test_batch: 'labels' must be integer class labels, got dtype float64"),
        ([0, 1, 2.5], r"test_batch: 'labels' must be integer class labels, got dtype float64"),
        ([[0], [1], [2]], r"test_batch: 'labels' must be one label per image \(1-D\), got shape \[3, 1\]"),
        (np.zeros((3, 1), np.int64), r"'labels' must be one label per image \(1-D\), got shape \[3, 1\]"),
        (["a", "b", "c"], r"'labels' must be integer class labels, got dtype <U1"),
    ],
)
def test_non_integer_or_multidimensional_labels_are_refused(cifar10, labels, message):
    """Labels 1.7 used to be read as 1, and [N, 1] labels were flattened silently."""
    _, d, batches = cifar10
    _write(d / "test_batch", {**batches["test_batch"], b"labels": labels})
    with pytest.raises(ValueError, match=message) as e:
        load_cifar10(d)
    assert "\n" not in str(e.value)


def test_integer_valued_float_labels_are_refused(cifar10):
    """Integral floats (3.0) are refused too, as ``--images`` refuses them (tests/data/test_label_dtypes.py)."""
    _, d, batches = cifar10
    _write(d / "test_batch", {**batches["test_batch"], b"labels": np.array([3.0, 0.0, 9.0])})
    with pytest.raises(ValueError, match=r"'labels' must be integer class labels, got dtype float64"):
        load_cifar10(d)


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_every_pickle_protocol_loads(cifar10, protocol):
    """Protocol 5 stores numpy arrays through numpy's ``_frombuffer``: it was refused as 'not a CIFAR batch'."""
    _, d, batches = cifar10
    for name, b in batches.items():
        with open(d / name, "wb") as f:
            pickle.dump(b, f, protocol=protocol)
    s = load_cifar10(d)
    assert s.x_train.shape == (10, 32, 32, 3)
    np.testing.assert_array_equal(s.y_test, batches["test_batch"][b"labels"])
    raw = batches["test_batch"][b"data"][2]
    assert s.x_test[2, 4, 5, 1] == np.float32(raw[1024 + 4 * 32 + 5]) / np.float32(255.0)


@pytest.mark.parametrize("data", [np.zeros((0, 3072), np.uint8), [], np.zeros((0,), np.uint8)])
def test_an_empty_batch_is_named_as_empty(cifar10, data):
    _, d, batches = cifar10
    _write(d / "test_batch", {b"data": data, b"labels": []})
    with pytest.raises(ValueError, match=r"test_batch: holds no images \('data' has shape \[0") as e:
        load_cifar10(d)
    assert "\n" not in str(e.value)


def test_data_dir_expands_the_home_directory(cifar10, monkeypatch):
    """The docs' own example, ``load_cifar10("~/data/cifar-10-batches-py")``."""
    root, _, _ = cifar10
    monkeypatch.setenv("HOME", str(root))
    for load in (load_cifar10, load_cifar):
        assert load("~/cifar-10-batches-py").x_test.shape == (3, 32, 32, 3)
        assert load("~").x_test.shape == (3, 32, 32, 3)
    assert cifar_kind("~") == "cifar10"
