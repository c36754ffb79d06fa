"""Peer agreement: robust accuracy from sarjax PGD / APGD vs torchattacks on the same weights.

Trains one MNIST MLP with JAX (the embedded 4,000/1,000 MNIST split), exports
its weights to an identical PyTorch module, and measures robust accuracy
(a sample counts as robust if it is correctly classified and the attack does
not change that) under equal budgets:

  * PGD linf: ``steps`` steps of ``alpha`` with a random start, 1 restart
    (torchattacks.PGD vs sarjax ``make_pgd``), final iterate on both sides;
  * APGD-CE linf: 100 iterations, 1 restart, rho 0.75 (torchattacks.APGD vs
    sarjax ``make_apgd``), best adversarial point on both sides;
  * APGD-DLR linf likewise (``loss="dlr"``).

Target: each sarjax figure within 1 percentage point of torchattacks'.
Writes JSON (``--out``; default a temporary folder), with the run's provenance (command, commit,
machine, date, load).

Usage:
  python benchmarks/peer_agreement.py --n 500 --eps 0.06 --out bench_peer.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _timing import provenance, results_path  # benchmarks/ is on sys.path when run as a script

from sarjax.attacks.apgd import make_apgd
from sarjax.attacks.pgd import PGDStep, make_pgd
from sarjax.data.mnist import load_mnist
from sarjax.models import zoo

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch threads must not spin on a shared CPU


def train_mlp(x, y, epochs=15, seed=0):
    arch = zoo.mlp()
    params = arch.init(jax.random.PRNGKey(seed))
    tx = optax.adam(1e-3)
    opt = tx.init(params)

    @jax.jit
    def step(params, opt, xb, yb):
        def loss(p):
            return optax.softmax_cross_entropy_with_integer_labels(arch.apply(p, xb), yb).mean()

        g = jax.grad(loss)(params)
        upd, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, upd), opt

    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        perm = rng.permutation(len(y))
        for i in range(0, len(y) - 63, 64):
            idx = perm[i : i + 64]
            params, opt = step(params, opt, x[idx], y[idx])
    return arch, params


def torch_mlp(arch, params):
    import torch
    from torch import nn

    P = jax.tree.map(np.asarray, params)
    layers, fan = [nn.Flatten()], 28 * 28
    for i, w in enumerate(arch.widths):
        lin = nn.Linear(fan, w)
        lin.weight.data = torch.tensor(P[f"dense{i}"]["w"].T.copy())
        lin.bias.data = torch.tensor(P[f"dense{i}"]["b"].copy())
        layers += [lin, nn.ReLU()]
        fan = w
    out = nn.Linear(fan, 10)
    out.weight.data = torch.tensor(P["out"]["w"].T.copy())
    out.bias.data = torch.tensor(P["out"]["b"].copy())
    model = nn.Sequential(*layers, out).eval()
    for q in model.parameters():
        q.requires_grad_(False)
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--eps", type=float, default=0.06)
    ap.add_argument("--pgd-steps", type=int, default=20)
    ap.add_argument("--apgd-iter", type=int, default=100)
    ap.add_argument("--seeds", type=int, default=1, help="attack seeds averaged on both sides")
    ap.add_argument("--out", default=None, help="JSON path (default: a temporary folder)")
    args = ap.parse_args()
    args.out = str(results_path("peer_agreement.json", args.out))

    import torch
    import torchattacks

    torch.set_num_threads(1)
    data = load_mnist()
    arch, params = train_mlp(data.x_train, data.y_train)
    x = jnp.asarray(data.x_test[: args.n])
    y = np.asarray(data.y_test[: args.n])
    model = torch_mlp(arch, params)
    tx = torch.tensor(np.asarray(x)).permute(0, 3, 1, 2).contiguous()  # NCHW for torch
    ty = torch.tensor(y).long()

    def t_apply(xn):  # torch sees NCHW; the MLP flattens, so permute back to NHWC order
        return model(xn.permute(0, 2, 3, 1))

    class Wrapped(torch.nn.Module):
        def forward(self, xn):
            return t_apply(xn)

    tmodel = Wrapped().eval()
    clean_j = np.asarray(jnp.argmax(arch.apply(params, x), -1)) == y
    with torch.no_grad():
        clean_t = tmodel(tx).argmax(-1).numpy() == y
    print(
        f"clean accuracy: jax {clean_j.mean():.4f} torch {clean_t.mean():.4f} "
        f"(logit parity {float(np.abs(np.asarray(arch.apply(params, x)) - tmodel(tx).detach().numpy()).max()):.1e})"
    )

    alpha = args.eps / 8
    rows = []
    yj = jnp.asarray(y, jnp.int32)

    def robust_torch(adv):
        with torch.no_grad():
            return float(((tmodel(adv).argmax(-1).numpy() == y) & clean_t).mean())

    specs = [
        (
            "PGD-linf",
            lambda s: make_pgd(
                arch.apply,
                norm="linf",
                steps=args.pgd_steps,
                step=PGDStep(step_size=alpha, restarts=1, random_start=True),
            ),
            lambda: torchattacks.PGD(tmodel, eps=args.eps, alpha=alpha, steps=args.pgd_steps, random_start=True),
            "final",
        ),
        (
            "APGD-CE-linf",
            lambda s: make_apgd(arch.apply, norm="linf", n_iter=args.apgd_iter, loss="ce"),
            lambda: torchattacks.APGD(
                tmodel, norm="Linf", eps=args.eps, steps=args.apgd_iter, n_restarts=1, loss="ce", rho=0.75, seed=0
            ),
            "best",
        ),
        (
            "APGD-DLR-linf",
            lambda s: make_apgd(arch.apply, norm="linf", n_iter=args.apgd_iter, loss="dlr"),
            lambda: torchattacks.APGD(
                tmodel, norm="Linf", eps=args.eps, steps=args.apgd_iter, n_restarts=1, loss="dlr", rho=0.75, seed=0
            ),
            "best",
        ),
    ]
    for name, mk_j, mk_t, which in specs:
        rj, rt, tj, tt = [], [], 0.0, 0.0
        for s in range(args.seeds):
            atk = mk_j(s)
            t0 = time.perf_counter()
            res = atk(params, x, yj, key=jax.random.PRNGKey(s), eps=args.eps)
            succ = np.asarray(res.success if which == "final" else res.best_success)[:, 0]
            tj += time.perf_counter() - t0
            rj.append(float((clean_j & ~succ).mean()))
            torch.manual_seed(s)
            tatk = mk_t()
            t0 = time.perf_counter()
            adv = tatk(tx, ty)
            tt += time.perf_counter() - t0
            rt.append(robust_torch(adv))
        row = {
            "attack": name,
            "eps": args.eps,
            "n": args.n,
            "robust_acc_sarjax": float(np.mean(rj)),
            "robust_acc_torchattacks": float(np.mean(rt)),
            "diff_pp": 100 * (float(np.mean(rj)) - float(np.mean(rt))),
            "seconds_sarjax": tj,
            "seconds_torchattacks": tt,
        }
        row["within_1pp"] = abs(row["diff_pp"]) <= 1.0
        rows.append(row)
        print(
            f"{name:14s} eps={args.eps}: sarjax {row['robust_acc_sarjax']:.4f} | torchattacks "
            f"{row['robust_acc_torchattacks']:.4f} | diff {row['diff_pp']:+.2f} pp "
            f"({'OK' if row['within_1pp'] else 'OUTSIDE 1pp'}) | time {tj:.1f}s vs {tt:.1f}s",
            flush=True,
        )
    with open(args.out, "w") as fh:
        res = {"clean_acc": float(clean_j.mean()), "command": " ".join(sys.argv), "rows": rows}
        json.dump({**res, "provenance": provenance()}, fh, indent=2)  # command, commit, machine, date, load
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
