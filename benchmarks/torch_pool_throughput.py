"""Joint PGD on pools of converted PyTorch models: sarjax vs PyTorch on the same weights.

Three pools (``--pools``), PyTorch modules with random weights and batch-norm statistics,
converted with ``Pool.from_torch`` (sarjax.models.torch_convert: torch.export -> a JAX function,
members stacked, one compiled apply):

  * ``cnn8``: 8 CNNs (conv 16 - BN - ReLU - maxpool - conv 32 - BN - ReLU - maxpool - dense 128 -
    dense 10, 28x28x1 inputs). The graph matches the zoo's ``cnn`` layout, so on CPU the stack
    runs the zoo's fused pool kernel (sarjax.models.torch_fused: batch-norm folded into the
    convolutions, sarjax.models.fused.cnn_pool_apply);
  * ``preact18``: 2 PreActResNet-18s (RobustBench's CIFAR-10 layout, 32x32x3);
  * ``wrn16-2``: 4 WideResNet-16-2s (RobustBench's layout, 32x32x3).

Joint linf PGD (the SAR paper's Table 1 step: mean cross-entropy of the members against their own
clean predictions, sign step eps/16, projection around x0, one random start) runs as

  * ``sarjax[pool.apply]``: ``make_joint_pgd(pool.apply)``, one compiled call (the stack's apply
    on CPU: the fused kernel for ``cnn8``; for the residual nets, the members unrolled, each
    running its graph on the whole batch channels-last, ``lax.conv`` in NHWC);
  * ``sarjax[op-by-op,im2col]`` (``cnn8`` only): the same members op by op, the path before the
    fused mapping;
  * ``sarjax[old:map,vmap,im2col]`` (residual nets; ``--no-old`` leaves it out): the path before
    the whole-batch one: ``lax.map`` over the members, each graph vmapped over the examples,
    im2col convolutions in NCHW;
  * ``torch_loop[tN]``: the modules in a Python loop (forward, summed CE, one backward);
  * ``torch_func_vmap[tN]``: ``torch.func.functional_call`` + ``torch.func.vmap`` over the stacked
    weights and buffers,

with PyTorch at 1 and 2 threads (``torch.set_num_threads``; ``OMP_WAIT_POLICY=PASSIVE`` unless
set, so that 2-thread rows do not spin on a loaded machine; the baseline is the fastest PyTorch
variant), alternated in one run (round-robin repetitions, the median of each reported).  Prints
member-sample-steps per second and the ratios against the fastest PyTorch variant; writes JSON
with the load averages before and after (the machine is shared: compare ratios from one run).
Where the residual nets' time goes: ``benchmarks/torch_conv_ceiling.py``.

Usage:
  PYTHONPATH=. python benchmarks/torch_pool_throughput.py            # every pool, 3 reps
  PYTHONPATH=. python benchmarks/torch_pool_throughput.py --quick    # first batch size, 2 steps
  PYTHONPATH=. python benchmarks/torch_pool_throughput.py --pools preact18 wrn16-2 --reps 2
Output: JSON at ``--out`` (default: a temporary folder; ``--out
benchmarks/results/torch_pool_throughput.json`` replaces the committed result), with the run's
provenance (command, commit, machine, date, load).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
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

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported: 2-thread rows do not spin

from _timing import provenance, results_path  # noqa: E402
from joint_attack_throughput import torch_joint_pgd_loop, torch_joint_pgd_vmap  # noqa: E402

from sarjax.attacks.joint import JointPGDStep, make_joint_pgd
from sarjax.models.pool import Pool
from sarjax.models.torch_convert import TorchStack

M = 8
EPS = 0.1


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


def _randomize_bn(models):
    from torch import nn

    for m in models:
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                with torch_no_grad():
                    mod.running_mean.normal_(0.0, 0.1)
                    mod.running_var.uniform_(0.5, 1.5)
                    mod.weight.uniform_(0.5, 1.5)
                    mod.bias.normal_(0.0, 0.1)
        m.eval()
        for p in m.parameters():
            p.requires_grad_(False)
    return models


def torch_no_grad():
    import torch

    return torch.no_grad()


def torch_preact_resnet18(n: int, seed: int = 0, num_classes: int = 10):
    """``n`` PreActResNet-18s (CIFAR-10 layout, RobustBench's ``PreActResNet18``), random weights."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.bn1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn2, self.conv2 = nn.BatchNorm2d(cout), nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.shortcut = None
            if stride != 1 or cin != cout:
                self.shortcut = nn.Conv2d(cin, cout, 1, stride, bias=False)

        def forward(self, x):
            out = F.relu(self.bn1(x))
            sc = self.shortcut(out) if self.shortcut is not None else x
            out = self.conv1(out)
            out = self.conv2(F.relu(self.bn2(out)))
            return out + sc

    class PreActResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
            layers, cin = [], 64
            for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
                layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
                cin = cout
            self.layers = nn.Sequential(*layers)
            self.bn, self.linear = nn.BatchNorm2d(512), nn.Linear(512, num_classes)

        def forward(self, x):
            out = F.relu(self.bn(self.layers(self.conv1(x))))
            return self.linear(F.avg_pool2d(out, 4).flatten(1))

    torch.manual_seed(seed)
    return _randomize_bn([PreActResNet18() for _ in range(n)])


def torch_wide_resnet(n: int, depth: int = 16, widen: int = 2, seed: int = 0, num_classes: int = 10):
    """``n`` WideResNet-``depth``-``widen`` (CIFAR-10 layout, RobustBench's ``WideResNet``), random weights."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.bn1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn2, self.conv2 = nn.BatchNorm2d(cout), nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.equal = cin == cout
            self.short = None if self.equal else nn.Conv2d(cin, cout, 1, stride, 0, bias=False)

        def forward(self, x):
            o = F.relu(self.bn1(x))
            y = self.conv2(F.relu(self.bn2(self.conv1(o))))
            return y + (x if self.equal else self.short(o))

    class WideResNet(nn.Module):
        def __init__(self):
            super().__init__()
            nb = (depth - 4) // 6
            ch = [16, 16 * widen, 32 * widen, 64 * widen]
            self.conv1 = nn.Conv2d(3, ch[0], 3, 1, 1, bias=False)
            blocks = []
            for g, stride in enumerate((1, 2, 2)):
                for i in range(nb):
                    blocks.append(Block(ch[g] if i == 0 else ch[g + 1], ch[g + 1], stride if i == 0 else 1))
            self.blocks = nn.Sequential(*blocks)
            self.bn, self.fc = nn.BatchNorm2d(ch[3]), nn.Linear(ch[3], num_classes)

        def forward(self, x):
            out = F.relu(self.bn(self.blocks(self.conv1(x))))
            return self.fc(F.avg_pool2d(out, 8).flatten(1))

    torch.manual_seed(seed)
    return _randomize_bn([WideResNet() for _ in range(n)])


# name -> (builder, members, input shape (H, W, C), default batch sizes, default steps)
POOLS = {
    "cnn8": (lambda m: torch_cnns(m), 8, (28, 28, 1), [64, 256], 5),
    "preact18": (lambda m: torch_preact_resnet18(m), 2, (32, 32, 3), [8], 1),
    "wrn16-2": (lambda m: torch_wide_resnet(m, 16, 2), 4, (32, 32, 3), [16], 1),
}


def joint_pgd(apply, steps: int):
    """``make_joint_pgd`` with one restart (the keyword moved into ``JointPGDStep``)."""
    if "restarts" in inspect.signature(make_joint_pgd).parameters:
        return make_joint_pgd(apply, eps=EPS, steps=steps, restarts=1)
    from sarjax.attacks.joint import JointPGDStep

    return make_joint_pgd(apply, eps=EPS, steps=steps, step=JointPGDStep(restarts=1))


def vmap_apply(stack):
    """The stack's logits ``[K, B, C]`` with ``jax.vmap`` over the members (TorchStack's apply off CPU)."""
    f = stack.member_apply

    def apply(params, x):
        (p,) = params
        return jax.vmap(f, in_axes=(0, None))(p, x)

    return apply


def op_by_op_pool(stack, conv_impl):
    """The same members run op by op (no fused kernel), convolutions by ``conv_impl``."""
    return Pool([TorchStack(dataclasses.replace(stack.program, conv_impl=conv_impl), stack.params, stack.names)])


def old_path_pool(stack):
    """The residual nets as before whole-batch channels-last execution: ``lax.map`` over the members,
    each member's graph ``jax.vmap``-ped over the examples (batch-1 convolutions), im2col in NCHW."""
    prog = dataclasses.replace(stack.program, conv_impl="im2col", batched=False)
    return Pool([TorchStack(prog, stack.params, stack.names)])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pools", nargs="+", default=list(POOLS), choices=list(POOLS))
    ap.add_argument("--steps", type=int, default=None, help="PGD steps (default: per pool, POOLS)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batches", type=int, nargs="+", default=None, help="batch sizes (default: per pool)")
    ap.add_argument("--torch-threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--no-old", action="store_true", help="leave out the old-path contender of the residual pools")
    ap.add_argument("--quick", action="store_true", help="the first batch size, 2 steps, 3 repetitions")
    ap.add_argument("--out", default=None, help="JSON path (default: a temporary folder, never benchmarks/results/)")
    args = ap.parse_args()
    args.out = str(results_path("torch_pool_throughput.json", args.out, quick=args.quick))
    if args.quick and args.reps == ap.get_default("reps"):
        args.reps = 3

    import torch

    warnings.filterwarnings("ignore", category=FutureWarning)
    load_before = os.getloadavg()
    rows, convert = [], {}
    print(
        f"jax {jax.__version__} ({jax.devices()[0].platform}), torch {torch.__version__}, cpus {os.cpu_count()}, "
        f"reps={args.reps}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}",
        flush=True,
    )
    for pool_name in args.pools:
        build, m, shape, batches, steps = POOLS[pool_name]
        steps = 2 if args.quick else (args.steps or steps)
        batches = batches[:1] if args.quick else (args.batches or batches)
        models = build(m)
        t0 = time.perf_counter()
        pool = Pool.from_torch(models, input_shape=shape)
        convert[pool_name] = time.perf_counter() - t0
        (stack,) = pool.stacks
        fused = stack.program.fused_cnn is not None
        print(f"{pool_name}: {pool} converted in {convert[pool_name]:.1f} s; fused kernel: {fused}", flush=True)
        variants = {"sarjax[pool.apply]": pool}
        if fused:  # the same members op by op (the path before the fused mapping)
            variants["sarjax[op-by-op,im2col]"] = op_by_op_pool(stack, "im2col")
        elif not args.no_old:  # the path before the whole-batch channels-last one
            variants["sarjax[old:map,vmap,im2col]"] = old_path_pool(stack)
        for b in batches:
            rows.append(_row(pool_name, models, variants, shape, m, b, steps, args, torch))
            _write(args.out, rows, convert, load_before, torch.__version__)  # after every row


def _row(pool_name, models, variants, shape, m, b, steps, args, torch):
    x0 = jax.random.uniform(jax.random.PRNGKey(b), (b, *shape))
    pool = variants["sarjax[pool.apply]"]
    ref = jnp.argmax(pool.logits(x0), -1).T.astype(jnp.int32)  # [B, M]: each member's own prediction
    mask = jnp.ones((b, m), jnp.float32)
    runners = {}
    for name, p in variants.items():
        atk = make_joint_pgd(p.apply, eps=EPS, steps=steps, step=JointPGDStep(restarts=1))
        runners[name] = lambda atk=atk, params=p.params: jax.block_until_ready(
            atk(params, x0, ref, key=jax.random.PRNGKey(1), mask=mask).x_adv
        )
    tx0 = torch.from_numpy(np.array(np.asarray(x0).transpose(0, 3, 1, 2)))
    tref = torch.from_numpy(np.asarray(ref)).long()
    gen = torch.Generator().manual_seed(0)
    for th in args.torch_threads:

        def loop(th=th):
            torch.set_num_threads(th)
            return torch_joint_pgd_loop(models, tx0, tref, steps, EPS, EPS / 16, gen)

        def fvmap(th=th):
            torch.set_num_threads(th)
            return torch_joint_pgd_vmap(models, tx0, tref, steps, EPS, EPS / 16, gen)

        runners[f"torch_loop[t{th}]"] = loop
        runners[f"torch_func_vmap[t{th}]"] = fvmap
    # parity of every sarjax variant with the modules (the same weights), then warm-up (compiles)
    with torch.no_grad():
        zt = np.stack([mod(tx0).numpy() for mod in models])
    parity = {k: float(np.abs(np.asarray(p.logits(x0)) - zt).max()) for k, p in variants.items()}
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
    work = m * b * steps
    med = {k: statistics.median(v) for k, v in times.items()}
    thr = {k: work / v for k, v in med.items()}
    best_torch_name = max((k for k in thr if k.startswith("torch")), key=lambda k: thr[k])
    row = {
        "pool": pool_name,
        "B": b,
        "M": m,
        "steps": steps,
        "logit_parity_maxabs": parity,
        "first_call_seconds": compile_s,
        "seconds_median": med,
        "seconds_all": times,
        "member_sample_steps_per_s": thr,
        "fastest_torch": best_torch_name,
        "ratio_vs_fastest_torch": {k: thr[k] / thr[best_torch_name] for k in thr if k.startswith("sarjax")},
        "load_after_row": os.getloadavg(),
    }
    print(
        f"{pool_name} B={b:4d} | "
        + " | ".join(f"{k} {thr[k]:,.0f}/s" for k in thr)
        + f" | vs {best_torch_name}: "
        + ", ".join(f"{k} {v:.2f}x" for k, v in row["ratio_vs_fastest_torch"].items())
        + f" | parity {max(parity.values()):.1e} | load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    return row


def _write(path, rows, convert_s, load_before, torch_version):
    out = {
        "benchmark": "joint linf PGD on converted PyTorch pools (Pool.from_torch) vs PyTorch",
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "jax": jax.__version__,
        "torch": torch_version,
        "platform": jax.devices()[0].platform,
        "cpus": os.cpu_count(),
        "eps": EPS,
        "convert_seconds": convert_s,  # per pool
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
