"""Adversarial-training throughput: PGD-AT of an M = 8 pool of small CNNs, sarjax vs PyTorch.

Every contender trains the same 8 members (the presets' CNN, ``zoo.cnn((8, 16), dense=64)``)
from the same initial parameters, on the same data (the embedded 4,000-image MNIST train split)
with the same per-member batch order, batch size, number of updates, optimiser (AdamW, lr 2e-3,
weight decay 0: the ``MemberConfig`` default) and objective, PGD-AT (Madry et al. 2018): per
update, linf PGD at eps 0.1 from a uniform random start in the ball, 10 steps of eps/4 (sign of
the input gradient of the mean cross-entropy, projection onto the ball and [0, 1]), then the
AdamW step on the cross-entropy at the adversarial batch.

- ``sarjax[fused]``: the compiled epoch of ``sarjax.models.train`` (``_make_epoch_fn``, the kernel
  ``train_stack`` runs once per epoch) with ``objective=sarjax.defenses.pgd_at(eps=0.1)``: ONE
  program, ``lax.scan`` over the updates of the member update ``vmap``-ed over the 8 members,
  the attack through ``make_pgd``'s jit-safe entry. ``conv_impl="fused"``: the inner attack's
  forward pass and input gradient run ``sarjax.models.fused_members`` (members on their own
  inputs, one unrolled member scan, hand-written input gradient); the AdamW step's parameter
  gradient runs ``arch.apply``.
- ``sarjax[im2col]`` (unless ``--no-im2col``): the same program with the default
  ``conv_impl="im2col"`` (vmapped im2col convolutions everywhere), for reference.
- ``torch_loop[tN]``: a Python loop over members and updates, ``torch.nn`` twins of the same
  architecture loaded with the same initial params, the same attack written in PyTorch
  (``torch.autograd.grad`` to the input), ``torch.optim.AdamW``; ``torch.set_num_threads(N)`` for
  N in ``--torch-threads`` (default 1 and 2). The faster is the baseline.

sarjax's PGD additionally evaluates the clean batch and the final iterate (2 forward passes per
update, for its query accounting and best-of choice; x_adv is the final iterate unless the clean
point has the higher loss); the torch loop does not.

Before timing, the torch twins' logits are checked against ``Arch.apply``; after the warm-up
run, every contender's final members are evaluated on 500 test images (clean accuracy, and
robust accuracy under 10-step PGD at eps 0.1 by sarjax's ``make_pgd``), so the table compares
the same work. The contenders then run alternately for ``--reps`` rounds (one of each per
round); the median of each is reported as member-sample updates per second
(M * updates * batch / seconds), with ratios against the faster torch loop. The machine may be
shared: load averages before and after are recorded; compare ratios from one run only.

``OMP_WAIT_POLICY`` defaults to ``PASSIVE`` (as in benchmarks/train_throughput.py).

Usage:
  python benchmarks/adv_training_throughput.py                       # B=64, 8 updates, 5 rounds
  python benchmarks/adv_training_throughput.py --batch 128 --updates 4 --reps 3
Output: JSON at ``--out`` (default: a temporary folder; ``--out
benchmarks/results/adv_training_throughput.json`` replaces the committed result), with the run's
provenance (command, commit, machine, date, load).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported
if "--jax-single-thread" in sys.argv:  # must be set before JAX initialises its CPU backend
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    )

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import provenance, results_path  # noqa: E402
from train_throughput import _numpy_init, load_jax_params, torch_module  # noqa: E402  (the torch twin of an Arch)

from sarjax.attacks import PGDStep, make_pgd  # noqa: E402
from sarjax.data.mnist import load_mnist  # noqa: E402
from sarjax.defenses import pgd_at  # noqa: E402
from sarjax.models import zoo  # noqa: E402
from sarjax.models.train import _make_epoch_fn  # noqa: E402

M = 8
EPS = 0.1
ATTACK_STEPS = 10
REL_STEP = 0.25
LR = 2e-3
ARCH = zoo.cnn((8, 16), dense=64)  # sarjax.models.presets.BASE_ARCH


class Setup:
    """What every contender shares: data, per-member batch order, initial params, keys."""

    def __init__(self, batch: int, updates: int, seed: int = 0):
        data = load_mnist()
        self.x, self.y = data.x_train, data.y_train
        self.x_test, self.y_test = data.x_test[:500], data.y_test[:500]
        self.batch, self.updates = batch, updates
        rng = np.random.default_rng(seed)
        n = len(self.x)
        per = [
            np.resize(np.concatenate([rng.permutation(n) for _ in range(-(-updates * batch // n))]), updates * batch)
            for _ in range(M)
        ]
        self.idx = np.stack(per).reshape(M, updates, batch).transpose(1, 0, 2).astype(np.int32)  # [updates, M, B]
        self.params0 = _numpy_init(ARCH, M, rng)
        base = jnp.stack([jax.random.key(seed * 1000 + m) for m in range(M)])
        fold = jax.vmap(
            lambda k: jax.vmap(lambda s: jax.random.fold_in(jax.random.fold_in(k, 0), s))(jnp.arange(updates))
        )
        self.keys = jax.jit(fold)(base).T  # [updates, M], as train_stack
        jax.block_until_ready((self.params0, self.keys))


def make_sarjax(st: Setup, conv_impl: str):
    """The trainer's compiled epoch with the PGD-AT objective over all M members."""
    arch = dataclasses.replace(ARCH, conv_impl=conv_impl)
    tx = optax.inject_hyperparams(optax.adamw)(learning_rate=1e-3, weight_decay=0.0)
    epoch = _make_epoch_fn(
        arch, False, tx, dropout=False, objective=pgd_at(eps=EPS, steps=ATTACK_STEPS, rel_step=REL_STEP)
    )

    def init_state(p):
        s = tx.init(p)
        s.hyperparams["learning_rate"] = jnp.asarray(LR, jnp.float32)
        s.hyperparams["weight_decay"] = jnp.asarray(0.0, jnp.float32)
        return s

    opt0 = jax.vmap(init_state)(st.params0)
    hp = {"aug": jnp.zeros(M), "ls": jnp.zeros(M), "dropout": jnp.zeros(M), "obj": {"eps": jnp.full(M, EPS)}}
    xd, yd = jnp.asarray(st.x), jnp.asarray(np.eye(10, dtype=np.float32)[st.y])
    idx, active = jnp.asarray(st.idx), jnp.ones(M, bool)
    jax.block_until_ready((opt0, xd, yd, idx))

    def run():
        p, _, loss = epoch(st.params0, opt0, xd, yd, idx, st.keys, hp, active, masked=False)
        jax.block_until_ready((p, loss))
        return p

    return run


def make_torch_loop(st: Setup, threads: int):
    """PGD-AT in PyTorch: a loop over members and updates (fresh modules and optimisers from the
    shared init each run, untimed)."""
    import torch
    import torch.nn.functional as F

    p0 = [jax.tree.map(lambda a, i=i: np.asarray(a[i]), st.params0) for i in range(M)]
    xt = torch.from_numpy(np.ascontiguousarray(st.x.transpose(0, 3, 1, 2)))
    yt = torch.from_numpy(st.y.astype(np.int64))
    idx = torch.from_numpy(st.idx.astype(np.int64))
    models = [torch_module(ARCH) for _ in range(M)]
    alpha = REL_STEP * EPS

    def run():
        torch.set_num_threads(threads)
        for mod, p in zip(models, p0):
            load_jax_params(ARCH, p, mod)
        opts = [torch.optim.AdamW(mod.parameters(), lr=LR, weight_decay=0.0) for mod in models]
        gen = torch.Generator().manual_seed(0)
        t = time.perf_counter()
        for i in range(M):
            mod, opt = models[i], opts[i]
            for s in range(st.updates):
                ib = idx[s, i]
                x0, yb = xt[ib], yt[ib]
                x = (x0 + (torch.rand(x0.shape, generator=gen) * 2 - 1) * EPS).clamp(0, 1)
                for _ in range(ATTACK_STEPS):
                    x.requires_grad_(True)
                    (g,) = torch.autograd.grad(F.cross_entropy(mod(x), yb), x)
                    x = torch.min(torch.max(x.detach() + alpha * g.sign(), x0 - EPS), x0 + EPS).clamp(0, 1)
                loss = F.cross_entropy(mod(x), yb)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        run.seconds = time.perf_counter() - t
        return models

    return run


def stacked_from_torch(models) -> dict:
    from train_throughput import jax_params_of

    ps = [jax_params_of(ARCH, m) for m in models]
    return jax.tree.map(lambda *v: jnp.stack([jnp.asarray(a) for a in v]), *ps)


def evaluate(st: Setup, params) -> dict:
    """Mean clean and robust accuracy (10-step PGD, linf eps 0.1) of the M members on 500 test images."""
    x, y = jnp.asarray(st.x_test), jnp.asarray(st.y_test)
    apply = lambda p, z: jax.vmap(ARCH.apply, in_axes=(0, None))(p, z)
    clean = float((jnp.argmax(apply(params, x), -1) == y[None]).mean())
    res = make_pgd(apply, eps=EPS, steps=10, step=PGDStep(rel_step=REL_STEP))(params, x, y, key=jax.random.key(1))
    return {"clean_acc": clean, "robust_acc_pgd10": float(1.0 - np.asarray(res.success).mean())}


def check_twin(st: Setup) -> float:
    """Max |logits_torch - logits_jax| of member 0 at init on 64 images; raises if > 1e-3."""
    import torch

    p = jax.tree.map(lambda a: np.asarray(a[0]), st.params0)
    mod = torch_module(ARCH)
    load_jax_params(ARCH, p, mod)
    xb = st.x[:64]
    with torch.no_grad():
        lt = mod(torch.from_numpy(np.ascontiguousarray(xb.transpose(0, 3, 1, 2)))).numpy()
    err = float(np.abs(lt - np.asarray(jax.jit(ARCH.apply)(p, jnp.asarray(xb)))).max())
    if err > 1e-3:
        raise RuntimeError(f"torch twin disagrees with Arch.apply: max |logit diff| {err:.2e}")
    return err


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64, help="per-member batch size (default 64)")
    ap.add_argument("--updates", type=int, default=8, help="PGD-AT updates per member per run (default 8)")
    ap.add_argument("--reps", type=int, default=5, help="timed rounds (default 5)")
    ap.add_argument("--torch-threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--no-im2col", action="store_true", help="skip the sarjax[im2col] reference contender")
    ap.add_argument(
        "--jax-single-thread",
        action="store_true",
        help="run XLA's CPU backend single-threaded (as benchmarks/joint_attack_throughput.py)",
    )
    ap.add_argument("--out", default=None, help="JSON path (default: a temporary folder, never benchmarks/results/)")
    a = ap.parse_args(argv)
    a.out = str(results_path("adv_training_throughput.json", a.out))
    if a.batch < 1 or a.updates < 1 or a.reps < 1:
        ap.error(f"--batch, --updates and --reps must be >= 1, got {a.batch}, {a.updates}, {a.reps}")

    import torch

    load0 = os.getloadavg()
    t0 = time.time()
    print(
        f"jax {jax.__version__}, torch {torch.__version__}, cpus {os.cpu_count()}, M={M}, batch {a.batch}, "
        f"{a.updates} updates, PGD-AT linf eps {EPS} x {ATTACK_STEPS} steps of eps/4, load {load0[0]:.1f}",
        flush=True,
    )
    st = Setup(a.batch, a.updates)
    twin = check_twin(st)
    runners = {"sarjax[fused]": make_sarjax(st, "fused")}
    if not a.no_im2col:
        runners["sarjax[im2col]"] = make_sarjax(st, "im2col")
    for th in a.torch_threads:
        runners[f"torch_loop[t{th}]"] = make_torch_loop(st, th)

    warm, quality = {}, {}
    for name, fn in runners.items():  # warm-up (compiles) and the same-work check
        t = time.perf_counter()
        out = fn()
        warm[name] = time.perf_counter() - t
        quality[name] = evaluate(st, out if name.startswith("sarjax") else stacked_from_torch(out))
        print(f"  warm-up {name}: {warm[name]:.1f} s, {quality[name]}", flush=True)
    quality["init"] = evaluate(st, st.params0)

    times = {k: [] for k in runners}
    for r in range(a.reps):  # alternate: one of each per round
        for name, fn in runners.items():
            t = time.perf_counter()
            fn()
            times[name].append(getattr(fn, "seconds", time.perf_counter() - t))
        print(
            f"  round {r + 1}/{a.reps}: "
            + "  ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items())
            + f"  load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    work = M * a.updates * a.batch
    med = {k: statistics.median(v) for k, v in times.items()}
    thr = {k: work / v for k, v in med.items()}
    best_torch = max(v for k, v in thr.items() if k.startswith("torch"))
    ratios = {k: thr[k] / best_torch for k in thr if k.startswith("sarjax")}
    print("\nmember-sample updates/s (PGD-AT, 10 attack steps each; higher is better)")
    for k in thr:
        print(
            f"  {k:16s} {thr[k]:9.0f}/s  median {med[k]:.2f} s"
            + (f"  {ratios[k]:.2f}x the faster torch loop" if k in ratios else "")
        )
    res = {
        "settings": {
            "members": M,
            "arch": ARCH.spec(),
            "batch": a.batch,
            "updates": a.updates,
            "reps": a.reps,
            "objective": pgd_at(eps=EPS, steps=ATTACK_STEPS, rel_step=REL_STEP).spec(),
            "optimizer": f"AdamW lr={LR} weight_decay=0",
            "torch_threads": a.torch_threads,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "jax_single_thread": a.jax_single_thread,
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "data": "embedded MNIST train split",
            "command": " ".join(
                ["python", "benchmarks/adv_training_throughput.py", *(argv if argv is not None else sys.argv[1:])]
            ),
        },
        "member_sample_updates_per_run": work,
        "median_seconds": med,
        "member_sample_updates_per_s": thr,
        "ratio_vs_faster_torch": ratios,
        "seconds_per_round": times,
        "warmup_seconds_incl_compile": warm,
        "equivalence": {"torch_twin_init_logits_max_abs_diff": twin, "after_warmup_run_500_test_images": quality},
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "jax": jax.__version__,
            "torch": torch.__version__,
            "loadavg_before": load0,
            "loadavg_after": os.getloadavg(),
            "wall_seconds": time.time() - t0,
        },
    }
    res["provenance"] = provenance()  # command, commit, machine, date, load
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"wrote {out} (load average before {load0[0]:.1f}, after {os.getloadavg()[0]:.1f})")
    return res


if __name__ == "__main__":
    main()
