"""Square attack (linf and l2): score-based black-box random search (Andriushchenko et al., ECCV 2020).

Shared defaults (paper Sec. 3-4 and AutoAttack's configuration of its Square
member): 5,000 queries, ``p_init = 0.8`` (AutoAttack's value for both norms),
the piecewise-constant schedule of the window's area share ``p`` (halved at
10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000 of 10,000 iterations,
rescaled to ``n_queries``), margin loss (untargeted) or cross-entropy to the
target (targeted), a proposal accepted only if it improves the loss, and
early stop per sample once every selected member is fooled.

linf (paper Alg. 2): vertical-stripe initialisation ``x0 +- eps``; every
proposal sets one ``s x s`` window (side ``round(sqrt(p * n / C))``, in
``[1, H - 1]``) to ``x0 +- eps`` with one random sign per channel.

l2 (paper Alg. 3 and Sec. 4.2, the authors' ``square_attack_l2``):

* initialisation: a grid of ``H // 5``-sided tiles, each filled with the
  centred-square pattern ``eta`` times a random sign per channel, the whole
  perturbation scaled to l2 norm ``eps`` and clipped to the box;
* ``eta(s)``: an ``s x s`` window split into two halves (rows, or columns with
  probability 1/2) of opposite sign, each half a stack of concentric
  rectangles whose value at Chebyshev distance ``d`` from the half's centre
  is ``sum_{k = d + 1}^{s // 2 + 1} 1 / k^2``; each half has unit l2 norm and
  the window is renormalised to unit l2 norm;
* every proposal picks two windows W1, W2 of side ``s = round(sqrt(p * n /
  C))`` (at least 3 and odd, as the paper; capped at ``min(H, W) - 1`` for
  tiny inputs); per channel, W1's perturbation becomes ``eta * sign +
  delta_W1 / ||delta_W1||``, rescaled to carry the mass of W1 ∪ W2 plus an
  equal share of the unused budget, ``sqrt(max(eps^2 - ||delta||^2, 0) / C +
  ||delta_{W1 ∪ W2}||^2)``; W2 is zeroed (the mass moves from W2 to W1);
  the whole perturbation is rescaled to ``||delta||_2 = eps`` and the point
  clipped to the box (clipping only moves elements towards ``x0``, so the
  point stays in the ball).

Deviations (documented): window positions are uniform over every position
that fits (the reference draws the top-left corner from ``[0, H - s)``,
never touching the last row); the l2 ``eta`` transpose and the signs are drawn
per sample (the reference draws one transpose per batch); the per-channel
mass follows the authors' repository (AutoAttack's port uses the mass of all
channels of W1 ∪ W2 in each channel before the final rescaling).

Only forward passes are used: each iteration costs M queries per still-active
sample (one forward of every member).  The model runs once per iteration on
the whole batch; proposals are drawn per example (keys from
``jax.random.fold_in``) and vmapped.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.attacks import geometry as G
from sarjax.attacks import queries as Q
from sarjax.attacks.core import AttackFn
from sarjax.attacks.core import evaluate as E
from sarjax.attacks.core import validate as V
from sarjax.attacks.core.protocol import Attack, Problem, sample_keys
from sarjax.attacks.losses import cross_entropy, fooled, margin
from sarjax.attacks.result import AttackResult
from sarjax.attacks.threat import canonical_norm

_SCHEDULE_AT = (10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000)
_TINY = 1e-12


def p_schedule(p_init: float, it, n_iters: int):
    """Square area share at iteration ``it`` (paper's schedule, defined for 10,000 iterations)."""
    i = jnp.floor(it / n_iters * 10000)
    k = jnp.searchsorted(jnp.asarray(_SCHEDULE_AT, jnp.float32), i, side="left")
    return p_init / (2.0**k)


def l2_window_side(p, n_features: int, channels: int, max_side: int):
    """Side of the l2 proposal windows: ``round(sqrt(p * n / C))``, at least 3, odd (paper
    Sec. 4.2), capped at ``max_side`` (tiny inputs).

    Args:
      p: scalar area share (traced or Python float).
      n_features: ``H * W * C``.
      channels: ``C``.
      max_side: largest allowed side (``max(min(H, W) - 1, 1)``).

    Returns:
      Scalar int32.
    """
    s = jnp.maximum(jnp.round(jnp.sqrt(p * n_features / channels)), 3.0).astype(jnp.int32)
    s = s + (s % 2 == 0).astype(jnp.int32)
    return jnp.minimum(s, max_side)


def _inv_square_table(n: int) -> np.ndarray:
    """``T[m] = sum_{k=1}^{m} 1 / k^2`` for ``m = 0..n`` (float32 ``[n + 1]``)."""
    return np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, n + 1) ** 2)]).astype(np.float32)


def _halves(a, b, s, table, xp=jnp):
    """Unnormalised positive (first half) and negative-half magnitudes of ``eta(s)`` at
    local coordinates ``(a, b)`` (integer arrays, broadcastable); zero outside."""
    h1 = s // 2
    h2 = s - h1
    top_k = s // 2 + 1  # number of concentric rectangles (both halves)
    cb = s // 2  # centre column
    inside_b = (b >= 0) & (b < s)
    in1 = (a >= 0) & (a < h1) & inside_b
    in2 = (a >= h1) & (a < s) & inside_b
    d1 = xp.maximum(xp.abs(a - h1 // 2), xp.abs(b - cb))
    d2 = xp.maximum(xp.abs(a - h1 - h2 // 2), xp.abs(b - cb))
    v1 = table[top_k] - table[xp.clip(d1, 0, top_k)]
    v2 = table[top_k] - table[xp.clip(d2, 0, top_k)]
    return xp.where(in1, v1, 0.0), xp.where(in2, v2, 0.0)


@functools.cache
def _half_norms(max_side: int) -> np.ndarray:
    """l2 norms of the two unnormalised halves of ``eta(s)`` for ``s = 0..max_side``
    (float32 ``[max_side + 1, 2]``), computed once on the host."""
    table = _inv_square_table(max_side + 1)
    g = np.arange(max_side)
    out = np.zeros((max_side + 1, 2), np.float32)
    for side in range(1, max_side + 1):
        v1, v2 = _halves(g[:, None], g[None, :], side, table, xp=np)
        out[side] = np.sqrt(np.sum(v1 * v1)), np.sqrt(np.sum(v2 * v2))
    return out


def centred_pattern(a, b, s, flip, max_side: int) -> jnp.ndarray:
    """The l2 Square attack's window pattern ``eta(s)`` (paper Sec. 4.2) at local coordinates.

    ``eta(s)`` is ``s x s``: the first ``s // 2`` rows hold ``+R(s // 2, s)``,
    the others ``-R(s - s // 2, s)``, where ``R(h, w)`` is a stack of
    concentric rectangles centred at ``(h // 2, w // 2)`` with value
    ``sum_{k=d+1}^{s//2+1} 1/k^2`` at Chebyshev distance ``d`` from the centre,
    scaled to unit l2 norm; the window is then scaled to unit l2 norm.  With
    ``flip`` the pattern is transposed (halves split by columns).

    Args:
      a, b: int arrays (broadcastable), row and column relative to the
        window's top-left corner; entries outside ``[0, s)^2`` give 0.
      s: scalar int (traced allowed), the window side, ``1 <= s <= max_side``.
      flip: bool, broadcastable with ``a`` and ``b``: transpose.
      max_side: static upper bound on ``s`` (sizes the table of half norms).

    Returns:
      float32 array of the broadcast shape of ``a, b, flip``.
    """
    table = jnp.asarray(_inv_square_table(max_side + 1))
    norms = jnp.asarray(_half_norms(max_side))  # [max_side + 1, 2], static
    n1, n2 = norms[s, 0], norms[s, 1]
    # both halves are unit vectors on disjoint supports: the window norm is
    # sqrt(2), or 1 when s == 1 (no first half)
    total = jnp.sqrt((n1 > 0).astype(jnp.float32) + (n2 > 0).astype(jnp.float32))
    aa, bb = jnp.where(flip, b, a), jnp.where(flip, a, b)
    v1, v2 = _halves(aa, bb, s, table)
    return (v1 / jnp.maximum(n1, _TINY) - v2 / jnp.maximum(n2, _TINY)) / total


def l2_init_perturbation(key, shape, eps) -> jnp.ndarray:
    """The l2 initialisation (paper Sec. 4.2): tiles of side ``max(H // 5, 1)`` from row and
    column ``max((H - 5 * side) // 2, 0)``, each ``eta(side)`` (random transpose) times a random
    sign per channel, scaled to l2 norm ``eps`` (before any box clipping).

    Args:
      key: PRNG key.
      shape: ``(H, W, C)``.
      eps: scalar radius.

    Returns:
      ``[H, W, C]`` float32 perturbation of l2 norm ``eps`` (0 if ``eps == 0``).
    """
    H, W, C = shape
    side = max(H // 5, 1)
    start = max((H - 5 * side) // 2, 0)
    nh, nw = H // side, W // side
    u = jax.random.uniform(key, (nh, nw, 1 + C))
    flips = u[..., 0] < 0.5
    signs = jnp.where(u[..., 1:] < 0.5, -1.0, 1.0)
    i = jnp.arange(H) - start
    j = jnp.arange(W) - start
    ti, tj = jnp.floor_divide(i, side), jnp.floor_divide(j, side)
    valid = ((i >= 0) & (ti < nh))[:, None] & ((j >= 0) & (tj < nw))[None, :]
    ti, tj = jnp.clip(ti, 0, nh - 1), jnp.clip(tj, 0, nw - 1)
    a, b = (i - ti * side)[:, None], (j - tj * side)[None, :]
    pat = centred_pattern(a, b, side, flips[ti[:, None], tj[None, :]], max(side, 1))
    delta = jnp.where(valid, pat, 0.0)[..., None] * signs[ti[:, None], tj[None, :]]
    return delta * (eps / jnp.maximum(jnp.sqrt(jnp.sum(delta * delta)), _TINY))


def _uniform_int(u, n):
    """``floor(u * n)`` in ``[0, n - 1]`` for ``u`` uniform in ``[0, 1)``."""
    return jnp.minimum(jnp.floor(u * n).astype(jnp.int32), n - 1)


def l2_window_update(delta, r1, c1, r2, c2, s, flip, sign, eps, max_side: int) -> jnp.ndarray:
    """The l2 Square update (paper Alg. 3) for given windows and draws, one example.

    Per channel, window W1 (top-left ``(r1, c1)``, side ``s``) becomes ``eta(s)
    * sign + delta_W1 / ||delta_W1||``, rescaled to l2 mass ``sqrt(max(eps^2 -
    ||delta||^2, 0) / C + ||delta_{W1 ∪ W2}||^2)``; W2 (top-left ``(r2, c2)``)
    outside W1 is zeroed; the result is rescaled to ``||.||_2 = eps``.

    Args:
      delta: ``[H, W, C]`` current perturbation ``x - x0``.
      r1, c1, r2, c2: scalar ints, window corners (``0 <= r <= H - s``).
      s: scalar int window side.
      flip: scalar bool, transpose ``eta``.
      sign: ``[C]`` in ``{-1, 1}``.
      eps: scalar radius.
      max_side: static bound on ``s``.

    Returns:
      ``[H, W, C]`` new perturbation with l2 norm ``eps`` (0 if ``eps == 0``);
      no box clipping.
    """
    H, W, _ = delta.shape
    C = delta.shape[-1]
    ii = jnp.arange(H)[:, None]
    jj = jnp.arange(W)[None, :]
    w1 = ((ii >= r1) & (ii < r1 + s) & (jj >= c1) & (jj < c1 + s))[..., None]  # [H, W, 1]
    w2 = ((ii >= r2) & (ii < r2 + s) & (jj >= c2) & (jj < c2 + s))[..., None]
    sq = delta * delta
    norm_img = jnp.sqrt(jnp.sum(sq))
    norm_w1 = jnp.sqrt(jnp.sum(jnp.where(w1, sq, 0.0), axis=(0, 1)))  # [C]
    norm_union = jnp.sqrt(jnp.sum(jnp.where(w1 | w2, sq, 0.0), axis=(0, 1)))  # [C]
    pat = centred_pattern(ii - r1, jj - c1, s, flip, max_side)[..., None]  # [H, W, 1]
    new = jnp.where(w1, pat * sign + delta / (norm_w1 + _TINY), 0.0)
    new_norm = jnp.sqrt(jnp.sum(new * new, axis=(0, 1)))  # [C]
    mass = jnp.sqrt(jnp.maximum(eps * eps - norm_img * norm_img, 0.0) / C + norm_union * norm_union)
    new = new * (mass / jnp.maximum(new_norm, _TINY))
    d = jnp.where(w1, new, jnp.where(w2, 0.0, delta))
    return d * (eps / jnp.maximum(jnp.sqrt(jnp.sum(d * d)), _TINY))


def l2_proposal(key, x, x0, eps, p, box=(0.0, 1.0)) -> jnp.ndarray:
    """One l2 Square proposal for one example: random windows, transpose and signs, then
    :func:`l2_window_update` and box clipping.

    Args:
      key: PRNG key.
      x: ``[H, W, C]`` current point (inside the l2 ball of ``x0`` and the box).
      x0: ``[H, W, C]`` clean input.
      eps: scalar radius.
      p: scalar area share from :func:`p_schedule`.
      box: element bounds.

    Returns:
      ``[H, W, C]`` the proposed point, ``||. - x0||_2 <= eps`` and inside the box.
    """
    H, W, C = x0.shape
    max_side = max(min(H, W) - 1, 1)
    s = l2_window_side(p, H * W * C, C, max_side)
    # one uniform draw per proposal (cheaper to compile than several randint/choice calls)
    u = jax.random.uniform(key, (6 + C,))
    r1, c1, r2, c2 = (_uniform_int(u[i], n) for i, n in enumerate((H - s + 1, W - s + 1, H - s + 1, W - s + 1)))
    flip = u[4] < 0.5
    sign = jnp.where(u[6:] < 0.5, -1.0, 1.0)
    d = l2_window_update(x - x0, r1, c1, r2, c2, s, flip, sign, eps, max_side)
    return jnp.clip(G.add_within(x0, d), box[0], box[1])


class SquareConfig(NamedTuple):
    apply: Callable
    n_queries: int
    p_init: float
    targeted: bool
    box: tuple
    p: float = math.inf


def _score(targeted):
    def score(z, ref, mask):
        losses = -cross_entropy(z, ref) if targeted else margin(z, ref)  # maximise
        ev = E.evaluation(losses, fooled(z, ref, targeted), mask)
        return ev.obj, ev

    return score


class SquareState(NamedTuple):
    """Square state: the problem, the iteration ``i`` (scalar), the current point ``x [B, H, W, C]``
    and its evaluation ``ev``, queries ``count [B]`` and the best-so-far point."""

    problem: Problem
    i: jax.Array
    x: jax.Array
    ev: E.Evaluation
    count: jax.Array
    best: E.Best


def _evaluate(cfg: SquareConfig):
    return E.make_batch_evaluate(cfg.apply, _score(cfg.targeted))


def init(cfg: SquareConfig, params, problem: Problem) -> SquareState:
    """Clean evaluation (M queries) and the initialisation (stripes / l2 tiles, or the warm start
    projected onto ball ∩ box; M queries): per sample ``fold_in(fold_in(key, sample_id), 0)``."""
    x0, ref, mask, eps, cap = problem.x0, problem.ref, problem.mask, problem.eps, problem.cap
    lo, hi = cfg.box
    B, M = ref.shape
    if x0.ndim != 4:
        raise ValueError(f"Square attack needs images [B, H, W, C], got shape {x0.shape}")
    _, H, W, C = x0.shape
    evaluate = _evaluate(cfg)
    n_sel = jnp.sum(mask > 0, axis=1).astype(jnp.int32)
    _, ev0 = evaluate(params, x0, ref, mask)
    count = jnp.full((B,), M, jnp.int32)

    def init_one(k, x0, eps, xi):
        if cfg.p == math.inf:
            stripes = jnp.where(jax.random.uniform(k, (1, W, C)) < 0.5, -1.0, 1.0)
            x = jnp.clip(G.add_within(x0, eps * stripes), lo, hi)
        else:
            x = jnp.clip(G.add_within(x0, l2_init_perturbation(k, (H, W, C), eps)), lo, hi)
        warm = G.project(xi, x0, eps, cfg.p, cfg.box)
        return jnp.where(problem.has_init, warm, x)

    keys = sample_keys(problem)  # init: fold_in(keys[b], 0), iteration it: fold_in(keys[b], it + 1)
    x = jax.vmap(init_one)(jax.vmap(lambda k: jax.random.fold_in(k, 0))(keys), x0, eps, problem.x_init)
    ok0 = (n_sel > 0) & Q.allowed(count, M, cap)
    _, ev = evaluate(params, x, ref, mask)
    count = Q.charge(count, M, ok0)
    x = Q.freeze(ok0, x, x0)
    ev = jax.vmap(E.select)(ok0, ev, ev0)
    best = jax.vmap(E.update_best)(E.Best(x0, ev0), x, ev, ok0)
    return SquareState(problem, jnp.zeros((), jnp.int32), x, ev, count, best)


def step(cfg: SquareConfig, s: SquareState, params) -> SquareState:
    """One proposal per still-active sample (M queries each), accepted if it raises the objective;
    samples whose selected members are all fooled, or whose budget is spent, are frozen."""
    pr = s.problem
    x0, ref, mask, eps, cap = pr.x0, pr.ref, pr.mask, pr.eps, pr.cap
    lo, hi = cfg.box
    B, M = ref.shape
    _, H, W, C = x0.shape
    n_feat = H * W * C
    it = s.i
    n_sel = jnp.sum(mask > 0, axis=1).astype(jnp.int32)

    def propose_linf(k, x, x0, eps, it):
        p = p_schedule(cfg.p_init, it, cfg.n_queries)
        side = jnp.clip(jnp.round(jnp.sqrt(p * n_feat / C)), 1, H - 1).astype(jnp.int32)
        u = jax.random.uniform(k, (2 + C,))
        rh = _uniform_int(u[0], H - side + 1)
        rw = _uniform_int(u[1], W - side + 1)
        ii = jnp.arange(H)[:, None, None]
        jj = jnp.arange(W)[None, :, None]
        win = (ii >= rh) & (ii < rh + side) & (jj >= rw) & (jj < rw + side)
        signs = jnp.where(u[2:] < 0.5, -1.0, 1.0)
        xn = jnp.where(win, G.add_within(x0, eps * signs), x)
        return jnp.clip(jnp.clip(xn, x0 - eps, x0 + eps), lo, hi)

    def propose_l2(k, x, x0, eps, it):
        return l2_proposal(k, x, x0, eps, p_schedule(cfg.p_init, it, cfg.n_queries), cfg.box)

    propose = propose_linf if cfg.p == math.inf else propose_l2
    done = s.ev.n_fooled >= n_sel
    active = ~done & (n_sel > 0) & Q.allowed(s.count, M, cap)
    kt = jax.vmap(lambda k: jax.random.fold_in(k, it + 1))(sample_keys(pr))
    xn = jax.vmap(propose, in_axes=(0, 0, 0, 0, None))(kt, s.x, x0, eps, it)
    _, evn = _evaluate(cfg)(params, xn, ref, mask)
    accept = active & (evn.obj > s.ev.obj)
    x = Q.freeze(accept, xn, s.x)
    ev = jax.vmap(E.select)(accept, evn, s.ev)
    best = jax.vmap(E.update_best)(s.best, xn, evn, active)
    return s._replace(i=it + 1, x=x, ev=ev, count=Q.charge(s.count, M, active), best=best)


def result(cfg: SquareConfig, s: SquareState, params) -> AttackResult:
    """``x_adv``: the current (accepted) point; ``best_x``: the best-so-far point."""
    del cfg, params
    return AttackResult(
        x_adv=s.x,
        success=s.ev.success,
        objective=s.ev.obj,
        member_loss=s.ev.losses,
        queries=s.count,
        best_x=s.best.x,
        best_success=s.best.ev.success,
        best_objective=s.best.ev.obj,
    )


def square_attack(cfg: SquareConfig) -> Attack:
    """The state machine: ``n_queries - 1`` proposals after the initialisation."""
    return Attack(init, step, result, cfg.n_queries - 1, cfg)


def make_square(
    apply: Callable,
    *,
    norm="linf",
    eps=None,
    n_queries: int = 5000,
    p_init: float = 0.8,
    targeted: bool = False,
    box=(0.0, 1.0),
    audit: bool = True,
) -> AttackFn:
    """Square attack (linf or l2), the black-box member of the suite.

    Args:
      apply: ``apply(params, x [B, H, W, C]) -> logits [M, B, C]`` (or ``[B, C]``).
      norm: ``"linf"`` or ``"l2"`` (see the module docstring for each variant).
      eps: default radius (scalar or ``[B]``).
      n_queries: iterations (one forward of every member each; 5,000 per
        AutoAttack's Square configuration).
      p_init: initial window area share (0.8, AutoAttack's setting for linf
        and l2; the authors' repository suggests 0.05 / 0.1 for undefended
        ImageNet models).
      targeted: minimise cross-entropy to ``ref`` instead of the margin of ``ref``.
      box, audit: as in :func:`sarjax.attacks.pgd.make_pgd`.

    Returns:
      An AttackFn (as :func:`sarjax.attacks.pgd.make_pgd`):
      ``fn(params, x0 [B, H, W, C], ref, mask=None, key, *, eps=None,
      max_queries=None, x_init=None) -> AttackResult``; ``objective`` is the
      mean margin of the selected members (untargeted) or their negated mean
      CE to the target; ``queries`` counts M per evaluated point (clean,
      initialisation, then every iteration while the sample is active).

    Raises:
      ValueError: for a norm other than linf / l2, ``n_queries < 1`` or
        ``p_init`` outside ``(0, 1]``.
    """
    p = canonical_norm(norm)
    if p not in (math.inf, 2.0):
        raise ValueError(f"Square attack supports norm 'linf' or 'l2', got {norm!r}")
    n_queries = V.check_positive_int("n_queries", n_queries)
    if not 0.0 < p_init <= 1.0:
        raise ValueError(f"p_init must be in (0, 1], got {p_init!r}")
    cfg = SquareConfig(apply, n_queries, float(p_init), bool(targeted), tuple(float(b) for b in box), p)
    return V.public(
        square_attack(cfg),
        name="square" if p == math.inf else "square-l2",
        p=p,
        default_eps=eps,
        box=box,
        audit=audit,
        apply=apply,
        ref_name="targets" if targeted else "labels",
    )
