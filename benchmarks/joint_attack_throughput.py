"""Joint PGD throughput: sarjax vs PyTorch on M=20 pools of MLPs and small CNNs.

Measures member-sample-steps per second (M * B * steps / seconds) of joint
linf PGD (the SAR paper's Table 1 attack: mean CE of the selected members,
sign steps of eps/16, projection around x0) for

  * sarjax ``make_joint_pgd`` over ``Pool.apply`` (one compiled call; conv
    formulations ``im2col`` and ``xla`` from ``sarjax.models.zoo``: ``xla`` is
    ``zoo._member_conv``, ordinary XLA convolutions per member instead of the
    grouped convolution that vmap makes; optionally ``shared``, written here:
    the first layer on the shared input as one im2col matmul for all members,
    which is what vmap already produces),
  * (a) a PyTorch loop over the 20 models, and
  * (b) ``torch.func`` vmap over stacked PyTorch models,

and, for the MLP pools, ``xla_matmuls_only``: the same number of steps reduced to their
matmuls (every layer's forward and input-gradient matmuls, nothing else; not an attack), an
upper bound on what any XLA formulation of the MLP step can reach with XLA's matmuls, and
``xla_matmuls_only+evals``: the same plus the matmuls of the two forward passes an attack call
makes besides its steps (the clean evaluation at x0 and the final evaluation that reports
success; one step's worth of matmuls per call); ``ratio_vs_matmul_floor`` in the JSON is sarjax's
throughput over each (>= 1: at least as fast),

and ``machine_sgemm_peak``: the fastest of PyTorch, JAX and NumPy on a 2048 x 2048 float32 matmul,
timed in the same round-robin (the best repetition, not the median, so the peak is not
understated).  With the analytic FLOPs of one member-sample-step
(:func:`sarjax.models.flops.step_flops`: the forward pass plus the gradient to the input, 2 x the
forward's multiply-adds, counted as 2 FLOPs each) it gives the machine's ceiling,
``peak / step_flops`` member-sample-steps/s, and the largest ratio vs the fastest PyTorch
baseline that ANY implementation doing the step's arithmetic could reach in this run
(``ceiling_ratio_vs_faster_torch``); each runner's GFLOP/s and share of the peak are reported
too,

with identical weights exported from JAX, the same steps, on the same cores
(PyTorch is run with 1 thread and with all CPU threads, since OpenMP
spin-waiting makes multi-threaded torch much slower on an oversubscribed
machine; the baseline is the fastest of the four torch variants), measured
alternately in one run (round-robin repetitions; the median of each is
reported).  Ratios are against the fastest PyTorch baseline.  Writes JSON.

Usage:
  PYTHONPATH=. python benchmarks/joint_attack_throughput.py --steps 5 --reps 3
  PYTHONPATH=. python benchmarks/joint_attack_throughput.py --jax-single-thread ...   # XLA on one thread
Output: JSON at ``--out`` (default: a temporary folder; ``--out
benchmarks/results/joint_attack_throughput.json`` replaces the committed result), with the run's
provenance (command, commit, machine, date, load) and the load averages before and after: the
machine is shared, compare only ratios from one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

# OpenMP worker threads that spin-wait (the default ACTIVE policy) make PyTorch's multi-threaded rows
# collapse when the cores are shared; PASSIVE (as benchmarks/train_throughput.py) keeps the 2-thread
# baseline honest. The environment's value wins; it must be set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

if "--jax-single-thread" in sys.argv:  # must be set before JAX initialises its CPU backend
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    )

import jax
import jax.numpy as jnp
import numpy as np
from _timing import provenance, results_path  # benchmarks/ is on sys.path when run as a script

from sarjax.attacks.joint import JointPGDStep, make_joint_pgd
from sarjax.models import zoo
from sarjax.models.flops import step_flops
from sarjax.models.pool import Pool, Stack

M = 20
EPS = 0.1
SETTLE_S = 0.5  # pause after each peak matmul block: OpenBLAS/MKL workers spin for ~0.1 s after a call


# ----------------------------------------------------------------------------- JAX side


def build_pool(family: str, conv_impl: str, seed: int = 0) -> Pool:
    arch = zoo.mlp() if family == "mlp" else zoo.cnn(conv_impl=conv_impl)
    return Pool((Stack.from_keys(arch, jax.random.split(jax.random.PRNGKey(seed), M)),))


def shared_first_layer_apply(arch):
    """CNN pool apply where layer 1 (on the input, shared by all members in a joint attack)
    is ONE im2col matmul against all members' kernels, then per-member im2col matmuls."""
    f = zoo.ACTIVATIONS[arch.act]

    def im2col(x, k):
        b, h, w, _ = x.shape
        pad = k // 2
        xp = jnp.pad(x, ((0, 0), (pad, k - 1 - pad), (pad, k - 1 - pad), (0, 0)))
        return jnp.concatenate([xp[:, i : i + h, j : j + w, :] for i in range(k) for j in range(k)], axis=-1)

    def apply(params, x):
        (p,) = params
        k = arch.kernel
        w0 = p["conv0"]["w"]  # [M, k, k, cin, c0]
        Mm, _, _, cin, c0 = w0.shape
        cols = im2col(x, k)  # [B, H, W, k*k*cin]
        z = jnp.einsum(
            "bhwk,kn->bhwn", cols, w0.reshape(Mm, k * k * cin, c0).transpose(1, 0, 2).reshape(k * k * cin, Mm * c0)
        )
        z = z.reshape(*z.shape[:3], Mm, c0) + p["conv0"]["b"]  # [B, H, W, M, c0]
        z = jnp.moveaxis(z, 3, 0)  # [M, B, H, W, c0]

        def rest(pm, z):
            z = zoo.max_pool2(f(z))
            for i in range(1, len(arch.widths)):
                z = zoo.max_pool2(f(zoo.conv2d(z, pm[f"conv{i}"], "im2col")))
            b = z.shape[0]
            z = f(z.reshape(b, -1) @ pm["dense"]["w"] + pm["dense"]["b"])
            return z @ pm["out"]["w"] + pm["out"]["b"]

        return jax.vmap(rest)(p, z)

    return apply


def mlp_matmul_only_steps(pool: Pool, steps: int, evals: bool = False):
    """A joint-PGD loop over an MLP pool that keeps ONLY the matmuls of each step (for reference).

    Per step: the forward matmuls of every layer of every member and the backward matmuls that
    carry the gradient to the input (no activations, loss, sign, projection or bookkeeping;
    x moves by a small multiple of its "gradient" so that the steps stay dependent).  Its
    throughput bounds what any XLA formulation of the step can reach with XLA's own matmuls.

    ``evals=True`` (the ``xla_matmuls_only+evals`` row) adds the matmuls of the two forward
    passes that one call of the attack makes besides its steps: every member's logits at ``x0``
    (the clean evaluation) and at the last iterate (the final evaluation, which reports success);
    the PyTorch baselines make neither.
    """
    (stack,) = pool.stacks
    prep = stack.prepare(stack.params)
    w1 = prep["_dense0_cat"]  # [D, M*H]
    ws = [prep[f"dense{i}"]["w"] for i in range(1, len(stack.arch.widths))] + [prep["out"]["w"]]

    def forward(x):
        b = x.shape[0]
        h = jnp.moveaxis((x.reshape(b, -1) @ w1).reshape(b, M, -1), 1, 0)  # [M, B, H]
        for w in ws:
            h = jnp.einsum("mbh,mhn->mbn", h, w)
        return h

    @jax.jit
    def run(x0):
        b = x0.shape[0]

        def body(x, _):
            g = forward(x)
            for w in reversed(ws):
                g = jnp.einsum("mbn,mhn->mbh", g, w)
            gx = jnp.moveaxis(g, 0, 1).reshape(b, -1) @ w1.T
            return x + 1e-6 * gx.reshape(x.shape), None

        x = x0 + 1e-6 * jnp.sum(forward(x0)) if evals else x0
        x = jax.lax.scan(body, x, None, length=steps)[0]
        return x + 1e-6 * jnp.sum(forward(x)) if evals else x

    return run


def sgemm_peak_runners(n: int = 2048, calls: int = 3) -> tuple[dict, int]:
    """Runners of ``calls`` float32 ``[n, n] @ [n, n]`` matmuls in PyTorch, JAX and NumPy (2 n^3 FLOPs each)."""
    import torch

    rng = np.random.default_rng(0)
    a, b = rng.random((n, n), dtype=np.float32), rng.random((n, n), dtype=np.float32)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    ja, jb = jnp.asarray(a), jnp.asarray(b)
    mm = jax.jit(jnp.matmul)

    def rep(f):
        def run():
            for _ in range(calls):
                f()

        return run

    return {
        "torch": rep(lambda: ta @ tb),
        "jax": rep(lambda: mm(ja, jb).block_until_ready()),
        "numpy": rep(lambda: a @ b),
    }, calls * 2 * n**3


# ----------------------------------------------------------------------------- torch side


def torch_models(pool: Pool, family: str):
    import torch
    from torch import nn

    (stack,) = pool.stacks
    P = jax.tree.map(np.asarray, stack.params)
    arch = stack.arch
    models = []
    for m in range(M):
        if family == "mlp":
            layers, fan = [nn.Flatten()], 28 * 28
            for i, w in enumerate(arch.widths):
                lin = nn.Linear(fan, w)
                lin.weight.data = torch.tensor(P[f"dense{i}"]["w"][m].T.copy())
                lin.bias.data = torch.tensor(P[f"dense{i}"]["b"][m].copy())
                layers += [lin, nn.ReLU()]
                fan = w
            out = nn.Linear(fan, 10)
            out.weight.data = torch.tensor(P["out"]["w"][m].T.copy())
            out.bias.data = torch.tensor(P["out"]["b"][m].copy())
            model = nn.Sequential(*layers, out)
        else:
            layers, cin = [], 1
            for i, c in enumerate(arch.widths):
                conv = nn.Conv2d(cin, c, arch.kernel, padding=arch.kernel // 2)
                conv.weight.data = torch.tensor(P[f"conv{i}"]["w"][m].transpose(3, 2, 0, 1).copy())
                conv.bias.data = torch.tensor(P[f"conv{i}"]["b"][m].copy())
                layers += [conv, nn.ReLU(), nn.MaxPool2d(2)]
                cin = c
            dense = nn.Linear(7 * 7 * cin, arch.dense)
            dense.weight.data = torch.tensor(P["dense"]["w"][m].T.copy())
            dense.bias.data = torch.tensor(P["dense"]["b"][m].copy())
            out = nn.Linear(arch.dense, 10)
            out.weight.data = torch.tensor(P["out"]["w"][m].T.copy())
            out.bias.data = torch.tensor(P["out"]["b"][m].copy())
            model = nn.Sequential(*layers, NHWCFlatten(), dense, nn.ReLU(), out)
        for q in model.parameters():
            q.requires_grad_(False)
        models.append(model.eval())
    return models


def _make_nhwc_flatten():
    from torch import nn

    class NHWCFlatten(nn.Module):
        """Flatten NCHW activations in JAX's NHWC order (so dense weights match)."""

        def forward(self, z):
            return z.permute(0, 2, 3, 1).reshape(z.shape[0], -1)

    return NHWCFlatten


NHWCFlatten = None


def to_torch_input(x, family):
    import torch

    x = torch.tensor(np.asarray(x))
    return x.permute(0, 3, 1, 2).contiguous() if family == "cnn" else x


def torch_joint_pgd_loop(models, x0, ref, steps, eps, alpha, gen):
    import torch
    import torch.nn.functional as F

    x = (x0 + (torch.rand(x0.shape, generator=gen) * 2 - 1) * eps).clamp(0, 1)
    for _ in range(steps):
        x.requires_grad_(True)
        loss = sum(F.cross_entropy(m(x), ref[:, i], reduction="sum") for i, m in enumerate(models)) / len(models)
        (g,) = torch.autograd.grad(loss, x)
        with torch.no_grad():
            x = torch.min(torch.max(x + alpha * g.sign(), x0 - eps), x0 + eps).clamp(0, 1)
    return x.detach()


def torch_joint_pgd_vmap(models, x0, ref, steps, eps, alpha, gen):
    import torch
    import torch.nn.functional as F
    from torch.func import functional_call, stack_module_state, vmap

    params, buffers = stack_module_state(models)
    base = models[0]

    def one(p, b, x):
        return functional_call(base, (p, b), (x,))

    fwd = vmap(one, in_dims=(0, 0, None))
    x = (x0 + (torch.rand(x0.shape, generator=gen) * 2 - 1) * eps).clamp(0, 1)
    for _ in range(steps):
        x.requires_grad_(True)
        logits = fwd(params, buffers, x)  # [M, B, C]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ref.T.reshape(-1), reduction="sum") / len(models)
        (g,) = torch.autograd.grad(loss, x)
        with torch.no_grad():
            x = torch.min(torch.max(x + alpha * g.sign(), x0 - eps), x0 + eps).clamp(0, 1)
    return x.detach()


# ----------------------------------------------------------------------------- main


def main():
    global NHWCFlatten
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--families", nargs="+", default=["mlp", "cnn"])
    ap.add_argument("--out", default=None, help="JSON path (default: a temporary folder, never benchmarks/results/)")
    ap.add_argument(
        "--conv-impls",
        nargs="+",
        default=["im2col", "xla", "fused"],
        help="CNN formulations measured: im2col, xla (zoo._member_conv), fused (sarjax.models.fused), shared",
    )
    ap.add_argument(
        "--torch-threads",
        type=int,
        nargs="+",
        default=[1, os.cpu_count() or 1],
        help="torch.set_num_threads variants measured (the fastest is the baseline)",
    )
    ap.add_argument(
        "--matmul-only",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time the MLP step reduced to its matmuls (xla_matmuls_only; not an attack)",
    )
    ap.add_argument(
        "--peak",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time a 2048^2 float32 matmul in torch, JAX and NumPy in the same round-robin: "
        "the machine's peak and the ceiling it implies for any implementation of the step",
    )
    ap.add_argument(
        "--jax-single-thread",
        action="store_true",
        help="run XLA's CPU backend single-threaded (faster on an oversubscribed machine)",
    )
    args = ap.parse_args()
    args.out = str(results_path("joint_attack_throughput.json", args.out))

    import torch

    NHWCFlatten = _make_nhwc_flatten()
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    print(
        f"jax {jax.__version__} ({jax.devices()[0].platform}), torch {torch.__version__}, "
        f"threads {threads}, M={M}, steps={args.steps}, reps={args.reps}"
    )
    load_before = os.getloadavg()
    results = []
    peak_runners, peak_flops = sgemm_peak_runners() if args.peak else ({}, 0)
    for family in args.families:
        base_pool = build_pool(family, "im2col")
        if family == "mlp":
            pools = {"dense": base_pool}
        else:
            pools = {"im2col": base_pool} if "im2col" in args.conv_impls else {}
        for impl in ("xla", "fused"):
            if family == "cnn" and impl in args.conv_impls:
                pools[impl] = build_pool(family, impl)  # same keys -> same weights
        models = torch_models(base_pool, family)
        for B in args.batches:
            x0 = jax.random.uniform(jax.random.PRNGKey(B), (B, 28, 28, 1))
            ref = jnp.argmax(base_pool.logits(x0), -1).T.astype(jnp.int32)  # [B, M] own predictions
            mask = jnp.ones((B, M), jnp.float32)
            runners = {}
            for impl, pool in pools.items():
                atk = make_joint_pgd(pool.apply, eps=EPS, steps=args.steps, step=JointPGDStep(restarts=1))
                runners[f"sarjax[{impl}]"] = lambda atk=atk, pool=pool: jax.block_until_ready(
                    atk(pool.params, x0, ref, key=jax.random.PRNGKey(1), mask=mask).x_adv
                )
            if family == "mlp" and args.matmul_only:
                mm = mlp_matmul_only_steps(base_pool, args.steps)
                runners["xla_matmuls_only"] = lambda mm=mm: jax.block_until_ready(mm(x0))
                mme = mlp_matmul_only_steps(base_pool, args.steps, evals=True)
                runners["xla_matmuls_only+evals"] = lambda mm=mme: jax.block_until_ready(mm(x0))
            if family == "cnn" and "shared" in args.conv_impls:
                sh_apply = shared_first_layer_apply(base_pool.stacks[0].arch)
                atk = make_joint_pgd(sh_apply, eps=EPS, steps=args.steps, step=JointPGDStep(restarts=1))
                runners["sarjax[shared]"] = lambda atk=atk: jax.block_until_ready(
                    atk(base_pool.params, x0, ref, key=jax.random.PRNGKey(1), mask=mask).x_adv
                )
            tx0 = to_torch_input(x0, family)
            tref = torch.tensor(np.asarray(ref)).long()
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
            if args.peak:
                for lib, f in peak_runners.items():

                    def peak(f=f, lib=lib):
                        if lib == "torch":
                            torch.set_num_threads(threads)
                        f()

                    runners[f"machine_sgemm_peak[{lib}]"] = peak
            # parity check of the formulations (logits), then warm-up (compiles)
            zj = np.asarray(base_pool.logits(x0))
            with torch.no_grad():
                zt = np.stack([m(tx0).numpy() for m in models])
            parity = float(np.abs(zj - zt).max())
            for pool in pools.values():
                parity = max(parity, float(np.abs(zj - np.asarray(pool.logits(x0))).max()))
            if family == "cnn" and "shared" in args.conv_impls:
                zs = np.asarray(jax.jit(shared_first_layer_apply(base_pool.stacks[0].arch))(base_pool.params, x0))
                parity = max(parity, float(np.abs(zj - zs).max()))
            for r in runners.values():
                r()
            times = {k: [] for k in runners}
            for _ in range(args.reps):  # alternate: one of each per repetition
                for k, r in runners.items():
                    t = time.perf_counter()
                    r()
                    times[k].append(time.perf_counter() - t)
                    if k.startswith("machine_sgemm_peak"):
                        time.sleep(SETTLE_S)  # untimed: let the BLAS worker threads stop spinning
            work = M * B * args.steps
            peak_times = {k: times.pop(k) for k in list(times) if k.startswith("machine_sgemm_peak")}
            med = {k: statistics.median(v) for k, v in times.items()}
            thr = {k: work / v for k, v in med.items()}
            best_torch = max(v for k, v in thr.items() if k.startswith("torch"))
            flops = step_flops(base_pool.stacks[0].arch)
            row = {
                "family": family,
                "B": B,
                "M": M,
                "steps": args.steps,
                "logit_parity_maxabs": parity,
                "seconds_median": med,
                "member_sample_steps_per_s": thr,
                "ratio_vs_faster_torch": {k: thr[k] / best_torch for k in thr if k.startswith(("sarjax", "xla"))},
                # sarjax vs the in-run matmul floors (MLP with --matmul-only): >= 1 means at least as fast
                "ratio_vs_matmul_floor": {
                    f"{k} / {f}": thr[k] / thr[f]
                    for k in thr
                    if k.startswith("sarjax")
                    for f in thr
                    if f.startswith("xla_")
                },
                "step_flops_per_member_sample": flops,
                "step_gflops": {k: v * flops / 1e9 for k, v in thr.items()},
            }
            if peak_times:
                peak_gflops = {k: peak_flops / min(v) / 1e9 for k, v in peak_times.items()}
                peak = max(peak_gflops.values())
                ceiling = peak * 1e9 / flops
                row.update(
                    {
                        "machine_sgemm_peak_gflops": peak_gflops,
                        "share_of_peak": {k: v / peak for k, v in row["step_gflops"].items()},
                        "ceiling_member_sample_steps_per_s": ceiling,
                        "ceiling_ratio_vs_faster_torch": ceiling / best_torch,
                    }
                )
            results.append(row)
            print(
                f"{family:4s} B={B:4d} | "
                + " | ".join(f"{k} {thr[k]:,.0f}/s" for k in thr)
                + " | ratio vs faster torch: "
                + ", ".join(f"{k} {v:.2f}x" for k, v in row["ratio_vs_faster_torch"].items())
                + "".join(f" | {k} {v:.2f}x" for k, v in row["ratio_vs_matmul_floor"].items())
                + f" | parity {parity:.1e} | load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            if peak_times:
                print(
                    f"          step {flops:,} FLOPs per member-sample | GFLOP/s (share of peak): "
                    + ", ".join(f"{k} {v:.0f} ({row['share_of_peak'][k]:.0%})" for k, v in row["step_gflops"].items())
                    + f" | sgemm peak {peak:.0f} GFLOP/s ("
                    + ", ".join(f"{k.split('[')[1][:-1]} {v:.0f}" for k, v in peak_gflops.items())
                    + f") -> ceiling {ceiling:,.0f}/s = {row['ceiling_ratio_vs_faster_torch']:.2f}x the fastest torch",
                    flush=True,
                )
    with open(args.out, "w") as fh:
        json.dump(
            {
                "jax": jax.__version__,
                "torch": torch.__version__,
                "threads": threads,
                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                "jax_single_thread": args.jax_single_thread,
                "xla_flags": os.environ.get("XLA_FLAGS", ""),
                "command": " ".join(sys.argv),
                "loadavg_before": load_before,
                "loadavg_after": os.getloadavg(),
                "results": results,
                "provenance": provenance(),  # command, commit, machine, date, load
            },
            fh,
            indent=2,
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
