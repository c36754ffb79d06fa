"""A user's first run: ``sarjax demo --quick`` and ``sarjax demo`` cold (issue 43, item 2).

Usage: PYTHONPATH=. python benchmarks/cold_start.py --out benchmarks/results/cold_start.json

Each setting runs once as a new process (a new Python, a new JAX: nothing compiled in memory) into
a fresh output directory (so the pools are trained and every attack runs) with a fresh, empty
persistent compilation cache (``--compile-cache DIR``): what a user's first ``sarjax demo`` pays.
Per run the JSON records the wall seconds of the process, its CPU seconds (user + system of the
child), the run's compilations (the demo's ``results.json`` ``"compile"``: programs compiled by
XLA, their seconds, cache hits), the compile share of the wall time, the programs per jitted
function (``SARJAX_COMPILE_LOG=1``: the command's stderr table), the cache directory's entries and
bytes after the run, and the load averages before and after; with the provenance (command,
commit, machine, date, load: ``benchmarks/_timing.py``). Program counts do not depend on the
machine's load; seconds do (read them with the load beside them).

``--samples N`` and ``--settings quick`` make a short check of the script (not a figure to quote).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import provenance, results_path  # noqa: E402

SETTINGS = {"quick": ["--quick"], "full": []}
# SARJAX_COMPILE_LOG=1's stderr table: "sarjax demo:   6 x   186.69 s  (+0 cached)  jit(run)"
ROW = re.compile(r"^sarjax demo:\s+(\d+) x\s+([\d.]+) s\s+\(\+(\d+) cached\)\s+(.+)$")


def _dir_size(d: Path) -> tuple[int, int]:
    """(files, bytes) under ``d``."""
    files = [p for p in d.rglob("*") if p.is_file()] if d.is_dir() else []
    return len(files), sum(p.stat().st_size for p in files)


def run_cold(setting: str, work: Path, samples: int | None, min_compile_seconds: float | None) -> dict[str, Any]:
    """One cold ``sarjax demo`` of ``setting`` ("quick" or "full") under ``work`` (fresh dirs)."""
    out, cache = work / f"{setting}-out", work / f"{setting}-cache"
    if out.exists() or cache.exists():
        raise ValueError(f"{out} or {cache} exists: a cold run needs fresh directories")
    argv = [sys.executable, "-m", "sarjax.cli", "demo", *SETTINGS[setting], "--out", str(out)]
    argv += ["--compile-cache", str(cache)]
    if samples is not None:
        argv += ["--samples", str(samples)]
    env = {**os.environ, "SARJAX_COMPILE_LOG": "1"}
    env.pop("SARJAX_NO_COMPILE_CACHE", None)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    if min_compile_seconds is not None:
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = str(min_compile_seconds)
    load_before = list(os.getloadavg())
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    compile_ = json.loads((out / "results.json").read_text())["compile"]
    per_function = []
    for line in r.stderr.splitlines():
        m = ROW.match(line.strip())
        if m:
            per_function.append({"name": m[4], "compiled": int(m[1]), "seconds": float(m[2]), "cache_hits": int(m[3])})
    files, nbytes = _dir_size(cache)
    return {
        "setting": setting,
        "argv": argv[1:],
        "wall_seconds": round(wall, 2),
        "cpu_seconds": round((ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime), 2),
        "compile": compile_,
        "compile_share": round(compile_["seconds"] / wall, 3),
        "per_function": per_function,
        "cache_entries": files,
        "cache_bytes": nbytes,
        "min_compile_seconds": min_compile_seconds,
        "load_before": load_before,
        "load_after": list(os.getloadavg()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="JSON to write (default: a fresh temporary folder)")
    ap.add_argument("--settings", nargs="+", choices=sorted(SETTINGS), default=["quick", "full"])
    ap.add_argument("--samples", type=int, default=None, help="the demo's --samples (a short check)")
    ap.add_argument(
        "--min-compile-seconds",
        type=float,
        default=None,
        help="JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS for the runs (default: the commands' own)",
    )
    args = ap.parse_args()
    if args.samples is not None and args.samples < 1:
        raise SystemExit(f"--samples must be >= 1, got {args.samples}")
    path = results_path("cold_start.json", args.out, quick=args.samples is not None)
    if path.exists():
        raise SystemExit(f"{path} exists: remove it first (a run never overwrites a result it did not produce)")
    runs = []
    with tempfile.TemporaryDirectory(prefix="sarjax-cold-start-") as work:
        for setting in args.settings:
            runs.append(run_cold(setting, Path(work), args.samples, args.min_compile_seconds))
            c = runs[-1]["compile"]
            print(
                f"{setting}: {runs[-1]['wall_seconds']:.0f} s wall, {c['programs']} programs compiled in "
                f"{c['seconds']:.0f} s ({runs[-1]['compile_share']:.0%}), load {runs[-1]['load_before'][0]:.1f}",
                flush=True,
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"provenance": provenance(), "samples": args.samples, "runs": runs}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
