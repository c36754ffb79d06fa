"""CIFAR-10 and CIFAR-100 from a local directory (the standard "python version" pickle batches).

Nothing is downloaded: point ``data_dir`` at the extracted archive (``cifar-10-batches-py/`` or
``cifar-100-python/``, or a directory that holds one of them).  Files, as distributed by
https://www.cs.toronto.edu/~kriz/cifar.html:

- CIFAR-10: ``data_batch_1`` ... ``data_batch_5`` (10,000 images each), ``test_batch`` and
  ``batches.meta`` (``label_names``); each batch a pickled dict with ``data`` (uint8
  ``[N, 3072]``: the 1,024 red, then green, then blue values of a 32x32 image, rows first)
  and ``labels`` (``N`` ints in 0..9).
- CIFAR-100: ``train`` (50,000), ``test`` (10,000) and ``meta``; ``data`` as above,
  ``fine_labels`` (0..99) and ``coarse_labels`` (0..19; ``fine_label_names`` /
  ``coarse_label_names`` in ``meta``).

Images come back NHWC float32 in [0, 1] (``[N, 32, 32, 3]``), labels int32, as a
:class:`CifarSplit` (a :class:`sarjax.data.mnist.Split` with the class names).  The pickles are
read with an unpickler that only builds numpy arrays, lists, dicts and strings (a pickle can run
code; these files never need to), from pickles of any protocol (the official files are protocol 2;
protocol 5 stores arrays as in-band buffers).  ``data_dir`` may start with ``~``.  Every problem
raises ``ValueError`` naming the file: missing, truncated or not a CIFAR batch, a batch with no
images, images that are not ``[N, 3072]`` uint8, labels without an integer dtype (floats are
refused, ``1.7`` and integral ``3.0`` alike, as ``--images`` refuses them), out of range, or not
one per image (a 1-D list; ``[N, 1]`` is refused).
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sarjax.data.mnist import Split

IMAGE_SHAPE = (32, 32, 3)
_PIXELS = 32 * 32 * 3

CIFAR10_FILES = ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch")
CIFAR100_FILES = ("train", "test")
_SUBDIRS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}


@dataclass(frozen=True)
class CifarSplit(Split):
    """A CIFAR train/test split: ``x_*`` ``[N, 32, 32, 3]`` float32 in [0, 1], ``y_*`` ``[N]`` int32.

    Attributes:
      label_names: the class names (from ``batches.meta`` / ``meta``; ``()`` when that file is absent).
    """

    label_names: tuple[str, ...] = ()


# numpy's array reconstruction (old and new module paths) and the codec python-2 pickles use for bytes
_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.numeric", "_frombuffer"),  # protocol 5: an array from its in-band buffer
    ("numpy._core.numeric", "_frombuffer"),
    ("_codecs", "encode"),
}


def _bytes(*args):
    """``bytes()``, as python-2 pickles of empty arrays call it, for bytes-like arguments only."""
    if any(not isinstance(a, bytes | bytearray | str) for a in args) or len(args) > 2:
        raise ValueError(f"refuses to build bytes from {[type(a).__name__ for a in args]}")
    return bytes(*args)


_BYTES = {("__builtin__", "bytes"), ("builtins", "bytes")}


class _ArrayUnpickler(pickle.Unpickler):
    def __init__(self, f, path: Path):
        super().__init__(f, encoding="bytes")
        self._path = path

    def find_class(self, module, name):
        if (module, name) in _BYTES:
            return _bytes
        if (module, name) not in _ALLOWED:
            raise ValueError(
                f"{self._path}: refuses to unpickle {module}.{name} (a CIFAR batch holds only arrays, lists and "
                f"strings; this file is not one)"
            )
        return super().find_class(module, name)


def _key(d: dict, name: str):
    """``d[name]`` for str or bytes keys (the official files are python-2 pickles: bytes keys)."""
    if name in d:
        return d[name]
    return d.get(name.encode())


def read_batch(path: str | os.PathLike) -> dict:
    """Unpickle one CIFAR file into a dict with str keys (values as stored).

    Raises:
      ValueError: naming the file, when it cannot be read, is truncated, holds anything but
        arrays / lists / strings, or is not a dict.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            obj = _ArrayUnpickler(f, path).load()
    except ValueError:
        raise
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, IndexError, TypeError, KeyError) as e:
        raise ValueError(f"cannot read CIFAR file {path}: {type(e).__name__}: {e} (corrupt or truncated)") from e
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a pickled dict, got {type(obj).__name__}")
    return {k.decode() if isinstance(k, bytes) else str(k): v for k, v in obj.items()}


def _integer_labels(path: Path, labels, label_key: str) -> np.ndarray:
    """``labels`` as a 1-D int64 array; raises ValueError (naming the file) for anything else:
    labels that are not one per image, or whose dtype is not an integer one. Float labels are
    refused even where integral (3.0), as :func:`sarjax.data.images.check_images` refuses them:
    a float label column is not a list of classes (1.7 is not read as 1, 3.0 not as 3)."""
    try:
        y = np.asarray(labels)
    except (TypeError, ValueError) as e:  # ragged nested lists
        raise ValueError(f"{path}: {label_key!r} must be a list of ints ({type(e).__name__}: {e})") from e
    if y.ndim != 1:
        raise ValueError(f"{path}: {label_key!r} must be one label per image (1-D), got shape {list(y.shape)}")
    if y.dtype.kind not in "iu":
        raise ValueError(f"{path}: {label_key!r} must be integer class labels, got dtype {y.dtype}")
    return y.astype(np.int64)


def _images_labels(path: Path, label_key: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    d = read_batch(path)
    data, labels = _key(d, "data"), _key(d, label_key)
    if data is None or labels is None:
        raise ValueError(f"{path}: expected keys 'data' and {label_key!r}, found {sorted(d)}")
    data = np.asarray(data)
    if data.size == 0:
        raise ValueError(
            f"{path}: holds no images ('data' has shape {list(data.shape)}); a CIFAR batch holds "
            f"[N, {_PIXELS}] uint8 images with N >= 1"
        )
    if data.ndim != 2 or data.shape[1] != _PIXELS:
        raise ValueError(f"{path}: 'data' must be [N, {_PIXELS}] (32x32 RGB images), got shape {list(data.shape)}")
    if data.dtype != np.uint8:
        raise ValueError(f"{path}: 'data' must be uint8 pixel values, got {data.dtype}")
    y = _integer_labels(path, labels, label_key)
    if len(y) != len(data):
        raise ValueError(f"{path}: {len(data)} images but {len(y)} {label_key!r}")
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        bad = np.flatnonzero((y < 0) | (y >= num_classes))
        raise ValueError(
            f"{path}: {label_key!r} must be in [0, {num_classes}), found {int(y[bad[0]])} at index {int(bad[0])} "
            f"({bad.size} out of range)"
        )
    x = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).astype(np.float32) / np.float32(255.0)
    return np.ascontiguousarray(x), y.astype(np.int32)


def _names(path: Path, key: str) -> tuple[str, ...]:
    if not path.is_file():
        return ()
    names = _key(read_batch(path), key)
    if names is None:
        return ()
    return tuple(n.decode() if isinstance(n, bytes) else str(n) for n in names)


def _resolve(data_dir: str | os.PathLike, kind: str) -> Path:
    d = Path(data_dir).expanduser()
    if not d.is_dir():
        raise ValueError(f"data directory {d} does not exist or is not a directory")
    sub = d / _SUBDIRS[kind]
    return sub if sub.is_dir() else d


def _require(d: Path, files: tuple[str, ...], what: str) -> None:
    missing = [f for f in files if not (d / f).is_file()]
    if missing:
        raise ValueError(
            f"missing {missing[0]} in {d}; {what} expects files {list(files)}, found {sorted(p.name for p in d.iterdir())}"
        )


def load_cifar10(data_dir: str | os.PathLike) -> CifarSplit:
    """CIFAR-10: 50,000 train images (``data_batch_1..5``) and 10,000 test images (``test_batch``).

    Args:
      data_dir: ``cifar-10-batches-py/`` or a directory containing it.

    Returns:
      A :class:`CifarSplit` (10 classes; ``label_names`` from ``batches.meta`` when present).

    Raises:
      ValueError: naming the file that is missing, truncated or malformed.
    """
    d = _resolve(data_dir, "cifar10")
    _require(d, CIFAR10_FILES, "CIFAR-10")
    parts = [_images_labels(d / f, "labels", 10) for f in CIFAR10_FILES]
    x_train = np.concatenate([p[0] for p in parts[:5]])
    y_train = np.concatenate([p[1] for p in parts[:5]])
    names = _names(d / "batches.meta", "label_names")
    return CifarSplit(x_train, y_train, parts[5][0], parts[5][1], f"CIFAR-10 batches in {d}", names)


def load_cifar100(data_dir: str | os.PathLike, *, labels: str = "fine") -> CifarSplit:
    """CIFAR-100: 50,000 train images (``train``) and 10,000 test images (``test``).

    Args:
      data_dir: ``cifar-100-python/`` or a directory containing it.
      labels: ``"fine"`` (100 classes) or ``"coarse"`` (20 superclasses).

    Returns:
      A :class:`CifarSplit` (``label_names`` from ``meta`` when present).

    Raises:
      ValueError: an unknown ``labels``, or naming the file that is missing, truncated or malformed.
    """
    if labels not in ("fine", "coarse"):
        raise ValueError(f"labels must be 'fine' or 'coarse', got {labels!r}")
    d = _resolve(data_dir, "cifar100")
    _require(d, CIFAR100_FILES, "CIFAR-100")
    n = 100 if labels == "fine" else 20
    xtr, ytr = _images_labels(d / "train", f"{labels}_labels", n)
    xte, yte = _images_labels(d / "test", f"{labels}_labels", n)
    names = _names(d / "meta", f"{labels}_label_names")
    return CifarSplit(xtr, ytr, xte, yte, f"CIFAR-100 ({labels} labels) in {d}", names)


def cifar_kind(data_dir: str | os.PathLike) -> str | None:
    """``"cifar10"`` or ``"cifar100"`` when ``data_dir`` (or its standard subdirectory) holds that
    data set's files (``test_batch`` / ``test``), else None (e.g. an MNIST IDX directory)."""
    d = Path(data_dir).expanduser()
    if not d.is_dir():
        return None
    for kind, marker in (("cifar10", "test_batch"), ("cifar100", "test")):
        if (d / marker).is_file() or (d / _SUBDIRS[kind] / marker).is_file():
            return kind
    return None


def load_cifar(data_dir: str | os.PathLike, *, labels: str = "fine") -> CifarSplit:
    """CIFAR-10 or CIFAR-100, whichever ``data_dir`` holds (see :func:`cifar_kind`).

    Raises:
      ValueError: when the directory holds neither (naming the files each expects).
    """
    kind = cifar_kind(data_dir)
    if kind == "cifar10":
        return load_cifar10(data_dir)
    if kind == "cifar100":
        return load_cifar100(data_dir, labels=labels)
    d = Path(data_dir).expanduser()
    found = sorted(p.name for p in d.iterdir()) if d.is_dir() else "no such directory"
    raise ValueError(
        f"{d} holds neither CIFAR-10 ({list(CIFAR10_FILES)}) nor CIFAR-100 ({list(CIFAR100_FILES)}) batches "
        f"(nor {list(_SUBDIRS.values())}); found {found}"
    )
