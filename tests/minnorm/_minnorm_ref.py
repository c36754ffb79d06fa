"""Exact minimal perturbations of affine classifiers inside the [0, 1] box (numpy, float64).

For f(x) = x . W + b the points misclassified as class j form the half-space
a . delta >= c with a = W[:, j] - W[:, y] and c = s_y - s_j (s = clean logits);
the minimal-norm misclassification is the minimum over j of the minimal-norm
point of that half-space intersected with the box l <= delta <= u
(l = -x0, u = 1 - x0).  Each half-space problem has an exact solution:
l2 and linf by bisection on the scalar multiplier of the KKT conditions,
l1 by the fractional-knapsack greedy, l0 by taking the largest per-element
gains (the gains are independent, so the greedy is exact; it agrees with
brute force over subsets, which the tests also check).
"""

import itertools
import math

import numpy as np


def _room(a, x0):
    # how far each element can move in the direction that increases a . delta
    return np.where(a > 0, 1.0 - x0, x0)


def halfspace_min(a, c, x0, p):
    a, x0 = np.asarray(a, np.float64), np.asarray(x0, np.float64)
    if c <= 0:
        return 0.0
    room = _room(a, x0)
    gain = np.abs(a) * room
    if gain.sum() < c:
        return math.inf
    if p == 0:
        g = np.sort(gain)[::-1]
        return float(np.searchsorted(np.cumsum(g), c) + 1)
    if p == 1:
        order = np.argsort(-np.abs(a))
        need, total = c, 0.0
        for i in order:
            if abs(a[i]) == 0:
                break
            step = min(room[i], need / abs(a[i]))
            total += step
            need -= step * abs(a[i])
            if need <= 1e-15:
                break
        return total
    lo_d, hi_d = -x0, 1.0 - x0
    if p == 2:
        delta = lambda lam: np.clip(lam * a, lo_d, hi_d)
        hi = 1.0
        while a @ delta(hi) < c:
            hi *= 2
    else:
        delta = lambda lam: np.clip(lam * np.sign(a), lo_d, hi_d)
        hi = 1.0
    lo = 0.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if a @ delta(mid) >= c:
            hi = mid
        else:
            lo = mid
    d = delta(hi)
    return float(np.sqrt(d @ d)) if p == 2 else float(np.abs(d).max())


def affine_min_norm(W, b, x0, y, p):
    """Returns (optimal norm, the class j whose boundary attains it)."""
    x = np.ravel(x0).astype(np.float64)
    s = x @ W + b
    best, arg = math.inf, -1
    for j in range(W.shape[1]):
        if j == y:
            continue
        v = halfspace_min(W[:, j] - W[:, y], s[y] - s[j], x, p)
        if v < best:
            best, arg = v, j
    return best, arg


def brute_force_l0(W, b, x0, y):
    """Smallest number of elements whose change (anywhere in [0, 1]) misclassifies."""
    x = np.ravel(x0).astype(np.float64)
    d = x.size
    s = x @ W + b
    for k in range(0, d + 1):
        for S in itertools.combinations(range(d), k):
            S = list(S)
            for j in range(W.shape[1]):
                if j == y:
                    continue
                a = W[:, j] - W[:, y]
                best = s[j] - s[y] + sum(max(a[i] * (1 - x[i]), -a[i] * x[i]) for i in S)
                if best > 0:
                    return k
    return math.inf


def make_affine(seed, shape, C=5, B=8, scale=1.0, nearest_is_runner_up=None):
    """Random affine classifier and B inputs in [0.2, 0.8], labelled by the model.

    With ``nearest_is_runner_up=p`` the inputs are drawn (by rejection) so that the
    class whose boundary is nearest in lp is also the runner-up class at x0: an
    untargeted local search that follows the runner-up can then reach the optimum
    (otherwise the minimum over classes is a global, combinatorial question that
    the targeted runs answer).
    """
    rng = np.random.default_rng(seed)
    d = int(np.prod(shape))
    W = (rng.normal(size=(d, C)) * scale / np.sqrt(d)).astype(np.float32)
    b = (rng.normal(size=(C,)) * 0.1).astype(np.float32)
    xs = []
    while len(xs) < B:
        x = rng.uniform(0.2, 0.8, size=tuple(shape)).astype(np.float32)
        s = x.reshape(-1) @ W + b
        yy = int(np.argmax(s))
        if nearest_is_runner_up is not None:
            runner = int(np.argsort(s)[-2])
            if affine_min_norm(W, b, x, yy, nearest_is_runner_up)[1] != runner:
                continue
        xs.append(x)
    x0 = np.stack(xs)
    y = np.argmax(x0.reshape(B, -1) @ W + b, axis=1).astype(np.int32)
    return W, b, x0, y
