"""PDPGD's linf proximal operator without a sort, and where PDPGD's and FAB-T's time goes.

Issue 17, item 5.  PDPGD on linf (``sarjax.attacks.pdpgd``) takes, per step, 5 proximal
sub-iterations, each the Moreau form ``prox_linf(x, lam) = x - lam P_{B1(1)}(x / lam)``
whose l1-ball projection sorts all ``d`` elements (Duchi et al. 2008).  XLA's CPU sort
is a scalar comparison sort: on a small MLP it costs far more than the model.
:func:`prox_linf_newton` computes the same projection without a sort: the threshold
``theta`` of ``P_{B1(r)}(v) = sign(v) max(|v| - theta, 0)`` is the root of the convex,
decreasing, piecewise linear ``g(theta) = sum_i max(|v_i| - theta, 0) - r``; Newton's
method from ``theta_0 = (sum |v| - r) / d`` (left of the root: Michelot 1986; Condat 2016,
"Fast projection onto the simplex and the l1 ball", Section 3) is monotone and lands on the
exact root once the active set ``{|v_i| > theta}`` stops changing, i.e. it returns
``(sum of the active |v_i| - r) / (their count)``: the sort-based formula's value, with the
same active set.  Each step is one O(d) pass.

The run (``--quick``: fewer samples and repetitions):

1. the proximal operator alone on ``[B, 784]`` inputs at the scales PDPGD meets (the sort
   form and the Newton form alternately, jitted and vmapped): ms per call, the ratio, the
   largest difference, the Newton iteration count;
2. the attacks at equal queries on the fixture nets of ``tests/frontier/fixtures``
   (196-16-16-10 and 196-32-10, their first layer spread over 28x28 inputs: 784 pixels, as
   on MNIST; a pool of 2), on ``--samples`` MNIST test images, linf,
   ``--queries`` per sample: FMN, PDPGD (as shipped), PDPGD with :func:`prox_linf_newton`
   swapped in, FAB and FAB-T, each compiled once then timed ``--reps`` times in a round
   robin; us per query and the ratio to FMN; the two PDPGD variants' norms compared;
3. FAB vs FAB-T: iterations at the same cap (FAB's step costs ``C + 1`` queries, FAB-T's
   3) and the time of one step's parts (the two ``hyperplane_box_step`` calls, which sort,
   vs the model's forward / backward passes).

Usage::

    PYTHONPATH=. python benchmarks/pdpgd_prox_speed.py [--quick] [--samples 32]
        [--queries 1000] [--reps 5] [--out benchmarks/results/pdpgd_prox_speed.json]
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _timing import first_calls, provenance, repeated, results_path, round_robin  # noqa: E402  (the shared round-robin loop)

# ---------------------------------------------------------------------------------------------
# the drop-in replacement
# ---------------------------------------------------------------------------------------------
from sarjax.attacks.pdpgd import project_l1_ball_newton  # noqa: E402  (the sort-free projection, now PDPGD's)


def prox_linf_newton(x: jax.Array, lam) -> jax.Array:
    """PDPGD's linf prox (:func:`sarjax.attacks.pdpgd.prox_linf`, sort-free since sarjax 0.3)."""
    from sarjax.attacks import pdpgd

    return pdpgd.prox_linf(x, lam)


# ---------------------------------------------------------------------------------------------
# PDPGD with either prox (the step traced with the chosen prox in pdpgd's table)
# ---------------------------------------------------------------------------------------------


def pdpgd_sort_spec(**hp):
    """PDPGD's spec with the former sort-based linf prox (:func:`sarjax.attacks.pdpgd.prox_linf_sort`;
    a distinct Spec: its own compile), the baseline the sort-free default is timed against."""
    from sarjax.attacks import minnorm as mn
    from sarjax.attacks import pdpgd

    base = pdpgd.spec(**hp)

    def step(ctx, s, i):
        old = pdpgd._PROX["linf"]
        pdpgd._PROX["linf"] = pdpgd.prox_linf_sort  # read when the step is traced
        try:
            return base.step(ctx, s, i)
        finally:
            pdpgd._PROX["linf"] = old

    return mn.Spec("pdpgd", base.init, step, base.norms, base.hp, base.costs, base.best, base.min_classes)


# ---------------------------------------------------------------------------------------------
# the benchmark
# ---------------------------------------------------------------------------------------------


def _fixture_pool():
    """The fixture nets (14x14 inputs) on 28x28 MNIST: the first layer's weights spread over
    the 2x2 blocks (/ 4), so that the net of a 28x28 image is the fixture net of its block
    average.  Returns a pool apply ``(params, x [B, 28, 28, 1]) -> [2, B, 10]`` and params."""
    z = np.load(ROOT / "tests" / "frontier" / "fixtures" / "exact_nets.npz")
    nets, k = [], 0
    while f"net{k}_w0" in z:
        L, l = [], 0
        while f"net{k}_w{l}" in z:
            W = z[f"net{k}_w{l}"]
            if l == 0:
                W = np.repeat(np.repeat(W.reshape(14, 14, -1), 2, 0), 2, 1).reshape(784, -1) / 4.0
            L.append((jnp.asarray(W, jnp.float32), jnp.asarray(z[f"net{k}_b{l}"])))
            l += 1
        nets.append(tuple(L))
        k += 1

    def apply(params, x):
        out = []
        for L in params:
            h = x.reshape(x.shape[0], -1)
            for W, b in L[:-1]:
                h = jax.nn.relu(h @ W + b)
            out.append(h @ L[-1][0] + L[-1][1])
        return jnp.stack(out)

    return apply, tuple(nets)


def prox_micro(batch: int, reps: int, inner: int) -> dict:
    from sarjax.attacks import pdpgd

    rng = np.random.default_rng(0)
    # PDPGD's prox inputs: a perturbation z - h (z - r) of scale ~0.05-0.3 and mu ~ 1e-4-1e-2
    x = jnp.asarray(rng.normal(0, 1, (batch, 784)) * rng.uniform(0.01, 0.3, (batch, 1)), jnp.float32)
    lam = jnp.asarray(10.0 ** rng.uniform(-4, -1, batch), jnp.float32)
    sort_f = jax.jit(jax.vmap(pdpgd.prox_linf_sort))
    newton_f = jax.jit(jax.vmap(prox_linf_newton))
    steps_f = jax.jit(jax.vmap(lambda v, l: project_l1_ball_newton(v / l)[1]))
    a, b = sort_f(x, lam), newton_f(x, lam)
    steps = np.asarray(steps_f(x, lam))

    t = round_robin({"sort": repeated(sort_f, inner, x, lam), "newton": repeated(newton_f, inner, x, lam)}, reps)
    return dict(
        batch=batch,
        ms_per_call={k: 1e3 * v / inner for k, v in t.items()},
        speedup=t["sort"] / t["newton"],
        max_abs_diff=float(jnp.max(jnp.abs(a - b))),
        newton_steps=dict(median=float(np.median(steps)), max=int(steps.max())),
    )


def attacks_at_equal_queries(samples: int, queries: int, reps: int) -> dict:
    from sarjax.attacks import fab, fmn, pdpgd
    from sarjax.attacks import minnorm as mn
    from sarjax.data.mnist import load_mnist

    apply, params = _fixture_pool()
    split = load_mnist()
    x0 = jnp.asarray(split.x_test[:samples])
    y = jnp.asarray(split.y_test[:samples])
    key = jax.random.key(0)
    # the spread first layer: the 28x28 pool equals the 14x14 fixture nets on block averages
    x14 = np.asarray(x0).reshape(samples, 14, 2, 14, 2).mean(axis=(2, 4)).reshape(samples, -1)
    z = np.load(ROOT / "tests" / "frontier" / "fixtures" / "exact_nets.npz")
    h = np.maximum(x14 @ z["net1_w0"] + z["net1_b0"], 0) @ z["net1_w1"] + z["net1_b1"]
    np.testing.assert_allclose(np.asarray(apply(params, x0))[1], h, rtol=1e-4, atol=1e-4)
    fns = {
        "fmn": fmn.make_fmn(apply, norm=math.inf, max_queries=queries),
        "pdpgd": mn.make(pdpgd_sort_spec(), apply, norm=math.inf, max_queries=queries),  # the former sort prox
        "pdpgd_newton": pdpgd.make_pdpgd(apply, norm=math.inf, max_queries=queries),  # the default
        "fab": fab.make_fab(apply, norm=math.inf, max_queries=queries),
        "fab_t": fab.make_fab(apply, norm=math.inf, max_queries=queries, fab_t=True),
    }
    runners = {k: (lambda f=f: f.jit(params, x0, y, key=key)) for k, f in fns.items()}
    results, compile_s = first_calls(runners)
    t = round_robin(runners, reps)
    spent = {k: int(np.asarray(r.queries).sum()) for k, r in results.items()}
    us_per_query = {k: 1e6 * t[k] / spent[k] for k in fns}
    a, b = np.asarray(results["pdpgd"].norm), np.asarray(results["pdpgd_newton"].norm)
    fin = np.isfinite(a) & np.isfinite(b)
    return dict(
        samples=samples,
        members=2,
        queries_cap=queries,
        seconds_per_run=t,
        first_call_seconds=compile_s,
        queries_spent=spent,
        us_per_query=us_per_query,
        ratio_to_fmn={k: us_per_query[k] / us_per_query["fmn"] for k in fns},
        pdpgd_speedup_newton=t["pdpgd"] / t["pdpgd_newton"],
        pdpgd_norms_newton_vs_sort=dict(
            same_success=bool(np.array_equal(np.isfinite(a), np.isfinite(b))),
            max_rel_diff=float(np.max(np.abs(a[fin] - b[fin]) / np.maximum(a[fin], 1e-12))) if fin.any() else 0.0,
            median_sort=float(np.median(a[fin])),
            median_newton=float(np.median(b[fin])),
        ),
        median_norm={
            k: float(np.median(np.asarray(r.norm)[np.isfinite(np.asarray(r.norm))])) for k, r in results.items()
        },
    )


def fab_profile(samples: int, reps: int, inner: int) -> dict:
    """One FAB / FAB-T step's parts on one member (784-32-32-10), vmapped over samples."""
    from sarjax.attacks import fab

    apply, params = _fixture_pool()
    from sarjax.data.mnist import load_mnist

    split = load_mnist()
    x = jnp.asarray(split.x_test[:samples])
    y = jnp.asarray(split.y_test[:samples])
    L = params[0]

    def f1(xi):
        h = xi.reshape(-1)
        for W, b in L[:-1]:
            h = jax.nn.relu(h @ W + b)
        return h @ L[-1][0] + L[-1][1]

    def lin_all(xi, yi):  # FAB: the C - 1 boundary gradients (one vjp, C cotangents)
        logits, vjp = jax.vjp(f1, xi)
        eye = jnp.eye(10, dtype=jnp.float32)
        return logits, jax.vmap(lambda e: vjp(e - eye[yi])[0])(eye)

    def lin_one(xi, yi):  # FAB-T: one
        logits, vjp = jax.vjp(f1, xi)
        eye = jnp.eye(10, dtype=jnp.float32)
        return logits, vjp(eye[(yi + 1) % 10] - eye[yi])[0]

    w = jax.random.normal(jax.random.key(1), x.shape)
    parts = {
        "linearise_fab (fwd + C-1 bwd)": jax.jit(jax.vmap(lin_all)),
        "linearise_fab_t (fwd + 1 bwd)": jax.jit(jax.vmap(lin_one)),
        "hyperplane_box_step x2 (sorts)": jax.jit(
            jax.vmap(
                lambda xi, wi: (
                    fab.hyperplane_box_step(xi, wi, 0.1, math.inf)
                    + fab.hyperplane_box_step(0.5 * xi, wi, 0.1, math.inf)
                )
            )
        ),
    }
    args = {k: ((x, y) if k.startswith("linearise") else (x, w)) for k in parts}
    for k, f in parts.items():
        jax.block_until_ready(f(*args[k]))

    t = round_robin({k: repeated(f, inner, *args[k]) for k, f in parts.items()}, reps)
    ms = {k: 1e3 * v / inner for k, v in t.items()}
    C = 10
    return dict(
        samples=samples,
        ms_per_step_part=ms,
        iterations_at_cap_1000={"fab": (1000 - 1) // (C + 1), "fab_t": (1000 - 1) // 3},
        note="per iteration FAB and FAB-T both pay the two hyperplane_box_step sorts; FAB-T takes (C + 1) / 3 = "
        "3.7x more iterations at the same cap",
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer samples and repetitions (about a minute)")
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument(
        "--out",
        default=None,
        help="JSON path (default: a temporary folder, never benchmarks/results/)",
    )
    args = ap.parse_args(argv)
    # without --out, a run never overwrites benchmarks/results/
    args.out = str(results_path("pdpgd_prox_speed.json", args.out, quick=args.quick))
    if args.quick:
        args.samples, args.reps = min(args.samples, 8), min(args.reps, 3)
    load0 = os.getloadavg()
    out = dict(
        command="python benchmarks/pdpgd_prox_speed.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        backend=jax.default_backend(),
        jax=jax.__version__,
        load_before=load0,
    )
    out["prox"] = [prox_micro(b, args.reps, 10) for b in ((64,) if args.quick else (64, 1024))]
    for r in out["prox"]:
        print(
            f"prox_linf B={r['batch']}: sort {r['ms_per_call']['sort']:.3f} ms, newton {r['ms_per_call']['newton']:.3f} ms "
            f"-> {r['speedup']:.1f}x; max |diff| {r['max_abs_diff']:.2e}; newton steps {r['newton_steps']}",
            flush=True,
        )
    out["attacks"] = attacks_at_equal_queries(args.samples, args.queries, args.reps)
    a = out["attacks"]
    for k in a["us_per_query"]:
        print(
            f"{k:>13}: {a['us_per_query'][k]:8.2f} us/query ({a['ratio_to_fmn'][k]:6.1f}x FMN), median norm {a['median_norm'][k]:.4f}"
        )
    print(f"PDPGD newton vs sort: {a['pdpgd_speedup_newton']:.1f}x faster; norms {a['pdpgd_norms_newton_vs_sort']}")
    out["fab"] = fab_profile(args.samples, args.reps, 10)
    for k, v in out["fab"]["ms_per_step_part"].items():
        print(f"  {k}: {v:.3f} ms")
    out["load_after"] = os.getloadavg()
    out["provenance"] = provenance()  # command, commit, machine, date, load
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"load {load0} -> {out['load_after']}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
