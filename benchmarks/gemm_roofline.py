"""How fast can a joint PGD step on an MLP pool be on this CPU? The matmul ceiling.

A joint PGD step on M stacked MLPs 784-256-128-10 sharing one input batch is dominated by two
matmuls: the first layer of every member at once, ``[B, 784] @ [784, M*256]``, and its input
gradient, ``[B, M*256] @ [M*256, 784]`` (about 86% of the step's FLOPs).  This script times both in
PyTorch, JAX and NumPy (in rotated blocks, one run), takes the fastest library for each, and reports
the ceiling it implies for ``benchmarks/joint_attack_throughput.py``:
``M * B / (t_forward + t_backward)`` member-sample-steps/s, counting nothing else.  A measured
attack (sarjax or PyTorch) at or near that ceiling cannot get much faster on this machine without
doing less arithmetic.

Usage:
  python benchmarks/gemm_roofline.py [--batches 64 256] [--reps 21]
Output: JSON at ``--out`` (default: a temporary folder; ``--out benchmarks/results/gemm_roofline.json``
replaces the committed result), with the run's provenance (command, commit, machine, date, load).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from _timing import provenance, results_path  # benchmarks/ is on sys.path when run as a script

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch threads must not spin on a shared CPU

M, D, H = 20, 784, 256


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--out", default=None, help="JSON path (default: a temporary folder, never benchmarks/results/)")
    args = ap.parse_args()
    args.out = str(results_path("gemm_roofline.json", args.out))
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    rng = np.random.default_rng(0)
    rows = []
    for b in args.batches:
        shapes = {"forward": (b, D, M * H), "input_grad": (b, M * H, D)}
        best = {}
        for name, (m, k, n) in shapes.items():
            a = rng.random((m, k), dtype=np.float32)
            w = rng.random((k, n), dtype=np.float32)
            ta, tw = torch.from_numpy(a), torch.from_numpy(w)
            ja, jw = jnp.asarray(a), jnp.asarray(w)
            mm = jax.jit(jnp.matmul)
            libs = {"torch": lambda: ta @ tw, "jax": lambda: mm(ja, jw).block_until_ready(), "numpy": lambda: a @ w}
            for f in libs.values():
                f()
            # blocks of one library at a time, rotated over 3 rounds: single calls alternated between
            # libraries run slower (each library's idle worker threads spin and steal the cores)
            med = {lib: float("inf") for lib in libs}
            for _ in range(3):
                for lib, f in libs.items():
                    f()
                    ts = []
                    for _ in range(args.reps):
                        t = time.perf_counter()
                        f()
                        ts.append(time.perf_counter() - t)
                    med[lib] = min(med[lib], statistics.median(ts))
            gflops = {lib: 2 * m * k * n / v / 1e9 for lib, v in med.items()}
            best[name] = min(med.values())
            print(
                f"B={b:4d} {name:10s} [{m}x{k}] @ [{k}x{n}]: "
                + ", ".join(f"{lib} {g:.1f} GFLOP/s" for lib, g in gflops.items()),
                flush=True,
            )
            rows.append({"B": b, "matmul": name, "shape": [m, k, n], "seconds_median": med, "gflops": gflops})
        ceiling = M * b / (best["forward"] + best["input_grad"])
        print(
            f"B={b:4d} ceiling from the two first-layer matmuls alone: {ceiling:,.0f} member-sample-steps/s", flush=True
        )
        rows.append({"B": b, "ceiling_member_sample_steps_per_s": ceiling})
    with open(args.out, "w") as fh:
        json.dump(
            {
                "jax": jax.__version__,
                "torch": torch.__version__,
                "threads": os.cpu_count(),
                "M": M,
                "D": D,
                "H": H,
                "loadavg": os.getloadavg(),
                "rows": rows,
                "provenance": provenance(),  # command, commit, machine, date, load
            },
            fh,
            indent=2,
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
