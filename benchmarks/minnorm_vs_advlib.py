"""sarjax minimum-norm attacks vs adv-lib (PyTorch, CPU) on MNIST pool members.

Trains two MLP members on the embedded MNIST split (one standard, one
adversarially trained with sarjax's PGD, linf eps 0.1), exports the same
weights to a PyTorch module, and runs every attack both libraries share, per
norm, on the same correctly classified test samples at the same query cap:
median best norm (``inf`` counts as failure), success rate and wall time.
sarjax attacks both members in one vmapped call (``minnorm.make(..., stacked=True)``);
adv-lib loops over them.  sarjax is timed warm (a first call compiles), the
two libraries alternately in the same run; adv-lib runs once at each ``--threads`` torch thread
count (default 1 and 2) and the speedup is against the faster of them.

``--affine`` also runs both libraries on the known-answer affine instances
of the tests (exact optimum known) and prints norm / optimum.

Needs ``pip install adv-lib torch==2.13.0`` (adv-lib's optional visdom /
torchvision imports are stubbed when missing: no attack used here needs them).

The JSON records the load average (``os.getloadavg()``) at the start, at the end and at every
sarjax timing, and CPU time (``time.process_time``, every thread) beside wall time: on a shared,
oversubscribed machine wall time mostly measures the other processes.

Usage:
  python benchmarks/minnorm_vs_advlib.py --quick       # a few minutes: 16 samples, 200 queries, 4 cases
  python benchmarks/minnorm_vs_advlib.py [--n 64] [--queries 1000] [--affine] [--attacks fmn,fab]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import types
from pathlib import Path

import numpy as np
from _timing import add_torch_threads_argument, provenance, results_path  # benchmarks/ is on sys.path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch threads must not spin on a shared CPU


def _import_advlib():
    for name in ("torchvision", "visdom"):
        try:
            __import__(name)
        except Exception:  # adv-lib imports these at module level for LPIPS / logging only
            m = types.ModuleType(name)
            m.models = None
            m.Visdom = object
            sys.modules[name] = m
    import torch
    from adv_lib.attacks import alma, ddn, fab, fmn, pdgd, pdpgd, sigma_zero

    return torch, dict(alma=alma, ddn=ddn, fab=fab, fmn=fmn, pdgd=pdgd, pdpgd=pdpgd, sigma_zero=sigma_zero)


def _advlib_call(call, model, x0, y, torch):
    """Runs an adv-lib attack; on an adv-lib exception returns x0 (counted as failures)."""
    try:
        return call["fn"](model, torch.tensor(x0), torch.tensor(y).long(), **call["kw"]).detach(), ""
    except Exception as e:  # e.g. adv-lib's FMN-l0 topk(k=0) when every radius collapsed to 0
        return torch.tensor(x0), f"{type(e).__name__}: {e}"


def _norm(d, p):
    d = d.reshape(d.shape[0], -1).astype(np.float64)
    if p == 0:
        return (np.abs(d) > 0).sum(1).astype(np.float64)
    if p == 1:
        return np.abs(d).sum(1)
    if p == 2:
        return np.sqrt((d * d).sum(1))
    return np.abs(d).max(1)


def train_members(seed=0, epochs=4, at_eps=0.1, n_train=None):
    import jax
    import jax.numpy as jnp
    import optax

    from sarjax.attacks.pgd import make_pgd
    from sarjax.data.mnist import load_mnist
    from sarjax.models import zoo

    data = load_mnist()
    arch = zoo.mlp(widths=(128,))
    tx = optax.adam(1e-3)

    def loss(params, x, y):
        logits = arch.apply(params, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    @jax.jit
    def step(params, opt, x, y):
        g = jax.grad(loss)(params, x, y)
        upd, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, upd), opt

    pgd = make_pgd(lambda p, x: arch.apply(p, x), norm="linf", eps=at_eps, steps=10, audit=False)
    members = []
    for adv in (False, True):
        params = arch.init(jax.random.key(seed + int(adv)))
        opt = tx.init(params)
        rng = np.random.default_rng(seed)
        for ep in range(epochs):
            perm = rng.permutation(len(data.y_train))[:n_train]
            for i in range(0, len(perm) - 127, 128):
                idx = perm[i : i + 128]
                x, y = data.x_train[idx], data.y_train[idx]
                if adv and ep > 0:  # one clean warm-up epoch, then PGD-AT (Madry et al. 2018)
                    x = np.asarray(pgd(params, x, y, key=jax.random.key(ep * 10000 + i)).x_adv)
                params, opt = step(params, opt, jnp.asarray(x), jnp.asarray(y))
        acc = float((np.asarray(arch.apply(params, data.x_test)).argmax(-1) == data.y_test).mean())
        members.append((params, acc))
    return arch, members, data


def torch_mlp(torch, params):
    W0, b0 = (torch.tensor(np.asarray(params["dense0"][k])) for k in ("w", "b"))
    W1, b1 = (torch.tensor(np.asarray(params["out"][k])) for k in ("w", "b"))
    return lambda x: torch.relu(x.flatten(1) @ W0 + b0) @ W1 + b1


# --quick: one norm per attack
QUICK = {"fmn": 2, "ddn": 2, "pdgd": 2, "fab": math.inf}


# attack name -> (sarjax module name, norms, sarjax spec kwargs, adv-lib call builder)
def _cases(C, T):
    fab_iter = (T - 1) // (C + 1)
    s2 = T // 2
    return [
        ("fmn", [0, 1, 2, math.inf], {}, lambda a, p: dict(fn=a["fmn"], kw=dict(norm=p, steps=s2))),
        ("ddn", [2], {}, lambda a, p: dict(fn=a["ddn"], kw=dict(steps=s2, levels=None))),
        ("alma", [1, 2], {}, lambda a, p: dict(fn=a["alma"], kw=dict(distance=f"l{int(p)}", num_steps=s2))),
        ("pdgd", [2], {}, lambda a, p: dict(fn=a["pdgd"], kw=dict(num_steps=s2))),
        (
            "pdpgd",
            [0, 1, 2, math.inf],
            {},
            lambda a, p: dict(
                fn=a["pdpgd"], kw=dict(norm=p, num_steps=s2, **({"proximal_operator": 23} if p == 0 else {}))
            ),
        ),
        ("sigma_zero", [0], {}, lambda a, p: dict(fn=a["sigma_zero"], kw=dict(num_steps=s2))),
        ("fab", [1, 2, math.inf], {}, lambda a, p: dict(fn=a["fab"], kw=dict(norm=p, n_iter=fab_iter))),
    ]


def _spec(name, **kw):
    import importlib

    return importlib.import_module(f"sarjax.attacks.{name}").spec(**kw)


def run_mnist(args, torch, adv):
    import jax
    import jax.numpy as jnp

    from sarjax.attacks import minnorm as mn

    t0 = time.time()
    arch, members, data = train_members(epochs=args.epochs, n_train=args.train_samples)
    print(
        f"trained 2 MLP members in {time.time() - t0:.0f}s: test acc standard {members[0][1]:.3f}, "
        f"PGD-AT {members[1][1]:.3f}"
    )
    params = jax.tree.map(lambda *xs: jnp.stack(xs), *[m[0] for m in members])
    tmods = [torch_mlp(torch, m[0]) for m in members]
    x_all, y_all = data.x_test, data.y_test
    ok = np.ones(len(y_all), bool)
    for m, tm in zip(members, tmods):
        pj = np.asarray(arch.apply(m[0], x_all))
        pt = tm(torch.tensor(x_all)).detach().numpy()
        assert np.abs(pj - pt).max() < 1e-3, "exported weights disagree"
        ok &= pj.argmax(-1) == y_all
    idx = np.flatnonzero(ok)[: args.n]
    x0, y = x_all[idx], y_all[idx].astype(np.int32)
    T = args.queries
    rows = []
    only = {a for a in args.attacks.split(",") if a}
    for name, norms, skw, tcall in _cases(10, T):
        if only and name not in only:
            continue
        for p in norms:
            if args.quick and p != QUICK[name]:
                continue
            spec = _spec(name, **skw)
            fn = mn.make(spec, arch.apply, norm=p, max_queries=T, stacked=True)  # results [B, M]
            # warm-up (compile), then alternate adv-lib / sarjax
            fn(params, x0, y, key=jax.random.key(0))
            by_threads = {}  # adv-lib at each torch thread count: (wall s, CPU s), both members
            a_norm = []
            for th in args.threads:
                torch.set_num_threads(th)
                ta = ca = 0.0
                for tm in tmods:
                    call = tcall(adv, p)
                    t1, c1 = time.time(), time.process_time()
                    xa, err = _advlib_call(call, tm, x0, y, torch)
                    ta += time.time() - t1
                    ca += time.process_time() - c1
                    if err:
                        print(f"  adv-lib {name} l{p} raised {err[:120]}")
                    if th == args.threads[0]:  # the norms of the first thread count's run
                        succ = tm(xa).argmax(1).numpy() != y
                        a_norm.append(np.where(succ, _norm(xa.numpy() - x0, p), np.inf))
                by_threads[th] = (ta, ca)
            fastest = min(by_threads, key=lambda t: by_threads[t][0])  # the ratio is against the faster
            ta, ca = by_threads[fastest]
            ts, cs = [], []
            for _ in range(args.repeats):  # the fastest of a few warm calls (the machine is shared)
                t1, c1 = time.time(), time.process_time()
                res = fn(params, x0, y, key=jax.random.key(0))
                jax.block_until_ready(res)
                ts.append(time.time() - t1)
                cs.append(time.process_time() - c1)
            ts, cs = min(ts), min(cs)
            load = os.getloadavg()[0]
            for m in range(2):
                sn = np.asarray(res.norm[:, m], np.float64)
                an = a_norm[m]
                row = dict(
                    member=["standard", "pgd-at"][m],
                    attack=name,
                    norm="linf" if p == math.inf else f"l{int(p)}",
                    queries=T,
                    n=len(y),
                    sarjax_median=float(np.median(sn)),
                    advlib_median=float(np.median(an)),
                    sarjax_success=float(np.isfinite(sn).mean()),
                    advlib_success=float(np.isfinite(an).mean()),
                    sarjax_time_s=ts / 2,
                    advlib_time_s=ta / 2,
                    sarjax_cpu_s=cs / 2,
                    advlib_cpu_s=ca / 2,
                    advlib_threads=fastest,
                    advlib_time_s_by_threads={str(t): v[0] / 2 for t, v in by_threads.items()},
                    load=load,
                )
                row["median_ratio"] = (
                    row["sarjax_median"] / row["advlib_median"] if row["advlib_median"] > 0 else float("nan")
                )
                row["speedup"] = row["advlib_time_s"] / max(row["sarjax_time_s"], 1e-9)
                row["cpu_ratio"] = row["advlib_cpu_s"] / max(row["sarjax_cpu_s"], 1e-9)
                rows.append(row)
                print(
                    f"{row['member']:9s} {name:10s} {row['norm']:5s} median sarjax {row['sarjax_median']:.4g} "
                    f"adv-lib {row['advlib_median']:.4g} (x{row['median_ratio']:.3f})  success "
                    f"{row['sarjax_success']:.2f}/{row['advlib_success']:.2f}  time {row['sarjax_time_s']:.2f}s/"
                    f"{row['advlib_time_s']:.2f}s (x{row['speedup']:.1f} faster; CPU time x{row['cpu_ratio']:.1f})",
                    flush=True,
                )
    return rows


def _affine_apply(params, x):
    return x.reshape(x.shape[0], -1) @ params[0] + params[1]


def run_affine(torch, adv):
    import jax
    import jax.numpy as jnp

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "minnorm"))
    from _minnorm_ref import affine_min_norm, make_affine

    from sarjax.attacks import minnorm as mn

    rows = []
    T = 1000
    for name, norms, skw, tcall in _cases(5, T):
        for p in norms:
            for k, (B, shape) in enumerate([(3, (4, 6)), (8, (5, 7, 7, 1))]):
                W, b, x0, y = make_affine(300 + k, shape, C=5, B=B, nearest_is_runner_up=p)
                opt = np.array([affine_min_norm(W, b, x0[i], y[i], p)[0] for i in range(B)])
                Wj, bj = jnp.asarray(W) * 10, jnp.asarray(b) * 10
                fn = mn.make(_spec(name, **skw), _affine_apply, norm=p, max_queries=T)
                r = fn((Wj, bj), x0, y, key=jax.random.key(0))
                Wt, bt = torch.tensor(W) * 10, torch.tensor(b) * 10
                model = lambda x, Wt=Wt, bt=bt: x.flatten(1) @ Wt + bt
                call = tcall(adv, p)
                xa, err = _advlib_call(call, model, x0, y, torch)
                if err:
                    print(f"  adv-lib {name} l{p} raised {err[:120]}")
                succ = model(xa).argmax(1).numpy() != y
                an = np.where(succ, _norm(xa.numpy() - x0, p), np.inf)
                rows.append(
                    dict(
                        attack=name,
                        norm=str(p),
                        case=k,
                        sarjax_worst=float((np.asarray(r.norm)[:, 0] / opt).max()),
                        advlib_worst=float((an / opt).max()),
                    )
                )
                print(
                    f"affine {name:10s} l{p} case {k}: worst norm/optimum sarjax {rows[-1]['sarjax_worst']:.3f} "
                    f"adv-lib {rows[-1]['advlib_worst']:.3f}",
                    flush=True,
                )
    return rows


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), platform.processor())
    except OSError:
        return platform.processor()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=None, help="test samples (correctly classified by both members; 64)")
    ap.add_argument("--queries", type=int, default=None, help="query cap T per sample (the frontier paper: 1000)")
    ap.add_argument("--epochs", type=int, default=None, help="training epochs of the members (4)")
    ap.add_argument("--train-samples", type=int, default=None, help="training images per epoch (all; --quick 10000)")
    ap.add_argument("--repeats", type=int, default=3, help="warm sarjax calls timed (the fastest is reported)")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="16 samples, 200 queries, 2 epochs of 10000 images, FMN-l2 / DDN / PDGD / FAB-linf only (a few minutes)",
    )
    ap.add_argument("--out", default=None, help="JSON path (default: a temporary folder, never benchmarks/results/)")
    ap.add_argument("--affine", action="store_true", help="also compare on the affine known-answer instances")
    ap.add_argument("--skip-mnist", action="store_true")
    ap.add_argument("--attacks", default="", help="comma-separated subset, e.g. pdpgd,fab (default: all)")
    add_torch_threads_argument(ap, "adv-lib")
    args = ap.parse_args()
    defaults = (
        dict(n=16, queries=200, epochs=2, train_samples=10000) if args.quick else dict(n=64, queries=1000, epochs=4)
    )
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.quick and not args.attacks:
        args.attacks = ",".join(QUICK)
    name = "minnorm_vs_advlib_quick.json" if args.quick else "minnorm_vs_advlib.json"
    args.out = str(results_path(name, args.out, quick=args.quick))
    torch, adv = _import_advlib()
    out = dict(
        command=" ".join(sys.argv),
        n=args.n,
        queries=args.queries,
        epochs=args.epochs,
        train_samples=args.train_samples,
        cpus=os.cpu_count(),
        torch_threads=args.threads,
        machine=platform.platform(),
        processor=_cpu_name(),
        load_start=os.getloadavg(),
    )
    if args.affine:
        out["affine"] = run_affine(torch, adv)
    if not args.skip_mnist:
        out["mnist"] = run_mnist(args, torch, adv)
    out["load_end"] = os.getloadavg()
    out["provenance"] = provenance()  # command, commit, machine, date, load
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
