"""sigma-zero (Cina et al., 2024): l0 minimum-norm attack.

Minimises ``max(m, 0) + mean(delta^2 / (delta^2 + sigma))`` (a smooth l0
surrogate) with Adam on the linf-normalised gradient, a cosine-annealed step
and an adaptive threshold ``tau`` that zeroes small elements of ``delta``
(raised after an adversarial iterate, lowered otherwise).  2 queries per step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sarjax.attacks import losses as L
from sarjax.attacks import minnorm as mn
from sarjax.attacks.optim import adam


def _init(ctx, x_init):
    hp, x0 = ctx.hp, ctx.x0
    f32 = lambda v: jnp.asarray(v, jnp.float32)
    return (x_init, jnp.zeros_like(x0), jnp.zeros_like(x0), f32(hp["tau0"]), f32(hp["eta0"]), x0, f32(jnp.inf)), None


def _step(ctx, s, i):
    f, x0, y, t, hp, steps = ctx.f, ctx.x0, ctx.y, ctx.t, ctx.hp, ctx.steps
    eta0, sigma, tf = hp["eta0"], hp["sigma"], hp["tau_factor"]

    def loss_fn(x):
        logits = f(x)
        d = x - x0
        l0a = jnp.mean(d * d / (d * d + sigma))
        return jnp.maximum(-L.goal_margin(logits, y, t), 0.0) + l0a, logits

    x, m1, m2, tau, eta, bx, bn = s
    (_, logits), g = jax.value_and_grad(loss_fn, has_aux=True)(x)
    g = jnp.where(jnp.isfinite(g), g, 0.0)
    adv = L.goal_reached(logits, y, t, ctx.strict)
    bx, bn, _ = mn.track(bx, bn, x, x0, adv, 0.0)
    g = g / jnp.maximum(jnp.max(jnp.abs(g)), 1e-12)
    m1, m2, num, denom = adam(g, m1, m2, i)
    x = jnp.clip(x - eta * num / denom, 0.0, 1.0)
    eta = 0.1 * eta0 + 0.9 * eta0 * 0.5 * (1.0 + jnp.cos(jnp.pi * i / steps))
    tau = jnp.clip(tau + jnp.where(adv, tf * eta, -tf * eta), 0.0, 1.0)
    d = x - x0
    x = jnp.where(jnp.abs(d) < tau, x0, x)
    return x, m1, m2, tau, eta, bx, bn


def spec(*, eta0: float = 1.0, sigma: float = 1e-3, tau0: float = 0.3, tau_factor: float = 0.01) -> mn.Spec:
    """sigma-zero as a :class:`~sarjax.attacks.minnorm.Spec`.

    Defaults (sigma-zero paper and reference code, as adv-lib): eta0 1 with
    cosine annealing to 0.1 eta0, sigma 1e-3, tau0 0.3, tau factor 0.01.
    """
    return mn.make_spec(
        "sigma_zero",
        _init,
        _step,
        (0,),
        dict(eta0=float(eta0), sigma=float(sigma), tau0=float(tau0), tau_factor=float(tau_factor)),
    )


make_sigma_zero = mn.factory(
    spec,
    0,
    2000,
    name="make_sigma_zero",
    doc="""sigma-zero (l0) on a pool (:func:`sarjax.attacks.minnorm.make`); default 2000 queries = its
1000 steps.  Targeted runs replace the margin by the margin towards the target (the reference
code is untargeted only).  ``**hp``: see :func:`spec`.
""",
)
