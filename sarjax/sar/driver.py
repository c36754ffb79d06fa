"""The resumable SAR run that the vision and LLM pipelines share.

A SAR pipeline (:func:`sarjax.sar.run_sar`, :func:`sarjax.sar.run_llm_sar`) has one skeleton:
fingerprint the run, check it against what the directory holds (or write it), then for every part
of the run (a chunk of images, the whole request batch) load the finished result, re-deriving
other deltas from its coverage order, or build the oracles, run the greedy with a checkpoint
every round and save the result. Steps before the greedy whose output the rerun must not redo
(the LLM pipeline's clean judgement and per-member attacks) are cached beside it.
:class:`ResumableRun` is that skeleton; the pipelines supply the fingerprint, the part's
directories and how to build its oracles.

The rules (:mod:`sarjax.runtime.fingerprint`): a rerun resumes only with an equal fingerprint; the
one accepted difference is the deltas, and only of a finished run (every part's result written):
they are re-derived from its coverage order (:func:`sarjax.cover.result.rederive`), or a
ValueError names the samples that order does not determine. ``overwrite`` first deletes what the
pipeline wrote there (its ``files``, nothing else).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sarjax.cover.greedy import GreedySettings, greedy_sar
from sarjax.cover.result import SARResult, rederive
from sarjax.cover.types import JointAttack, SingleAttack
from sarjax.runtime import fingerprint as fingerprints

RESULT_FILE = "result.json"  # what SARResult.save writes last: a part with it is finished


class ResumableRun:
    """One SAR run's directory (or none): the fingerprint check, cached steps, the greedy per part.

    Args:
        root: the run's checkpoint directory; None: nothing is read or written, every step runs.
        hint: the ways on after a mismatch (e.g. ``"pass overwrite=True to discard it or choose
            another checkpoint_dir"``), appended to every error about the directory.
    """

    def __init__(self, root: str | os.PathLike | None, *, hint: str):
        self.root = None if root is None else Path(root)
        self.hint = hint

    def open(
        self,
        fingerprint: dict[str, Any],
        *,
        overwrite: bool,
        files: Sequence[str],
        results: Sequence[str],
        parts: Sequence[str],
    ) -> None:
        """Check (or write) ``root/fingerprint.json`` before the run reads or writes checkpoints.

        Args:
            fingerprint: everything that changes the result (JSON data, with a ``deltas`` field).
            overwrite: first delete ``files`` under ``root``.
            files: what the pipeline writes under ``root`` (glob patterns, the fingerprint among them).
            results: patterns whose presence means ``root`` holds results of this kind of run
                (then a missing fingerprint raises: they cannot be checked).
            parts: the result directories of the run's parts, relative to ``root``; the run is
                finished when each holds ``result.json``.

        Raises:
            FingerprintMismatch: a stored run with other settings, or other deltas on a run that is
                not finished.
        """
        root = self.root
        if root is None:
            return
        if overwrite and root.is_dir():
            fingerprints.remove_paths(root, files)
        holds = root.is_dir() and any(any(root.glob(p)) for p in results)
        stored = fingerprints.check_fingerprint(
            root, fingerprint, hint=self.hint, holds_results=holds, allow=("deltas",)
        )
        if stored is None:
            fingerprints.write_fingerprint(root, fingerprint)
            return
        finished = all((root / p / RESULT_FILE).exists() for p in parts)
        if fingerprints.differing_fields(stored, {**stored, "deltas": fingerprint["deltas"]}) and not finished:
            raise fingerprints.FingerprintMismatch(
                fingerprints.mismatch_reason(root, stored, fingerprint, ["deltas"]) + ", and other deltas are read "
                f"off a finished run only (rerun with deltas={stored['deltas']} to finish it first)",
                self.hint,
                ["deltas"],
                stored,
            )

    def cached_json(self, name: str, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """``root/name`` when a run wrote it, else ``compute()`` (JSON data), written there."""
        path = None if self.root is None else self.root / name
        if path is not None and path.exists():
            return json.loads(path.read_text())
        out = compute()
        if path is not None:
            path.write_text(json.dumps(out))
        return out

    def cached_arrays(self, name: str, compute: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """The arrays of ``root/name`` (an ``.npz``) when a run wrote it, else ``compute()``, written there."""
        path = None if self.root is None else self.root / name
        if path is not None and path.exists():
            with np.load(path) as z:
                return {k: z[k] for k in z.files}
        out = compute()
        if path is not None:
            np.savez(path, **out)  # pyright: ignore[reportArgumentType]  (numpy's stub: **kwds as allow_pickle)
        return out

    def greedy(
        self,
        oracles: Callable[[], tuple[JointAttack, SingleAttack]],
        clean_broken: Any,
        deltas: Sequence[float],
        *,
        checkpoint: str,
        result: str,
        valid: Any = None,
        **options: Any,
    ) -> SARResult:
        """One part's SAR: its finished result (other deltas re-derived), or the greedy run and saved.

        Args:
            oracles: builds the part's ``(joint, single)`` oracles (called only when the greedy runs).
            clean_broken, deltas: see :func:`sarjax.cover.greedy_sar`.
            checkpoint: the greedy's checkpoint directory, relative to ``root``.
            result: the part's result directory, relative to ``root``.
            valid: see :func:`sarjax.cover.greedy_sar`.
            **options: the other :class:`sarjax.cover.GreedySettings` fields (``checkpoint_dir``
                is the part's ``checkpoint``).

        Raises:
            ValueError: the stored coverage order does not determine a new delta's result.
        """
        done = None if self.root is None else self.root / result
        deltas = tuple(float(d) for d in deltas)
        if done is not None and (done / RESULT_FILE).exists():
            part = SARResult.load(done)
            if tuple(part.deltas) != deltas:  # a finished run asked for other deltas
                try:
                    part = rederive(part, deltas)
                except ValueError as e:
                    raise ValueError(f"{self.root}: {e}; {self.hint}") from None
            return part
        joint, single = oracles()
        part = greedy_sar(
            joint,
            single,
            clean_broken,
            deltas,
            valid=valid,
            settings=GreedySettings(checkpoint_dir=None if self.root is None else self.root / checkpoint, **options),
        )
        if done is not None:
            part.save(done)
        return part


__all__ = ["ResumableRun"]
