"""SAR across processes on JAX's distributed runtime: the samples split, the results gathered.

The generic process helpers (``initialize``, ``process_rows``, ``all_ok``, ``allgather_rows``)
live in :mod:`sarjax.runtime.distributed`; this module holds the SAR part.

Every sample's attack draws its random stream from its index in the data set (``fold_in(key,
sample_id)``) and the greedy treats every sample alone, so a sample's SAR does not depend on
which other samples run with it. A multi-process run therefore splits the SAMPLES: process ``i``
of ``n`` runs the greedy on its contiguous block of rows (:func:`sarjax.runtime.distributed.process_rows`), with its own
checkpoint directory, on a mesh over its own devices when it shards the pool
(:func:`sarjax.models.sharding.make_mesh` with ``local=True``); :func:`allgather_parts` then
hands every process the per-sample results of all of them, in sample order. The merged result
is the one-process result, array for array (round logs padded as for ``chunk_size``).

The gather uses the runtime's own collective (:func:`jax.experimental.multihost_utils.process_allgather`
through :func:`sarjax.runtime.distributed.allgather_bytes`,
gloo on CPU, NCCL / ICI on GPU / TPU): no shared file system is needed, so hosts with local
disks (a TPU pod slice) work as well as one machine.

Example (two processes on one machine, each its own shell)::

    sarjax sar --pool POOL --eps 0.05 --delta 0.15 --coordinator localhost:12355 \\
        --num-processes 2 --process-id 0 --out OUT      # and --process-id 1
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from sarjax.attacks.core.validate import check_sample_ids
from sarjax.cover.result import SARResult, concat_results
from sarjax.runtime.distributed import all_ok as all_ok  # the SAR callers' barrier, from the runtime
from sarjax.runtime.distributed import allgather_bytes, process_rows
from sarjax.runtime.distributed import process_checkpoint_dir as process_checkpoint_dir  # (from the runtime)
from sarjax.sar.settings import SARSettings
from sarjax.sar.vision import run_sar

_META = "__sarjax_meta__"
_EXTRA = "extra/"


def _pack(result: SARResult, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    """A result and extra arrays as one ``uint8`` buffer (a compressed ``.npz``)."""
    out = result.arrays()
    out.update({_EXTRA + k: np.asarray(v) for k, v in arrays.items()})
    buf = io.BytesIO()
    out[_META] = np.array(json.dumps(result.header()))
    np.savez_compressed(buf, **out)  # pyright: ignore[reportArgumentType]  (numpy's stub: **kwds as allow_pickle)
    return np.frombuffer(buf.getvalue(), np.uint8)


def _unpack(blob: np.ndarray) -> tuple[SARResult, dict[str, np.ndarray]]:
    with np.load(io.BytesIO(blob.tobytes()), allow_pickle=False) as z:
        got = {k: z[k] for k in z.files}
    meta = json.loads(str(got.pop(_META)))
    extra = {k[len(_EXTRA) :]: got.pop(k) for k in list(got) if k.startswith(_EXTRA)}
    return SARResult.from_parts(meta, got), extra


def allgather_parts(
    result: SARResult, arrays: Mapping[str, Any] | None = None
) -> tuple[SARResult, dict[str, np.ndarray]]:
    """Every process's result and per-sample arrays, concatenated in process order, on every process.

    Each process serialises its part (a compressed ``.npz``), the lengths and then the padded
    buffers are gathered with ``process_allgather`` (the same shapes on every process, as the
    collective requires), and each process reads all parts back. With one process the inputs
    come back as they are.

    Args:
        result: this process's :class:`SARResult` (its block of samples).
        arrays: extra arrays whose axis 0 is this process's samples (e.g. the per-member attack
            success ``[B_i, M]``); the same names on every process.

    Returns:
        ``(result over all samples, {name: array over all samples})``; the result is
        :func:`sarjax.cover.result.concat_results` of the parts (round logs padded to the
        longest part, exactly as for ``run_sar``'s chunks).
    """
    arrays = {k: np.asarray(v) for k, v in (arrays or {}).items()}
    if jax.process_count() == 1:
        return result, arrays
    parts = [_unpack(blob) for blob in allgather_bytes(_pack(result, arrays))]
    names = sorted(arrays)
    for i, (_, extra) in enumerate(parts):
        if sorted(extra) != names:
            raise ValueError(f"process {i} sent arrays {sorted(extra)}, this process {names}")
    merged = concat_results([r for r, _ in parts])
    return merged, {k: np.concatenate([extra[k] for _, extra in parts], axis=0) for k in names}


def run_sar_across_processes(
    pool: Any,
    x: Any,
    eps: float,
    deltas: Any,
    *,
    key: jax.Array,
    labels: Any = None,
    attack: Callable | None = None,
    sample_ids: Any = None,
    member_attacks: tuple[Any, Any] | None = None,
    settings: SARSettings | None = None,
) -> SARResult:
    """:func:`sarjax.sar.vision.run_sar` with the samples split over the JAX processes.

    Every process passes the same arguments (the whole batch); each runs ``run_sar`` on its
    block of rows (:func:`sarjax.runtime.distributed.process_rows`) with those rows' sample ids, checkpointing under
    ``settings.checkpoint_dir/process_<i>_of_<n>``; the blocks are then gathered (:func:`allgather_parts`).
    The result, on every process, equals ``run_sar`` on the whole batch in one process. With one
    process it is ``run_sar``.

    Args:
        pool: a ``Pool``, or a ``ShardedPool`` on this process's devices
            (``make_mesh(..., local=True)``).
        x, eps, deltas, key, labels, attack: as for ``run_sar`` (``x`` ``[B, *S]``, ``labels`` ``[B]``).
        sample_ids: ``[B]`` int ids of ``x``'s rows (default ``arange(B)``).
        member_attacks: ``(x_adv [M, B, *S], queries [M, B])`` for the whole batch, or None.
        settings: as for ``run_sar`` (:class:`sarjax.sar.settings.SARSettings`, default
            ``SARSettings()``); its ``checkpoint_dir`` is the run's checkpoint root.

    Raises:
        ValueError: fewer samples than processes, and whatever ``run_sar`` raises.
    """

    settings = SARSettings() if settings is None else settings
    if not isinstance(settings, SARSettings):
        raise TypeError(f"settings must be a sarjax.sar.SARSettings or None, got {type(settings).__name__}")
    b = int(np.shape(x)[0])
    rows = process_rows(b)
    ids = np.asarray(check_sample_ids(sample_ids, b))
    part = run_sar(
        pool,
        np.asarray(x)[rows],
        eps,
        deltas,
        key=key,
        labels=None if labels is None else np.asarray(labels)[rows],
        attack=attack,
        sample_ids=ids[rows],
        member_attacks=None
        if member_attacks is None
        else (np.asarray(member_attacks[0])[:, rows], np.asarray(member_attacks[1])[:, rows]),
        settings=dataclasses.replace(settings, checkpoint_dir=process_checkpoint_dir(settings.checkpoint_dir)),
    )
    return allgather_parts(part)[0]
