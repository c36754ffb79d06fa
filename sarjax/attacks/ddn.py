"""Decoupled Direction and Norm attack (DDN; Rony et al., CVPR 2019), l2.

Each step evaluates the cross-entropy and its gradient at the iterate (2
queries), keeps the best adversarial point, takes a cosine-decayed step
along the normalised gradient, then rescales the perturbation to the
current norm ``eps`` (which shrinks by ``1 - gamma`` after an adversarial
iterate and grows by ``1 + gamma`` otherwise), clips to the box and
optionally quantizes to ``levels`` grey levels.
"""

from __future__ import annotations

import jax.numpy as jnp

from sarjax.attacks import losses as L
from sarjax.attacks import minnorm as mn


def _init(ctx, x_init):
    return (x_init, jnp.asarray(ctx.hp["init_norm"], jnp.float32), ctx.x0, jnp.asarray(jnp.inf, jnp.float32)), None


def _step(ctx, state, i):
    f, x0, y, t, hp = ctx.f, ctx.x0, ctx.y, ctx.t, ctx.hp
    gamma, levels = hp["gamma"], hp["levels"]
    worst = mn.worst_norm(x0, 2.0)
    x, eps, bx, bn = state
    _, g, logits = L.value_grad(f, L.goal_cross_entropy, x, y, t)
    adv = L.goal_reached(logits, y, t, ctx.strict)
    bx, bn, _ = mn.track(bx, bn, x, x0, adv, 2.0)
    gn = jnp.sqrt(jnp.sum(g * g))
    rnd = mn.hash_direction(ctx.key, i, x.shape)
    direction = jnp.where(gn < 1e-12, rnd, g / jnp.maximum(gn, 1e-12))  # ascend the goal's CE
    alpha = mn.cosine(i, ctx.steps, hp["alpha_init"], hp["alpha_final"])
    delta = (x - x0) + alpha * direction
    eps = jnp.minimum(jnp.where(adv, (1.0 - gamma) * eps, (1.0 + gamma) * eps), worst)
    dn = jnp.sqrt(jnp.sum(delta * delta))
    delta = delta * (eps / jnp.maximum(dn, 1e-12))
    x = jnp.clip(x0 + delta, 0.0, 1.0)
    if levels is not None:
        x = jnp.round(x * (levels - 1)) / (levels - 1)
    return x, eps, bx, bn


def spec(
    *,
    gamma: float = 0.05,
    init_norm: float = 1.0,
    alpha_init: float = 1.0,
    alpha_final: float = 0.01,
    levels: int | None = None,
) -> mn.Spec:
    """DDN as a :class:`~sarjax.attacks.minnorm.Spec`.

    Args:
      gamma: norm update factor 0.05 (DDN paper; adv-lib default).
      init_norm: initial norm 1 (DDN paper; adv-lib default).
      alpha_init, alpha_final: step size, cosine 1 -> 0.01 (adv-lib's DDN).
      levels: quantize every iterate to this many levels (adv-lib uses 256 by
        default; ``None`` here: the issue makes it optional, and quantization
        bounds the precision of the returned norm).
    """
    if levels is not None and (int(levels) != levels or levels < 2):
        raise ValueError(f"levels must be None or an int >= 2, got {levels!r}")
    return mn.make_spec(
        "ddn",
        _init,
        _step,
        (2,),
        dict(
            gamma=float(gamma),
            init_norm=float(init_norm),
            alpha_init=float(alpha_init),
            alpha_final=float(alpha_final),
            levels=None if levels is None else int(levels),
        ),
    )


make_ddn = mn.factory(
    spec,
    2,
    200,
    name="make_ddn",
    doc="""Decoupled Direction and Norm attack (l2) on a pool (:func:`sarjax.attacks.minnorm.make`).

``max_queries // 2`` steps; the default 200 queries = DDN's 100 steps.  ``**hp``: see :func:`spec`.
""",
)
