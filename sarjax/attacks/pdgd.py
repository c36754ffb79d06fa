"""Primal-Dual Gradient Descent (PDGD; Matyasko & Chau, 2021), l2.

Minimises the Lagrangian ``lam_0 ||delta||_2 + lam_1 softplus(m)`` (``m`` the
difference of logits, negative once adversarial) with Adam on ``delta``
(exponentially decayed rate) and gradient ascent on the log dual ratio
(``sign(m)``, linearly decayed rate), whose softmax is smoothed by an EMA.
2 queries per step.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from sarjax.attacks import losses as L
from sarjax.attacks import minnorm as mn
from sarjax.attacks.optim import adam


def _safe_l2(v):
    s = jnp.sum(v * v)
    return jnp.where(s > 0, jnp.sqrt(jnp.where(s > 0, s, 1.0)), 0.0)


def dual_init(hp):
    lam = jnp.asarray([0.0, -math.log(hp["dual_ratio_init"])], jnp.float32)
    return lam, jax.nn.softmax(lam)


def dual_update(lam, lam_ema, m, i, steps, hp):
    """Ascent on the log dual ratio with sign(m), then the EMA of its softmax."""
    theta = hp["dual_lr"] * (
        (steps - 1 - i) / jnp.maximum(steps - 1, 1) * (1 - hp["dual_lr_decrease"]) + hp["dual_lr_decrease"]
    )
    lo = math.log(hp["dual_min_ratio"])
    lam = lam.at[1].set(jnp.clip(lam[1] + theta * jnp.sign(m), lo, -lo))
    lam_ema = lam_ema + (1.0 - hp["dual_ema"]) * (jax.nn.softmax(lam) - lam_ema)
    return lam, lam_ema


def _init(ctx, x_init):
    lam, lam_ema = dual_init(ctx.hp)
    x0 = ctx.x0
    return (x_init, jnp.zeros_like(x0), jnp.zeros_like(x0), lam, lam_ema, x0, jnp.asarray(jnp.inf, jnp.float32)), None


def _step(ctx, s, i):
    f, x0, y, t, hp, steps = ctx.f, ctx.x0, ctx.y, ctx.t, ctx.hp, ctx.steps

    def loss_fn(x, lam_ema):
        logits = f(x)
        m = -L.goal_margin(logits, y, t)  # the constraint, negative once adversarial
        return lam_ema[0] * _safe_l2(x - x0) + lam_ema[1] * jax.nn.softplus(m), (logits, m)

    x, m1, m2, lam, lam_ema, bx, bn = s
    (_, (logits, m)), g = jax.value_and_grad(loss_fn, has_aux=True)(x, lam_ema)
    g = jnp.where(jnp.isfinite(g), g, 0.0)
    adv = L.goal_reached(logits, y, t, ctx.strict)
    bx, bn, _ = mn.track(bx, bn, x, x0, adv, 2.0)
    m1, m2, num, denom = adam(g, m1, m2, i)
    lr = hp["primal_lr"] * hp["primal_lr_decrease"] ** (i / steps)
    x = jnp.clip(x - lr * num / denom, 0.0, 1.0)
    lam, lam_ema = dual_update(lam, lam_ema, m, i, steps, hp)
    return x, m1, m2, lam, lam_ema, bx, bn


def default_hp(
    primal_lr=0.1,
    primal_lr_decrease=0.01,
    dual_ratio_init=0.01,
    dual_lr=0.1,
    dual_lr_decrease=0.1,
    dual_ema=0.9,
    dual_min_ratio=1e-6,
):
    """PDGD's primal / dual hyperparameters as floats (defaults: see :func:`spec`)."""
    return {k: float(v) for k, v in locals().items()}


def spec(**hp) -> mn.Spec:
    """PDGD as a :class:`~sarjax.attacks.minnorm.Spec`.

    Defaults (Matyasko & Chau's reference code, as adv-lib): primal lr 0.1
    decayed x0.01, dual ratio init 0.01, dual lr 0.1 decayed linearly to
    x0.1, dual EMA 0.9, dual ratio clamp 1e-6.
    """
    return mn.make_spec("pdgd", _init, _step, (2,), default_hp(**hp))


make_pdgd = mn.factory(
    spec,
    2,
    1000,
    name="make_pdgd",
    doc="""PDGD (l2) on a pool (:func:`sarjax.attacks.minnorm.make`); default 1000 queries = 500 steps
(the reference default).  ``**hp``: see :func:`spec`.
""",
)
