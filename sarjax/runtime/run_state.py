"""State files of a resumable host-driven loop (the AutoAttack cascade): written, read, agreed on.

A host-driven loop that can be interrupted (:func:`sarjax.attacks.autoattack.autoattack`'s
cascade, ``checkpoint_dir``) hands its state after every completed step to :func:`save_state`: a
dict of numpy arrays and a JSON-able ``info`` dict, written to one compressed ``.npz`` file
atomically (``path.tmp``, then renamed), tagged with a format string so that another kind of
file is refused. :func:`resume_state` reads it back for a rerun, checks that the settings it was
written with (``want``) match, and, across the processes of JAX's distributed runtime
(:mod:`sarjax.runtime.distributed`), picks the state every process holds: processes one step
apart keep the state they replaced as ``path.prev`` (``keep_prev``), and all resume at the
earliest of the processes' latest steps (or all start over).

This module does the file I/O only; what the state holds and how a loop resumes from it is the
loop's (the attack layer stays pure). The run directory's fingerprint is
:mod:`sarjax.runtime.fingerprint`'s.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from sarjax.runtime.distributed import all_ok, allgather_rows


def _prev(path: Path) -> Path:
    return path.with_name(path.name + ".prev")


def save_state(
    path: str | os.PathLike,
    arrays: Mapping[str, np.ndarray],
    info: Mapping[str, Any],
    *,
    fmt: str,
    keep_prev: bool = False,
) -> None:
    """Writes a loop's state to ``path`` atomically and compressed.

    Args:
      path: the state file (``.npz``); its folder is created.
      arrays: named numpy arrays (any shapes); the name ``info`` is reserved.
      info: a JSON-able dict (counters, positions, the settings the state was written with).
      fmt: the format tag stored with ``info`` (``{"format": fmt, **info}``) and checked on load.
      keep_prev: keep the state this one replaces as ``path.prev`` (distributed resume: processes
        one step apart agree on the older one).

    Raises:
      ValueError: ``arrays`` uses the reserved name ``info``.
    """
    if "info" in arrays:
        raise ValueError("save_state: the array name 'info' is reserved for the state's JSON info")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez_compressed(f, info=np.asarray(json.dumps({"format": fmt, **info})), **arrays)
    if keep_prev and path.exists():
        os.replace(path, _prev(path))
    os.replace(tmp, path)


def load_state(path: str | os.PathLike, *, fmt: str) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """``(arrays, info)`` of a state :func:`save_state` wrote with ``fmt``, or None when there is none.

    Raises:
      ValueError: the file holds another format.
    """
    path = Path(path)
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    info = json.loads(str(arrays.pop("info")))
    if info.get("format") != fmt:
        raise ValueError(f"{path} is not a {fmt} state file, got format {info.get('format')!r}")
    return arrays, info


def resume_state(
    path: str | os.PathLike,
    *,
    fmt: str,
    want: Mapping[str, Any],
    position: tuple[str, ...],
    share: object | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """The state to resume from, or None: start over.

    Args:
      path: the state file :func:`save_state` writes.
      fmt: its format tag.
      want: what must equal the stored ``info`` (e.g. batch size, members, stages).
      position: the ``info`` keys (int values) that order states, most significant first (e.g.
        ``("next_stage", "next_run")``).
      share: None (one process), or anything (distributed: every process calls this at once, and
        all resume at the same position: the earliest of the processes' latest states, a process
        one step ahead taking its ``path.prev``; when some process has no state at that position,
        every process starts over).

    Raises:
      ValueError: the stored state was written with other ``want`` values (names the first that
        differs), or the file holds another format.
    """
    got = load_state(path, fmt=fmt)
    if got is not None:
        bad = {k: (got[1].get(k), v) for k, v in want.items() if got[1].get(k) != v}
        if bad:
            k, (old, new) = next(iter(bad.items()))
            raise ValueError(f"{path}: the checkpoint was written with {k}={old}, this run has {k}={new}")
    if share is None:
        return got
    prev = load_state(_prev(Path(path)), fmt=fmt)

    def pos(s):
        return [-1] * len(position) if s is None else [int(s[1][k]) for k in position]

    every = allgather_rows({"pos": np.asarray([pos(got)], np.int64)})["pos"]
    target = min(tuple(int(v) for v in r) for r in every)
    pick = next((s for s in (got, prev) if s is not None and tuple(pos(s)) == target), None)
    # every process resumes at the same position, or all start over (the loop is deterministic)
    if target == (-1,) * len(position) or not all_ok(pick is not None):
        return None
    return pick


__all__ = ["load_state", "resume_state", "save_state"]
