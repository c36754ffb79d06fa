"""Fast Adaptive Boundary attack (FAB; Croce & Hein, ICML 2020) for l1, l2, linf.

Each iteration linearises the classifier at the iterate, picks the class
whose linearised boundary is nearest (``|z_j - z_y| / ||grad(z_j - z_y)||_q``),
projects both the iterate and the ORIGINAL input onto that hyperplane
intersected with the box (exact lp projections), and moves to the convex
combination ``(1 - a)(x + eta d_x) + a (x0 + eta d_0)`` with
``a = min(||d_x|| / (||d_x|| + ||d_0||), alpha_max)``; an adversarial iterate
is pulled back towards ``x0`` by ``beta``.

Queries per iteration: one forward and ``C - 1`` backward passes (one per
other class; FAB-T: one towards its target) at the iterate, plus one forward
to check the new point; plus one forward of ``x0`` at the start.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from sarjax.attacks import geometry
from sarjax.attacks import losses as L
from sarjax.attacks import minnorm as mn


def hyperplane_box_step(x: jax.Array, w: jax.Array, b, p) -> jax.Array:
    """Smallest-lp step ``d`` with ``w . (x + d) = b`` and ``x + d`` in ``[0, 1]``.

    Exact for l1 (fractional knapsack on ``|w|``), l2 and linf (piecewise
    linear in the multiplier, solved on its sorted breakpoints).  When the
    hyperplane does not meet the box, returns the step to the box corner
    that gets closest to it.

    Args:
      x: ``[*S]`` point in the box.
      w: ``[*S]`` hyperplane normal.
      b: scalar offset.
      p: ``1, 2`` or ``inf``.

    Returns:
      ``[*S]`` step.
    """
    xf, wf = jnp.ravel(x), jnp.ravel(w)
    c = jnp.dot(wf, xf) - b
    a = jnp.where(c >= 0, -wf, wf)  # need a . d = |c|
    need = jnp.abs(c)
    absa = jnp.abs(a)
    room = jnp.where(a > 0, 1.0 - xf, xf)
    sgn = jnp.sign(a)
    if p == 1.0:
        order = jnp.argsort(-absa)
        g = (absa * room)[order]
        cum = jnp.cumsum(g)
        prev = cum - g
        full = cum <= need
        part = (prev < need) & (cum > need)
        amt_s = jnp.where(full, room[order], jnp.where(part, (need - prev) / jnp.maximum(absa[order], 1e-30), 0.0))
        amt = jnp.zeros_like(xf).at[order].set(amt_s)
        d = sgn * amt
    else:
        s = jnp.where(absa > 0, absa if p == 2.0 else jnp.ones_like(absa), 0.0)
        r = jnp.where(s > 0, room / jnp.where(s > 0, s, 1.0), jnp.inf)
        order = jnp.argsort(r)
        rs, gs, ws = r[order], (absa * room)[order], (absa * s)[order]
        S = jnp.cumsum(gs) - gs  # fully clipped before k
        A = jnp.cumsum(ws[::-1])[::-1]  # still linear from k on
        fin = jnp.isfinite(rs)
        H = jnp.where(fin, S + jnp.where(fin, rs, 0.0) * A, S)
        ok = H >= need
        k = jnp.argmax(ok)
        r_max = jnp.max(jnp.where(fin, rs, 0.0))
        lam = jnp.where(jnp.any(ok), (need - S[k]) / jnp.maximum(A[k], 1e-30), r_max)
        d = sgn * jnp.minimum(lam * s, room)
    return jnp.where(need > 0, d, 0.0).reshape(x.shape)


def _init(ctx, x_init):
    """The start: one forward of ``x0`` (an already misclassified input has norm 0)."""
    adv0 = L.goal_reached(ctx.f(ctx.x0), ctx.y, ctx.t, ctx.strict)
    bn = jnp.where(adv0, 0.0, jnp.inf).astype(jnp.float32)
    return (x_init, ctx.x0, bn), bn


def _step(ctx, s, i):
    f, x0, y, t, p, hp = ctx.f, ctx.x0, ctx.y, ctx.t, ctx.p, ctx.hp
    targeted = hp["targeted"]
    q = geometry.dual_exponent(p)

    def linearise(x):
        logits, vjp = jax.vjp(f, x)
        C = logits.shape[-1]
        eye = jnp.eye(C, dtype=jnp.float32)
        if targeted:
            other = jnp.where(jnp.arange(C) == y, -jnp.inf, logits)
            j = jnp.where(t >= 0, t, jnp.argmax(other))
            (dg,) = vjp(eye[j] - eye[y])
            return logits[j] - logits[y], dg
        dgs = jax.vmap(lambda e: vjp(e - eye[y])[0])(eye)  # [C, *S]
        dfs = logits - logits[y]
        norms = jax.vmap(lambda g: geometry.norm(g, q))(dgs)
        ratio = jnp.abs(dfs) / jnp.maximum(norms, 1e-12)
        ratio = jnp.where(jnp.arange(C) == y, jnp.inf, ratio)
        j = jnp.argmin(ratio)
        return dfs[j], dgs[j]

    x, bx, bn = s
    df, dg = linearise(x)
    dg = jnp.where(jnp.isfinite(dg), dg, 0.0)
    bval = jnp.sum(dg * x) - df
    d1 = hyperplane_box_step(x, dg, bval, p)
    d2 = hyperplane_box_step(x0, dg, bval, p)
    a1 = jnp.maximum(geometry.norm(d1, p), 1e-8)
    a2 = jnp.maximum(geometry.norm(d2, p), 1e-8)
    alpha = jnp.clip(a1 / (a1 + a2), 0.0, hp["alpha_max"])
    x = jnp.clip((1 - alpha) * (x + hp["eta"] * d1) + alpha * (x0 + hp["eta"] * d2), 0.0, 1.0)
    adv = L.goal_reached(f(x), y, t, ctx.strict)
    bx, bn, _ = mn.track(bx, bn, x, x0, adv, p)
    x = jnp.where(adv, x0 + (x - x0) * hp["beta"], x)
    return x, bx, bn


def _costs(hp, num_classes):
    # start: one forward of x0; per iteration: one forward and C - 1 backward passes (FAB-T:
    # one backward) at the iterate plus one forward at the new point
    return 1, (3 if hp["targeted"] else num_classes + 1)


def spec(*, targeted: bool = False, alpha_max: float = 0.1, eta: float = 1.05, beta: float = 0.9) -> mn.Spec:
    """FAB as a :class:`~sarjax.attacks.minnorm.Spec`.

    Args:
      targeted: FAB-T: linearise only towards each sample's target (``targets``;
        samples with ``-1`` use the current runner-up class), one backward per
        iteration instead of ``C - 1`` (AutoAttack runs it at the top-9 classes).
      alpha_max, eta, beta: AutoAttack's FAB defaults 0.1, 1.05, 0.9
        (Croce & Hein 2020).
    """
    return mn.make_spec(
        "fab-t" if targeted else "fab",
        _init,
        _step,
        (1, 2, math.inf),
        dict(targeted=bool(targeted), alpha_max=float(alpha_max), eta=float(eta), beta=float(beta)),
        costs=_costs,
    )


def _fab_spec(*, fab_t: bool = False, **hp) -> mn.Spec:
    return spec(targeted=fab_t, **hp)


make_fab = mn.factory(
    _fab_spec,
    math.inf,
    1000,
    name="make_fab",
    doc="""FAB on a pool (l1, l2, linf; :func:`sarjax.attacks.minnorm.make`); default norm linf, 1000
queries.

``make_fab(apply, *, norm=inf, max_queries=1000, fab_t=False, targeted=False, success=None,
restarts=0, init_eps=None, stacked=False, audit=True, **hp)``.  AutoAttack's FAB runs 100
iterations; with ``C`` classes that is ``1 + 100 (C + 1)`` queries untargeted, ``1 + 300`` for
FAB-T.

Args:
  fab_t: FAB-T's linearisation (``spec(targeted=True)``): towards the target when
    ``targeted=True``, towards the current runner-up class otherwise.
  targeted: the targets convention (``ref`` = targets, ``labels=`` at the call).
  **hp: ``alpha_max``, ``eta``, ``beta`` (see :func:`spec`); the rest as
    :func:`sarjax.attacks.minnorm.make`.
""",
)
