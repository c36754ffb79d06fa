"""Does ``sarjax plan``'s method predict what a step costs? Projected vs measured on THIS CPU.

Three step programs, each built by :mod:`sarjax.experiments.plan` exactly as ``sarjax plan``
builds it (one CPU device, mesh 1 x 1), then run here on concrete arrays:

- ``cnn``: joint PGD (the SAR paper's step, 1 restart) on a pool of 8 small CNNs (zoo, 28x28x1,
  batch 64);
- ``wrn``: joint PGD on a pool of 3 DM-style WideResNet-10-2 members (base width 4) converted from
  PyTorch (``Pool.from_torch``; tests/models/_torch_nets.py), 32x32x3, batch 16;
- ``llm``: one joint GCG step on 2 tiny Llama-shaped decoders (float32; d=64, 2 layers, vocab
  1,024), 2 requests, 64 candidates.

For each:

- memory: the plan's per-device figure (XLA ``memory_analysis``: argument + output + temp +
  generated code - alias) against the measured one: the arguments' bytes (exact: the live
  buffers) plus the rise of the process's resident memory during the step's first run (a later
  run reuses buffers the allocator kept: measured 6 MB against 92 MB for the CNN; Linux ``VmHWM``
  reset through ``/proc/self/clear_refs`` just before, ``VmRSS`` before as the base), in a fresh
  process with ``MALLOC_MMAP_THRESHOLD_=4096`` and ``MALLOC_TRIM_THRESHOLD_=0`` (every buffer of
  4 KiB or more is fresh pages, and a freed one goes back to the system: the rise is what the step
  touches). The rise is compared with its own projection, output + temp - alias, since the
  arguments are exact on both sides. Resident memory counts the pages a step touches; XLA's
  figure is its buffer assignment, which holds the larger branch of every ``lax.cond`` (joint
  PGD's restart and step branches) and whole buffers a kernel may touch in part, so measured below
  projected is expected; the figure varies from run to run with what the allocator returns.
- time: the roofline, ``max(flops / peak, bytes / bandwidth)`` with the step's FLOPs and bytes
  from XLA's cost analysis (scans unrolled, as the plan counts them) and THIS CPU's peak and
  bandwidth measured just before and just after the timed steps, in their process (a 2,048^3
  float32 matmul; a 64 Mi-float update in place, read + write; their mean), against the median warm
  step time, in another fresh process with the ordinary ``malloc``.

The ratios are measured / projected. The machine is shared: timings are under load (the 1-, 5-
and 15-minute load averages at the start, after each program and at the end are in the JSON,
and the calibrations before and after each program's steps show how much the load moved).

Usage:
  python benchmarks/plan_validation.py [--configs cnn wrn llm] [--reps 9] [--out FILE]
Output: JSON at ``--out`` (default: a temporary folder; ``--out benchmarks/results/plan_validation.json``
replaces the committed result), with the run's provenance.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
CONFIGS = ("cnn", "wrn", "llm")
DESCRIPTION = {
    "cnn": "joint PGD step, 8 x CNN (zoo cnn 16x32, dense 128), 28x28x1, batch 64",
    "wrn": "joint PGD step, 3 x WideResNet-10-2 (base 4) converted from PyTorch, 32x32x3, batch 16",
    "llm": "joint GCG step, 2 x tiny Llama (d 64, 2 layers, vocab 1,024, float32), 2 requests, 64 candidates",
}


# ------------------------------------------------------------------------------------ measurement


def _status() -> dict:
    """``VmRSS`` and ``VmHWM`` of this process, bytes (Linux)."""
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) * 1024
    return out


def _reset_peak() -> None:
    """Set this process's ``VmHWM`` to its current ``VmRSS`` (Linux ``clear_refs``: 5)."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def calibrate(reps: int) -> dict:
    """This CPU's float32 matmul FLOP/s and copy bandwidth (bytes/s), medians of ``reps`` calls."""
    import jax
    import jax.numpy as jnp

    n = 2048
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    mm = jax.jit(jnp.matmul)
    big = jnp.ones((64 * 2**20,), jnp.float32)
    nbytes = big.nbytes
    # one read and one write of every element, in place (the input donated: no fresh pages to fault in)
    cp = jax.jit(lambda z: z * 1.0001, donate_argnums=0)
    mm(a, b).block_until_ready()
    big = cp(big).block_until_ready()
    tm, tc = [], []
    for _ in range(reps):
        t = time.perf_counter()
        mm(a, b).block_until_ready()
        tm.append(time.perf_counter() - t)
        t = time.perf_counter()
        big = cp(big).block_until_ready()
        tc.append(time.perf_counter() - t)
    flops = 2 * n**3 / statistics.median(tm)
    bw = 2 * nbytes / statistics.median(tc)
    return {
        "matmul": f"[{n}x{n}] @ [{n}x{n}] float32, jax.jit",
        "peak_flops": flops,
        "copy": f"{big.size:,} float32 read and written in place (x * 1.0001, donated), jax.jit",
        "bandwidth": bw,
        "reps": reps,
    }


# ------------------------------------------------------------------------------------ the programs


def _vision(config: str):
    import jax
    import numpy as np

    from sarjax.experiments import plan as PL
    from sarjax.models import zoo
    from sarjax.models.pool import Pool, Stack
    from sarjax.models.sharding import make_mesh

    if config == "cnn":
        arch = zoo.cnn(channels=(16, 32), dense=128, input_shape=(28, 28, 1), num_classes=10)
        shapes = jax.eval_shape(jax.vmap(arch.init), jax.random.split(jax.random.key(0), 8))
        rng = np.random.default_rng(0)
        params = jax.tree.map(lambda s: (rng.standard_normal(s.shape) / np.sqrt(np.prod(s.shape[1:-1]) or 1.0))
                              .astype(np.float32), shapes)  # fmt: skip
        pool = Pool([Stack(arch, params, tuple(f"cnn/{i}" for i in range(8)))])
        batch = 64
    else:
        sys.path.insert(0, str(ROOT / "tests" / "models"))  # _torch_nets: the DM-style WideResNet
        import torch
        from _torch_nets import WideResNet, randomize_bn

        mods = []
        for seed in range(3):
            torch.manual_seed(seed)
            mods.append(randomize_bn(WideResNet(depth=10, width=2, base=4), seed=seed))
        pool = Pool.from_torch(mods, input_shape=(32, 32, 3), verify=False)
        batch = 16
    (prog,) = PL.vision_program(PL.pool_shapes(pool), "joint-pgd", batch, make_mesh(1, 1),
                                {"steps": 40, "restarts": 1, "eps": 8 / 255})  # fmt: skip
    rng = np.random.default_rng(1)
    x = rng.random((batch, *pool.input_shape), dtype=np.float32)
    ref = rng.integers(0, pool.num_classes, (batch, pool.num_members)).astype(np.int32)
    mask = np.ones((batch, pool.num_members), np.float32)
    return prog, tuple(pool.params), (x, ref, mask, jax.random.key(2))


def _llm():
    import jax
    import jax.numpy as jnp
    import numpy as np

    from sarjax.attacks.queries import NO_CAP
    from sarjax.attacks.text import requests as TR
    from sarjax.experiments import plan as PL
    from sarjax.models.llm.config import config_from_hf
    from sarjax.models.llm.decoder import init_params

    hf = {"model_type": "llama", "vocab_size": 1024, "hidden_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "rms_norm_eps": 1e-5,
          "max_position_embeddings": 256, "tie_word_embeddings": False, "hidden_act": "silu"}  # fmt: skip
    cfg = config_from_hf(hf)
    m, b = 2, 2
    s = {"steps": 20, "topk": 32, "candidates": 64, "suffix_len": 10, "prompt_len": 16, "after_len": 4,
         "target_len": 8}  # fmt: skip
    prog, _, _ = PL.llm_program([cfg] * m, b, {"pool": 1, "data": 1, "model": 1}, s, "float32")
    params = jax.vmap(lambda k: init_params(cfg, k, jnp.float32))(jax.random.split(jax.random.key(0), m))
    rng = np.random.default_rng(1)

    def ids(n):
        return rng.integers(1, cfg.vocab_size, (b, n)).astype(np.int32)

    ones = lambda n: np.ones((b, n), np.int32)  # noqa: E731
    pb, pa, tt, ls = s["prompt_len"], s["after_len"], s["target_len"], s["suffix_len"]
    batch = TR.TextBatch(ids(pb), ones(pb), ids(pa), ones(pa), ids(tt), ones(tt))
    problem = TR.TextProblem(batch, np.ones((b, m), np.float32), np.ones((cfg.vocab_size,), bool),
                            np.full((b,), NO_CAP, np.int32), jax.random.key(3), np.arange(b, dtype=np.int32),
                            ids(ls), np.full((b,), ls, np.int32))  # fmt: skip
    return prog, params, (problem,)


def measure(config: str, mode: str, reps: int) -> dict:
    """Plan ``config`` and run its step in this (fresh) process.

    ``mode="memory"``: the resident-memory rise of the step's first run (run with a low
    ``MALLOC_MMAP_THRESHOLD_``: every buffer of 4 KiB or more is fresh pages, freed back at once);
    ``mode="time"``: ``reps`` warm steps (ordinary ``malloc``), this CPU calibrated just before and
    just after them (:func:`calibrate`; the machine's load changes within minutes).
    """
    import jax

    from sarjax.experiments import plan as PL

    prog, params, args = _llm() if config == "llm" else _vision(config)
    a = PL.analyse(prog)
    compiled = jax.jit(prog.fn, donate_argnums=1).lower(prog.params, prog.state).compile()
    state = jax.block_until_ready(jax.jit(prog.init)(params, *args))
    out: dict = {"plan": {k: a[k] for k in ("memory", "flops", "bytes_accessed", "loops", "cost_from",
                                             "compile_seconds")}}  # fmt: skip
    if mode == "memory":  # the step's FIRST run: the buffers it allocates are fresh (later runs reuse some)
        gc.collect()
        time.sleep(1.0)  # let freed memory go back before the base is read
        before = _status()["VmRSS"]
        _reset_peak()
        state = jax.block_until_ready(compiled(params, state))
        peak = _status()["VmHWM"]
        arg_bytes = sum(x.nbytes for x in jax.tree.leaves((params, state)))
        out["measured"] = {"argument_bytes": arg_bytes, "rss_before_step": before, "rss_peak_during_step": peak,
                           "rise_bytes": peak - before}  # fmt: skip
        return out
    state = jax.block_until_ready(compiled(params, state))  # a first (warm-up) run
    cal = [calibrate(5)]
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        state = jax.block_until_ready(compiled(params, state))
        times.append(time.perf_counter() - t)
    cal.append(calibrate(5))
    out["measured"] = {"step_seconds": times, "step_seconds_median": statistics.median(times)}
    out["cpu"] = {
        "before": cal[0],
        "after": cal[1],
        "peak_flops": statistics.mean(c["peak_flops"] for c in cal),
        "bandwidth": statistics.mean(c["bandwidth"] for c in cal),
        "note": "the mean of the calibrations just before and just after the timed steps",
    }
    return out


# ------------------------------------------------------------------------------------ the run


def _child(config: str, mode: str, reps: int) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    if mode == "memory":
        env.update(MALLOC_MMAP_THRESHOLD_="4096", MALLOC_TRIM_THRESHOLD_="0")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", config, "--mode", mode, "--reps", str(reps)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"{config} ({mode}) failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def ratios(row: dict) -> dict:
    """Measured / projected memory (total and the step's rise) and step time (the roofline with the
    CPU calibrated around the timed steps)."""
    from sarjax.experiments.plan import PROJECTION, roofline
    from sarjax.runtime.devices import DeviceSpec

    cpu = row["cpu"]
    spec = DeviceSpec("this-cpu", "this CPU (measured)", 0.0, cpu["bandwidth"],
                      {"fp32": cpu["peak_flops"], "tf32": None, "bf16": None}, "measured in this run")  # fmt: skip
    rl = roofline(row["plan"]["flops"], row["plan"]["bytes_accessed"], spec, "fp32")
    mea, m = row["measured"], row["plan"]["memory"]
    proj_total, proj_rise = m["total"], m["output"] + m["temp"] - m["alias"]
    total = mea["argument_bytes"] + mea["rise_bytes"]
    return {
        "projected_memory_bytes": proj_total,
        "projected_rise_bytes": proj_rise,
        "measured_memory_bytes": total,
        "memory_ratio": total / proj_total,
        "rise_ratio": mea["rise_bytes"] / proj_rise if proj_rise > 0 else None,
        "roofline": {k: rl[k] for k in ("seconds", "compute_seconds", "memory_seconds", "bound")}
        | {"label": PROJECTION},
        "time_ratio": mea["step_seconds_median"] / rl["seconds"],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    ap.add_argument("--reps", type=int, default=9, help="warm steps timed per program (median)")
    ap.add_argument("--out", default=None, help="JSON path (default: a temporary folder, never benchmarks/results/)")
    ap.add_argument("--child", choices=CONFIGS, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=["memory", "time"], default="time", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.child:
        print(json.dumps(measure(args.child, args.mode, args.reps), default=str))
        return 0
    sys.path.insert(0, str(HERE))
    from _timing import provenance, results_path

    out = results_path("plan_validation.json", args.out)
    load_start = list(os.getloadavg())
    rows = {}
    for name in args.configs:
        mem, tim = _child(name, "memory", args.reps), _child(name, "time", args.reps)
        row = {"description": DESCRIPTION[name], "plan": tim["plan"], "cpu": tim["cpu"],
               "measured": {**mem["measured"], **tim["measured"]}, "load_after": list(os.getloadavg())}  # fmt: skip
        row["ratios"] = ratios(row)
        rows[name] = row
        r, c = row["ratios"], row["cpu"]
        print(
            f"{name}: memory measured / projected {r['memory_ratio']:.3f} (the step's rise {r['rise_ratio']:.3f}); "
            f"step {row['measured']['step_seconds_median'] * 1e3:.1f} ms measured, "
            f"{r['roofline']['seconds'] * 1e3:.2f} ms roofline (projection, {r['roofline']['bound']}-bound; this CPU "
            f"{c['peak_flops'] / 1e9:.0f} GFLOP/s, {c['bandwidth'] / 1e9:.1f} GB/s): ratio {r['time_ratio']:.2f}",
            flush=True,
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "load_start": load_start, "provenance": provenance()}, indent=2,
                              default=str))  # fmt: skip
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
