"""How many XLA programs this process compiled, and how long that took (``sarjax`` commands log it).

Counts come from JAX's monitoring events (``jax.monitoring``), so they cover every program that
passes through ``jax.jit``'s compiler, whoever calls it (sarjax's attacks, a user's model, eager
``jax.numpy`` operations outside ``jit``, each a small program of its own):

* ``/jax/core/compile/backend_compile_duration``: one per program handed to the backend (XLA),
  its seconds. It also wraps the lookup in the persistent compilation cache
  (:mod:`sarjax.runtime.compile_cache`), so a program read back from the cache fires it too.
* ``/jax/compilation_cache/cache_retrieval_time_sec``: fired (inside the first event, on the
  same thread) only when a program was read back from the persistent cache: such a program is
  counted as a cache hit, not as compiled, and its seconds as cache seconds.
* ``/jax/core/compile/jaxpr_trace_duration`` and ``/jax/core/compile/jaxpr_to_mlir_module_duration``:
  Python tracing of a top-level ``jit`` and its lowering to MLIR (before compilation).

A program is counted when it is compiled, not when it runs: calling a jitted function again with
the same shapes counts nothing (JAX's in-memory cache), and after ``jax.clear_caches()`` a program
compiled again counts again. A compilation that fails counts too (XLA spent the time). The
listeners are registered once per process, at the first :func:`start_compile_stats` (or
:func:`count_compiles`); compilations before that are not seen. ``jax.monitoring.clear_event_listeners()``
removes them (and so stops the counts).

Each program is also recorded by name (:func:`program_records`; the name is the one JAX's
compile event gives, ``jit(f)`` for a jitted function ``f``, ``jit(multiply)`` for an eager ``*``): :meth:`CompileCounter.programs` lists a counter's, and
:func:`by_name` sums them per name, which shows the functions that compile at several shapes (or
twice at one). ``SARJAX_COMPILE_LOG=1`` makes ``sarjax``'s commands print that table on stderr.

Usage::

    with count_compiles() as c:
        run_the_work()
    print(c.stats.summary())  # "compiled 3 XLA programs in 0.2 s ..."; None when nothing compiled
    report["compile"] = c.stats.to_json()
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_RETRIEVAL_EVENT = "/jax/compilation_cache/cache_retrieval_time_sec"
TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
LOWER_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"


@dataclasses.dataclass(frozen=True)
class CompileStats:
    """Compilation counts and seconds (totals since counting began, or a difference of two totals).

    Attributes:
      programs_compiled: programs XLA compiled (not read back from the persistent cache).
      compile_seconds: wall-clock seconds of those compilations.
      cache_hits: programs read back from the persistent compilation cache instead.
      cache_load_seconds: wall-clock seconds of those reads (cache key included).
      trace_seconds: seconds of tracing top-level jitted functions to jaxprs.
      lower_seconds: seconds of lowering jaxprs to MLIR modules.
    """

    programs_compiled: int = 0
    compile_seconds: float = 0.0
    cache_hits: int = 0
    cache_load_seconds: float = 0.0
    trace_seconds: float = 0.0
    lower_seconds: float = 0.0

    def __sub__(self, other: CompileStats) -> CompileStats:
        """The counts between two snapshots (``later - earlier``)."""
        if not isinstance(other, CompileStats):
            return NotImplemented
        return CompileStats(
            **{f.name: getattr(self, f.name) - getattr(other, f.name) for f in dataclasses.fields(self)}
        )

    @property
    def any(self) -> bool:
        """Whether any program was compiled or read back from the cache."""
        return self.programs_compiled > 0 or self.cache_hits > 0

    def to_json(self) -> dict[str, Any]:
        """The commands' JSON ``"compile"`` field: ``programs`` (compiled by XLA), ``seconds``
        (their compilation), ``cache_hits`` and ``cache_seconds`` (programs read back from the
        persistent cache, and the reads), ``trace_seconds`` and ``lower_seconds``; seconds
        rounded to milliseconds."""
        return {
            "programs": int(self.programs_compiled),
            "seconds": round(float(self.compile_seconds), 3),
            "cache_hits": int(self.cache_hits),
            "cache_seconds": round(float(self.cache_load_seconds), 3),
            "trace_seconds": round(float(self.trace_seconds), 3),
            "lower_seconds": round(float(self.lower_seconds), 3),
        }

    def summary(self) -> str | None:
        """One line, e.g. ``compiled 37 XLA programs in 41.2 s (12 loaded from the compilation
        cache in 0.8 s; tracing and lowering 5.1 s)``; ``None`` when nothing was compiled or loaded."""
        if not self.any:
            return None
        n = self.programs_compiled
        line = f"compiled {n} XLA program{'' if n == 1 else 's'} in {self.compile_seconds:.1f} s"
        extra = []
        if self.cache_hits:
            extra.append(f"{self.cache_hits} loaded from the compilation cache in {self.cache_load_seconds:.1f} s")
        extra.append(f"tracing and lowering {self.trace_seconds + self.lower_seconds:.1f} s")
        return f"{line} ({'; '.join(extra)})"


@dataclasses.dataclass(frozen=True)
class ProgramRecord:
    """One program handed to XLA (compiled, or read back from the persistent cache).

    Attributes:
      name: the name JAX's compile event gives it (``jit(f)`` for a jitted function ``f``; ``"?"``
        when JAX gave none).
      seconds: its compile (or cache read) seconds.
      cached: read back from the persistent compilation cache instead of compiled.
    """

    name: str
    seconds: float
    cached: bool


_lock = threading.Lock()
_totals: dict[str, Any] = dataclasses.asdict(CompileStats())
_records: list[ProgramRecord] = []
_hit = threading.local()  # set by the cache-retrieval event, read by the backend-compile event around it
_registered = False


def _on_duration(event: str, duration_secs: float, **kwargs: str | int) -> None:
    """JAX's duration-event listener (see the module docstring)."""
    if event == CACHE_RETRIEVAL_EVENT:
        _hit.value = True
        return
    with _lock:
        if event == BACKEND_COMPILE_EVENT:
            hit = bool(getattr(_hit, "value", False))
            if hit:
                _hit.value = False
                _totals["cache_hits"] += 1
                _totals["cache_load_seconds"] += duration_secs
            else:
                _totals["programs_compiled"] += 1
                _totals["compile_seconds"] += duration_secs
            _records.append(ProgramRecord(str(kwargs.get("fun_name", "?")), float(duration_secs), hit))
        elif event == TRACE_EVENT:
            _totals["trace_seconds"] += duration_secs
        elif event == LOWER_EVENT:
            _totals["lower_seconds"] += duration_secs


def start_compile_stats() -> CompileStats:
    """Starts counting this process's compilations (once; later calls only read) and returns the
    totals so far (zeros at the first call). Imports jax; starts no backend."""
    global _registered
    with _lock:
        if not _registered:
            import jax.monitoring  # deferred: sarjax --help should not load jax

            jax.monitoring.register_event_duration_secs_listener(_on_duration)
            _registered = True
        return CompileStats(**_totals)


def compile_stats() -> CompileStats:
    """The totals since counting began in this process (starting it if needed)."""
    return start_compile_stats()


def program_records() -> list[ProgramRecord]:
    """Every program handed to XLA since counting began in this process, in order (a copy)."""
    start_compile_stats()
    with _lock:
        return list(_records)


def by_name(records: list[ProgramRecord]) -> list[dict[str, Any]]:
    """``records`` summed per name, the most compile seconds first: ``{"name", "compiled",
    "seconds", "cache_hits"}`` each (seconds: compiled programs only, rounded to milliseconds)."""
    rows: dict[str, dict[str, Any]] = {}
    for r in records:
        row = rows.setdefault(r.name, {"name": r.name, "compiled": 0, "seconds": 0.0, "cache_hits": 0})
        if r.cached:
            row["cache_hits"] += 1
        else:
            row["compiled"] += 1
            row["seconds"] += r.seconds
    out = sorted(rows.values(), key=lambda row: (-row["seconds"], row["name"]))
    for row in out:
        row["seconds"] = round(row["seconds"], 3)
    return out


class CompileCounter:
    """Counts the compilations from its creation on: ``stats`` is the difference to the totals at
    creation, and stops changing when the ``with`` block ends (or :meth:`stop` is called).
    Counters nest: each has its own start.
    """

    def __init__(self) -> None:
        self._start = start_compile_stats()
        with _lock:
            self._first = len(_records)
        self._end: CompileStats | None = None
        self._last: int | None = None

    def __enter__(self) -> CompileCounter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> CompileStats:
        """Freezes the counts (a second call keeps the first) and returns them."""
        if self._end is None:
            self._end = compile_stats()
            with _lock:
                self._last = len(_records)
        return self._end - self._start

    def programs(self) -> list[ProgramRecord]:
        """The programs handed to XLA since this counter began (until it stopped), in order."""
        with _lock:
            return list(_records[self._first : self._last])

    @property
    def stats(self) -> CompileStats:
        """The compilations since this counter began (until it stopped)."""
        return (self._end if self._end is not None else compile_stats()) - self._start


def count_compiles() -> CompileCounter:
    """A :class:`CompileCounter` started now (use it as a context manager or keep it)."""
    return CompileCounter()
