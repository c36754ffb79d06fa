"""What the one-element max-pool gradient (``zoo.window_max``) costs against ``jnp.max``'s rule.

``zoo.max_pool2`` routes each window's gradient to one maximal element chosen by ``argmax``
(docs/models.md, "Max-pooling gradients"); ``jnp.max``'s own rule counts the elements equal to the
maximum and divides by that count, which gave NaN gradients when XLA recomputed the operand with
other rounding. Both are timed alternately in one run (``_timing.round_robin``) on the zoo's
default CNN pool (M = 20) for the two convolution formulations that use ``max_pool2``
(``im2col``, ``xla``; ``fused`` has its own pooling kernel):

* joint PGD (``make_joint_pgd``, ``--steps`` steps, one restart) on ``B`` images;
* one training gradient (cross-entropy of every member, ``jax.grad`` over the stacked params).

Prints each ratio (``jnp.max`` time / ``window_max`` time: above 1 means the new rule is faster)
and writes JSON (``--out``; none without it), with the run's provenance (command, commit, machine,
date, load).

    python benchmarks/window_max_cost.py --reps 5 --out benchmarks/results/window_max_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).parent))
from _timing import first_calls, provenance, round_robin  # noqa: E402

from sarjax.attacks.joint import JointPGDStep, make_joint_pgd  # noqa: E402
from sarjax.models import zoo  # noqa: E402
from sarjax.models.pool import Pool, Stack  # noqa: E402

M = 20
EPS = 0.1


def _jnp_max(x, axes):
    """The former rule: ``zoo.max_pool2`` reduced with ``jnp.max`` (its tie-sharing derivative)."""
    return jnp.max(x, axis=axes)


def runners(conv_impl: str, batch: int, steps: int) -> dict:
    pool = Pool((Stack.from_keys(zoo.cnn(conv_impl=conv_impl), jax.random.split(jax.random.PRNGKey(0), M)),))
    x0 = jax.random.uniform(jax.random.PRNGKey(batch), (batch, 28, 28, 1))
    ref = jnp.argmax(pool.logits(x0), -1).T.astype(jnp.int32)
    mask = jnp.ones((batch, M), jnp.float32)
    y = ref[:, 0]

    def train_grad():
        def loss(params):
            logits = pool.apply(params, x0)  # [M, B, C]
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[None, :, None], -1))

        return jax.jit(jax.grad(loss))

    out = {}
    for rule in ("window_max", "jnp.max"):
        atk = make_joint_pgd(pool.apply, eps=EPS, steps=steps, step=JointPGDStep(restarts=1))
        g = train_grad()
        out[(rule, "joint_pgd")] = lambda atk=atk: atk(pool.params, x0, ref, key=jax.random.PRNGKey(1), mask=mask).x_adv
        out[(rule, "train_grad")] = lambda g=g: g(pool.params)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--conv-impls", nargs="+", default=["im2col", "xla"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    load = os.getloadavg()
    rows = []
    for impl in args.conv_impls:
        fns = runners(impl, args.batch, args.steps)
        compiled = {}
        for key, f in fns.items():  # trace each variant with its own max-pool rule
            rule = zoo.window_max
            if key[0] == "jnp.max":
                zoo.window_max = _jnp_max  # max_pool2 looks it up when traced
            try:
                outs, secs = first_calls({key: f})
            finally:
                zoo.window_max = rule
            compiled[key] = (f, outs[key], secs[key])
        for what in ("joint_pgd", "train_grad"):
            a, b = compiled[("window_max", what)], compiled[("jnp.max", what)]
            same = bool(jnp.array_equal(jnp.asarray(jax.tree.leaves(a[1])[0]), jnp.asarray(jax.tree.leaves(b[1])[0])))
            t = round_robin({"window_max": a[0], "jnp.max": b[0]}, args.reps)
            row = {
                "conv_impl": impl,
                "what": what,
                "batch": args.batch,
                "steps": args.steps if what == "joint_pgd" else None,
                "seconds": t,
                "first_call_seconds": {"window_max": a[2], "jnp.max": b[2]},
                "ratio_jnp_max_over_window_max": t["jnp.max"] / t["window_max"],
                "outputs_equal": same,
            }
            rows.append(row)
            print(
                f"{impl:7s} {what:10s} window_max {t['window_max'] * 1e3:8.1f} ms  jnp.max {t['jnp.max'] * 1e3:8.1f} ms"
                f"  ratio {row['ratio_jnp_max_over_window_max']:.3f}  outputs equal: {same}"
            )
    res = {
        "jax": jax.__version__,
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "load_before": load,
        "load_after": os.getloadavg(),
        "M": M,
        "rows": rows,
        "provenance": provenance(),  # command, commit, machine, date, load
    }
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
