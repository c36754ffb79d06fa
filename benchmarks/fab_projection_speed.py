"""FAB's hyperplane projection without a sort, and FAB / FAB-T vs FMN at equal queries.

Issue 17, item 5.  Each FAB iteration projects the iterate and the original input onto the
linearised decision boundary intersected with the box (:func:`sarjax.attacks.fab.hyperplane_box_step`,
twice per iteration).  Until sarjax 0.3 that projection sorted all ``d`` pixels
(:func:`~sarjax.attacks.fab.hyperplane_box_step_sort`, kept as the reference); XLA's CPU sort
is a scalar comparison sort, which dominated FAB's time on small models.  The sort-free
projection (Newton on the piecewise linear multiplier for l2 / linf, a bisection on the
float bits of the knapsack threshold for l1) replaces it.

The run (``--quick``: fewer samples and repetitions):

1. the projection alone on ``[B, 784]`` MNIST images with random normals (sort and sort-free
   alternately, jitted and vmapped): ms per call, the ratio, the largest difference;
2. the attacks at equal queries on the fixture nets of ``tests/frontier/fixtures`` (spread to
   28x28, a pool of 2, see ``benchmarks/pdpgd_prox_speed.py``) on ``--samples`` MNIST test
   images: FMN, FAB and FAB-T, each with the sort projection (a distinct spec traced with the
   reference) and the sort-free one, each compiled once then timed ``--reps`` times in a
   round robin: us per query, the ratios to FMN, the speed-up, and whether the two
   projections give the same norms.

FAB-T vs FAB: FAB's iteration costs ``C + 1`` queries (a forward and ``C - 1`` backward passes
at the iterate, a forward at the new point), FAB-T's 3, so at the same cap FAB-T takes
``(C + 1) / 3`` = 3.7x more iterations (MNIST), each paying the two projections: with the
sort those dominated and FAB-T was 3-4x slower than FAB at the same cap.

Usage::

    PYTHONPATH=. python benchmarks/fab_projection_speed.py [--quick] [--samples 32]
        [--queries 1000] [--reps 3] [--norms linf,l1] [--out benchmarks/results/fab_projection_speed.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from _timing import first_calls, provenance, repeated, results_path, round_robin  # noqa: E402  (the shared round-robin loop)
from pdpgd_prox_speed import _fixture_pool  # noqa: E402

NORMS = {"linf": math.inf, "l1": 1.0, "l2": 2.0}


def fab_sort_spec(*, targeted: bool = False):
    """FAB's spec traced with the sorting projection (a distinct Spec, its own compile)."""
    from sarjax.attacks import fab
    from sarjax.attacks import minnorm as mn

    base = fab.spec(targeted=targeted)

    def step(ctx, s, i):
        old = fab.hyperplane_box_step
        fab.hyperplane_box_step = fab.hyperplane_box_step_sort  # read when the step is traced
        try:
            return base.step(ctx, s, i)
        finally:
            fab.hyperplane_box_step = old

    return mn.Spec(base.name, base.init, step, base.norms, base.hp, base.costs, base.best, base.min_classes)


def projection_micro(batch: int, reps: int, inner: int, p: float) -> dict:
    from sarjax.attacks import fab
    from sarjax.data.mnist import load_mnist

    rng = np.random.default_rng(0)
    x = np.asarray(load_mnist().x_test[:batch], np.float32).reshape(batch, -1)
    w = rng.normal(size=x.shape).astype(np.float32)
    b = (np.sum(w * x, 1) + rng.uniform(-3, 3, batch)).astype(np.float32)
    fs = {
        "sort": jax.jit(jax.vmap(lambda x, w, b: fab.hyperplane_box_step_sort(x, w, b, p))),
        "sort_free": jax.jit(jax.vmap(lambda x, w, b: fab.hyperplane_box_step(x, w, b, p))),
    }
    outs = {k: np.asarray(f(x, w, b)) for k, f in fs.items()}

    t = round_robin({k: repeated(f, inner, x, w, b) for k, f in fs.items()}, reps)
    return dict(
        batch=batch,
        norm=p,
        ms_per_call={k: 1e3 * v / inner for k, v in t.items()},
        speedup=t["sort"] / t["sort_free"],
        max_abs_diff=float(np.max(np.abs(outs["sort"] - outs["sort_free"]))),
    )


def attacks_at_equal_queries(samples: int, queries: int, reps: int, p: float) -> dict:
    from sarjax.attacks import fab, fmn
    from sarjax.attacks import minnorm as mn
    from sarjax.data.mnist import load_mnist

    apply, params = _fixture_pool()
    split = load_mnist()
    x0 = jnp.asarray(split.x_test[:samples])
    y = jnp.asarray(split.y_test[:samples])
    key = jax.random.key(0)
    fns = {
        "fmn": fmn.make_fmn(apply, norm=p, max_queries=queries),
        "fab_sort": mn.make(fab_sort_spec(), apply, norm=p, max_queries=queries),
        "fab": fab.make_fab(apply, norm=p, max_queries=queries),
        "fab_t_sort": mn.make(fab_sort_spec(targeted=True), apply, norm=p, max_queries=queries),
        "fab_t": fab.make_fab(apply, norm=p, max_queries=queries, fab_t=True),
    }
    runners = {k: (lambda f=f: f.jit(params, x0, y, key=key)) for k, f in fns.items()}
    results, first = first_calls(runners)
    t = round_robin(runners, reps)
    spent = {k: int(np.asarray(r.queries).sum()) for k, r in results.items()}
    us = {k: 1e6 * t[k] / spent[k] for k in fns}

    def same(a, b):
        a, b = np.asarray(results[a].norm, np.float64), np.asarray(results[b].norm, np.float64)
        fin = np.isfinite(a) & np.isfinite(b)
        rel = np.abs(a[fin] - b[fin]) / np.maximum(a[fin], 1e-12)
        return dict(
            same_success=bool(np.array_equal(np.isfinite(a), np.isfinite(b))),
            max_rel_diff=float(rel.max()) if fin.any() else 0.0,
            median_rel_diff=float(np.median(rel)) if fin.any() else 0.0,
        )

    return dict(
        norm=p,
        samples=samples,
        members=2,
        queries_cap=queries,
        seconds_per_run=t,
        first_call_seconds=first,
        queries_spent=spent,
        us_per_query=us,
        ratio_to_fmn={k: us[k] / us["fmn"] for k in fns},
        speedup={"fab": t["fab_sort"] / t["fab"], "fab_t": t["fab_t_sort"] / t["fab_t"]},
        fab_t_over_fab_same_cap={"sort": t["fab_t_sort"] / t["fab_sort"], "sort_free": t["fab_t"] / t["fab"]},
        norms_sort_vs_sort_free={"fab": same("fab_sort", "fab"), "fab_t": same("fab_t_sort", "fab_t")},
        median_norm={
            k: float(np.median(np.asarray(r.norm)[np.isfinite(np.asarray(r.norm))])) for k, r in results.items()
        },
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer samples and repetitions (a few minutes)")
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--norms", default="linf,l1")
    ap.add_argument(
        "--out",
        default=None,
        help="JSON path (default: a temporary folder, never benchmarks/results/)",
    )
    args = ap.parse_args(argv)
    # without --out, a run never overwrites benchmarks/results/
    args.out = str(results_path("fab_projection_speed.json", args.out, quick=args.quick))
    if args.quick:
        args.samples, args.reps = min(args.samples, 8), min(args.reps, 2)
    load0 = os.getloadavg()
    out: dict = dict(
        command="python benchmarks/fab_projection_speed.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        backend=jax.default_backend(),
        jax=jax.__version__,
        load_before=load0,
        projection=[],
        attacks=[],
    )
    norms = [n for n in args.norms.split(",") if n]
    for n in norms:
        r = projection_micro(64, max(args.reps, 3), 10, NORMS[n])
        out["projection"].append(r)
        print(
            f"{n} projection B=64: sort {r['ms_per_call']['sort']:.2f} ms, sort-free "
            f"{r['ms_per_call']['sort_free']:.2f} ms -> {r['speedup']:.1f}x; max |diff| {r['max_abs_diff']:.1e}",
            flush=True,
        )
    for n in norms:
        a = attacks_at_equal_queries(args.samples, args.queries, args.reps, NORMS[n])
        out["attacks"].append(a)
        for k in a["us_per_query"]:
            print(
                f"{n} {k:>11}: {a['seconds_per_run'][k]:7.2f} s, {a['us_per_query'][k]:8.1f} us/query "
                f"({a['ratio_to_fmn'][k]:5.2f}x FMN), median norm {a['median_norm'][k]:.4f}",
                flush=True,
            )
        print(f"{n} speed-up {a['speedup']}; FAB-T / FAB at the same cap {a['fab_t_over_fab_same_cap']}")
        print(f"{n} norms sort vs sort-free {a['norms_sort_vs_sort_free']}", flush=True)
    out["load_after"] = os.getloadavg()
    out["provenance"] = provenance()  # command, commit, machine, date, load
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"load {load0} -> {out['load_after']}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
