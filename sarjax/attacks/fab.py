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


def _halfspace_setup(x, w, b):
    """``(xf, a, need, room, sgn)``: the step ``d`` must reach ``a . d = need >= 0`` inside the box."""
    xf, wf = jnp.ravel(x), jnp.ravel(w)
    c = jnp.dot(wf, xf) - b
    a = jnp.where(c >= 0, -wf, wf)  # need a . d = |c|
    room = jnp.where(a > 0, 1.0 - xf, xf)
    return xf, a, jnp.abs(c), room, jnp.sign(a)


def hyperplane_box_step_sort(x: jax.Array, w: jax.Array, b, p) -> jax.Array:
    """:func:`hyperplane_box_step` by sorting (the reference; FAB's step until sarjax 0.3).

    l1: the fractional knapsack on ``|w|`` in decreasing order; l2 / linf: the piecewise linear
    ``H(lam)`` evaluated at its breakpoints in sorted order.  Same arguments and result.
    """
    xf, a, need, room, sgn = _halfspace_setup(x, w, b)
    absa = jnp.abs(a)
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


def _knapsack_threshold(absa, g, need):
    """Smallest non-negative float ``v`` with ``sum(g[absa >= v]) <= need``, by bisection on the
    float32 bit pattern (monotone for non-negative floats): 31 passes, exact."""
    bits = jax.lax.bitcast_convert_type(absa.astype(jnp.float32), jnp.int32)

    def mass(t):
        return jnp.sum(jnp.where(bits >= t, g, 0.0))

    def body(_, c):
        lo, hi = c  # mass(lo) > need (or lo = 0), mass(hi) <= need
        mid = lo + (hi - lo) // 2
        ok = mass(mid) <= need
        return jnp.where(ok, lo, mid), jnp.where(ok, mid, hi)

    hi0 = jnp.max(bits) + 1
    lo, hi = jax.lax.fori_loop(0, 31, body, (jnp.asarray(0, jnp.int32), hi0))
    return jnp.where(mass(jnp.asarray(0, jnp.int32)) <= need, 0, hi), bits


def hyperplane_box_step(x: jax.Array, w: jax.Array, b, p) -> jax.Array:
    """Smallest-lp step ``d`` with ``w . (x + d) = b`` and ``x + d`` in ``[0, 1]``, without a sort.

    With ``a`` the normal oriented so that the step needs ``a . d = need >= 0`` and
    ``room_i`` the distance to the box face in the direction of ``a_i``:

    * l2 / linf: ``d_i = sign(a_i) min(lam s_i, room_i)`` with ``s = |a|`` (l2) or ``1``
      (linf) and ``lam`` the root of the concave, increasing, piecewise linear
      ``H(lam) = sum_i |a_i| min(lam s_i, room_i) = need``.  Newton's method from ``lam = 0``
      stays left of the root and lands on it once the unclipped set ``{lam s_i < room_i}``
      stops shrinking (the same argument as :func:`sarjax.attacks.pdpgd.project_l1_ball_newton`,
      Michelot 1986; Condat 2016); each step is one O(d) pass.
    * l1: the fractional knapsack on ``|a|`` (fill the largest ``|a_i|`` first): the
      threshold ``v`` on ``|a|`` above which pixels are filled is found by a 31-step
      bisection on the float32 bit pattern (exact), the pixel(s) just below it filled
      partially (tied pixels share the remainder in proportion to their room: another
      optimum of the same norm).

    Equal to the sorted :func:`hyperplane_box_step_sort` within float tolerance (tested;
    the sums run in another order).  When the hyperplane does not meet the box, returns the
    step to the box corner that gets closest to it.

    Args:
      x: ``[*S]`` point in the box.
      w: ``[*S]`` hyperplane normal.
      b: scalar offset.
      p: ``1, 2`` or ``inf``.

    Returns:
      ``[*S]`` step.
    """
    xf, a, need, room, sgn = _halfspace_setup(x, w, b)
    absa = jnp.abs(a)
    g = absa * room  # how far pixel i alone can move a . d
    if p == 1.0:
        v, bits = _knapsack_threshold(absa, g, need)
        full = bits >= v
        rest = need - jnp.sum(jnp.where(full, g, 0.0))
        below = jnp.where(full, -1.0, absa)
        top = jnp.max(below)  # the next |a| below the threshold: filled partially
        tied = (below == top) & (top > 0)
        share = jnp.sum(jnp.where(tied, g, 0.0))
        frac = jnp.clip(rest / jnp.where(share > 0, share, 1.0), 0.0, 1.0)
        amt = jnp.where(full, room, jnp.where(tied, frac * room, 0.0))
        d = sgn * amt
    else:
        s = jnp.where(absa > 0, absa if p == 2.0 else jnp.ones_like(absa), 0.0)
        reach = jnp.sum(jnp.where(s > 0, g, 0.0))
        n = absa.size

        def lin(lam):
            free = (lam * s < room) & (s > 0)
            clipped = jnp.sum(jnp.where(free | (s == 0), 0.0, g))
            slope = jnp.sum(jnp.where(free, absa * s, 0.0))
            return free, clipped, slope

        def cond(c):
            _, count, prev, i = c
            return (count < prev) & (i <= n)

        def body(c):
            lam, count, _, i = c
            free, clipped, slope = lin(lam)
            cnt = jnp.sum(free.astype(jnp.int32))
            new = (need - clipped) / jnp.maximum(slope, 1e-30)
            return jnp.maximum(new, lam), cnt, count, i + 1

        # state: (lam, size of the free set lam was computed from, the size before, steps); the
        # loop ends when the free set at the newest lam has the size of the one before it
        big = jnp.asarray(n + 1, jnp.int32)
        init = (jnp.asarray(0.0, xf.dtype), big, big + 1, jnp.asarray(0, jnp.int32))
        lam, _, _, _ = jax.lax.while_loop(cond, body, init)
        d = jnp.where(need >= reach, sgn * jnp.where(s > 0, room, 0.0), sgn * jnp.minimum(lam * s, room))
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
