"""``sarjax frontier`` at 1 and at 2 processes, and the per-image cost that sizes a paper-size run.

Issue 37, item 5: the frontier spread over processes (``--coordinator``), bit-identical to one
process. This script runs the same ``sarjax frontier`` command in one process and in two local
processes (a coordinator on a free localhost port), alternately for ``--rounds`` rounds, each into
a fresh OUT, and records:

* the wall time of each run, from launch to the last process's exit (imports and compilation
  included: what a user waits), the median per process count and their ratio;
* the attack seconds of every (pool, entry) (``frontier.json``'s ``extra.attack_seconds``: for
  the two-process run, the sum over the processes) and, from the one-process runs, the
  steady-state cost of one image on one model for one entry at this cap: the median over the
  entries that reuse compiled kernels (not the first entry of an (attack, base / restart /
  targeted) kind: that one compiles) of ``seconds / (images x members)``;
* the paper-size estimate: that cost scaled to a ``--paper-cap`` cap (the attacks' steps are
  linear in the cap) times 12 models x 1,000 images x the entries of the norm's whole attack
  pool with 5 restarts and 9 targeted runs (``attack_pool(norm)``), in process-hours; it assumes
  every attack of the pool costs per query what the measured ones do.

The pool: the first ``--members`` members of the first stack of ``--pool-dir`` (a pool saved by
``sarjax train-pool`` or ``sarjax demo``) or, without it, trainless nearest-template MLPs on
MNIST (as tests/frontier/test_cli_frontier.py builds them); given to the command as ``--model
PKG.MODULE:FUNCTION`` through a module written to a temporary folder. Images: the first
``--samples`` embedded MNIST test images.

The machine may be shared: the load averages before and after every run are recorded with the
run's provenance; the figures are those of the machine as it was loaded then.

Usage::

    PYTHONPATH=. python benchmarks/frontier_processes.py --quick
    PYTHONPATH=. python benchmarks/frontier_processes.py --pool-dir POOL --out benchmarks/results/frontier_processes.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from _timing import provenance, results_path  # benchmarks/ is on sys.path when run as a script

MODULE = """
import os

import jax
import numpy as np

from sarjax.models.checkpoint import load_pool
from sarjax.models.pool import Pool, Stack
from sarjax.models.zoo import mlp

K = int(os.environ["FRONTIER_BENCH_MEMBERS"])


def make_pool():
    d = os.environ.get("FRONTIER_BENCH_POOL")
    if d:  # the first K members of the saved pool's first stack
        st = load_pool(d)[0].stacks[0]
        return Pool([Stack(st.arch, jax.tree.map(lambda a: np.asarray(a)[:K], st.params), tuple(st.names[:K]))])
    from sarjax.data.mnist import load_mnist

    split = load_mnist()  # nearest-template members: unit c = relu(<x, noisy mean image of class c>)
    x = split.x_train.reshape(len(split.x_train), -1)
    means = np.stack([x[split.y_train == c].mean(0) for c in range(10)], 1)
    rng = np.random.default_rng(0)
    members = []
    for _ in range(K):
        w1 = np.zeros((784, 16), np.float32)
        w1[:, :10] = means - means.mean(1, keepdims=True) + 0.01 * rng.standard_normal((784, 10))
        w2 = np.zeros((16, 10), np.float32)
        w2[:10, :10] = np.eye(10)
        members.append({"dense0": {"w": w1, "b": np.zeros(16, np.float32)}, "out": {"w": w2, "b": np.zeros(10, np.float32)}})
    params = jax.tree.map(lambda *a: np.stack(a), *members)
    return Pool([Stack(mlp((16,)), params, tuple(f"t{i}" for i in range(K)))])
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _run(cmd: list[str], out: Path, procs: int, env: dict, timeout: float) -> dict:
    """One ``sarjax frontier`` run at ``procs`` processes: wall seconds, the report's timings."""
    cmds = [[*cmd, "--out", str(out)]]
    if procs > 1:
        port = _free_port()
        cmds = [
            [*cmd, "--out", str(out), "--coordinator", f"localhost:{port}", "--num-processes", str(procs)]
            + ["--process-id", str(i)]
            for i in range(procs)
        ]
    load0 = list(os.getloadavg())
    t0 = time.perf_counter()
    ps = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for c in cmds]
    logs = []
    for p in ps:
        try:
            logs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in ps:
                q.kill()
            raise
        if p.returncode != 0:
            raise RuntimeError(f"sarjax frontier ({procs} processes) failed:\n{logs[-1][-3000:]}")
    wall = time.perf_counter() - t0
    rep = json.loads((out / "frontier.json").read_text())
    return {
        "processes": procs,
        "wall_seconds": wall,
        "attack_seconds": rep["extra"]["attack_seconds"],
        "load_before": load0,
        "load_after": list(os.getloadavg()),
        "report": rep,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pool-dir", default=None, help="a saved pool (default: trainless template MLPs)")
    ap.add_argument("--members", type=int, default=4, help="members of the pool attacked")
    ap.add_argument("--samples", type=int, default=64, help="MNIST test images")
    ap.add_argument("--batch", type=int, default=32, help="images per attack call (whole batches per process)")
    ap.add_argument("--norm", default="l2")
    ap.add_argument("--attacks", default="fmn", help="the attacks run (comma-separated)")
    ap.add_argument("--restarts", type=int, default=2)
    ap.add_argument("--targeted", type=int, default=2)
    ap.add_argument("--cap", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds (1 process, then 2)")
    ap.add_argument("--paper-cap", type=int, default=1000, help="the paper's per-attack cap T")
    ap.add_argument("--timeout", type=float, default=1200, help="seconds one run may take")
    ap.add_argument("--quick", action="store_true", help="8 images, cap 20, one round (a smoke test)")
    ap.add_argument("--out", default=None, help="JSON path (default: a temporary folder)")
    a = ap.parse_args()
    if a.quick:
        a.samples, a.batch, a.cap, a.rounds, a.restarts, a.targeted = 8, 4, 20, 1, 1, 1
    from sarjax.experiments.frontier_config import attack_pool

    tmp = Path(tempfile.mkdtemp(prefix="sarjax-frontier-processes-"))
    (tmp / "frontier_bench_models.py").write_text(textwrap.dedent(MODULE))
    root = Path(__file__).resolve().parent.parent
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "FRONTIER_BENCH_MEMBERS": str(a.members),
        "PYTHONPATH": os.pathsep.join([str(tmp), str(root), os.environ.get("PYTHONPATH", "")]),
    }
    if a.pool_dir:
        env["FRONTIER_BENCH_POOL"] = str(Path(a.pool_dir).resolve())
    cmd = [sys.executable, "-m", "sarjax.cli", "frontier", "--model", "frontier_bench_models:make_pool"]
    cmd += ["--norm", a.norm, "--attacks", a.attacks, "--restarts", str(a.restarts), "--targeted", str(a.targeted)]
    cmd += ["--cap", str(a.cap), "--samples", str(a.samples), "--batch", str(a.batch), "--no-progress"]
    cmd += ["--tiers", str(a.cap), str(2 * a.cap), "--heldout", "0.25"]
    runs = []
    for r in range(a.rounds):
        for procs in (1, 2):
            out = tmp / f"r{r}-p{procs}"
            res = _run(cmd, out, procs, env, a.timeout)
            print(f"round {r}: {procs} process(es) {res['wall_seconds']:.1f} s (load {res['load_before'][0]:.1f})")
            runs.append(res)
    # bit-identity of the numbers the runs report (the report without its timings)
    reports = []
    for res in runs:
        rep = res.pop("report")
        ex = rep["extra"]
        for k in ("attack_seconds", "attack_seconds_by_attack", "processes"):
            ex.pop(k)
        reports.append(json.dumps(rep, sort_keys=True))
    identical = len(set(reports)) == 1
    wall = {p: statistics.median(r["wall_seconds"] for r in runs if r["processes"] == p) for p in (1, 2)}
    # steady-state per-image cost from the one-process runs: the entries after the first of their
    # (attack, kind) (the first compiles the attack's kernel, the first restart also the random starts)
    members, kinds_seen, per_image = a.members, set(), []
    entries = attack_pool(a.norm, a.attacks.split(","), a.restarts, a.targeted)
    for res in (r for r in runs if r["processes"] == 1):
        kinds_seen.clear()
        for e in entries:
            kind = (e.attack, e.kind)
            secs = next(v for k, v in res["attack_seconds"].items() if k.split(":", 1)[1] == e.name)
            if kind in kinds_seen:
                per_image.append(secs / (a.samples * members))
            kinds_seen.add(kind)
    cost = statistics.median(per_image) if per_image else None
    paper_entries = len(attack_pool(a.norm))
    paper = None
    if cost is not None:
        s = cost * a.paper_cap / a.cap * 12 * 1000 * paper_entries
        paper = {
            "models": 12,
            "images": 1000,
            "cap": a.paper_cap,
            "entries": paper_entries,
            "process_seconds": s,
            "process_hours": s / 3600,
            "assumes": "every attack of the pool costs per query what the measured attacks do; compilation excluded",
        }
    result = {
        "benchmark": "frontier_processes",
        "settings": {k: v for k, v in vars(a).items() if k not in ("out",)},
        "note": "a loaded-machine figure: the machine (2 cores) is shared with other jobs; see load_before/after",
        "runs": runs,
        "median_wall_seconds": {str(p): v for p, v in wall.items()},
        "speedup_2_over_1": wall[1] / wall[2],
        "reports_identical": identical,
        "seconds_per_image_per_model_per_entry": cost,
        "seconds_per_image_per_model_per_entry_at_paper_cap": None if cost is None else cost * a.paper_cap / a.cap,
        "steady_samples": len(per_image),
        "steady_seconds_per_image_per_model_per_entry": per_image,
        "paper_size_estimate": paper,
        "provenance": provenance(),
    }
    path = results_path("frontier_processes.json", a.out, quick=a.quick)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(
        f"1 process {wall[1]:.1f} s, 2 processes {wall[2]:.1f} s (x{wall[1] / wall[2]:.2f}); reports identical: "
        f"{identical}; {cost if cost is None else f'{cost * 1e3:.3f}'} ms per image per model per entry at cap "
        f"{a.cap}" + (f"; paper size ~{paper['process_hours']:.1f} process-hours" if paper else "")
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
