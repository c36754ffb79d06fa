"""The settings of the vision SAR pipeline (:func:`sarjax.sar.vision.run_sar`).

One frozen dataclass holds the pipeline's knobs (chunking, packing, checkpointing, the greedy's
options); the data (images, labels, sample ids, precomputed member attacks) stays an argument of
:func:`~sarjax.sar.vision.run_sar`, and the attack's hyperparameters live in its factory
(:func:`sarjax.sar.vision.default_sar_attack` or any mask-driven attack), never here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

PACK_LEVELS = 4  # run_sar's default: batch sizes B, B/2, ..., B/16 (at most 5 compiled shapes)
# run_sar's default floor of packed batch sizes: a packed shape of fewer rows saves less attack time
# than its compilation costs (one compiled program per batch size; about 15 CPU-seconds for a
# packed SAR shape on this project's 2-core CPU, benchmarks/sar_compile_cost.py)
PACK_MIN_ROWS = 16


def _is_int(v: object) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, np.integer))


@dataclass(frozen=True)
class SARSettings:
    """How :func:`sarjax.sar.vision.run_sar` runs (not what it attacks with).

    Attributes:
        chunk_size: samples per greedy run (default None: all). The last chunk is padded to the
            same size (padding rows are never attacked), so the attack compiles once. An int
            ``>= 1``; larger than the batch means the batch.
        pack_levels: each attack call runs only the samples still active, packed into the
            smallest batch of ``chunk_size``, ``chunk_size / 2``, ..., ``chunk_size /
            2**pack_levels`` (rounded up) that holds them (default 4: at most 5 compiled shapes;
            0: every call on the whole chunk). Each sample's result is unchanged (its stream
            comes from its id; see :func:`sarjax.sar.vision.make_attack_oracles`).
        pack_min_rows: no packed batch smaller than this many rows (default 16: a smaller
            shape costs a compilation that the rows saved do not repay; a chunk smaller than it
            is never packed). An int ``>= 1`` (1: every ``pack_levels`` size). Results unchanged.
        use_best: take the attack's best-so-far point (ranked by the number of selected members
            fooled) instead of its final point (default False: Table 1 of the SAR paper returns
            the restart with the highest objective). Recorded in the checkpoint fingerprint.
        count_clean_input: see :func:`sarjax.cover.greedy_sar` (default False).
        stop_when_unreachable: see :func:`sarjax.cover.greedy_sar` (default True).
        store_inputs: keep every sample's adversarial inputs in the result (default True; see
            :func:`sarjax.cover.greedy_sar`).
        progress: show a progress bar per chunk (default False).
        checkpoint_dir: default None (no checkpoint). If set, each chunk checkpoints every round
            under ``chunk_<i>/`` and writes its result when done; a rerun resumes when
            ``fingerprint.json`` matches (see :func:`sarjax.sar.vision.run_sar`).
        overwrite: delete what an earlier run wrote in ``checkpoint_dir`` (``fingerprint.json``
            and ``chunk_*``, nothing else) and start afresh (default False).

    Raises:
        ValueError: ``chunk_size`` not None or an int ``>= 1``; ``pack_levels`` not an int
            ``>= 0``; ``pack_min_rows`` not an int ``>= 1``.
        TypeError: a flag that is not a bool; ``checkpoint_dir`` not None, a str or a path.
    """

    chunk_size: int | None = None
    pack_levels: int = PACK_LEVELS
    pack_min_rows: int = PACK_MIN_ROWS
    use_best: bool = False
    count_clean_input: bool = False
    stop_when_unreachable: bool = True
    store_inputs: bool = True
    progress: bool = False
    checkpoint_dir: str | os.PathLike | None = None
    overwrite: bool = False

    def __post_init__(self) -> None:
        if self.chunk_size is not None and (not _is_int(self.chunk_size) or self.chunk_size < 1):
            raise ValueError(f"chunk_size must be an int >= 1, got {self.chunk_size!r}")
        if not _is_int(self.pack_levels) or self.pack_levels < 0:
            raise ValueError(f"pack_levels must be an int >= 0, got {self.pack_levels!r}")
        if not _is_int(self.pack_min_rows) or self.pack_min_rows < 1:
            raise ValueError(f"pack_min_rows must be an int >= 1, got {self.pack_min_rows!r}")
        for name in ("use_best", "count_clean_input", "stop_when_unreachable", "store_inputs", "progress", "overwrite"):
            v = getattr(self, name)
            if not isinstance(v, (bool, np.bool_)):
                raise TypeError(f"SARSettings.{name} must be a bool, got {type(v).__name__} {v!r}")
        if self.checkpoint_dir is not None and not isinstance(self.checkpoint_dir, (str, os.PathLike)):
            raise TypeError(
                f"SARSettings.checkpoint_dir must be None, a str or a path, got {type(self.checkpoint_dir).__name__}"
            )
