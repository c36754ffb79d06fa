"""Exact minimal adversarial distances of tiny ReLU nets by mixed-integer linear programming.

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
import os
import sys
import time
from pathlib import Path

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's sarjax when run as a script

NORMS = ("linf", "l1")
ARCHS = ((16, 16), (32,))  # hidden widths of the two nets
SIZE = 14  # input side: MNIST block-averaged to 14 x 14 (the programs of 784 inputs took minutes)
SEEDS = (0, 1)
MARGIN_TOL = 1e-5  # an optimum point may classify the label first by at most this much (boundary)
NORM_TOL = 1e-6  # |norm of the optimum point - objective|
MIP_REL_GAP = 1e-9


# ---------------------------------------------------------------------------------------------
# the net in float64
# ---------------------------------------------------------------------------------------------


def layers_from_params(params: dict) -> list[tuple[np.ndarray, np.ndarray]]:
    """``[(W [n_in, n_out], b [n_out]), ...]`` in float64 from a zoo MLP's params."""
    names = sorted(k for k in params if k.startswith("dense")) + ["out"]
    return [(np.asarray(params[k]["w"], np.float64), np.asarray(params[k]["b"], np.float64)) for k in names]


def logits64(layers, x: np.ndarray) -> np.ndarray:
    """Logits ``[..., C]`` of inputs ``[..., d]`` in float64."""
    z = np.asarray(x, np.float64)
    for W, b in layers[:-1]:
        z = np.maximum(z @ W + b, 0.0)
    W, b = layers[-1]
    return z @ W + b


def label_lead(layers, x: np.ndarray, y: int) -> float:
    """``z_y - max_{j != y} z_j`` at ``x`` (float64); ``<= 0`` = not classified as ``y``."""
    z = logits64(layers, x)
    return float(z[y] - np.max(np.delete(z, y)))


def dist(d: np.ndarray, p: str) -> float:
    return float(np.max(np.abs(d)) if p == "linf" else np.sum(np.abs(d)))


# ---------------------------------------------------------------------------------------------
# bounds
# ---------------------------------------------------------------------------------------------


def first_layer_bounds(W: np.ndarray, b: np.ndarray, x0: np.ndarray, p: str, r: float):
    """Exact bounds of ``(x0 + d) @ W + b`` over ``||d||_p <= r``, ``0 <= x0 + d <= 1``."""
    lo_d, hi_d = -x0, 1.0 - x0
    base = x0 @ W + b
    if p == "linf":
        lo_d, hi_d = np.maximum(lo_d, -r), np.minimum(hi_d, r)
        up = base + np.sum(np.maximum(W * hi_d[:, None], W * lo_d[:, None]), axis=0)
        dn = base + np.sum(np.minimum(W * hi_d[:, None], W * lo_d[:, None]), axis=0)
        return dn, up
    # l1: fractional knapsack per neuron and direction (gain |w_i| per unit, capacity = box cap)
    dn, up = np.empty_like(base), np.empty_like(base)
    for j in range(W.shape[1]):
        w = W[:, j]
        for sign, out in ((1.0, up), (-1.0, dn)):
            ws = sign * w
            cap = np.where(ws > 0, hi_d, -lo_d)  # how far coordinate i can move in its good direction
            gain = np.abs(ws)
            order = np.argsort(-gain)
            take = np.minimum(cap[order], np.maximum(r - np.concatenate([[0.0], np.cumsum(cap[order])[:-1]]), 0.0))
            out[j] = base[j] + sign * float(np.sum(gain[order] * take))
    return dn, up


def interval_bounds(layers, x0: np.ndarray, p: str, r: float):
    """Pre-activation bounds ``[(l, u), ...]`` of every hidden layer and the logits."""
    W, b = layers[0]
    lo, hi = first_layer_bounds(W, b, x0, p, r)
    out = [(lo, hi)]
    for W, b in layers[1:]:
        alo, ahi = np.maximum(lo, 0.0), np.maximum(hi, 0.0)
        Wp, Wn = np.maximum(W, 0.0), np.minimum(W, 0.0)
        lo, hi = alo @ Wp + ahi @ Wn + b, ahi @ Wp + alo @ Wn + b
        out.append((lo, hi))
    return out


# ---------------------------------------------------------------------------------------------
# the program
# ---------------------------------------------------------------------------------------------


class _Program:
    """Variables (bounds, cost, integrality) and sparse rows ``lb <= A v <= ub``, built in turn."""

    def __init__(self):
        self.vlb, self.vub, self.cost, self.integ = [], [], [], []
        self.r, self.c, self.v, self.lb, self.ub = [], [], [], [], []

    def var(self, lb, ub, cost=0.0, integer=0) -> int:
        self.vlb.append(float(lb))
        self.vub.append(float(ub))
        self.cost.append(float(cost))
        self.integ.append(integer)
        return len(self.vlb) - 1

    def row(self, cols, vals, lb, ub) -> None:
        i = len(self.lb)
        self.r.extend([i] * len(cols))
        self.c.extend(cols)
        self.v.extend(vals)
        self.lb.append(float(lb))
        self.ub.append(float(ub))

    def arrays(self):
        n = len(self.vlb)
        A = coo_matrix((self.v, (self.r, self.c)), shape=(len(self.lb), n)).tocsr()
        return (
            np.asarray(self.cost),
            np.asarray(self.integ),
            Bounds(np.asarray(self.vlb), np.asarray(self.vub)),
            LinearConstraint(A, np.asarray(self.lb), np.asarray(self.ub)),
        )


def _encode(layers, bounds, x0: np.ndarray, p: str, r: float, depth: int, relax: bool):
    """The input region and the first ``depth`` hidden layers of the net.

    Returns:
      (program, units, input columns): ``units`` the last encoded layer's post-activations as
      ``(column or None, constant)`` (the input ``x0 + d`` itself when ``depth = 0``), counts of
      binaries and stable neurons; ``relax``: binaries relaxed to [0, 1] (for bound tightening).
    """
    P = _Program()
    n_in = x0.size
    lo_d, hi_d = np.maximum(-x0, -r), np.minimum(1.0 - x0, r)
    if p == "linf":
        d_cols = [P.var(lo_d[i], hi_d[i]) for i in range(n_in)]
        e = P.var(0.0, r, 1.0)
        for i in range(n_in):
            P.row([d_cols[i], e], [1.0, -1.0], -np.inf, 0.0)
            P.row([d_cols[i], e], [-1.0, -1.0], -np.inf, 0.0)
        in_terms = [[(d_cols[i], 1.0)] for i in range(n_in)]
        in_cols = (d_cols,)
    else:
        pos = [P.var(0.0, max(hi_d[i], 0.0), 1.0) for i in range(n_in)]
        neg = [P.var(0.0, max(-lo_d[i], 0.0), 1.0) for i in range(n_in)]
        P.row(pos + neg, [1.0] * (2 * n_in), -np.inf, r)
        in_terms = [[(pos[i], 1.0), (neg[i], -1.0)] for i in range(n_in)]
        in_cols = (pos, neg)
    # units: per unit of the current layer a list of (col, coefficient) terms + a constant
    units = [(terms, float(x0[i])) for i, terms in enumerate(in_terms)]
    n_bin = n_stable = 0
    for k in range(depth):
        W, b = layers[k]
        lo, hi = bounds[k]
        nxt = []
        for j in range(W.shape[1]):
            cols, vals, const = [], [], float(b[j])
            for i, (terms, c0) in enumerate(units):
                w = W[i, j]
                if w == 0.0:
                    continue
                const += w * c0
                for col, coef in terms:
                    cols.append(col)
                    vals.append(w * coef)
            if hi[j] <= 0:  # stably inactive: a = 0
                nxt.append(([], 0.0))
                n_stable += 1
            elif lo[j] >= 0:  # stably active: a = z
                a = P.var(lo[j], hi[j])
                P.row(cols + [a], vals + [-1.0], -const, -const)
                nxt.append(([(a, 1.0)], 0.0))
                n_stable += 1
            else:
                a = P.var(0.0, hi[j])
                dl = P.var(0.0, 1.0, 0.0, 0 if relax else 1)
                n_bin += 1
                P.row(cols + [a], vals + [-1.0], -np.inf, -const)  # a >= z
                P.row(
                    cols + [a, dl], [-v for v in vals] + [1.0, -lo[j]], -np.inf, const - lo[j]
                )  # a <= z - l (1 - delta)
                P.row([a, dl], [1.0, -hi[j]], -np.inf, 0.0)  # a <= u delta
                nxt.append(([(a, 1.0)], 0.0))
        units = nxt
    return P, units, in_cols, n_bin, n_stable


def _affine(units, w: np.ndarray, b: float):
    """``w . units + b`` as (cols, vals, const)."""
    cols, vals, const = [], [], float(b)
    for i, (terms, c0) in enumerate(units):
        if w[i] == 0.0:
            continue
        const += w[i] * c0
        for col, coef in terms:
            cols.append(col)
            vals.append(w[i] * coef)
    return cols, vals, const


def tightened_bounds(layers, x0: np.ndarray, p: str, r: float):
    """Pre-activation bounds of the hidden layers: exact for the first (:func:`first_layer_bounds`),
    then per neuron the LP relaxation's optimum (binaries in [0, 1]) over the layers before,
    intersected with interval arithmetic."""
    bounds = interval_bounds(layers, x0, p, r)[: len(layers) - 1]
    for k in range(1, len(layers) - 1):
        P, units, _, _, _ = _encode(layers, bounds, x0, p, r, k, relax=True)
        cost0, _, bnds, cons = P.arrays()
        W, b = layers[k]
        lo, hi = bounds[k][0].copy(), bounds[k][1].copy()
        for j in range(W.shape[1]):
            cols, vals, const = _affine(units, W[:, j], b[j])
            c = np.zeros_like(cost0)
            np.add.at(c, cols, vals)
            for sign in (1.0, -1.0):
                res = milp(sign * c, integrality=np.zeros_like(c), bounds=bnds, constraints=[cons])
                if res.status != 0:
                    continue  # keep the interval bound (always valid)
                val = sign * res.fun + const
                slack = 1e-6 * (1.0 + abs(val))  # the LP's tolerances: keep the bound valid
                if sign > 0:
                    lo[j] = max(lo[j], val - slack)
                else:
                    hi[j] = min(hi[j], val + slack)
        bounds[k] = (lo, hi)
        # deeper layers by interval arithmetic from the tightened ones
        for kk in range(k + 1, len(layers) - 1):
            alo, ahi = np.maximum(bounds[kk - 1][0], 0.0), np.maximum(bounds[kk - 1][1], 0.0)
            Wk, bk = layers[kk]
            Wp, Wn = np.maximum(Wk, 0.0), np.minimum(Wk, 0.0)
            bounds[kk] = (
                np.maximum(bounds[kk][0], alo @ Wp + ahi @ Wn + bk),
                np.minimum(bounds[kk][1], ahi @ Wp + alo @ Wn + bk),
            )
    return bounds


def solve_target(
    layers, x0: np.ndarray, y: int, t: int, p: str, r: float, *, bounds=None, time_limit: float = 600.0
) -> dict:
    """Minimal ``||d||_p`` with ``z_t(x0 + d) >= z_y(x0 + d)``, ``||d||_p <= r``, in the box.

    Args:
      layers: ``[(W, b), ...]`` float64 (:func:`layers_from_params`).
      x0: ``[d]`` float64 clean input in [0, 1].
      y: label; t: target class (``!= y``).
      p: ``"linf"`` or ``"l1"``.
      r: radius of the search region (an upper bound of the optimum over all targets).
      bounds: the hidden layers' pre-activation bounds over that region (default
        :func:`tightened_bounds`).
      time_limit: HiGHS time limit in seconds.

    Returns:
      dict with ``status`` ("optimal" / "infeasible" / HiGHS's message), ``objective``,
      ``d`` (``[d]`` optimum perturbation or None), ``gap``, ``nodes``, ``seconds``,
      ``binaries`` (unstable neurons) and ``stable`` (stable neurons).
    """
    if bounds is None:
        bounds = tightened_bounds(layers, x0, p, r)
    P, units, in_cols, n_bin, n_stable = _encode(layers, bounds, x0, p, r, len(layers) - 1, relax=False)
    W, b = layers[-1]
    cols, vals, const = _affine(units, W[:, t] - W[:, y], b[t] - b[y])
    out = dict(binaries=n_bin, stable=n_stable)
    if not cols:  # the decision does not depend on the input inside the region
        ok = const >= 0
        out.update(
            status="optimal" if ok else "infeasible", objective=0.0 if ok else None, d=np.zeros_like(x0) if ok else None
        )
        return out
    P.row(cols, vals, -const, np.inf)  # z_t - z_y >= 0
    cost, integ, bnds, cons = P.arrays()
    t0 = time.perf_counter()
    res = milp(
        c=cost,
        integrality=integ,
        bounds=bnds,
        constraints=[cons],
        options={"mip_rel_gap": MIP_REL_GAP, "time_limit": float(time_limit), "presolve": True},
    )
    out.update(
        seconds=round(time.perf_counter() - t0, 3),
        gap=None if getattr(res, "mip_gap", None) is None else float(res.mip_gap),
        nodes=None if getattr(res, "mip_node_count", None) is None else int(res.mip_node_count),
    )
    if res.status == 0:
        v = res.x
        d = v[np.asarray(in_cols[0])] if p == "linf" else v[np.asarray(in_cols[0])] - v[np.asarray(in_cols[1])]
        out.update(status="optimal", objective=float(res.fun), d=d)
    elif res.status == 2:
        out.update(status="infeasible", objective=None, d=None)
    else:
        out.update(status=f"HiGHS status {res.status}: {res.message}", objective=None, d=None)
    return out


def upper_bound(layers, x0: np.ndarray, y: int, p: str, pool_x: np.ndarray) -> float:
    """Distance of SOME input not classified as ``y``: the closest (in ``p``) of ``pool_x``
    that the net classifies otherwise, pulled back to the boundary by bisection on the
    segment from ``x0``.  Only the solve time depends on its quality."""
    pred = np.argmax(logits64(layers, pool_x), -1)
    cand = pool_x[pred != y]
    dd = np.max(np.abs(cand - x0), axis=1) if p == "linf" else np.sum(np.abs(cand - x0), axis=1)
    x1 = cand[np.argmin(dd)]
    lo, hi = 0.0, 1.0  # lead > 0 at lo, <= 0 at hi
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if label_lead(layers, x0 + mid * (x1 - x0), y) > 0:
            lo = mid
        else:
            hi = mid
    return dist(hi * (x1 - x0), p) * (1.0 + 1e-9)


class RadiusTooSmall(RuntimeError):
    """Every target's program was infeasible: the search radius is below the optimum."""


def exact_min_distance(layers, x0: np.ndarray, y: int, p: str, r: float, *, time_limit: float = 600.0) -> dict:
    """Untargeted exact minimal distance: every target solved under the shrinking radius.

    Returns:
      dict with ``opt`` (float), ``target``, ``d`` (``[d]``), ``programs`` (per target: status,
      objective, gap, nodes, seconds, binaries, stable, radius).
    """
    z0 = logits64(layers, x0)
    order = [int(c) for c in np.argsort(-z0) if c != y]
    best, best_t, best_d, programs = math.inf, -1, None, {}
    radius, bounds = r * (1.0 + 1e-7), None
    for t in order:
        if bounds is None:
            bounds = tightened_bounds(layers, x0, p, radius)
        res = solve_target(layers, x0, y, t, p, radius, bounds=bounds, time_limit=time_limit)
        d = res.pop("d")
        res["radius"] = radius
        programs[str(t)] = res
        if res["status"] == "optimal" and res["objective"] < best:
            best, best_t, best_d = res["objective"], t, d
            if best * (1.0 + 1e-7) < 0.99 * radius:  # a smaller region: tighter bounds
                radius, bounds = best * (1.0 + 1e-7), None
            radius = min(radius, best * (1.0 + 1e-7))
        elif res["status"] not in ("optimal", "infeasible"):
            raise RuntimeError(f"target {t}, norm {p}: {res['status']}")
    if best_d is None:
        raise RadiusTooSmall(f"norm {p}: no target reached within the radius {r}")
    return dict(opt=best, target=best_t, d=best_d, programs=programs)


def validate(layers, x0, y, p, sol) -> tuple[float, float]:
    """Checks an optimum point: on/over the boundary (float64) and its norm = the objective.

    Returns:
      (label lead at the point, |norm - objective|); raises AssertionError if out of tolerance.
    """
    x = x0 + sol["d"]
    if np.any(x < -1e-6) or np.any(x > 1 + 1e-6):  # HiGHS primal feasibility tolerance 1e-7
        raise AssertionError("optimum point leaves the box")
    lead = label_lead(layers, np.clip(x, 0.0, 1.0), y)
    err = abs(dist(sol["d"], p) - sol["opt"])
    if lead > MARGIN_TOL or err > NORM_TOL:
        raise AssertionError(f"optimum point invalid: label lead {lead:.3g} (<= {MARGIN_TOL}), norm error {err:.3g}")
    return lead, err


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


def save_nets(path: Path, nets_layers32) -> None:
    arrays = {}
    for k, layers in enumerate(nets_layers32):
        for l, (W, b) in enumerate(layers):
            arrays[f"net{k}_w{l}"] = W
            arrays[f"net{k}_b{l}"] = b
    np.savez_compressed(path, **arrays)


def load_nets(path: str | os.PathLike) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """The fixture nets as ``[[(W, b) float32, ...] per net]``."""
    z = np.load(path)
    nets = []
    k = 0
    while f"net{k}_w0" in z:
        layers, l = [], 0
        while f"net{k}_w{l}" in z:
            layers.append((z[f"net{k}_w{l}"], z[f"net{k}_b{l}"]))
            l += 1
        nets.append(layers)
        k += 1
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


def apply_layers(layers, x):
    """Logits ``[B, C]`` of ``x: [B, *S]`` for a list of ``(W, b)`` jax arrays (ReLU MLP)."""
    import jax

    z = x.reshape(x.shape[0], -1)
    for W, b in layers[:-1]:
        z = jax.nn.relu(z @ W + b)
    return z @ layers[-1][0] + layers[-1][1]


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
