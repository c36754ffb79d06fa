"""Fingerprints of resumable runs (run directories of the demos, the SAR pipelines, the frontier, the zoo).

A resumable run (``run_sar(settings=SARSettings(checkpoint_dir=...))``, ``sarjax sar``, ``sarjax demo``) writes
``fingerprint.json`` into its directory before its first result: a JSON dict of everything that
changes the result (pool content hash, eps, deltas, the attacked images and their indices,
attack settings, key, conv impl, data source, sarjax version). A rerun into the same directory
resumes only when its own fingerprint is equal; otherwise :func:`check_fingerprint` raises a
one-line ``ValueError`` that names the settings that differ and the two ways on (discard the
old run, or write elsewhere).

The one allowed difference is the deltas of a finished run: the greedy records the coverage
order of every sample, and :func:`sarjax.cover.result.rederive` reads a new delta's ``k_hat``
off that order when the order determines it (and raises, naming the samples, when it does not).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

import sarjax

FINGERPRINT_FILE = "fingerprint.json"
FORMAT = "sarjax-run/1"


class FingerprintMismatch(ValueError):
    """A directory holds a run written with other settings than this run's.

    Attributes:
        reason: the message without its hint (what differs), for callers that word the ways on
            in their own terms (``--overwrite`` rather than ``overwrite=True``).
        differing: names of the fingerprint fields that differ.
        stored: the fingerprint found in the directory.
    """

    def __init__(self, reason: str, hint: str, differing: Sequence[str], stored: dict[str, Any]):
        super().__init__(f"{reason}; {hint}")
        self.reason = reason
        self.differing = tuple(differing)
        self.stored = stored


def sarjax_version() -> str:
    """The installed sarjax version (``importlib.metadata``), or ``sarjax.__version__``."""
    try:
        return version("sarjax")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return str(sarjax.__version__)


def array_digest(*arrays: Any) -> str:
    """SHA-256 (hex) over the shape, dtype and bytes of each array (None counts as a value)."""
    h = hashlib.sha256()
    for a in arrays:
        if a is None:
            h.update(b"None")
            continue
        a = np.ascontiguousarray(np.asarray(a))
        h.update(repr((a.shape, str(a.dtype))).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def key_fingerprint(key: Any) -> list[int]:
    """The raw data of a PRNG key (typed ``jax.random.key`` or legacy ``PRNGKey``) as a list."""
    import jax  # deferred: keeps runtime (imported by the CLI for --help) free of jax's 2 s import

    k = key
    dtype = getattr(k, "dtype", None)
    if dtype is not None and jax.numpy.issubdtype(dtype, jax.dtypes.prng_key):
        k = jax.random.key_data(k)
    return np.asarray(k).astype(np.int64).ravel().tolist()


def pool_fingerprint(pool: Any) -> dict[str, Any]:
    """``{"pool": content hash, "conv_impl": ...}`` of a pool.

    ``Pool.content_hash`` (names, architecture specs, params bytes) when the pool has one,
    otherwise a hash of its member count and params leaves. ``conv_impl`` is the sorted list of
    the stacks' convolution formulations (None for a pool without convolutional stacks); it is
    recorded separately because it changes floating-point rounding, not the model.
    """
    import jax  # deferred: keeps runtime (imported by the CLI for --help) free of jax's 2 s import

    if hasattr(pool, "content_hash"):
        digest = pool.content_hash()
    else:
        digest = array_digest(np.asarray(pool.num_members), *jax.tree.leaves(pool.params))
    impls = sorted({str(c) for s in getattr(pool, "stacks", ()) if (c := getattr(s, "conv_impl", None)) is not None})
    return {"pool": digest, "conv_impl": impls or None}


def _normal(fp: dict[str, Any]) -> dict[str, Any]:
    """The fingerprint as it reads back from JSON (tuples become lists, numpy scalars plain)."""
    return json.loads(json.dumps(fp, default=_json_default))


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"fingerprint values must be JSON data, got {type(o).__name__}")


def _show(v: Any) -> str:
    if isinstance(v, str) and re.fullmatch(r"[0-9a-f]{40,}", v):
        return v[:12]  # a hash: its head is enough to tell two apart
    return json.dumps(v) if not isinstance(v, str) else v


def _name(field: str, v: Any) -> str:
    return f"{field}={_show(v)}" if v is not _MISSING else f"no {field}"


_MISSING = object()


def differing_fields(stored: dict[str, Any], fp: dict[str, Any]) -> list[str]:
    """Names of the fields whose values differ between two fingerprints (missing counts)."""
    a, b = _normal(stored), _normal(fp)
    return [k for k in list(b) + [k for k in a if k not in b] if a.get(k, _MISSING) != b.get(k, _MISSING)]


def mismatch_reason(
    directory: str | os.PathLike, stored: dict[str, Any], fp: dict[str, Any], differing: Sequence[str]
) -> str:
    """``DIR was written with eps=0.04, this run has eps=0.3`` (every differing field)."""
    a, b = _normal(stored), _normal(fp)
    old = ", ".join(_name(k, a.get(k, _MISSING)) for k in differing)
    new = ", ".join(_name(k, b.get(k, _MISSING)) for k in differing)
    return f"{directory} was written with {old}, this run has {new}"


def read_fingerprint(directory: str | os.PathLike) -> dict[str, Any] | None:
    """The fingerprint stored in ``directory``, or None when there is none.

    Raises:
        ValueError: the file exists but is not a fingerprint.
    """
    path = Path(directory) / FINGERPRINT_FILE
    if not path.is_file():
        return None
    try:
        stored = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from e
    if not isinstance(stored, dict) or stored.get("format") != FORMAT:
        raise ValueError(f"{path} is not a {FORMAT} fingerprint")
    return stored


def write_fingerprint(directory: str | os.PathLike, fp: dict[str, Any]) -> Path:
    """Write ``fp`` (with ``format``) to ``directory/fingerprint.json`` atomically."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / (FINGERPRINT_FILE + ".tmp")
    tmp.write_text(json.dumps({"format": FORMAT, **fp}, indent=1, default=_json_default))
    os.replace(tmp, path / FINGERPRINT_FILE)
    return path / FINGERPRINT_FILE


def check_fingerprint(
    directory: str | os.PathLike, fp: dict[str, Any], *, hint: str, holds_results: bool, allow: Iterable[str] = ()
) -> dict[str, Any] | None:
    """Compare a directory's stored fingerprint with this run's, field by field.

    Args:
        directory: the run's checkpoint / output directory.
        fp: this run's fingerprint (JSON data; ``format`` is added on write).
        hint: what to do about a mismatch, e.g. ``"pass --overwrite to discard it or choose
            another --out"``.
        holds_results: whether ``directory`` already holds checkpoints or results of this kind
            of run (then a missing fingerprint is an error: they cannot be checked).
        allow: fields that may differ (the caller handles them, e.g. ``deltas`` of a finished
            run); their differences are returned, not raised.

    Returns:
        The stored fingerprint, or None when the directory holds no run yet (nothing is written:
        call :func:`write_fingerprint` once the settings are validated).

    Raises:
        FingerprintMismatch: a field outside ``allow`` differs (the message names each one with
            the stored and the new value), or results exist without a fingerprint.
    """
    stored = read_fingerprint(directory)
    if stored is None:
        if holds_results:
            raise FingerprintMismatch(
                f"{directory} holds results without a {FINGERPRINT_FILE} (written by an older "
                f"sarjax), so their settings cannot be checked",
                hint,
                (),
                {},
            )
        return None
    want = {"format": FORMAT, **fp}
    diff = differing_fields(stored, want)
    bad = [k for k in diff if k not in set(allow)]
    if bad:
        raise FingerprintMismatch(mismatch_reason(directory, stored, want, bad), hint, bad, stored)
    return stored


def remove_paths(directory: str | os.PathLike, names: Iterable[str]) -> list[Path]:
    """Delete the named files and folders under ``directory`` (only those; ``--overwrite``).

    Names may be glob patterns (``chunk_*``). Returns what was removed.
    """
    root = Path(directory)
    removed = []
    for name in names:
        for p in sorted(root.glob(name)):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
            removed.append(p)
    return removed
