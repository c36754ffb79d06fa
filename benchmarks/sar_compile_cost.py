"""First-call compile cost of run_sar's joint-PGD kernels per packed batch shape (H3, issue 19).

Usage: PYTHONPATH=. python benchmarks/sar_compile_cost.py --batch 50 --sizes 50 13 4 --runs 1 --out benchmarks/results/sar_compile_cost.json

Untrained high-diversity pool (weights do not change compile time): presets.HIGH_ARCHS cycled over
M members, CNN stacks re-wrapped to conv_impl=fused as the demo does.  For each batch size that
run_sar's packing uses for a chunk of B, lower + compile the joint-PGD kernel (the demo's: on
pool.apply; --gate: run_sar's default with StackGate) and report process CPU seconds, plus
the wall time of --runs executions per size.  Measured on a loaded machine: compare CPU seconds.
JSON only with ``--out`` (with the run's provenance: command, commit, machine, date, load).
"""

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from _timing import provenance  # benchmarks/ is on sys.path when run as a script

ap = argparse.ArgumentParser()
ap.add_argument("--members", type=int, default=20)
ap.add_argument("--batch", type=int, default=50)
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--restarts", type=int, default=3)
ap.add_argument("--sizes", type=int, nargs="*", default=None)
ap.add_argument("--gate", action="store_true")
ap.add_argument("--runs", type=int, default=0)
ap.add_argument("--out", default=None)
args = ap.parse_args()

from sarjax.attacks.core.protocol import run_jit
from sarjax.attacks.joint import JointPGDStep, make_joint_pgd
from sarjax.models import presets
from sarjax.models.pool import Pool, Stack
from sarjax.sar.vision import PACK_LEVELS, StackGate, pack_sizes

archs = presets.HIGH_ARCHS
groups = {}
for i in range(args.members):
    groups.setdefault(i % len(archs), []).append(i)
stacks = []
for j, idx in groups.items():
    a = archs[j]
    if a.family == "cnn":
        import dataclasses

        a = dataclasses.replace(a, conv_impl="fused")
    stacks.append(
        Stack.from_keys(a, jax.random.split(jax.random.key(j), len(idx)), names=[f"{a.name}/{i}" for i in idx])
    )
pool = Pool(stacks)
print(pool, [s.size for s in pool.stacks], flush=True)
M = pool.num_members
if args.gate:
    gate = StackGate.of(pool)
    fn = make_joint_pgd(gate.apply, eps=0.05, steps=args.steps, step=JointPGDStep(restarts=args.restarts))
else:
    fn = make_joint_pgd(pool.apply, eps=0.05, steps=args.steps, step=JointPGDStep(restarts=args.restarts))
sizes = args.sizes or list(pack_sizes(args.batch, PACK_LEVELS))
rows = []
for b in sizes:
    x0 = np.asarray(jax.random.uniform(jax.random.key(b), (b, 28, 28, 1)))
    ref = np.zeros((b, M), np.int32)
    mask = np.ones((b, M), np.float32)
    params = gate.params(mask) if args.gate else pool.params
    pr = fn.problem(params, x0, ref, key=jax.random.key(0), mask=mask, eps=0.05, sample_ids=np.arange(b))
    t0, c0 = time.perf_counter(), time.process_time()
    low = run_jit.lower(fn.attack, params, pr)
    t1, c1 = time.perf_counter(), time.process_time()
    comp = low.compile()
    t2, c2 = time.perf_counter(), time.process_time()
    hlo = len(comp.as_text())
    run_s = []
    for _ in range(args.runs):
        t3 = time.perf_counter()
        jax.block_until_ready(comp(params, pr))
        run_s.append(time.perf_counter() - t3)
    row = dict(
        batch=b,
        lower_wall=t1 - t0,
        lower_cpu=c1 - c0,
        compile_wall=t2 - t1,
        compile_cpu=c2 - c1,
        hlo_chars=hlo,
        run_s=run_s,
    )
    rows.append(row)
    print(row, "load", os.getloadavg()[0], flush=True)
tot = dict(compile_cpu=sum(r["compile_cpu"] for r in rows), lower_cpu=sum(r["lower_cpu"] for r in rows))
print("total", tot)
if args.out:
    res = dict(args=vars(args), rows=rows, total=tot, load=os.getloadavg(), provenance=provenance())
    with open(args.out, "w") as fh:
        json.dump(res, fh, indent=1)

if os.environ.get("H3_PARTS"):
    b = sizes[-1]
    x0 = jnp.asarray(np.asarray(jax.random.uniform(jax.random.key(b), (b, 28, 28, 1))))
    parts = {
        "forward": jax.jit(lambda p, x: pool.apply(p, x)),
        "fwd+grad_x": jax.jit(jax.grad(lambda x, p: jnp.sum(jax.nn.log_softmax(pool.apply(p, x))[..., 0]))),
    }
    for name, f in parts.items():
        args_ = (pool.params, x0) if name == "forward" else (x0, pool.params)
        c0 = time.process_time()
        low = f.lower(*args_)
        c1 = time.process_time()
        low.compile()
        c2 = time.process_time()
        print(f"part {name} B={b}: lower {c1 - c0:.1f} s, compile {c2 - c1:.1f} s cpu", flush=True)
    for st in pool.stacks:
        sub = Pool([st])
        f = jax.jit(jax.grad(lambda x, p: jnp.sum(jax.nn.log_softmax(sub.apply(p, x))[..., 0])))
        c0 = time.process_time()
        f.lower(x0, sub.params).compile()
        c1 = time.process_time()
        print(f"part stack {st.name} x{st.size} fwd+grad_x compile {c1 - c0:.1f} s cpu", flush=True)
