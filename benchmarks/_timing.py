"""Timing helpers shared by the benchmarks (one copy of the round-robin loop).

Every benchmark that compares formulations times them alternately in one run (one repetition of
each per round), so that a change of machine load hits all of them alike; the medians are
reported.  Compile first (:func:`first_calls`), then time (:func:`round_robin`).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import jax


def results_path(name: str, out: str | None, *, quick: bool = False) -> Path:
    """Where a benchmark writes its output ``name`` (a JSON file, or a folder): ``out`` when given;
    else a fresh temporary folder (``sarjax-<stem>[-quick]-*``), for a full run as for a ``--quick``
    one. No run writes under ``benchmarks/results/`` unless it is asked to with ``--out``: a
    committed result is replaced only on purpose (``--out benchmarks/results/<name>``), and then it
    carries the :func:`provenance` of the run that wrote it."""
    if out:
        return Path(out)
    tag = f"sarjax-{Path(name).stem}-quick-" if quick else f"sarjax-{Path(name).stem}-"
    return Path(tempfile.mkdtemp(prefix=tag)) / name


def provenance() -> dict:
    """What produced a result, written by the script into its JSON: ``command``, ``commit``,
    ``sarjax``, ``machine``, ``date``, ``load`` (:func:`sarjax.runtime.provenance.provenance`, the
    record the ``sarjax`` commands write too)."""
    from sarjax.runtime.provenance import provenance as run_provenance

    return run_provenance()


def add_torch_threads_argument(ap: argparse.ArgumentParser, what: str) -> None:
    """``--threads N [N ...]``: the torch intra-op thread counts ``what`` is timed at (default 1
    and 2); the benchmarks quote their ratio against the fastest of them."""
    ap.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=[1, 2],
        help=f"torch intra-op thread counts {what} runs at, alternated with sarjax (the baseline is the fastest)",
    )


def repeated(f: Callable, inner: int, *args) -> Callable[[], object]:
    """A runner that calls ``f(*args)`` ``inner`` times and returns the last output (for calls
    too short to time one by one; divide the runner's time by ``inner``)."""

    def run():
        out = None
        for _ in range(inner):
            out = f(*args)
        return out

    return run


def first_calls(fns: dict[str, Callable[[], object]]) -> tuple[dict[str, object], dict[str, float]]:
    """Run each runner once (compiling it): ``(outputs, seconds of each first call)``."""
    outs, secs = {}, {}
    for k, f in fns.items():
        t = time.perf_counter()
        outs[k] = jax.block_until_ready(f())
        secs[k] = time.perf_counter() - t
    return outs, secs


def round_robin(fns: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    """Median wall seconds of each runner over ``reps`` rounds, one call of each per round
    (alternated, so the runners share the machine's load); outputs are waited for
    (``jax.block_until_ready``)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            t = time.perf_counter()
            jax.block_until_ready(f())
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}
