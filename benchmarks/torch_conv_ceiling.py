"""The convolution ceiling for converted residual nets on CPU: XLA:CPU vs PyTorch (oneDNN), per layer shape.

Joint PGD needs, per convolution, the forward pass and the input gradient (no weight gradient).
For the 3x3 convolution shapes of the residual pools in ``benchmarks/torch_pool_throughput.py``
(WideResNet-16-2 and PreActResNet-18 on 32x32 CIFAR inputs), this times ``forward + input
gradient`` of ONE convolution layer as

  * ``torch[tN]``: ``F.conv2d`` and ``torch.autograd.grad`` in the input (oneDNN), N threads;
  * ``jax[im2col]``: the converter's CPU lowering (``sarjax.models.torch_ops.conv`` with
    ``impl="im2col"``: shifted slices and one contraction, NCHW), ``jax.vjp`` in the input, jitted;
  * ``jax[xla,nchw]``: ``lax.conv_general_dilated`` in NCHW (the converter's ``conv_impl="xla"``);
  * ``jax[xla,nhwc]``: ``lax.conv_general_dilated`` in NHWC / HWIO (the zoo's layout),

alternated in one run (round-robin repetitions, the median reported), and prints GFLOP/s
(``4 B Ho Wo Cout Cin k^2`` per call: forward and input gradient) and each JAX lowering's ratio
to the fastest PyTorch variant. Writes JSON with the run's provenance.

Usage:
  PYTHONPATH=. python benchmarks/torch_conv_ceiling.py            # B = 16, 7 repetitions
  PYTHONPATH=. python benchmarks/torch_conv_ceiling.py --quick    # 3 shapes, 3 repetitions
Output: JSON at ``--out`` (default: a temporary folder; ``--out
benchmarks/results/torch_conv_ceiling.json`` replaces the committed result).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported: 2-thread rows do not spin

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import provenance, results_path  # noqa: E402

from sarjax.models import torch_ops

# (label, H = W, Cin, Cout, stride): the 3x3 convolutions of WRN-16-2 and PreActResNet-18 (32x32 inputs)
SHAPES = [
    ("wrn16-2 s1", 32, 16, 32, 1),
    ("wrn16-2 s1b", 32, 32, 32, 1),
    ("wrn16-2 s2", 16, 64, 64, 1),
    ("wrn16-2 s3", 8, 128, 128, 1),
    ("preact18 l1", 32, 64, 64, 1),
    ("preact18 l2", 16, 128, 128, 1),
    ("preact18 l3", 8, 256, 256, 1),
    ("preact18 l4", 4, 512, 512, 1),
]


def _time(f, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t) / n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--inner", type=int, default=5, help="calls per timed repetition")
    ap.add_argument("--torch-threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--quick", action="store_true", help="3 shapes, 3 repetitions")
    ap.add_argument("--out", default=None, help="JSON path (default: a temporary folder, never benchmarks/results/)")
    args = ap.parse_args()
    args.out = str(results_path("torch_conv_ceiling.json", args.out, quick=args.quick))
    shapes = SHAPES
    if args.quick:
        shapes, args.reps = [SHAPES[1], SHAPES[4], SHAPES[6]], 3

    import torch
    import torch.nn.functional as F

    load_before = os.getloadavg()
    print(f"jax {jax.__version__}, torch {torch.__version__}, cpus {os.cpu_count()}, B={args.batch}", flush=True)
    rows = []
    for label, hw, cin, cout, stride in shapes:
        b = args.batch
        rng = np.random.default_rng(0)
        x = rng.standard_normal((b, cin, hw, hw), dtype=np.float32)
        w = (rng.standard_normal((cout, cin, 3, 3), dtype=np.float32) / np.sqrt(9 * cin)).astype(np.float32)
        ho = (hw + 2 - 3) // stride + 1
        g = rng.standard_normal((b, cout, ho, ho), dtype=np.float32)
        flops = 4.0 * b * ho * ho * cout * cin * 9

        def jax_runner(conv, layout="nchw"):
            xj, wj, gj = jnp.asarray(x), jnp.asarray(w), jnp.asarray(g)
            if layout == "nhwc":
                xj, wj, gj = xj.transpose(0, 2, 3, 1), wj.transpose(2, 3, 1, 0), gj.transpose(0, 2, 3, 1)

            @jax.jit
            def step(xv, wv, gv):
                y, vjp = jax.vjp(lambda v: conv(v, wv), xv)
                return y, vjp(gv)[0]

            return lambda: jax.block_until_ready(step(xj, wj, gj))

        dn_nhwc = ("NHWC", "HWIO", "NHWC")
        runners = {
            "jax[im2col]": jax_runner(lambda v, k: torch_ops.conv(v, k, None, stride, 1, impl="im2col")),
            "jax[xla,nchw]": jax_runner(lambda v, k: torch_ops.conv(v, k, None, stride, 1, impl="xla")),
            "jax[xla,nhwc]": jax_runner(
                lambda v, k: jax.lax.conv_general_dilated(
                    v, k, (stride, stride), [(1, 1), (1, 1)], dimension_numbers=dn_nhwc
                ),
                "nhwc",
            ),
        }
        tx, tw, tg = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(g)
        for th in args.torch_threads:

            def run_torch(th=th):
                torch.set_num_threads(th)
                xv = tx.clone().requires_grad_(True)
                y = F.conv2d(xv, tw, None, stride, 1)
                (dx,) = torch.autograd.grad(y, xv, tg)
                return dx

            runners[f"torch[t{th}]"] = run_torch
        for r in runners.values():  # warm-up (compiles)
            r()
        times = {k: [] for k in runners}
        for _ in range(args.reps):
            for k, r in runners.items():
                times[k].append(_time(r, args.inner))
        med = {k: statistics.median(v) for k, v in times.items()}
        gflops = {k: flops / v / 1e9 for k, v in med.items()}
        best = max((k for k in med if k.startswith("torch")), key=lambda k: gflops[k])
        row = {
            "shape": label,
            "B": b,
            "H": hw,
            "Cin": cin,
            "Cout": cout,
            "stride": stride,
            "flop_per_call": flops,
            "seconds_median": med,
            "gflop_per_s": gflops,
            "fastest_torch": best,
            "ratio_vs_fastest_torch": {k: gflops[k] / gflops[best] for k in gflops if k.startswith("jax")},
            "load_after_row": os.getloadavg(),
        }
        rows.append(row)
        print(
            f"{label:12s} B={b} {hw}x{hw} {cin}->{cout} | "
            + " | ".join(f"{k} {v:.1f} GF/s" for k, v in gflops.items())
            + f" | vs {best}: "
            + ", ".join(f"{k} {v:.2f}x" for k, v in row["ratio_vs_fastest_torch"].items())
            + f" | load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        out = {
            "benchmark": "one 3x3 convolution, forward + input gradient: XLA:CPU lowerings vs PyTorch (oneDNN)",
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "jax": jax.__version__,
            "torch": torch.__version__,
            "cpus": os.cpu_count(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "rows": rows,
            "provenance": provenance(),
        }
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump(out, fh, indent=2)
    print(f"wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()
