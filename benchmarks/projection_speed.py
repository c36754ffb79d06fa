"""Projection speed: sort-based exact projections vs the previous ones.

``sarjax.attacks.geometry.project`` onto ``{x : ||x - x0||_p <= eps} ∩ [0, 1]^d``
for l2 and l1 used a 48-step bisection on the KKT multiplier and for l0 a
double argsort; it now uses piecewise Newton (l2, l1; the one-sort solvers as
``sort``) and, for l0, a 31-step bisection on the gains' bit patterns (the one
stable sort as ``sort``).  This times both on a batch of 256 inputs of 784 elements
(MNIST-sized), jitted and vmapped with per-sample eps, the old and the new
run alternately (round robin, ``--reps`` rounds of ``--inner`` calls each);
the median per call of each is reported with the ratio old / new.  The old
implementations are the reference copies in
``tests/attacks/test_attacks_geometry.py`` (``_ref_project*``).  Half the
samples start outside the ball (the constraint is active), half inside.

Usage:
  PYTHONPATH=. python benchmarks/projection_speed.py [--batch 256 4096] [--dim 784] [--reps 7]
      [--inner 20] [--out benchmarks/results/projection_speed.json]

Without ``--out`` the JSON goes to a temporary folder; it records the run's provenance (command,
commit, machine, date, load).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "attacks"))

from _timing import provenance, results_path  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from test_attacks_geometry import _ref_project  # noqa: E402  (the old bisection / double argsort)

from sarjax.attacks import geometry  # noqa: E402


def _inputs(batch, dim, p, seed=0):
    rng = np.random.default_rng(seed)
    x0 = rng.uniform(0, 1, (batch, dim)).astype(np.float32)
    x = (x0 + rng.normal(0, 0.3, (batch, dim))).astype(np.float32)
    if p == 0:
        eps = rng.integers(1, dim // 4, batch).astype(np.float32)
    else:
        clipped = np.linalg.norm(np.clip(x, 0, 1) - x0, ord=p, axis=1)
        eps = (clipped * np.where(np.arange(batch) % 2 == 0, 0.3, 1.5)).astype(np.float32)
    return jnp.asarray(x), jnp.asarray(x0), jnp.asarray(eps)


def _timed(fn, args, inner):
    t = time.perf_counter()
    for _ in range(inner):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - t) / inner


def _variants(p):
    box = (0.0, 1.0)
    v = {"old": lambda x, c, e: _ref_project(x, c, e, p), "project": lambda x, c, e: geometry.project(x, c, e, p)}
    if p == 2:
        v["sort"] = lambda x, c, e: geometry._project_l2_sort(x, c, e, box)
        v["newton"] = lambda x, c, e: geometry._project_l2_newton(x, c, e, box)
    if p == 1:
        v["sort"] = lambda x, c, e: geometry._project_l1_sort(x, c, e, box)
        v["newton"] = lambda x, c, e: geometry._project_l1_newton(x, c, e, box)
    if p == 0:
        v["sort"] = lambda x, c, e: geometry._project_l0_sort(x, c, e, box)
    return {k: jax.jit(jax.vmap(f)) for k, f in v.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[256])
    ap.add_argument("--dim", type=int, default=784)
    ap.add_argument("--reps", type=int, default=7, help="alternating rounds")
    ap.add_argument("--inner", type=int, default=20, help="calls per round")
    ap.add_argument("--out", default=None, help="JSON path (default: a temporary folder, never benchmarks/results/)")
    args = ap.parse_args()
    args.out = str(results_path("projection_speed.json", args.out))
    rows = []
    for batch in args.batch:
        for p in (2, 1, 0):
            fns = _variants(p)
            data = _inputs(batch, args.dim, p)
            ref = np.asarray(fns["old"](*data))
            times = {k: [] for k in fns}
            diffs = {k: float(np.abs(np.asarray(f(*data)) - ref).max()) for k, f in fns.items()}  # + compile
            for _ in range(args.reps):
                for k, f in fns.items():
                    times[k].append(_timed(f, data, args.inner))
            med = {k: statistics.median(t) for k, t in times.items()}
            row = dict(
                norm=f"l{p}",
                batch=batch,
                dim=args.dim,
                ms={k: 1e3 * t for k, t in med.items()},
                speedup_vs_old={k: med["old"] / t for k, t in med.items()},
                max_abs_diff_vs_old=diffs,
            )
            rows.append(row)
            print(
                f"B={batch} l{p}: "
                + ", ".join(f"{k} {1e3 * med[k]:.3f} ms (x{med['old'] / med[k]:.2f})" for k in fns)
                + "; max |diff| vs old "
                + ", ".join(f"{k} {d:.1e}" for k, d in diffs.items() if k != "old"),
                flush=True,
            )
    out = dict(
        command=" ".join(sys.argv),
        backend=jax.default_backend(),
        device=str(jax.devices()[0]),
        jax=jax.__version__,
        reps=args.reps,
        inner=args.inner,
        implementations={
            "old": "48-step bisection (l1, l2) / double argsort (l0): the previous code",
            "project": "geometry.project as shipped",
            "sort": "one sort + cumulative sums (l1, l2) / one stable sort (l0)",
            "newton": "piecewise Newton, no sort",
        },
        rows=rows,
        provenance=provenance(),  # command, commit, machine, date, load
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
