"""The user's own images: an ``.npz`` file with ``x``, ``y`` and optional ``ids``, checked.

``x`` is ``[N, H, W, C]`` in ``[0, 1]`` (any float or integer dtype; read as float32), ``y`` the
``[N]`` integer labels and ``ids`` (optional) ``[N]`` distinct non-negative integers naming the
images (below 2**31): the attacks seed each image's random stream from its id (default ``0 .. N-1``), so an
image keeps its draws when it is attacked in another subset. Write one with::

    np.savez("mine.npz", x=x, y=y)          # x [N, 28, 28, 1] in [0, 1], y [N]

and pass ``--images mine.npz`` to ``sarjax sar``, ``frontier`` or ``autoattack``.
"""

import hashlib
import os
import zipfile
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

# Sample ids are in [0, SAMPLE_ID_LIMIT): the attacks fold them into their keys as int32 and fold
# their other streams in with constants at or above it (sarjax.attacks.core.evaluate). Defined here,
# in the bottom layer, so that the image checks and the attacks share one constant.
SAMPLE_ID_LIMIT = 2**31


class ImageSet(NamedTuple):
    """Checked images: ``x`` float32 ``[N, *S]`` in [0, 1], ``y`` int32 ``[N]``, ``ids`` int64 ``[N]``,
    and ``source`` (the file, the count and a SHA-256 prefix of its arrays; for run fingerprints)."""

    x: np.ndarray
    y: np.ndarray
    ids: np.ndarray
    source: str


def check_images(
    x: Any,
    y: Any,
    *,
    input_shape: tuple[int, ...] | None = None,
    num_classes: int | None = None,
    ids: Any = None,
    what: str = "images",
) -> tuple[np.ndarray, np.ndarray]:
    """Check a batch of images and labels; return them as float32 ``x`` and int32 ``y``.

    Checks: ``x`` is a numeric ``[N, *input_shape]`` array with ``N >= 1`` (``[N, H, W, C]`` when
    no shape is given), finite, in ``[0, 1]``; ``y`` is an integer ``[N]`` array in
    ``[0, num_classes)``; ``ids`` (when given) is ``N`` distinct non-negative integers.

    Raises:
        ValueError: one line naming ``what`` and what is wrong (shapes, the first bad index, ...).
    """
    x = np.asarray(x)
    y = np.asarray(y)
    if x.dtype == bool or not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise ValueError(f"{what}: x must be a numeric array, got dtype {x.dtype}")
    if x.ndim < 2 or x.shape[0] < 1:
        raise ValueError(f"{what}: x must be [N, H, W, C] with N >= 1, got shape {list(x.shape)}")
    if input_shape is not None and tuple(x.shape[1:]) != tuple(input_shape):
        raise ValueError(f"{what}: x has images of shape {list(x.shape[1:])}, the pool takes {list(input_shape)}")
    if input_shape is None and x.ndim != 4:
        raise ValueError(f"{what}: x must be [N, H, W, C] (channels last), got shape {list(x.shape)}")
    xf = x.astype(np.float32)
    if not np.isfinite(xf).all():
        i = int(np.argwhere(~np.isfinite(xf).reshape(len(xf), -1).all(1))[0, 0])
        raise ValueError(f"{what}: x has non-finite values (first in image {i})")
    lo, hi = float(xf.min()), float(xf.max())
    if lo < 0 or hi > 1:
        raise ValueError(f"{what}: x must be in [0, 1] (divide 8-bit images by 255), got values in [{lo:g}, {hi:g}]")
    if y.dtype == bool or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"{what}: y must be integer class labels, got dtype {y.dtype}")
    if y.shape != (len(x),):
        raise ValueError(f"{what}: y must be [N] = [{len(x)}] labels, got shape {list(y.shape)}")
    if (y < 0).any() or (num_classes is not None and (y >= num_classes).any()):
        bad = int(np.argwhere((y < 0) | (y >= (num_classes or np.iinfo(np.int64).max)))[0, 0])
        raise ValueError(
            f"{what}: label y[{bad}] = {int(y[bad])} is not a class"
            + (f" of the pool (0 .. {num_classes - 1})" if num_classes is not None else " (labels are >= 0)")
        )
    if ids is not None:
        check_ids(ids, len(x), what=what)
    return xf, y.astype(np.int32)


def check_ids(ids: Any, n: int, *, what: str = "images") -> np.ndarray:
    """``ids`` as int64 after checking they are ``n`` distinct non-negative integers (ValueError otherwise)."""
    ids = np.asarray(ids)
    if ids.dtype == bool or not np.issubdtype(ids.dtype, np.integer) or ids.shape != (n,):
        raise ValueError(f"{what}: ids must be [N] = [{n}] integers, got {ids.dtype} of shape {list(ids.shape)}")
    if (ids < 0).any() or (ids >= SAMPLE_ID_LIMIT).any():
        bad = int(ids.min()) if (ids < 0).any() else int(ids.max())
        raise ValueError(f"{what}: ids must be in [0, 2**31 - 1] (the attacks' int32 sample ids), got {bad}")
    if len(np.unique(ids)) != n:
        vals, counts = np.unique(ids, return_counts=True)
        raise ValueError(f"{what}: ids must be distinct, id {int(vals[counts > 1][0])} repeats")
    return ids.astype(np.int64)


def load_images(
    path: str | os.PathLike, *, input_shape: tuple[int, ...] | None = None, num_classes: int | None = None
) -> ImageSet:
    """Read and check an ``.npz`` of the user's images (see the module doc).

    Args:
        path: the file (``~`` expanded).
        input_shape: one image's shape as the pool takes it (checked when given).
        num_classes: the pool's class count (labels checked against it when given).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not an ``.npz`` with ``x`` and ``y``, another key, or a check of
            :func:`check_images` fails (naming the file).
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"--images {p}: no such file")
    try:
        z = np.load(p, allow_pickle=False)
    except (ValueError, OSError, zipfile.BadZipFile) as e:
        raise ValueError(f"--images {p}: not a numpy .npz file ({e})") from e
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise ValueError(f"--images {p}: expected an .npz with arrays x and y, got a single array (.npy)")
    with z:
        keys = set(z.files)
        if not {"x", "y"} <= keys or keys - {"x", "y", "ids"}:
            raise ValueError(f"--images {p}: expected arrays x, y and optionally ids, got {sorted(keys)}")
        x, y = z["x"], z["y"]
        ids = z["ids"] if "ids" in keys else None
    what = f"--images {p}"
    xf, yi = check_images(x, y, input_shape=input_shape, num_classes=num_classes, ids=ids, what=what)
    ids = np.arange(len(xf), dtype=np.int64) if ids is None else check_ids(ids, len(xf), what=what)
    h = hashlib.sha256()
    for a in (xf, yi, ids):
        h.update(np.ascontiguousarray(a).tobytes())
    return ImageSet(xf, yi, ids, f"images {p.absolute()} ({len(xf)} images, sha256 {h.hexdigest()[:16]})")
