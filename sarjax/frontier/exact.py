"""Exact minimal adversarial distances of small ReLU MLPs by mixed-integer linear programming.

The test oracle of the minimum-norm attacks (issue 17, item 3; docs/exact_optima.md): for a
ReLU MLP given as float64 ``[(W [n_in, n_out], b [n_out]), ...]`` and a clean input ``x0`` in
``[0, 1]^d`` with label ``y``, the EXACT smallest linf or l1 distance, inside the box, to any
input the net does not classify as ``y`` (untargeted: the minimum over the targets ``t != y``
of the distance to ``{x : z_t(x) >= z_y(x)}``).  ``scripts/exact_minimal_distances.py`` trains
the fixture nets and writes the optima with it; ``tests/frontier/test_exact_optima.py`` scores
the attacks against them and re-solves instances.

Formulation (the big-M encoding of a ReLU as in Tjeng, Xiao & Tedrake, "Evaluating robustness
of neural networks with mixed integer programming", ICLR 2019):

* variables: the perturbation ``d = x - x0`` (continuous, ``-x0 <= d <= 1 - x0``), every
  hidden neuron's post-activation ``a`` (continuous), one binary per UNSTABLE neuron, and for
  linf the norm ``e``.  l1 splits ``d = d+ - d-`` (both ``>= 0``), objective ``sum(d+ + d-)``;
  linf has ``-e <= d_i <= e``, objective ``e``;
* a neuron with pre-activation bounds ``l < 0 < u``: ``a >= 0``, ``a >= z``, ``a <= u delta``,
  ``a <= z - l (1 - delta)``; stable neurons are linear (``l >= 0``: ``a = z``) or removed
  (``u <= 0``: ``a = 0``);
* the bounds come from the region ``||d||_p <= r`` (``r`` an upper bound of the optimum)
  intersected with the box: the first layer's bounds are exact (linf: interval sums; l1: the
  fractional knapsack over the per-coordinate box caps), deeper layers by the LP relaxation
  intersected with interval arithmetic;
* the decision constraint of target ``t``: ``z_t - z_y >= 0``.

:func:`exact_min_distance` solves the targets one by one in the order of their clean logit
(runner-up first) under a shrinking radius; every program must end ``optimal`` or
``infeasible``.  HiGHS runs with ``mip_rel_gap = 1e-9``; its absolute gap (1e-6) and
feasibility tolerance (1e-7) bound the error of an optimum.  :func:`validate` checks an optimum
point in float64.  :func:`ratio_scores` / :func:`score_pool` score attack distances and
allocated ensembles by their ratio to the optima.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from sarjax.frontier.allocation import PoolEntry, TrajectoryPool, nested_allocations

NORMS = ("linf", "l1")
MARGIN_TOL = 1e-5  # an optimum point may classify the label first by at most this much (boundary)
NORM_TOL = 1e-6  # |norm of the optimum point - objective|
MIP_REL_GAP = 1e-9
LEVEL_EVERY = 100  # the frontier paper Section 5.1: candidate levels S = {100, ..., 1000}


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
        in_cols: tuple[list[int], ...] = (d_cols,)
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
    out: dict[str, Any] = dict(binaries=n_bin, stable=n_stable)
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
        d = v[np.asarray(in_cols[0])] if p == "linf" else v[np.asarray(in_cols[0])] - v[np.asarray(in_cols[-1])]
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


def save_nets(path: str | os.PathLike, nets_layers32) -> None:
    """Writes nets ``[[(W, b) float32, ...] per net]`` as ``net{k}_w{l}`` / ``net{k}_b{l}`` (npz)."""
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


def apply_layers(layers, x):
    """Logits ``[B, C]`` of ``x: [B, *S]`` for a list of ``(W, b)`` jax arrays (ReLU MLP)."""
    import jax  # deferred: sarjax.frontier is host-side numpy; jax (about 2 s) only for this helper

    z = x.reshape(x.shape[0], -1)
    for W, b in layers[:-1]:
        z = jax.nn.relu(z @ W + b)
    return z @ layers[-1][0] + layers[-1][1]


# ---------------------------------------------------------------------------------------------
# scores against the optima
# ---------------------------------------------------------------------------------------------


def ratio_scores(d, optima, floor: float = 0.999) -> dict:
    """Per-sample distances ``[N]`` (``inf``: failed) against exact optima ``[N]``: median and
    worst ratio, failures, count within 1.02x, count below ``floor`` (an impossible beat)."""
    r = np.asarray(d, np.float64) / np.asarray(optima, np.float64)
    return dict(
        median=float(np.median(r)),
        worst=float(np.max(r)),
        failures=int(np.sum(~np.isfinite(r))),
        within_1_02=int(np.sum(r <= 1.02)),
        below_floor=int(np.sum(r < floor)),
        n=int(r.size),
    )


def pool_from_levels(traj_levels, entries_json: str, cap: int = 1000):
    """A :class:`sarjax.frontier.TrajectoryPool` from trajectories at the levels (every 100)."""
    specs = json.loads(entries_json)
    entries = tuple(
        PoolEntry(s["name"], s["kind"], None if s["kind"] == "base" else s["attack"], s["rank"]) for s in specs
    )
    return TrajectoryPool(
        np.asarray(traj_levels, np.float64), entries, cap=cap, every=LEVEL_EVERY, models=("net0", "net1")
    )


def score_pool(pool, optima, tiers=(4000, 8000, 12000)) -> dict:
    """Nested allocations on both nets and every tier's ratios to the optima (net-major)."""
    out: dict = {"tiers": [], "entries": {}}
    for al in nested_allocations(pool, tiers):
        d = pool.distances(al.q).reshape(-1)
        out["tiers"].append(
            dict(budget=al.budget, used=al.used, aoi=al.aoi, ensemble=al.ensemble, **ratio_scores(d, optima))
        )
    front = pool.frontier().reshape(-1)
    out["frontier"] = ratio_scores(front, optima)
    for a, e in enumerate(pool.entries):
        if e.kind == "base":
            out["entries"][e.name] = ratio_scores(pool.column(a, pool.cap).reshape(-1), optima)
    by_attack: dict[str, list[int]] = {}
    for a, e in enumerate(pool.entries):
        by_attack.setdefault(e.name.split("/")[0], []).append(a)
    out["attack_with_its_runs"] = {
        k: ratio_scores(np.min([pool.column(a, pool.cap) for a in idx], axis=0).reshape(-1), optima)
        for k, idx in by_attack.items()
    }
    return out


__all__ = [
    "LEVEL_EVERY",
    "MARGIN_TOL",
    "MIP_REL_GAP",
    "NORM_TOL",
    "NORMS",
    "RadiusTooSmall",
    "apply_layers",
    "dist",
    "exact_min_distance",
    "first_layer_bounds",
    "interval_bounds",
    "label_lead",
    "layers_from_params",
    "load_nets",
    "logits64",
    "pool_from_levels",
    "ratio_scores",
    "save_nets",
    "score_pool",
    "solve_target",
    "tightened_bounds",
    "upper_bound",
    "validate",
]
