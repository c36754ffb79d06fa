"""Square attack (linf, l2, l1): score-based black-box random search (Andriushchenko et al., ECCV 2020;
l1: Croce & Hein, ICML 2021, "Mind the box").

Shared defaults (paper Sec. 3-4 and AutoAttack's configuration of its Square
member): 5,000 queries, ``p_init = 0.8`` (AutoAttack's value for every norm),
the piecewise-constant schedule of the window's area share ``p`` (halved at
10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000 iterations of 10,000; with
``rescale_schedule=True``, the default here and the authors' ``p_selection``,
rescaled to ``n_queries``; AutoAttack builds its Square with
``resc_schedule=False``: the thresholds apply to the raw iteration count, so
5,000 queries end at ``p_init / 128``), margin loss (untargeted) or
cross-entropy to the target (targeted), a proposal accepted only if it
improves the loss, and early stop per sample once every selected member is
fooled.

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

l1 (AutoAttack's ``square.py``, branch ``norm == 'L1'``, the Square member of its l1 version,
Croce & Hein 2021; read, not copied):

* ``eta_1(s)``: the l2 pattern's two halves of opposite sign with weights ``1 / k^4`` in place
  of ``1 / k^2`` (value ``sum_{k = d + 1}^{s // 2 + 1} 1 / k^4`` at Chebyshev distance ``d``),
  each half of unit l1 norm, the window renormalised to unit l1 norm (:func:`l1_centred_pattern`);
* initialisation: the l2 grid of ``H // 5``-sided tiles, each ``eta_1`` times a random sign per
  channel, NOT rescaled (each tile and channel has l1 mass 1), then projected onto the l1 ball
  of radius ``eps`` ∩ the box around ``x0`` (:func:`l1_init_perturbation`);
* every proposal: the l2 windows and side rule; per channel, W1 becomes ``eta_1 * sign +
  delta_W1 / ||delta_W1||_1`` rescaled to l1 mass ``C (max(eps - ||delta||_1, 0) / C +
  ||delta_{W1 ∪ W2}||_1)`` (the reference's ``* c``: for grey images, ``C = 1``, the mass of W1 ∪ W2
  plus the unused budget), W2 outside W1 is zeroed, and the point is projected onto the l1 ball
  ∩ box around ``x0`` (the exact Euclidean projection, :func:`sarjax.attacks.geometry.project`;
  the reference's ``L1_projection`` at radius ``eps (1 - 1e-6)``, the same set up to its
  rounding margin) (:func:`l1_window_update`, :func:`l1_proposal`).

Deviations (documented): window positions are uniform over every position
that fits (the reference draws the top-left corner from ``[0, H - s)``,
never touching the last row); the l2 / l1 ``eta`` transpose and the signs are drawn
per sample (the reference draws one transpose per batch and tile); the l2 per-channel
mass follows the authors' repository (AutoAttack's port uses the mass of all
channels of W1 ∪ W2 in each channel before the final rescaling); the windows' side
is capped at ``min(H, W) - 1`` (the reference: ``min(H, W)``; equal for MNIST and CIFAR at
``p_init = 0.8``: sides 25 and 29).

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


def p_schedule(p_init: float, it, n_iters: int, rescale: bool = True):
    """Square area share at iteration ``it`` (0-based): ``p_init`` halved after each of 10, 50,
    200, 500, 1000, 2000, 4000, 6000, 8000 iterations (``10 < i <= 50``: ``p_init / 2``, ...).

    Args:
      p_init: the initial share.
      it: iteration (traced allowed).
      n_iters: the attack's iterations.
      rescale: map ``it`` to ``floor(it / n_iters * 10000)`` first (the paper's schedule is
        defined for 10,000 iterations; the authors' ``p_selection`` and torchattacks' default
        ``resc_schedule=True``); False: the raw ``it`` (AutoAttack's ``SquareAttack(...,
        resc_schedule=False)``).
    """
    i = jnp.floor(it / n_iters * 10000) if rescale else jnp.asarray(it, jnp.float32)
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


def _inv_power_table(n: int, power: int = 2) -> np.ndarray:
    """``T[m] = sum_{k=1}^{m} 1 / k^power`` for ``m = 0..n`` (float32 ``[n + 1]``; power 2: the
    l2 pattern, 4: the l1 pattern)."""
    return np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, n + 1) ** power)]).astype(np.float32)


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
def _half_norms(max_side: int, power: int = 2, order: int = 2) -> np.ndarray:
    """l``order`` norms of the two unnormalised halves of ``eta(s)`` (weights ``1 / k^power``) for
    ``s = 0..max_side`` (float32 ``[max_side + 1, 2]``), computed once on the host."""
    table = _inv_power_table(max_side + 1, power)
    g = np.arange(max_side)
    out = np.zeros((max_side + 1, 2), np.float32)
    for side in range(1, max_side + 1):
        v1, v2 = _halves(g[:, None], g[None, :], side, table, xp=np)
        out[side] = np.linalg.norm(v1.ravel(), ord=order), np.linalg.norm(v2.ravel(), ord=order)
    return out


def _pattern(a, b, s, flip, max_side: int, power: int, order: int) -> jnp.ndarray:
    """``eta(s)`` with weights ``1 / k^power``, halves and window of unit l``order`` norm."""
    table = jnp.asarray(_inv_power_table(max_side + 1, power))
    norms = jnp.asarray(_half_norms(max_side, power, order))  # [max_side + 1, 2], static
    n1, n2 = norms[s, 0], norms[s, 1]
    # both halves are unit vectors on disjoint supports: the window's l2 norm is sqrt(2) and its
    # l1 norm 2, or 1 when s == 1 (no first half)
    halves = (n1 > 0).astype(jnp.float32) + (n2 > 0).astype(jnp.float32)
    total = jnp.sqrt(halves) if order == 2 else halves
    aa, bb = jnp.where(flip, b, a), jnp.where(flip, a, b)
    v1, v2 = _halves(aa, bb, s, table)
    return (v1 / jnp.maximum(n1, _TINY) - v2 / jnp.maximum(n2, _TINY)) / total


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
    return _pattern(a, b, s, flip, max_side, 2, 2)


def l1_centred_pattern(a, b, s, flip, max_side: int) -> jnp.ndarray:
    """The l1 Square attack's window pattern ``eta_1(s)`` at local coordinates (AutoAttack's
    ``square.py``, ``eta`` / ``eta_rectangles`` with ``norm == 'L1'``).

    As :func:`centred_pattern` with the concentric rectangles weighted ``1 / k^4`` (value
    ``sum_{k=d+1}^{s//2+1} 1/k^4`` at Chebyshev distance ``d`` from a half's centre), each half
    scaled to unit l1 norm, the window to unit l1 norm (each half then carries 1/2).

    Args:
      a, b, s, flip, max_side: as :func:`centred_pattern`.

    Returns:
      float32 array of the broadcast shape of ``a, b, flip``, unit l1 norm over the window.
    """
    return _pattern(a, b, s, flip, max_side, 4, 1)


def _tiles(key, shape, pattern) -> jnp.ndarray:
    """The Square l2 / l1 initialisation's grid: tiles of side ``max(H // 5, 1)`` from row and
    column ``max((H - 5 * side) // 2, 0)``, each ``pattern(side)`` (random transpose) times a
    random sign per channel; zero outside the grid. ``[H, W, C]``, unscaled."""
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
    pat = pattern(a, b, side, flips[ti[:, None], tj[None, :]], max(side, 1))
    return jnp.where(valid, pat, 0.0)[..., None] * signs[ti[:, None], tj[None, :]]


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
    delta = _tiles(key, shape, centred_pattern)
    return delta * (eps / jnp.maximum(jnp.sqrt(jnp.sum(delta * delta)), _TINY))


def l1_init_perturbation(key, shape) -> jnp.ndarray:
    """The l1 initialisation's perturbation before projection (AutoAttack's ``square.py``,
    ``norm == 'L1'``): the l2 grid of tiles, each ``eta_1(side)`` (:func:`l1_centred_pattern`,
    random transpose) times a random sign per channel, NOT rescaled: every tile and channel
    carries l1 mass 1. The attack starts from its projection onto the l1 ball ∩ box around
    ``x0`` (``project(x0 + delta, x0, eps, 1)``).

    Args:
      key: PRNG key.
      shape: ``(H, W, C)``.

    Returns:
      ``[H, W, C]`` float32 perturbation of l1 norm ``C * (number of tiles)``.
    """
    return _tiles(key, shape, l1_centred_pattern)


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


def l1_window_update(delta, r1, c1, r2, c2, s, flip, sign, eps, max_side: int) -> jnp.ndarray:
    """The l1 Square update for given windows and draws, one example (AutoAttack's
    ``square.py``, ``attack_single_run`` with ``norm == 'L1'``).

    Per channel, window W1 (top-left ``(r1, c1)``, side ``s``) becomes ``eta_1(s) * sign +
    delta_W1 / ||delta_W1||_1``, rescaled to l1 mass ``C (max(eps - ||delta||_1, 0) / C +
    ||delta_{W1 ∪ W2}||_1)`` (norms per channel except the whole image's ``||delta||_1``; the
    factor ``C`` is the reference's); W2 (top-left ``(r2, c2)``) outside W1 is zeroed. No
    projection here: :func:`l1_proposal` projects onto the l1 ball ∩ box.

    Args:
      delta: ``[H, W, C]`` current perturbation ``x - x0``.
      r1, c1, r2, c2: scalar ints, window corners (``0 <= r <= H - s``).
      s: scalar int window side.
      flip: scalar bool, transpose ``eta_1``.
      sign: ``[C]`` in ``{-1, 1}``.
      eps: scalar radius.
      max_side: static bound on ``s``.

    Returns:
      ``[H, W, C]`` the new perturbation (its l1 norm can exceed ``eps`` before the projection).
    """
    H, W, C = delta.shape
    ii = jnp.arange(H)[:, None]
    jj = jnp.arange(W)[None, :]
    w1 = ((ii >= r1) & (ii < r1 + s) & (jj >= c1) & (jj < c1 + s))[..., None]  # [H, W, 1]
    w2 = ((ii >= r2) & (ii < r2 + s) & (jj >= c2) & (jj < c2 + s))[..., None]
    ad = jnp.abs(delta)
    norm_img = jnp.sum(ad)
    norm_w1 = jnp.sum(jnp.where(w1, ad, 0.0), axis=(0, 1))  # [C]
    norm_union = jnp.sum(jnp.where(w1 | w2, ad, 0.0), axis=(0, 1))  # [C]
    pat = l1_centred_pattern(ii - r1, jj - c1, s, flip, max_side)[..., None]  # [H, W, 1]
    new = jnp.where(w1, pat * sign + delta / (norm_w1 + _TINY), 0.0)
    new_norm = jnp.sum(jnp.abs(new), axis=(0, 1))  # [C]
    mass = (jnp.maximum(eps - norm_img, 0.0) / C + norm_union) * C
    new = new * (mass / jnp.maximum(new_norm, _TINY))
    return jnp.where(w1, new, jnp.where(w2, 0.0, delta))


def l1_proposal(key, x, x0, eps, p, box=(0.0, 1.0)) -> jnp.ndarray:
    """One l1 Square proposal for one example: random windows (the l2 side rule,
    :func:`l2_window_side`), transpose and signs, :func:`l1_window_update`, then the projection
    onto ``{x' : ||x' - x0||_1 <= eps} ∩ box``.

    Args:
      key: PRNG key.
      x: ``[H, W, C]`` current point (inside the l1 ball of ``x0`` and the box).
      x0: ``[H, W, C]`` clean input.
      eps: scalar radius.
      p: scalar area share from :func:`p_schedule`.
      box: element bounds.

    Returns:
      ``[H, W, C]`` the proposed point, ``||. - x0||_1 <= eps`` and inside the box.
    """
    H, W, C = x0.shape
    max_side = max(min(H, W) - 1, 1)
    s = l2_window_side(p, H * W * C, C, max_side)
    u = jax.random.uniform(key, (6 + C,))
    r1, c1, r2, c2 = (_uniform_int(u[i], n) for i, n in enumerate((H - s + 1, W - s + 1, H - s + 1, W - s + 1)))
    flip = u[4] < 0.5
    sign = jnp.where(u[6:] < 0.5, -1.0, 1.0)
    d = l1_window_update(x - x0, r1, c1, r2, c2, s, flip, sign, eps, max_side)
    return G.project(G.add_within(x0, d), x0, eps, 1.0, box)


class SquareConfig(NamedTuple):
    apply: Callable
    n_queries: int
    p_init: float
    targeted: bool
    box: tuple
    p: float = math.inf
    rescale: bool = True


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
    """Clean evaluation (M queries) and the initialisation (linf stripes, l2 tiles, l1 tiles projected, or the
    warm start projected onto ball ∩ box; M queries): per sample ``fold_in(fold_in(key, sample_id), 0)``."""
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
        elif cfg.p == 2.0:
            x = jnp.clip(G.add_within(x0, l2_init_perturbation(k, (H, W, C), eps)), lo, hi)
        else:  # l1: the unscaled tiles projected onto the l1 ball ∩ box (AutoAttack, norm L1)
            x = G.project(G.add_within(x0, l1_init_perturbation(k, (H, W, C))), x0, eps, 1.0, cfg.box)
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
        p = p_schedule(cfg.p_init, it, cfg.n_queries, cfg.rescale)
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
        return l2_proposal(k, x, x0, eps, p_schedule(cfg.p_init, it, cfg.n_queries, cfg.rescale), cfg.box)

    def propose_l1(k, x, x0, eps, it):
        return l1_proposal(k, x, x0, eps, p_schedule(cfg.p_init, it, cfg.n_queries, cfg.rescale), cfg.box)

    propose = {math.inf: propose_linf, 2.0: propose_l2, 1.0: propose_l1}[cfg.p]
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
        queries=Q.per_member(s.count, 0, s.problem.mask),  # every charge: one forward of every member
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
    rescale_schedule: bool = True,
) -> AttackFn:
    """Square attack (linf, l2 or l1), the black-box member of the suite.

    Args:
      apply: ``apply(params, x [B, H, W, C]) -> logits [M, B, C]`` (or ``[B, C]``).
      norm: ``"linf"``, ``"l2"`` or ``"l1"`` (see the module docstring for each variant).
      eps: default radius (scalar or ``[B]``).
      n_queries: iterations (one forward of every member each; 5,000 per
        AutoAttack's Square configuration).
      p_init: initial window area share (0.8, AutoAttack's setting for every norm,
        ``SquareAttack(p_init=.8)`` in ``autoattack.py``; the authors' repository suggests
        0.05 / 0.1 for undefended ImageNet models).
      targeted: minimise cross-entropy to ``ref`` instead of the margin of ``ref``.
      box, audit: as in :func:`sarjax.attacks.pgd.make_pgd`.
      rescale_schedule: rescale the ``p`` schedule (defined for 10,000 iterations) to
        ``n_queries`` (True: the authors' ``p_selection`` and torchattacks' default); AutoAttack
        runs its Square with False (:func:`p_schedule`).

    Returns:
      An AttackFn (as :func:`sarjax.attacks.pgd.make_pgd`):
      ``fn(params, x0 [B, H, W, C], ref, *, key, mask=None, eps=None,
      max_queries=None, x_init=None) -> AttackResult``; ``objective`` is the
      mean margin of the selected members (untargeted) or their negated mean
      CE to the target; ``queries`` counts M per evaluated point (clean,
      initialisation, then every iteration while the sample is active).

    Raises:
      ValueError: for a norm other than linf / l2 / l1, ``n_queries < 1`` or
        ``p_init`` outside ``(0, 1]``.
      TypeError: ``rescale_schedule`` not a bool.
    """
    p = canonical_norm(norm)
    if p not in (math.inf, 2.0, 1.0):
        raise ValueError(f"Square attack supports norm 'linf', 'l2' or 'l1', got {norm!r}")
    if not isinstance(rescale_schedule, bool):
        raise TypeError(f"rescale_schedule must be a bool, got {rescale_schedule!r}")
    n_queries = V.check_positive_int("n_queries", n_queries)
    if not 0.0 < p_init <= 1.0:
        raise ValueError(f"p_init must be in (0, 1], got {p_init!r}")
    cfg = SquareConfig(
        apply, n_queries, float(p_init), bool(targeted), tuple(float(b) for b in box), p, rescale_schedule
    )
    return V.public(
        square_attack(cfg),
        name={math.inf: "square", 2.0: "square-l2", 1.0: "square-l1"}[p],
        p=p,
        default_eps=eps,
        box=box,
        audit=audit,
        apply=apply,
        ref_name="targets" if targeted else "labels",
    )
