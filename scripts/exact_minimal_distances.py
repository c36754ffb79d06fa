"""Exact minimal adversarial distances of tiny ReLU nets by mixed-integer linear programming.

The solver is :mod:`sarjax.frontier.exact`; this script trains the fixture nets, picks the
images and writes the fixtures.

The known answers of ``tests/frontier/test_exact_optima.py`` (issue 17, item 3): two small
ReLU MLPs trained on the embedded MNIST, and for a few dozen correctly classified test
images the EXACT smallest linf and l1 distance, inside the box ``[0, 1]^d``, to any input
that the net does not classify as the label (untargeted: the minimum over the target classes
``t != y`` of the distance to ``{x : z_t(x) >= z_y(x)}``).

Formulation (docs/exact_optima.md; the big-M encoding of a ReLU as in Tjeng, Xiao & Tedrake,
"Evaluating robustness of neural networks with mixed integer programming", ICLR 2019):

* variables: the perturbation ``d = x - x0`` (continuous, ``-x0 <= d <= 1 - x0``), every
  hidden neuron's post-activation ``a`` (continuous), one binary per UNSTABLE neuron, and for
  linf the norm ``e``.  l1 splits ``d = d+ - d-`` (both ``>= 0``), objective ``sum(d+ + d-)``;
  linf has ``-e <= d_i <= e``, objective ``e``;
* a neuron with pre-activation bounds ``l < 0 < u``: ``a >= 0``, ``a >= z``, ``a <= u delta``,
  ``a <= z - l (1 - delta)``; stable neurons are linear (``l >= 0``: ``a = z``) or removed
  (``u <= 0``: ``a = 0``);
* the bounds come from the region ``||d||_p <= r`` (``r`` an upper bound of the optimum, see
  below) intersected with the box: the first layer's bounds are exact (linf: interval sums;
  l1: the fractional knapsack over the per-coordinate box caps), deeper layers by interval
  arithmetic;
* the decision constraint of target ``t``: ``z_t - z_y >= 0``.

Search: ``r`` starts at 1.01x the norm FMN (sarjax, 1000 queries) reaches, or, where FMN
fails or its radius leaves every target infeasible, at the distance of the boundary on the
segment from ``x0`` to the nearest training image the net classifies otherwise (any valid
radius gives the same optimum; its size only changes the solve time).  The targets
are solved one by one, in the order of their clean logit (runner-up first), each with the
constraint ``||d||_p <= r`` and the bounds recomputed for that ``r``; an optimum lowers ``r``
for the next target; an infeasible program proves the target's distance exceeds ``r``.
Every program must end ``optimal`` or ``infeasible`` (anything else fails the script).
HiGHS runs with ``mip_rel_gap = 1e-9``; its absolute gap (1e-6) and feasibility tolerance
(1e-7) bound the error of an optimum.

Validation (in float64 numpy, the nets' float32 weights cast up): at each optimum point the
net does not classify the label strictly first by more than 1e-5 (the point is on the
decision boundary), and its norm equals the objective to 1e-6.

Outputs in ``--out`` (default ``tests/frontier/fixtures``):

* ``exact_nets.npz``: the two nets' weights (float32; ``net{k}_w{l}``, ``net{k}_b{l}``);
* ``exact_optima.npz``: ``idx`` [N] test-split indices, ``x0`` [N, 28, 28, 1], ``y`` [N],
  and per net ``k`` and norm ``p``: ``opt_{k}_{p}`` [N] (float64 optimum), ``target_{k}_{p}``
  [N] (the class whose boundary is nearest), ``xstar_{k}_{p}`` [N, 196] (float32 optimum
  point);
* ``exact_optima.json``: the command, the nets' test accuracy, and every program's status,
  objective, gap, node count and time.

Usage::

    python scripts/exact_minimal_distances.py [--samples 24] [--out tests/frontier/fixtures]
        [--time-limit 600]

Runs in about ten minutes on 2 CPU cores (most of it the l1 programs of the two-layer net).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's sarjax when run as a script

from sarjax.frontier.exact import (  # noqa: E402
    MARGIN_TOL,
    MIP_REL_GAP,
    NORM_TOL,
    NORMS,
    RadiusTooSmall,
    apply_layers,
    exact_min_distance,
    logits64,
    save_nets,
    upper_bound,
    validate,
)

ARCHS = ((16, 16), (32,))  # hidden widths of the two nets
SIZE = 14  # input side: MNIST block-averaged to 14 x 14 (the programs of 784 inputs took minutes)
SEEDS = (0, 1)


# ---------------------------------------------------------------------------------------------
# nets
# ---------------------------------------------------------------------------------------------


def downsample(x: np.ndarray, size: int) -> np.ndarray:
    """``[N, 28, 28, 1]`` -> ``[N, size, size, 1]`` by averaging ``28 // size`` squared blocks."""
    f = 28 // size
    return x.reshape(len(x), size, f, size, f, 1).mean(axis=(2, 4)).astype(np.float32)


def train_nets(x: np.ndarray, y: np.ndarray, epochs: int, archs=ARCHS, seeds=SEEDS):
    """The nets (hidden widths ``archs``, seeds ``seeds``) by :func:`sarjax.models.train.train_pool`.

    Args:
      x: ``[N, H, W, 1]`` training images; y: ``[N]`` labels.

    Returns:
      one params dict per net (numpy).
    """
    from sarjax.models.train import MemberConfig, TrainConfig, train_pool
    from sarjax.models.zoo import mlp

    members = [(mlp(w, input_shape=x.shape[1:]), MemberConfig(seed=s, data_seed=s)) for w, s in zip(archs, seeds)]
    pool, _ = train_pool(members, x, y, config=TrainConfig(epochs=epochs, patience=0), progress=False)
    nets = []
    for stack in pool.stacks:
        params = {k: {kk: np.asarray(vv[0]) for kk, vv in v.items()} for k, v in stack.params.items()}
        nets.append(params)
    return nets


def fmn_bounds(layers32, x: np.ndarray, y: np.ndarray, p: str) -> np.ndarray:
    """``[N]`` norms FMN (sarjax, 1000 queries) reaches: only search radii, checked by the
    program (a radius below the optimum would leave every target infeasible)."""
    import jax
    import jax.numpy as jnp

    from sarjax.attacks import fmn

    params = [(jnp.asarray(W), jnp.asarray(b)) for W, b in layers32]
    fn = fmn.make_fmn(apply_layers, norm=math.inf if p == "linf" else 1, max_queries=1000)
    res = fn(params, jnp.asarray(x), jnp.asarray(y), key=jax.random.key(0))
    return np.asarray(res.norm)[:, 0].astype(np.float64)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=24, help="test images (correctly classified by both nets)")
    ap.add_argument("--size", type=int, default=SIZE, choices=(7, 14, 28), help="input side (block-averaged MNIST)")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--out", default="tests/frontier/fixtures")
    ap.add_argument("--time-limit", type=float, default=600.0, help="per program, seconds")
    ap.add_argument("--norms", nargs="+", default=list(NORMS), choices=NORMS)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from sarjax.data.mnist import load_mnist

    split = load_mnist()
    x_train, x_test = downsample(split.x_train, args.size), downsample(split.x_test, args.size)
    nets = train_nets(x_train, split.y_train, args.epochs)
    layers32 = []
    for params in nets:
        names = sorted(k for k in params if k.startswith("dense")) + ["out"]
        layers32.append([(params[k]["w"].astype(np.float32), params[k]["b"].astype(np.float32)) for k in names])
    layers64 = [[(W.astype(np.float64), b.astype(np.float64)) for W, b in L] for L in layers32]
    save_nets(out / "exact_nets.npz", layers32)

    xt = x_test.reshape(len(split.y_test), -1).astype(np.float64)
    yt = split.y_test
    acc = [float(np.mean(np.argmax(logits64(L, xt), -1) == yt)) for L in layers64]
    ok = np.all([np.argmax(logits64(L, xt), -1) == yt for L in layers64], axis=0)
    # a stratified pick: the first correctly classified images of each class in turn
    per_class = [list(np.flatnonzero(ok & (yt == c))) for c in range(10)]
    idx = []
    while len(idx) < args.samples:
        for c in range(10):
            if per_class[c] and len(idx) < args.samples:
                idx.append(per_class[c].pop(0))
    idx = np.asarray(sorted(idx))
    xtr = x_train.reshape(len(split.y_train), -1).astype(np.float64)

    report = dict(
        command="python scripts/exact_minimal_distances.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        input_shape=[args.size, args.size, 1],
        nets=[dict(widths=list(w), seed=s, test_accuracy=a) for w, s, a in zip(ARCHS, SEEDS, acc)],
        samples=idx.tolist(),
        mip_rel_gap=MIP_REL_GAP,
        margin_tol=MARGIN_TOL,
        norm_tol=NORM_TOL,
        results={},
    )
    arrays = dict(idx=idx, x0=x_test[idx], y=yt[idx])
    t_all = time.perf_counter()
    for k, L in enumerate(layers64):
        for p in args.norms:
            found = fmn_bounds(layers32[k], x_test[idx], yt[idx], p)
            opt, tgt, xs, rows = [], [], [], []
            for n, i in enumerate(idx):
                x0, y = xt[i], int(yt[i])
                r_data = upper_bound(L, x0, y, p, xtr)
                r = min(r_data, found[n] * 1.01) if np.isfinite(found[n]) else r_data
                t0 = time.perf_counter()
                try:
                    sol = exact_min_distance(L, x0, y, p, r, time_limit=args.time_limit)
                except RadiusTooSmall:  # FMN's radius was not an upper bound in float64: the data's is
                    r = r_data
                    sol = exact_min_distance(L, x0, y, p, r, time_limit=args.time_limit)
                lead, err = validate(L, x0, y, p, sol)
                secs = time.perf_counter() - t0
                opt.append(sol["opt"])
                tgt.append(sol["target"])
                xs.append(np.clip(x0 + sol["d"], 0.0, 1.0).astype(np.float32))
                rows.append(
                    dict(
                        index=int(i),
                        label=y,
                        opt=sol["opt"],
                        target=sol["target"],
                        radius=r,
                        label_lead_at_opt=lead,
                        norm_error=err,
                        seconds=round(secs, 2),
                        programs=sol["programs"],
                    )
                )
                print(
                    f"net{k} {p} [{n + 1}/{len(idx)}] idx {i} y {y}: opt {sol['opt']:.6f} (t={sol['target']}, "
                    f"radius {r:.4f}) {secs:.1f}s",
                    flush=True,
                )
            arrays[f"opt_{k}_{p}"] = np.asarray(opt, np.float64)
            arrays[f"target_{k}_{p}"] = np.asarray(tgt, np.int32)
            arrays[f"xstar_{k}_{p}"] = np.stack(xs)
            report["results"][f"net{k}_{p}"] = rows
    report["seconds"] = round(time.perf_counter() - t_all, 1)
    statuses = {prog["status"] for rs in report["results"].values() for row in rs for prog in row["programs"].values()}
    report["statuses"] = sorted(statuses)
    np.savez_compressed(out / "exact_optima.npz", **arrays)
    (out / "exact_optima.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"statuses: {sorted(statuses)}; wrote {out}/exact_nets.npz, exact_optima.npz, exact_optima.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
