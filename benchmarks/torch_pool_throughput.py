"""Joint PGD on a pool of 8 converted PyTorch CNNs: sarjax vs PyTorch on the same weights.

Eight PyTorch CNNs of one architecture (conv 16 - BN - ReLU - maxpool - conv 32 - BN - ReLU -
maxpool - dense 128 - dense 10, MNIST-sized 28x28x1 inputs, random weights and batch-norm
statistics) are converted with ``Pool.from_torch`` (sarjax.models.torch_convert: torch.export ->
a JAX function, members stacked, one compiled apply).  Joint linf PGD (the SAR paper's Table 1
step: mean cross-entropy of the 8 members against their own clean predictions, sign step eps/16,
projection around x0, one random start) runs for ``--steps`` steps as

  * ``sarjax[pool.apply]``: ``make_joint_pgd(pool.apply)``, one compiled call; the TorchStack's
    apply on CPU: ``lax.map`` of the converted member function over the stacked params (the
    members one after the other inside the call), convolutions as im2col contractions (the
    converter's default on CPU);
  * ``sarjax[vmap]``: the same attack over ``jax.vmap`` of the member function (the stack's apply
    on other backends; on CPU a vmapped convolution over members is a batched contraction);
  * ``sarjax[vmap,xla-conv]``: vmap with ``lax.conv_general_dilated`` convolutions;
  * ``torch_loop[tN]``: the 8 modules in a Python loop (forward, summed CE, one backward);
  * ``torch_func_vmap[tN]``: ``torch.func.functional_call`` + ``torch.func.vmap`` over the stacked
    weights and buffers,

with PyTorch at 1 and 2 threads (``torch.set_num_threads``; the baseline is the fastest PyTorch
variant), alternated in one run (round-robin repetitions, the median of each reported).  Prints
member-sample-steps per second and the ratios against the fastest PyTorch baseline; writes JSON
with the load averages before and after (the machine is shared: compare ratios from one run).

Usage:
  PYTHONPATH=. python benchmarks/torch_pool_throughput.py            # B = 64 and 256, 10 steps, 5 reps
  PYTHONPATH=. python benchmarks/torch_pool_throughput.py --quick    # B = 64, 5 steps, 3 reps
Output: JSON at ``--out`` (default: a temporary folder; ``--out
benchmarks/results/torch_pool_throughput.json`` replaces the committed result), with the run's
provenance (command, commit, machine, date, load).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the torch loops of joint_attack_throughput.py

from _timing import provenance, results_path  # noqa: E402
from joint_attack_throughput import torch_joint_pgd_loop, torch_joint_pgd_vmap  # noqa: E402

from sarjax.attacks.joint import JointPGDStep, make_joint_pgd
from sarjax.models.pool import Pool
from sarjax.models.torch_convert import TorchStack

M = 8
EPS = 0.1
SHAPE = (28, 28, 1)


def torch_cnns(n: int, seed: int = 0):
    """``n`` PyTorch CNNs of one architecture with random weights and batch-norm statistics."""
    import torch
    from torch import nn

    class CNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(1, 16, 3, padding=1),
                nn.BatchNorm2d(16),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(16, 32, 3, padding=1),
                nn.BatchNorm2d(32),
                nn.ReLU(),
                nn.MaxPool2d(2),
            )
            self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))

        def forward(self, x):
            return self.head(self.features(x))

    torch.manual_seed(seed)
    models = []
    for _ in range(n):
        m = CNN()
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                with torch.no_grad():
                    mod.running_mean.normal_(0.0, 0.1)
                    mod.running_var.uniform_(0.5, 1.5)
        models.append(m.eval())
    for m in models:
        for p in m.parameters():
            p.requires_grad_(False)
    return models


def vmap_apply(stack):
    """The stack's logits ``[K, B, C]`` with ``jax.vmap`` over the members (TorchStack's apply off CPU)."""
    f = stack.member_apply

    def apply(params, x):
        (p,) = params
        return jax.vmap(f, in_axes=(0, None))(p, x)

    return apply


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--torch-threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--quick", action="store_true", help="B = 64, 5 steps, 3 repetitions")
    ap.add_argument("--out", default=None, help="JSON path (default: a temporary folder, never benchmarks/results/)")
    args = ap.parse_args()
    args.out = str(results_path("torch_pool_throughput.json", args.out, quick=args.quick))
    if args.quick:
        args.steps, args.reps, args.batches = 5, 3, [64]

    import torch

    warnings.filterwarnings("ignore", category=FutureWarning)
    models = torch_cnns(M)
    t0 = time.perf_counter()
    pool = Pool.from_torch(models, input_shape=SHAPE)
    convert_s = time.perf_counter() - t0
    print(
        f"jax {jax.__version__} ({jax.devices()[0].platform}), torch {torch.__version__}, cpus {os.cpu_count()}, "
        f"M={M}, steps={args.steps}, reps={args.reps}; {pool} converted in {convert_s:.1f} s",
        flush=True,
    )
    (stack,) = pool.stacks
    # the same members with lax.conv_general_dilated convolutions (the default on CPU is im2col)
    xla_pool = Pool([TorchStack(dataclasses.replace(stack.program, conv_impl="xla"), stack.params, stack.names)])
    load_before = os.getloadavg()
    rows = []
    for b in args.batches:
        x0 = jax.random.uniform(jax.random.PRNGKey(b), (b, *SHAPE))
        ref = jnp.argmax(pool.logits(x0), -1).T.astype(jnp.int32)  # [B, M]: each member's own prediction
        mask = jnp.ones((b, M), jnp.float32)
        attacks = {
            "sarjax[pool.apply]": (make_joint_pgd(pool.apply, eps=EPS, steps=args.steps, step=JointPGDStep(restarts=1)), pool.params),
            "sarjax[vmap]": (make_joint_pgd(vmap_apply(stack), eps=EPS, steps=args.steps, step=JointPGDStep(restarts=1)), pool.params),
            "sarjax[vmap,xla-conv]": (
                make_joint_pgd(xla_pool.apply, eps=EPS, steps=args.steps, step=JointPGDStep(restarts=1)),
                xla_pool.params,
            ),
        }
        runners = {}
        for name, (atk, params) in attacks.items():
            runners[name] = lambda atk=atk, params=params: jax.block_until_ready(
                atk(params, x0, ref, key=jax.random.PRNGKey(1), mask=mask).x_adv
            )
        tx0 = torch.from_numpy(np.array(np.asarray(x0).transpose(0, 3, 1, 2)))
        tref = torch.from_numpy(np.asarray(ref)).long()
        gen = torch.Generator().manual_seed(0)
        for th in args.torch_threads:

            def loop(th=th):
                torch.set_num_threads(th)
                return torch_joint_pgd_loop(models, tx0, tref, args.steps, EPS, EPS / 16, gen)

            def fvmap(th=th):
                torch.set_num_threads(th)
                return torch_joint_pgd_vmap(models, tx0, tref, args.steps, EPS, EPS / 16, gen)

            runners[f"torch_loop[t{th}]"] = loop
            runners[f"torch_func_vmap[t{th}]"] = fvmap
        # parity of the converted pool with the modules (the same weights), then warm-up (compiles)
        with torch.no_grad():
            zt = np.stack([m(tx0).numpy() for m in models])
        parity = float(np.abs(np.asarray(pool.logits(x0)) - zt).max())
        zm = np.asarray(jax.jit(vmap_apply(stack))(pool.params, x0))
        parity = max(parity, float(np.abs(zm - zt).max()), float(np.abs(np.asarray(xla_pool.logits(x0)) - zt).max()))
        compile_s = {}
        for k, r in runners.items():
            t = time.perf_counter()
            r()
            compile_s[k] = time.perf_counter() - t
        times = {k: [] for k in runners}
        for _ in range(args.reps):  # alternate: one of each per repetition
            for k, r in runners.items():
                t = time.perf_counter()
                r()
                times[k].append(time.perf_counter() - t)
        work = M * b * args.steps
        med = {k: statistics.median(v) for k, v in times.items()}
        thr = {k: work / v for k, v in med.items()}
        best_torch_name = max((k for k in thr if k.startswith("torch")), key=lambda k: thr[k])
        row = {
            "B": b,
            "M": M,
            "steps": args.steps,
            "logit_parity_maxabs": parity,
            "first_call_seconds": compile_s,
            "seconds_median": med,
            "seconds_all": times,
            "member_sample_steps_per_s": thr,
            "fastest_torch": best_torch_name,
            "ratio_vs_fastest_torch": {k: thr[k] / thr[best_torch_name] for k in thr if k.startswith("sarjax")},
            "load_after_row": os.getloadavg(),
        }
        rows.append(row)
        print(
            f"B={b:4d} | "
            + " | ".join(f"{k} {thr[k]:,.0f}/s" for k in thr)
            + f" | vs {best_torch_name}: "
            + ", ".join(f"{k} {v:.2f}x" for k, v in row["ratio_vs_fastest_torch"].items())
            + f" | parity {parity:.1e} | load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        _write(args.out, rows, convert_s, load_before, torch.__version__)  # after every row: a long run keeps its rows


def _write(path, rows, convert_s, load_before, torch_version):
    out = {
        "benchmark": "joint linf PGD on 8 converted PyTorch CNNs (Pool.from_torch) vs PyTorch",
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "jax": jax.__version__,
        "torch": torch_version,
        "platform": jax.devices()[0].platform,
        "cpus": os.cpu_count(),
        "eps": EPS,
        "convert_seconds": convert_s,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "rows": rows,
        "provenance": provenance(),  # command, commit, machine, date, load
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(out, fh, indent=2)
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
