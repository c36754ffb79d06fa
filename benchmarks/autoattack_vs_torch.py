"""AutoAttack in sarjax vs torchattacks' ``AutoAttack`` on the same weights: robust accuracy and speed.

A small CNN (``zoo.cnn((8, 16), dense=64)``) is trained here on the embedded MNIST (PGD-AT linf
``--train-eps`` with ``--pgd-at``, else standard training) or the first member of ``--pool DIR``
is loaded; its weights are copied into the equivalent ``torch.nn`` module (the twins of
``benchmarks/train_throughput.py``; the logits are checked to agree). Both AutoAttacks then run
the standard version (linf, ``--eps``) on the same ``--samples`` test images, ALTERNATED for
``--repeats`` rounds (sarjax, torch, sarjax, torch, ...; the first sarjax call compiles and is
timed separately), and the script reports each one's robust accuracy, their agreement and the
wall time per 1,000 images.

torchattacks' defaults differ from AutoAttack's reference code (fra31/auto-attack,
``autoattack.py``): its ``AutoAttack`` builds APGD, APGD-T and FAB with their class defaults of
``steps = 10`` iterations (the reference: 100) and Square with ``resc_schedule=True`` (the
reference's AutoAttack: False); the targets (9), restarts (1), Square's 5,000 queries and
``p_init = 0.8`` agree. The peer comparison therefore runs sarjax at torchattacks' 10 iterations
(``--iters``, default 10: the same work); ``--reference`` adds a sarjax run at the reference's
100 iterations (robust accuracy only, for the record).

    python benchmarks/autoattack_vs_torch.py --quick     # 32 images, a minute or two
    python benchmarks/autoattack_vs_torch.py --samples 200 --pgd-at --reference
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see benchmarks/train_throughput.py

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_throughput import load_jax_params, torch_module  # noqa: E402  (the torch twins)


def _model(a, data):
    from sarjax.models import zoo

    if a.pool:
        from sarjax.models.checkpoint import load_pool

        pool, _ = load_pool(a.pool)
        stack = pool.stacks[0]
        return stack.arch, jax.tree.map(lambda v: v[0], stack.params), f"{a.pool} member 0 ({stack.names[0]})"
    from sarjax.defenses import make_objective
    from sarjax.models.train import MemberConfig, TrainConfig, train_stack

    arch = zoo.cnn((8, 16), dense=64)
    obj = make_objective("pgd-at", eps=a.train_eps, norm="linf") if a.pgd_at else None
    stack, _ = train_stack(
        arch,
        [MemberConfig(seed=a.seed)],
        data.x_train,
        data.y_train,
        config=TrainConfig(epochs=a.epochs, patience=0),
        progress=False,
        objective=obj,
    )
    what = f"zoo.cnn((8, 16), dense=64), {'PGD-AT linf ' + str(a.train_eps) if a.pgd_at else 'standard'}, {a.epochs} epochs"
    return arch, jax.tree.map(lambda v: v[0], stack.params), what


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--eps", type=float, default=0.1)
    ap.add_argument("--iters", type=int, default=10, help="APGD / FAB iterations of both (torchattacks: 10)")
    ap.add_argument("--square-queries", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--batch-size", type=int, default=50, help="sarjax rows per compiled call (still-robust rows are packed)"
    )
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--pool", default=None, help="a saved pool: attack its first member (a CNN or MLP)")
    ap.add_argument("--pgd-at", action="store_true", help="train the CNN with PGD-AT (else standard)")
    ap.add_argument("--train-eps", type=float, default=0.1)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--reference", action="store_true", help="also run sarjax at the reference's 100 iterations")
    ap.add_argument("--quick", action="store_true", help="32 images, 1 repeat, 500 Square queries, 1 epoch, batch 16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/autoattack_vs_torch.json")
    a = ap.parse_args(argv)
    if a.quick:
        a.samples, a.repeats, a.square_queries, a.epochs, a.batch_size = 32, 1, 500, 1, 16
    import torch
    import torchattacks

    from sarjax.attacks.autoattack import autoattack
    from sarjax.data.mnist import load_mnist

    torch.set_num_threads(a.threads)
    data = load_mnist()
    arch, params, what = _model(a, data)
    # a fixed random subset: the embedded test split is sorted by class (its first 100 images are zeros)
    sel = np.sort(np.random.default_rng(0).permutation(len(data.x_test))[: a.samples])
    x = np.asarray(data.x_test[sel], np.float32)
    y = np.asarray(data.y_test[sel], np.int32)
    tm = torch_module(arch).eval()
    load_jax_params(arch, params, tm)
    xt, yt = torch.from_numpy(x.transpose(0, 3, 1, 2).copy()), torch.from_numpy(y.astype(np.int64))
    with torch.no_grad():
        zt = tm(xt).numpy()
    zj = np.asarray(arch.apply(params, jnp.asarray(x)))
    twin = float(np.max(np.abs(zt - zj)))
    print(f"model: {what}; torch twin max |logit diff| {twin:.2e}")
    if twin > 1e-3 * (1 + np.abs(zj).max()):
        raise SystemExit("the torch twin disagrees with the JAX model")
    clean = float(np.mean(np.argmax(zj, 1) == y))

    def run_sarjax(n_iter=a.iters):
        res = autoattack(
            arch.apply, params, x, y, norm="linf", eps=a.eps, key=jax.random.PRNGKey(a.seed), n_iter=n_iter,
            fab_iter=n_iter, square_queries=a.square_queries, log=False, checks=False, batch_size=a.batch_size,
        )  # fmt: skip
        return float(res.robust_accuracy[0]), res

    def run_torch():
        atk = torchattacks.AutoAttack(tm, norm="Linf", eps=a.eps, version="standard", n_classes=10, seed=a.seed)
        for sub in atk._autoattack.attacks:  # the same budget as sarjax's run
            if hasattr(sub, "steps"):
                sub.steps = a.iters
            if hasattr(sub, "n_queries"):
                sub.n_queries = a.square_queries
        xa = atk(xt, yt)
        with torch.no_grad():
            pred = tm(xa).argmax(1).numpy()
        dist = float((xa - xt).abs().amax().item())
        run_torch.robust = pred == y
        return float(np.mean(pred == y)), dist

    t0 = time.perf_counter()
    acc_s, res = run_sarjax()  # compile + run
    first = time.perf_counter() - t0
    print(f"sarjax first call (compiles): {first:.1f} s, robust accuracy {100 * acc_s:.1f}%")
    times = {"sarjax": [], "torchattacks": []}
    accs = {"sarjax": [], "torchattacks": []}
    for r in range(a.repeats):
        t0 = time.perf_counter()
        acc, res = run_sarjax()
        times["sarjax"].append(time.perf_counter() - t0)
        accs["sarjax"].append(acc)
        t0 = time.perf_counter()
        acc_t, dist_t = run_torch()
        times["torchattacks"].append(time.perf_counter() - t0)
        accs["torchattacks"].append(acc_t)
        print(
            f"round {r}: sarjax {times['sarjax'][-1]:.1f} s ({100 * acc:.1f}%), torchattacks "
            f"{times['torchattacks'][-1]:.1f} s ({100 * acc_t:.1f}%, max linf {dist_t:.4f}); load {os.getloadavg()[0]:.1f}"
        )
    med = {k: float(np.median(v)) for k, v in times.items()}
    per_k = {k: 1000.0 * v / a.samples for k, v in med.items()}
    ratio = med["torchattacks"] / med["sarjax"]
    diff = 100 * (np.median(accs["sarjax"]) - np.median(accs["torchattacks"]))
    print(f"\nclean accuracy {100 * clean:.1f}%  eps {a.eps}  {a.samples} images  iterations {a.iters}")
    print(
        f"robust accuracy: sarjax {100 * np.median(accs['sarjax']):.2f}%  torchattacks {100 * np.median(accs['torchattacks']):.2f}%  (diff {diff:+.2f} points)"
    )
    print(
        f"seconds per 1,000 images: sarjax {per_k['sarjax']:.1f}  torchattacks {per_k['torchattacks']:.1f}  speed ratio {ratio:.2f}x"
    )
    print("sarjax stages: " + ", ".join(f"{s.name} {100 * s.robust_accuracy[0]:.1f}%" for s in res.log))
    only_s = np.flatnonzero(res.robust[:, 0] & ~run_torch.robust).tolist()
    only_t = np.flatnonzero(~res.robust[:, 0] & run_torch.robust).tolist()
    print(f"robust for sarjax only: {only_s}; robust for torchattacks only: {only_t} (last round)")
    ref = None
    if a.reference:
        t0 = time.perf_counter()
        acc_ref, res_ref = run_sarjax(100)
        ref = dict(
            robust_accuracy=acc_ref, seconds=time.perf_counter() - t0, queries_mean=float(res_ref.queries.mean())
        )
        print(f"sarjax at the reference's 100 iterations: robust accuracy {100 * acc_ref:.2f}%")
    out = dict(
        benchmark="autoattack_vs_torch",
        model=what,
        settings=vars(a),
        torch_twin_max_abs_diff=twin,
        clean_accuracy=clean,
        robust_accuracy={k: v for k, v in accs.items()},
        robust_accuracy_diff_points=float(diff),
        robust_only_sarjax=only_s,
        robust_only_torchattacks=only_t,
        seconds=times,
        seconds_per_1000_images=per_k,
        speed_ratio_torch_over_sarjax=ratio,
        sarjax_first_call_seconds=first,
        sarjax_stages=[
            dict(name=s.name, robust_accuracy=float(s.robust_accuracy[0]), queries=s.queries) for s in res.log
        ],
        sarjax_queries_per_image=float(res.queries.mean()),
        reference_100_iterations=ref,
        defaults_note=(
            "torchattacks.AutoAttack builds APGD/APGD-T/FAB with steps=10 (reference: 100) and Square with "
            "resc_schedule=True (reference: False); both run here at --iters for the peer comparison"
        ),
        load=os.getloadavg(),
        machine=platform.platform(),
        torch=torch.__version__,
        torchattacks=torchattacks.__version__,
        jax=jax.__version__,
    )
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {a.out}")
    return out


if __name__ == "__main__":
    main()
