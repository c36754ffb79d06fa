"""What XLA's persistent compilation cache saves a user's second run (issue 37, item 6).

Usage: PYTHONPATH=. python benchmarks/compile_cache_demo.py --out benchmarks/results/compile_cache_demo.json

Times whole commands, each in a fresh subprocess (a new Python, a new JAX: nothing compiled in
memory), back to back on this machine:

* ``sarjax demo --quick`` (``--full-demo``: the full demo) into a fresh output directory each
  time, so that every run recomputes the attacks; the trained pools come from one shared
  ``--cache`` directory filled by an untimed-for-the-comparison warm-up run, so that what is timed
  is what a user's rerun pays (``sarjax demo --overwrite`` loads the pools from ``OUT/pools``
  and attacks again). ``--pools DIR`` holding the pools (of the same ``--quick`` or full
  settings) skips the warm-up. Without the cache (``SARJAX_NO_COMPILE_CACHE=1``, no ``--compile-cache``)
  vs with it (``--compile-cache DIR``, DIR fresh for the first run and kept for the second: the
  default cache directory does the same), first and second run.
* ``sarjax sar`` on the warm-up's high-diversity pool (six architectures): with the cache, a
  first run at ``--eps`` A into a fresh cache, then the rerun at ``--eps`` B; without, the same
  two runs. The rerun on another eps is what the cache is for.

The runs alternate (without, with, without, with, per round) so that the load other processes put
on the machine hits both alike; ``os.getloadavg`` is recorded before every run, and each run's
CPU seconds (user + system), which load moves less than wall seconds. The script checks
that the results are identical with and without the cache (every number of results.json but the
timings) and counts the cache's entries after each run (the second run must write none).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import provenance, results_path  # noqa: E402

# results.json keys that are timings or the machine's state, not results (compared: everything else)
TIMING_KEYS = {"seconds", "time_split", "load_average", "elapsed_seconds", "wall_seconds", "date"}


def _strip(x):
    if isinstance(x, dict):
        return {k: _strip(v) for k, v in x.items() if k not in TIMING_KEYS}
    if isinstance(x, list):
        return [_strip(v) for v in x]
    return x


def _diff(a, b, path="") -> list[str]:
    """Paths where two JSON trees differ (exact equality of numbers)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}/{k}: only in one" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            out += _diff(a[k], b[k], f"{path}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} vs {len(b)}"]
        return [d for i, (u, v) in enumerate(zip(a, b, strict=True)) for d in _diff(u, v, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


def _entries(cache: Path | None) -> int | None:
    return None if cache is None else sum(1 for p in cache.rglob("*") if p.is_file())


def run_cmd(argv: list[str], env: dict, cache: Path | None, log: Path) -> dict:
    """One command in a fresh process: wall and CPU seconds (user + system of the child), load
    before, cache entries after."""
    load = list(os.getloadavg())
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    with open(log, "w") as f:
        r = subprocess.run([sys.executable, "-m", "sarjax.cli", *argv], env=env, stdout=f, stderr=subprocess.STDOUT)
    sec = time.perf_counter() - t
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed (rc {r.returncode}); see {log}:\n{log.read_text()[-3000:]}")
    return {
        "argv": argv,
        "seconds": sec,
        "cpu_seconds": cpu,
        "load_before": load,
        "cache_entries_after": _entries(cache),
        "log": str(log),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--full-demo", action="store_true", help="time the full demo instead of `sarjax demo --quick`")
    ap.add_argument("--samples", type=int, default=None, help="the demo's --samples (default: its own)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of (without, with) x (first, second) demo runs")
    ap.add_argument("--pools", default=None, help="shared trained-pool cache (default: a fresh one, trained first)")
    ap.add_argument("--sar-eps", type=float, nargs=2, default=[0.05, 0.1], help="eps of the first run and the rerun")
    ap.add_argument("--sar-samples", type=int, default=50)
    ap.add_argument("--no-sar", action="store_true", help="skip the sar rerun")
    ap.add_argument("--workdir", default=None, help="where the runs write (default: a temporary folder)")
    ap.add_argument("--quick", action="store_true", help="smoke test: 2 images, few steps; output to a temp folder")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    work = Path(args.workdir or tempfile.mkdtemp(prefix="sarjax-compile-cache-"))
    work.mkdir(parents=True, exist_ok=True)
    pools = Path(args.pools) if args.pools else work / "pools"
    # XDG_CACHE_HOME in the work folder: the user's default cache directory is never read or written
    base_env = {**os.environ, "JAX_PLATFORMS": "cpu", "XDG_CACHE_HOME": str(work / "xdg")}
    off_env = {**base_env, "SARJAX_NO_COMPILE_CACHE": "1"}
    demo = ["demo", "--cache", str(pools)] + ([] if args.full_demo else ["--quick"])
    if args.quick:
        demo += ["--samples", "2"]
    elif args.samples is not None:
        demo += ["--samples", str(args.samples)]
    records: dict = {"demo": {"warmup": None, "runs": []}, "sar": {"runs": []}}
    path = results_path("compile_cache_demo.json", args.out, quick=args.quick)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.json")  # the runs so far, rewritten after each (removed at the end)

    def save_partial() -> None:
        partial.write_text(json.dumps(records, indent=1))

    if args.pools and any(pools.glob("high-*")):
        print(f"work folder {work}; the pools in {pools} (no warm-up run)", flush=True)
    else:
        print(f"work folder {work}; warm-up (fills the pool cache {pools})", flush=True)
        warm = run_cmd([*demo, "--out", str(work / "demo_warmup")], off_env, None, work / "demo_warmup.log")
        records["demo"]["warmup"] = warm
        print(f"  warm-up {warm['seconds']:.1f} s", flush=True)
    reference = None  # the first run without the cache: every other run must give the same numbers

    mismatches: list[str] = []
    for rnd in range(args.rounds):
        cache = work / f"xla_demo_{rnd}"
        for nth in ("first", "second"):
            for mode in ("without", "with"):
                name = f"demo_{mode}_{nth}_{rnd}"
                argv = [*demo, "--out", str(work / name)]
                if mode == "with":
                    argv += ["--compile-cache", str(cache)]
                rec = run_cmd(argv, off_env, cache if mode == "with" else None, work / f"{name}.log")
                res = json.loads((work / name / "results.json").read_text())
                rec.update(mode=mode, nth=nth, round=rnd, time_split=res.get("time_split"))
                if reference is None:
                    reference = _strip(res)
                d = _diff(reference, _strip(res))
                rec["identical_to_first_without"] = not d
                mismatches += [f"{name}{x}" for x in d]
                records["demo"]["runs"].append(rec)
                save_partial()
                print(
                    f"  {name}: {rec['seconds']:.1f} s ({rec['cpu_seconds']:.0f} CPU s), load {rec['load_before'][0]:.2f}, "
                    f"identical {not d}",
                    flush=True,
                )

    if not args.no_sar:
        high = sorted(pools.glob("high-*"))
        if not high:
            raise SystemExit(f"no high-diversity pool in {pools}")
        sar = ["sar", "--pool", str(high[0]), "--delta", "0", "--samples", str(args.sar_samples)]
        if args.quick:
            sar += ["--samples", "2", "--steps", "2", "--restarts", "1"]
        cache = work / "xla_sar"
        outs = {}
        for nth, eps in zip(("first", "rerun"), args.sar_eps, strict=True):
            for mode in ("without", "with"):
                name = f"sar_{mode}_{nth}"
                argv = [*sar, "--eps", str(eps), "--out", str(work / name)]
                if mode == "with":
                    argv += ["--compile-cache", str(cache)]
                rec = run_cmd(argv, off_env, cache if mode == "with" else None, work / f"{name}.log")
                outs[name] = _strip(json.loads((work / name / "results.json").read_text()))
                rec.update(mode=mode, nth=nth, eps=eps)
                records["sar"]["runs"].append(rec)
                save_partial()
                print(
                    f"  {name}: {rec['seconds']:.1f} s ({rec['cpu_seconds']:.0f} CPU s), load {rec['load_before'][0]:.2f}",
                    flush=True,
                )
            d = _diff(outs[f"sar_without_{nth}"], outs[f"sar_with_{nth}"])
            mismatches += [f"sar_{nth}{x}" for x in d]
            records["sar"][f"identical_{nth}"] = not d

    def med(kind, mode, nth) -> float:
        return statistics.median(r["seconds"] for r in records[kind]["runs"] if r["mode"] == mode and r["nth"] == nth)

    def med_cpu(kind, mode, nth) -> float:
        return statistics.median(
            r["cpu_seconds"] for r in records[kind]["runs"] if r["mode"] == mode and r["nth"] == nth
        )

    summary: dict[str, Any] = {
        "demo_seconds": {f"{m}_{n}": med("demo", m, n) for m in ("without", "with") for n in ("first", "second")},
        "demo_cpu_seconds": {
            f"{m}_{n}": med_cpu("demo", m, n) for m in ("without", "with") for n in ("first", "second")
        },
    }
    s = summary["demo_seconds"]
    summary["demo_second_speedup"] = s["without_second"] / s["with_second"]
    summary["demo_first_overhead"] = s["with_first"] / s["without_first"]
    c = summary["demo_cpu_seconds"]
    summary["demo_second_cpu_speedup"] = c["without_second"] / c["with_second"]
    if not args.no_sar:
        summary["sar_seconds"] = {f"{m}_{n}": med("sar", m, n) for m in ("without", "with") for n in ("first", "rerun")}
        summary["sar_rerun_speedup"] = summary["sar_seconds"]["without_rerun"] / summary["sar_seconds"]["with_rerun"]
    summary["identical"] = not mismatches
    summary["adopt"] = summary["identical"] and summary["demo_second_speedup"] >= 1.3
    result = {
        **provenance(),
        "what": "sarjax demo" + ("" if args.full_demo else " --quick") + " and a sarjax sar rerun on another eps, "
        "with and without XLA's persistent compilation cache, each run a fresh process",
        "demo_command": ["sarjax", *demo, "--out", "FRESH_DIR", "[--compile-cache DIR]"],
        "min_compile_seconds_env": os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"),
        "summary": summary,
        "mismatches": mismatches[:50],
        "load_after": list(os.getloadavg()),
        **records,
    }
    path.write_text(json.dumps(result, indent=1))
    partial.unlink(missing_ok=True)
    print(json.dumps(summary, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
