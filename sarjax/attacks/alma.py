"""Augmented Lagrangian Method for Adversarial attacks (ALMA; Rony et al., ICCV 2021), l1 and l2.

Minimises ``||delta||_p + P2(c(x), rho, mu)`` where ``c`` is the difference of
logits ratio (DLR) constraint, ``P2`` the penalty-Lagrangian function of
Birgin et al., with an RMSProp-with-momentum step on ``delta`` whose rate
decays exponentially from the first success.  Every ``check_steps`` steps the
penalty ``rho`` grows by ``gamma`` unless the constraint improved by ``tau`` or
an adversarial point was found; the multiplier ``mu`` follows an EMA of the
penalty's derivative.  2 queries per step.

The first learning rate is ``lr_init`` (adv-lib's default) or, with
``init_lr_distance``, the one whose first step moves that far (the paper's
experiments: 0.5 in l1, 0.1 in l2; ``spec(init_lr_distance="paper")``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from sarjax.attacks import losses as L
from sarjax.attacks import minnorm as mn

# The ALMA paper's experiments (Rony et al. 2021, their released MNIST / CIFAR-10 scripts):
# the first step moves 0.5 in l1, 0.1 in l2.  ``spec(init_lr_distance="paper")`` uses these.
PAPER_INIT_LR_DISTANCE = {1.0: 0.5, 2.0: 0.1}
_LR_DOUBLINGS = 40


def _p2(v, rho, mu):
    sup = mu * v + mu * rho * v**2 + rho**2 * v**3 / 6.0
    inf = mu * v / (1.0 - rho * jnp.minimum(v, 0.0))
    return jnp.where(v >= 0, sup, inf)


def _dlr_constraint(logits, y, t, tol):
    srt = jnp.sort(logits)[::-1]
    k4 = srt[3] if logits.shape[-1] >= 4 else srt[-1]
    norm = jnp.where(t >= 0, srt[0] - 0.5 * (srt[2] + k4), srt[0] - srt[2])
    return (tol - L.goal_margin(logits, y, t)) / (norm + 1e-8)  # <= 0 once adversarial by tol


def _dist(delta, p):
    if p == 1.0:
        # |delta| written as sign(delta) * delta: its gradient is sign(delta), 0 at delta = 0, as
        # PyTorch's abs / l1 norm (the reference).  jnp.abs's gradient at 0 is 1: every element at
        # x0 (on MNIST most pixels, clipped at the box) would be pushed by the distance term and
        # RMSProp's momentum would pile up against the box.
        return jnp.sum(jnp.sign(delta) * delta)
    s = jnp.sum(delta * delta)
    safe = jnp.where(s > 0, s, 1.0)
    return jnp.where(s > 0, jnp.sqrt(safe), 0.0)


def _init_lr(x0, g, p, target):
    """Learning rate whose plain step ``clip(x0 - lr g)`` moves ``target`` away from ``x0``.

    ALMA's initial learning-rate search (the paper's epsilon, adv-lib's
    ``init_lr_finder``): double ``lr`` from 1 until the distance exceeds
    ``target``, then 20 bisection steps.  Distances only, no model query.  The
    doubling stops after ``_LR_DOUBLINGS`` (the reference loops until found);
    a target out of reach then keeps the last, largest ``lr``.
    """
    dist = lambda lr: _dist(jnp.clip(x0 - lr * g, 0.0, 1.0) - x0, p)

    def double(c):
        lo, hi, n = c
        return hi, hi * 2.0, n + 1

    lo, hi, _ = jax.lax.while_loop(
        lambda c: (dist(c[1]) <= target) & (c[2] < _LR_DOUBLINGS),
        double,
        (jnp.zeros(()), jnp.ones(()), jnp.zeros((), jnp.int32)),
    )

    def bisect(_, c):
        lo, hi = c
        mid = 0.5 * (lo + hi)
        larger = dist(mid) > target
        return jnp.where(larger, lo, mid), jnp.where(larger, mid, hi)

    lo, hi = jax.lax.fori_loop(0, 20, bisect, (lo, hi))
    return 0.5 * (lo + hi)


def _init_dist(ctx):
    d = ctx.hp["init_lr_distance"]
    return PAPER_INIT_LR_DISTANCE[ctx.p] if d == "paper" else d


def _alma_step(ctx, s, i, first=False, rand_dir=None):
    # ``i`` is ALMA's own step index (0 = the first step, taken by _init); ALMA's step count
    # is the driver's (the steps after the first) plus one
    f, x0, y, t, p, hp = ctx.f, ctx.x0, ctx.y, ctx.t, ctx.p, ctx.hp
    steps = ctx.steps + 1.0
    init_dist = _init_dist(ctx)
    a, tau, gam, tol = hp["alpha"], hp["tau"], hp["gamma"], hp["logit_tolerance"]

    def loss_fn(x, rho, mu, first):
        logits = f(x)
        c = _dlr_constraint(logits, y, t, tol)
        pen = _p2(c, rho, mu)
        return jnp.where(first, 0.0, _dist(x - x0, p)) + pen, (logits, c)

    x, sq, mom, lr, rho, mu, prev_c, found, i_found, bx, bn = s
    (_, (logits, c)), g = jax.value_and_grad(loss_fn, has_aux=True)(x, rho, mu, i == 0)
    g = jnp.where(jnp.isfinite(g), g, 0.0)
    if first and init_dist is not None and rand_dir is not None:  # _init passes rand_dir exactly then
        # first step: a (near) zero gradient is replaced by a random unit direction and the
        # learning rate is set so that this step moves init_dist (ALMA paper / adv-lib's
        # init_lr_finder)
        g = jnp.where(jnp.sqrt(jnp.sum(g * g)) <= 1e-6, rand_dir, g)
        lr = _init_lr(x0, g, p, init_dist).astype(lr.dtype)
    check = (i > 0) & (jnp.mod(i + 1, hp["check_steps"]) == 0)
    improved = c < tau * prev_c
    rho = jnp.where(check & ~(found | improved), gam * rho, rho)
    prev_c = jnp.where((i == 0) | check, c, prev_c)
    new_mu = jax.grad(_p2)(c, rho, mu)
    mu = jnp.where(i > 0, jnp.clip(mu + (1.0 - a) * (new_mu - mu), 1e-6, 1e12), mu)
    adv = L.goal_reached(logits, y, t, ctx.strict)
    bx, bn, _ = mn.track(bx, bn, x, x0, adv, p)
    i_found = jnp.where(~found & adv, i, i_found)
    found = found | adv
    decay = hp["lr_reduction"] ** (jnp.maximum(i - i_found, 0.0) / (steps - i_found))
    sq = a * sq + (1.0 - a) * g * g
    mom = a * mom + g / (jnp.sqrt(sq) + 1e-8)
    x = jnp.clip(x - lr * decay * mom, 0.0, 1.0)
    return x, sq, mom, lr, rho, mu, prev_c, found, i_found, bx, bn


def _init(ctx, x_init):
    """ALMA's first step (2 queries; it sets the learning rate when ``init_lr_distance``)."""
    x0, hp = ctx.x0, ctx.hp
    f32 = lambda v: jnp.asarray(v, jnp.float32)
    rand_dir = None
    if _init_dist(ctx) is not None:
        rand_dir = jax.random.normal(jax.random.fold_in(ctx.key, 0), x0.shape, x0.dtype)
        rand_dir = rand_dir / jnp.maximum(jnp.sqrt(jnp.sum(rand_dir * rand_dir)), 1e-12)
    s = (
        x_init,
        jnp.ones_like(x0),
        jnp.zeros_like(x0),
        f32(hp["lr_init"]),
        f32(hp["rho_init"]),
        f32(hp["mu_init"]),
        f32(0.0),
        jnp.asarray(False),
        f32(ctx.steps + 2.0),
        x0,
        f32(jnp.inf),
    )
    s = _alma_step(ctx, s, jnp.zeros((), jnp.float32), first=True, rand_dir=rand_dir)
    return s, s[-1]


def _step(ctx, s, i):
    return _alma_step(ctx, s, i + 1.0)


def _costs(hp, num_classes):
    return 2, 2


def spec(
    *,
    lr_init: float = 0.1,
    lr_reduction: float = 0.01,
    mu_init: float = 1.0,
    rho_init: float = 1.0,
    check_steps: int = 10,
    tau: float = 0.95,
    gamma: float = 1.2,
    alpha: float = 0.9,
    logit_tolerance: float = 1e-4,
    init_lr_distance=None,
) -> mn.Spec:
    """ALMA as a :class:`~sarjax.attacks.minnorm.Spec`.

    Defaults are adv-lib's ``alma`` defaults (Rony et al. 2021): lr 0.1
    decayed exponentially x0.01 from the first success, mu = rho = 1, the
    penalty checked every 10 steps with tau 0.95 and growth gamma 1.2, EMA /
    RMSProp / momentum factor alpha 0.9, DLR logit tolerance 1e-4, penalty P2.

    Args:
      lr_init, lr_reduction, mu_init, rho_init, check_steps, tau, gamma,
        alpha, logit_tolerance: as above.
      init_lr_distance: ``None`` (adv-lib's default) starts every sample at
        ``lr_init``.  A float ``e > 0`` instead sets each sample's learning
        rate so that the first step moves ``e`` in the attack's norm (the
        paper's epsilon; adv-lib's ``init_lr_distance``, a line search over
        distances only, no query).  ``"paper"`` takes the value of the ALMA
        paper's own experiments and AttackBench's configs: 0.5 in l1, 0.1 in
        l2 (:data:`PAPER_INIT_LR_DISTANCE`).  On l1 this is what brings ALMA
        to the optimum on affine models (see docs/minnorm.md).

    Raises:
      ValueError: ``init_lr_distance`` neither ``None``, ``"paper"`` nor a
        finite float > 0.
    """
    hp: dict = {k: float(v) for k, v in locals().items() if k not in ("check_steps", "init_lr_distance")}
    if init_lr_distance is not None and init_lr_distance != "paper":
        if (
            isinstance(init_lr_distance, bool)
            or not isinstance(init_lr_distance, (int, float))
            or not (math.isfinite(init_lr_distance) and init_lr_distance > 0)
        ):
            raise ValueError(f"init_lr_distance must be None, 'paper' or a finite float > 0, got {init_lr_distance!r}")
        init_lr_distance = float(init_lr_distance)
    hp.update(check_steps=int(check_steps), init_lr_distance=init_lr_distance)
    return mn.make_spec(
        "alma",
        _init,
        _step,
        (1, 2),
        hp,
        costs=_costs,
        min_classes=3,
    )


make_alma = mn.factory(
    spec,
    2,
    2000,
    name="make_alma",
    doc="""ALMA on a pool (l1 or l2; :func:`sarjax.attacks.minnorm.make`); default 2000 queries = ALMA's
1000 steps (C >= 3; targeted needs 4).  ``**hp``: see :func:`spec`.
""",
)
