"""Minimum-norm APGD (APGD-min; the frontier paper Section 3.3) for l1, l2, linf.

APGD's projected-gradient updates (Croce & Hein, ICML 2020; l1: Croce & Hein,
ICCV 2021) with a per-sample radius ``eps_t`` instead of a fixed one:

* ``eps_0`` is the first-order boundary estimate ``||delta_0|| + |m| / ||grad m||_q``
  (``m`` the difference of logits, ``q`` the dual exponent) at the start;
* after every evaluation, as in FMN, the radius shrinks towards the best
  adversarial norm (``min(eps (1 - gamma), ||delta*||)``) when the iterate is
  adversarial and expands (``eps (1 + gamma)``) otherwise, with ``gamma``
  cosine-decayed 0.05 -> 0.001;
* the step size is rescaled by ``eps_{t+1} / eps_t``;
* at APGD's checkpoints the step is halved (l2/linf: oscillation or no
  improvement, APGD's conditions with rho = 0.75) and the iterate restarts
  from the best adversarial point (the best-loss point before any success);
* l1 keeps l1-APGD's sparse sign direction (top-k elements by ``|grad|``),
  no momentum, exact projection onto ``B1(eps_t) ∩ [0, 1]^d`` and its
  sparsity-ratio checkpoints (every 4% of the steps: the step is reset to
  ``eps`` when the sparsity of the best point dropped below 0.95 of the
  last, divided by 1.5 otherwise, within ``[eps / 10, eps]``; the share of
  elements the step moves becomes ``||delta*||_0 / d / 1.5``).

One deliberate difference from AutoAttack's l1-APGD: the number of elements
the sign step moves, ``k = ||delta*||_0 / 1.5``, is rounded to the nearest
integer (at least 1), where AutoAttack's index arithmetic rounds it up.
Rounding up pins ``k`` at 2 as soon as the best point has 2 non-zero
elements (``ceil(2 / 1.5) = 2``).  The sign step moves its ``k`` elements by
equal amounts and the l1 projection takes equal amounts off every non-zero
element, so the split of the mass between them never changes: the
minimum-norm search stalls on a 2-3 element split of a one-element optimum,
measured up to 1.34x the optimum on affine models (3 equal elements with
``|w|`` 0.32, 0.21, 0.19).  With ``k = 1`` the step feeds the element of
largest ``|grad|`` while the projection drains the others, which is the
greedy l1 optimum on an affine model in the box.  Fixed-radius l1-APGD
never needed this: any adversarial point inside the ball is good enough.

Queries: the start costs 3 (one forward, two backward: the loss gradient and
the margin gradient for ``eps_0``), every step 2.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from sarjax.attacks import geometry
from sarjax.attacks import losses as L
from sarjax.attacks import minnorm as mn

_LOSSES = {"ce": L.goal_cross_entropy, "dlr": L.goal_dlr}  # ascended


def _schedule(steps, p):
    """APGD's checkpoint schedule for ``steps`` steps (traced): ``(k, k_min, dec)`` as ints in
    float32; the first checkpoint is after step ``k - 1``, the next ones ``max(k - dec, k_min)``
    further on each time (l1: every ``k`` steps, ``k = max(4% of the steps, 1)``).  Integer
    arithmetic ``(22 * steps) // 100`` stands for AutoAttack's ``int(0.22 * steps)``."""
    n = steps.astype(jnp.int32)
    pct = lambda c: jnp.maximum((c * n) // 100, 1).astype(jnp.float32)
    if p == 1.0:
        k = pct(4)
        return k, k, jnp.zeros_like(k)
    return pct(22), pct(6), pct(3)


def _setup(ctx):
    loss = _LOSSES[ctx.hp["loss"]]
    alpha = 1.0 if ctx.p == 1.0 else 2.0
    return loss, alpha, ctx.x0.size, mn.worst_norm(ctx.x0, ctx.p)


def _init(ctx, x_init):
    f, x0, y, t, p, strict = ctx.f, ctx.x0, ctx.y, ctx.t, ctx.p, ctx.strict
    loss, alpha, d, worst = _setup(ctx)
    # start: one forward, two backward passes
    logits, vjp = jax.vjp(f, x_init)
    A = loss(logits, y, t)
    g = vjp(jax.grad(loss)(logits, y, t))[0]  # ascent direction of the attack loss
    gm = vjp(jax.grad(L.goal_margin)(logits, y, t))[0]
    g = jnp.where(jnp.isfinite(g), g, 0.0)
    gm = jnp.where(jnp.isfinite(gm), gm, 0.0)
    m = L.goal_margin(logits, y, t)
    adv = L.goal_reached(logits, y, t, strict)
    n0 = geometry.norm(x_init - x0, p)
    bx = jnp.where(adv, x_init, x0)
    bn = jnp.where(adv, n0, jnp.inf)
    bg = g
    eps = jnp.where(adv, n0, n0 + jnp.abs(m) / jnp.maximum(geometry.dual_norm(gm, p), 1e-12))
    eps = jnp.minimum(eps, worst)
    eta = alpha * eps
    sp0 = geometry.norm(x_init - x0, 0)
    topk = jnp.where(sp0 > 0, sp0 / d / 1.5, 0.2)
    k, _, _ = _schedule(ctx.steps, p)
    state = dict(
        x=x_init,
        xp=x_init,
        g=g,
        A=A,
        eps=eps,
        eta=eta,
        bx=bx,
        bn=bn,
        bg=bg,
        found=adv,
        Ab=A,
        xab=x_init,
        gab=g,
        nincr=jnp.zeros((), jnp.int32),
        Ab_last=A,
        red_last=jnp.asarray(False),
        since=jnp.zeros((), jnp.int32),
        topk=jnp.asarray(topk, jnp.float32),
        sp_old=jnp.asarray(jnp.where(sp0 > 0, sp0, d), jnp.float32),
        next_check=k - 1.0,
        ck=k,
    )
    return state, bn


def _step(ctx, s, i):
    f, x0, y, t, p, strict, steps = ctx.f, ctx.x0, ctx.y, ctx.t, ctx.p, ctx.strict, ctx.steps
    loss, alpha, d, worst = _setup(ctx)
    rho, g0, g1 = ctx.hp["rho"], ctx.hp["gamma_init"], ctx.hp["gamma_final"]
    _, kmin, dec = _schedule(steps, p)
    is_check = i == s["next_check"]
    ck = jnp.where(is_check, jnp.maximum(s["ck"] - dec, kmin), s["ck"])
    next_check = jnp.where(is_check, s["next_check"] + ck, s["next_check"])
    x, eps, eta = s["x"], s["eps"], s["eta"]
    gamma = mn.cosine(i, steps, g0, g1)
    if p == 1.0:
        # keep round(topk * d) >= 1 elements (see module doc)
        k = jnp.round(s["topk"] * d).astype(jnp.int32)
        direction = geometry.sparse_sign_top_k(s["g"], x, k)
        x_new = geometry.project(x + eta * direction, x0, eps, p)
    else:
        a = jnp.where(i == 0, 1.0, 0.75)
        z = geometry.project(x + eta * geometry.steepest(s["g"], p), x0, eps, p)
        x_new = geometry.project(x + a * (z - x) + (1.0 - a) * (x - s["xp"]), x0, eps, p)
    A_new, g_new, logits = L.value_grad(f, loss, x_new, y, t)
    adv = L.goal_reached(logits, y, t, strict)
    n = geometry.norm(x_new - x0, p)
    better = adv & (n < s["bn"])
    bx = jnp.where(better, x_new, s["bx"])
    bn = jnp.where(better, n, s["bn"])
    bg = jnp.where(better, g_new, s["bg"])
    found = s["found"] | adv
    nincr = s["nincr"] + (A_new > s["A"]).astype(jnp.int32)
    up = A_new > s["Ab"]
    Ab = jnp.where(up, A_new, s["Ab"])
    xab = jnp.where(up, x_new, s["xab"])
    gab = jnp.where(up, g_new, s["gab"])
    # radius: shrink towards the best norm after success, expand otherwise
    eps_new = jnp.where(adv, jnp.minimum(eps * (1.0 - gamma), bn), eps * (1.0 + gamma))
    eps_new = jnp.minimum(eps_new, worst)
    eta = eta * jnp.where(eps > 0, eps_new / jnp.where(eps > 0, eps, 1.0), 1.0)
    since = s["since"] + 1
    # restart point: best adversarial, else best loss
    rx = jnp.where(found, bx, xab)
    rg = jnp.where(found, bg, gab)
    if p == 1.0:
        sp = geometry.norm(rx - x0, 0)
        fl = (sp / jnp.maximum(s["sp_old"], 1.0)) < 0.95
        eta_c = jnp.where(fl, alpha * eps_new, eta / 1.5)
        eta_c = jnp.clip(eta_c, alpha * eps_new / 10.0, alpha * eps_new)
        restart = is_check & fl
        eta = jnp.where(is_check, eta_c, eta)
        topk = jnp.where(is_check, jnp.clip(sp / d / 1.5, 0.0, 1.0), s["topk"])
        sp_old = jnp.where(is_check, sp, s["sp_old"])
        red_last, Ab_last = s["red_last"], s["Ab_last"]
    else:
        cond1 = nincr.astype(jnp.float32) <= since.astype(jnp.float32) * rho
        cond2 = (~s["red_last"]) & (s["Ab_last"] >= Ab)
        restart = is_check & (cond1 | cond2)
        eta = jnp.where(restart, eta / 2.0, eta)
        red_last = jnp.where(is_check, cond1 | cond2, s["red_last"])
        Ab_last = jnp.where(is_check, Ab, s["Ab_last"])
        topk, sp_old = s["topk"], s["sp_old"]
    x_next = jnp.where(restart, geometry.project(rx, x0, eps_new, p), x_new)
    xp = jnp.where(restart, x_next, x)
    g_next = jnp.where(restart, rg, g_new)
    A_next = A_new  # loss of the point the increase counter compares against
    s = dict(
        x=x_next,
        xp=xp,
        g=g_next,
        A=A_next,
        eps=eps_new,
        eta=eta,
        bx=bx,
        bn=bn,
        bg=bg,
        found=found,
        Ab=Ab,
        xab=xab,
        gab=gab,
        nincr=jnp.where(is_check, 0, nincr),
        Ab_last=Ab_last,
        red_last=red_last,
        since=jnp.where(is_check, 0, since),
        topk=topk,
        sp_old=sp_old,
        next_check=next_check,
        ck=ck,
    )
    return s


def _best(s):
    return s["bx"], s["bn"]


def _costs(hp, num_classes):
    return 3, 2  # the start: one forward, two backward passes; then 2 per step


def spec(*, loss: str = "ce", rho: float = 0.75, gamma_init: float = 0.05, gamma_final: float = 0.001) -> mn.Spec:
    """APGD-min as a :class:`~sarjax.attacks.minnorm.Spec`.

    Args:
      loss: ``"ce"`` or ``"dlr"`` (the frontier paper Table 3 runs both, APGDmin-CE and
        APGDmin-DLR; DLR needs >= 3 classes, its targeted form 4).
      rho: APGD's oscillation threshold 0.75 (Croce & Hein 2020).
      gamma_init, gamma_final: radius update rate, cosine 0.05 -> 0.001
        (FMN's defaults, which the frontier paper Section 3.3 follows).
    """
    if loss not in _LOSSES:
        raise ValueError(f"loss must be 'ce' or 'dlr', got {loss!r}")
    return mn.make_spec(
        f"apgd_min-{loss}",
        _init,
        _step,
        (1, 2, math.inf),
        dict(loss=loss, rho=float(rho), gamma_init=float(gamma_init), gamma_final=float(gamma_final)),
        costs=_costs,
        best=_best,
        min_classes=3 if loss == "dlr" else 2,
    )


make_apgd_min = mn.factory(
    spec,
    math.inf,
    1000,
    name="make_apgd_min",
    doc="""Minimum-norm APGD on a pool (l1, l2, linf; :func:`sarjax.attacks.minnorm.make`); default
norm linf, 1000 queries.  ``**hp``: ``loss`` (``"ce"`` / ``"dlr"``), see :func:`spec`.
""",
)
