"""Square attack (linf): score-based black-box random search (Andriushchenko et al., ECCV 2020).

Defaults from the paper and AutoAttack's configuration: 5,000 queries,
``p_init = 0.8``, the piecewise-constant schedule of the square's area share
``p`` (halved at 10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000 of 10,000
iterations, rescaled to ``n_queries``), vertical-stripe initialisation,
margin loss (untargeted) or cross-entropy to the target (targeted), a
proposal accepted only if it improves the loss, and early stop per sample.

Only forward passes are used: each iteration costs M queries per still-active
sample (one forward of every member).  The model runs once per iteration on
the whole batch; proposals are drawn per example and vmapped.

Not implemented: the l2 variant of the paper (its centred-square mass
redistribution); ``make_square`` raises for ``norm != linf``.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from sarjax.attacks import _engine as E
from sarjax.attacks import queries as Q
from sarjax.attacks.losses import cross_entropy, fooled, margin
from sarjax.attacks.result import AttackResult
from sarjax.attacks.threat import canonical_norm

_SCHEDULE_AT = (10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000)


def p_schedule(p_init: float, it, n_iters: int):
    """Square area share at iteration ``it`` (paper's schedule, defined for 10,000 iterations)."""
    i = jnp.floor(it / n_iters * 10000)
    k = jnp.searchsorted(jnp.asarray(_SCHEDULE_AT, jnp.float32), i, side="left")
    return p_init / (2.0 ** k)


class SquareConfig(NamedTuple):
    apply: Callable
    n_queries: int
    p_init: float
    targeted: bool
    box: tuple


def _score(targeted):
    def score(z, ref, mask):
        losses = -cross_entropy(z, ref) if targeted else margin(z, ref)  # maximise
        succ = fooled(z, ref, targeted)
        w = mask.astype(z.dtype)
        obj = jnp.sum(w * losses) / jnp.maximum(jnp.sum(w), 1.0)
        n = jnp.sum(succ & (mask > 0)).astype(jnp.int32)
        return obj, E.Evaluation(obj, losses, succ, n)
    return score


@partial(jax.jit, static_argnums=0)
def square_kernel(cfg: SquareConfig, params, x0, ref, mask, eps, cap, key, x_init, has_init):
    """Batch kernel; arguments as :func:`sarjax.attacks._engine.gradient_kernel` (``x_init``
    replaces the stripe initialisation where ``has_init``)."""
    lo, hi = cfg.box
    B, M = ref.shape
    if x0.ndim != 4:
        raise ValueError(f"Square attack needs images [B, H, W, C], got shape {x0.shape}")
    _, H, W, C = x0.shape
    n_feat = H * W * C
    evaluate = E.make_batch_evaluate(cfg.apply, _score(cfg.targeted))
    upd = jax.vmap(E.update_best)
    n_sel = jnp.sum(mask > 0, axis=1).astype(jnp.int32)
    keys = jax.random.split(key, B)
    _, ev0 = evaluate(params, x0, ref, mask)
    count = jnp.full((B,), M, jnp.int32)

    def init_one(k, x0, eps, xi):
        stripes = jax.random.choice(k, jnp.asarray([-1.0, 1.0]), (1, W, C))
        x = jnp.clip(x0 + eps * stripes, lo, hi)
        warm = jnp.clip(jnp.clip(xi, x0 - eps, x0 + eps), lo, hi)
        return jnp.where(has_init, warm, x)

    x = jax.vmap(init_one)(jax.vmap(lambda k: jax.random.fold_in(k, 0))(keys), x0, eps, x_init)
    ok0 = (n_sel > 0) & Q.allowed(count, M, cap)
    _, ev = evaluate(params, x, ref, mask)
    count = Q.charge(count, M, ok0)
    x = Q.freeze(ok0, x, x0)
    ev = jax.vmap(E.select)(ok0, ev, ev0)
    best = upd(E.Best(x0, ev0), x, ev, ok0)

    def propose(k, x, x0, eps, it):
        p = p_schedule(cfg.p_init, it, cfg.n_queries)
        s = jnp.clip(jnp.round(jnp.sqrt(p * n_feat / C)), 1, H - 1).astype(jnp.int32)
        k1, k2, k3 = jax.random.split(k, 3)
        rh = jax.random.randint(k1, (), 0, H - s + 1)
        rw = jax.random.randint(k2, (), 0, W - s + 1)
        ii = jnp.arange(H)[:, None, None]
        jj = jnp.arange(W)[None, :, None]
        win = (ii >= rh) & (ii < rh + s) & (jj >= rw) & (jj < rw + s)
        signs = jax.random.choice(k3, jnp.asarray([-1.0, 1.0]), (1, 1, C))
        xn = jnp.where(win, x0 + eps * signs, x)
        return jnp.clip(jnp.clip(xn, x0 - eps, x0 + eps), lo, hi)

    def body(c, it):
        x, ev, count, best = c
        done = ev.n_fooled >= n_sel
        active = ~done & (n_sel > 0) & Q.allowed(count, M, cap)
        kt = jax.vmap(lambda k: jax.random.fold_in(k, it + 1))(keys)
        xn = jax.vmap(propose, in_axes=(0, 0, 0, 0, None))(kt, x, x0, eps, it)
        _, evn = evaluate(params, xn, ref, mask)
        accept = active & (evn.obj > ev.obj)
        x = Q.freeze(accept, xn, x)
        ev = jax.vmap(E.select)(accept, evn, ev)
        best = upd(best, xn, evn, active)
        return (x, ev, Q.charge(count, M, active), best), None

    (x, ev, count, best), _ = jax.lax.scan(body, (x, ev, count, best), jnp.arange(cfg.n_queries - 1))
    return AttackResult(x_adv=x, success=ev.success, objective=ev.obj, member_loss=ev.losses,
                        queries=count, best_x=best.x, best_success=best.ev.success,
                        best_objective=best.ev.obj)


def make_square(apply: Callable, *, norm="linf", eps=None, n_queries: int = 5000, p_init: float = 0.8,
                targeted: bool = False, box=(0.0, 1.0), audit: bool = True) -> Callable:
    """Square attack (linf), the black-box member of the suite.

    Args:
      apply: ``apply(params, x [B, H, W, C]) -> logits [M, B, C]`` (or ``[B, C]``).
      norm: ``"linf"`` only (see module docstring).
      eps: default radius (scalar or ``[B]``).
      n_queries: iterations (one forward of every member each; 5,000 per paper/AutoAttack).
      p_init: initial square area share (0.8 per AutoAttack's linf setting).
      targeted: minimise cross-entropy to ``ref`` instead of the margin of ``ref``.
      box, audit: as in :func:`sarjax.attacks.pgd.make_pgd`.

    Returns:
      ``fn(params, x0 [B, H, W, C], ref, mask=None, key=None, *, eps=None,
      max_queries=None, x_init=None) -> AttackResult``; ``objective`` is the
      negated mean margin (untargeted) or negated CE to the target.
    """
    p = canonical_norm(norm)
    if p != math.inf:
        raise ValueError(f"Square attack is implemented for linf only, got {norm!r}")
    n_queries = E.check_positive_int("n_queries", n_queries)
    if not 0.0 < p_init <= 1.0:
        raise ValueError(f"p_init must be in (0, 1], got {p_init!r}")
    cfg = SquareConfig(apply, n_queries, float(p_init), bool(targeted), tuple(float(b) for b in box))
    return E.public(partial(square_kernel, cfg), name="square", p=p, default_eps=eps, box=box,
                    audit_output=audit)
