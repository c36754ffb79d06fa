"""The step-rule attacks' state machine (FGSM, PGD, MI-FGSM, joint PGD; any loss, targeted DLR).

One :class:`~sarjax.attacks.core.protocol.Attack` for every attack that takes projected
steepest-ascent steps from a (random) start: ``num_steps = restarts * max(steps, 1)`` calls of
:func:`step`, one gradient iteration each. Scalar (batch-shared) counters in the state give the
restart ``r = i // steps`` and its iteration ``t = i % steps``; ``lax.cond`` on them runs the
restart's start (``t == 0``: a random point of the eps-ball of ``x0``, or the warm start for
restart 0) and its final evaluation (``t == steps - 1``, one forward of every member), so no
step pays for a forward pass it does not need. Every restart starts from ``x0``, never from a
previous restart's output; restarts are combined by final objective (``x_adv``) and the
best-so-far point over every evaluated iterate is kept separately (``best_x``).

Query accounting (one forward or backward pass of one member on one sample = 1 query): the
clean evaluation costs M; a gradient step costs M forwards (every member is evaluated to track
per-member success) plus one backward per selected member; a restart's final evaluation costs
M. A step or restart only runs if it fits under the per-sample cap, with the restart's final
evaluation reserved; samples with no selected member take no steps. With ``eot`` draws every
evaluation and every step runs ``eot`` times and costs ``eot`` times as much.

Random streams: sample ``b``'s random start of restart ``r`` uses ``fold_in(fold_in(key,
sample_ids[b]), r)``; EOT draws of restart ``r``, step ``t`` use ``fold_in(fold_in(ekey, r + 1),
t)`` with ``ekey = fold_in(key, EOT_SALT)`` (the clean and final evaluations share the draws
``fold_in(ekey, 0)``: a paired comparison).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

from sarjax.attacks import geometry as G
from sarjax.attacks import queries as Q
from sarjax.attacks.core import validate as V
from sarjax.attacks.core.entry import AttackFn
from sarjax.attacks.core.evaluate import (
    EOT_SALT,
    Best,
    Evaluation,
    at_key,
    batch_logits,
    evaluators,
    prepare_cfg,
    scorer,
    select,
    update_best,
)
from sarjax.attacks.core.protocol import Attack, Problem, sample_keys
from sarjax.attacks.result import AttackResult


class Config(NamedTuple):
    """Static description of a step-rule attack (hashable: it keys the jit cache).

    Two factories called with equal configs share one compiled kernel.
    """

    apply: Callable
    p: float
    steps: int
    restarts: int
    random_start: bool
    loss: str
    targeted: bool
    box: tuple
    rel_step: float | None = None  # alpha = rel_step * eps
    abs_step: float | None = None  # or a fixed alpha
    l1_sparsity: float = 0.99
    momentum: float | None = None  # MI-FGSM decay
    eot: int = 1  # EOT draws per evaluation (apply(params, x, key) when > 1)


def alpha(cfg: Config, eps):
    """Step size of ``cfg`` for radius ``eps``."""
    if cfg.abs_step is not None:
        return jnp.asarray(cfg.abs_step, jnp.float32)
    return cfg.rel_step * eps


def pgd_step(cfg: Config, state, x, g, x0, eps):
    """Projected steepest ascent (PGD; Madry et al. 2018), optionally with MI-FGSM momentum.

    ``state`` is the momentum buffer (unused without momentum).  Returns
    ``(state, x_new)`` with ``x_new`` projected onto the ball of x0 and the box.
    """
    if cfg.momentum is not None:
        state = cfg.momentum * state + g / jnp.maximum(jnp.sum(jnp.abs(g)), 1e-12)
        g = state
    if cfg.p == 1.0:
        d = G.sparse_l1_direction(g, x, cfg.l1_sparsity, cfg.box)
    else:
        d = G.steepest(g, cfg.p)
    return state, G.project(x + alpha(cfg, eps) * d, x0, eps, cfg.p, cfg.box)


class GradientState(NamedTuple):
    """State of a step-rule attack (batch axis first; ``i`` is shared by the batch).

    Attributes:
      problem: the call (:class:`~sarjax.attacks.core.protocol.Problem`).
      i: scalar int32, steps taken (restart ``i // steps``, iteration ``i % steps``).
      x: ``[B, *S]`` current iterate.
      mom: ``[B, *S]`` MI-FGSM momentum buffer (zeros otherwise).
      count: ``[B]`` int32 queries spent.
      grads: ``[B]`` int32 backward passes charged to each selected member (for the per-member
        queries, :func:`sarjax.attacks.queries.per_member`).
      run: ``[B]`` bool, samples the current restart runs for (budget and selected members).
      src: ``[B, M]`` int32, targeted DLR: the clean prediction to leave (else zeros).
      best: best-so-far point (:class:`~sarjax.attacks.core.evaluate.Best`).
      final_x: ``[B, *S]`` the best restart's final iterate so far (``x0`` before any).
      final_ev: its :class:`~sarjax.attacks.core.evaluate.Evaluation`.
    """

    problem: Problem
    i: jax.Array
    x: jax.Array
    mom: jax.Array
    count: jax.Array
    grads: jax.Array
    run: jax.Array
    src: jax.Array
    best: Best
    final_x: jax.Array
    final_ev: Evaluation


def _keys(cfg: Config, problem: Problem):
    ekey = jax.random.fold_in(problem.key, EOT_SALT)
    return ekey, jax.random.fold_in(ekey, 0)  # (EOT key, the clean / final evaluations' draws)


def init(cfg: Config, params, problem: Problem) -> GradientState:
    """Evaluates ``x0`` (``eot * M`` queries); no step taken yet."""
    x0, ref, mask = problem.x0, problem.ref, problem.mask
    B, M = ref.shape
    evaluate, _ = evaluators(cfg.apply, scorer(cfg.loss, cfg.targeted), cfg.eot)
    _, clean_key = _keys(cfg, problem)
    if cfg.loss == "dlr" and cfg.targeted:  # targeted DLR leaves the clean prediction
        clean_apply = at_key(cfg.apply, cfg.eot, jax.random.fold_in(clean_key, 0))
        src = jnp.argmax(batch_logits(clean_apply, params, x0), axis=-1).astype(jnp.int32)
    else:
        src = jnp.zeros_like(ref)
    _, ev0 = evaluate(params, x0, ref, mask, src, clean_key)
    count = jnp.full((B,), cfg.eot * M, jnp.int32)
    return GradientState(
        problem,
        jnp.zeros((), jnp.int32),
        x0,
        jnp.zeros_like(x0),
        count,
        jnp.zeros((B,), jnp.int32),
        jnp.zeros((B,), bool),
        src,
        Best(x0, ev0),
        x0,
        ev0,
    )


def step(cfg: Config, s: GradientState, params) -> GradientState:
    """One iteration: the restart's start where ``t == 0``, a gradient step (if ``steps > 0``),
    the restart's final evaluation where ``t == steps - 1``."""
    pr = s.problem
    x0, ref, mask, eps, cap = pr.x0, pr.ref, pr.mask, pr.eps, pr.cap
    p, box, eot = cfg.p, cfg.box, cfg.eot
    B, M = ref.shape
    T = max(cfg.steps, 1)
    r, t = s.i // T, s.i % T
    evaluate, vg = evaluators(cfg.apply, scorer(cfg.loss, cfg.targeted), eot)
    ekey, clean_key = _keys(cfg, pr)
    n_sel = jnp.sum(mask > 0, axis=1).astype(jnp.int32)
    cost = eot * (M + n_sel)

    def start(s):
        run = (n_sel > 0) & Q.allowed(s.count, eot * M, cap)
        if cfg.random_start:
            kr = jax.vmap(lambda k: jax.random.fold_in(k, r))(sample_keys(pr))
            x_start = jax.vmap(lambda k, c, e: G.random_in_ball(k, c, e, p, box))(kr, x0, eps)
        else:
            x_start = x0
        warm = jax.vmap(lambda x, c, e: G.project(x, c, e, p, box))(pr.x_init, x0, eps)
        x_start = jnp.where(pr.has_init & (r == 0), warm, x_start)
        return s._replace(x=x_start, mom=jnp.zeros_like(x0), run=run)

    s = jax.lax.cond(t == 0, start, lambda s: s, s)
    if cfg.steps > 0:
        ok = s.run & Q.allowed(s.count, cost + eot * M, cap)
        rkey = jax.random.fold_in(ekey, r + 1)
        (_, ev), g = vg(params, s.x, ref, mask, s.src, jax.random.fold_in(rkey, t))
        best = jax.vmap(update_best)(s.best, s.x, ev, ok)
        mom2, x2 = jax.vmap(partial(pgd_step, cfg))(s.mom, s.x, g, x0, eps)
        s = s._replace(
            x=Q.freeze(ok, x2, s.x),
            mom=Q.freeze(ok, mom2, s.mom),
            count=Q.charge(s.count, cost, ok),
            best=best,
            grads=Q.charge(s.grads, eot, ok),
        )

    def finish(s):
        _, ev = evaluate(params, s.x, ref, mask, s.src, clean_key)  # EOT: the clean evaluation's draws (paired)
        best = jax.vmap(update_best)(s.best, s.x, ev, s.run)
        fx, fev = jax.vmap(select)(s.run & (ev.obj > s.final_ev.obj), (s.x, ev), (s.final_x, s.final_ev))
        return s._replace(count=Q.charge(s.count, eot * M, s.run), best=best, final_x=fx, final_ev=fev)

    s = jax.lax.cond(t == T - 1, finish, lambda s: s, s)
    return s._replace(i=s.i + 1)


def result(cfg: Config, s: GradientState, params) -> AttackResult:
    """``x_adv``: the best restart's final iterate (or ``x0``); ``best_x``: the best-so-far point."""
    del cfg, params
    ev = s.final_ev
    return AttackResult(
        x_adv=s.final_x,
        success=ev.success,
        objective=ev.obj,
        member_loss=ev.losses,
        queries=Q.per_member(s.count, s.grads, s.problem.mask),
        best_x=s.best.x,
        best_success=s.best.ev.success,
        best_objective=s.best.ev.obj,
    )


def gradient_attack(cfg: Config) -> Attack:
    """The :class:`~sarjax.attacks.core.protocol.Attack` of ``cfg``: ``restarts * max(steps, 1)``
    steps (equal configs give equal attacks, which share one compiled kernel)."""
    return Attack(init, step, result, cfg.restarts * max(cfg.steps, 1), cfg, prepare_cfg)


def gradient_factory(
    name: str, apply: Callable, p: float, eps, loss: str, targeted: bool, box, audit: bool, eot: int, step_rule: dict
) -> AttackFn:
    """The :class:`~sarjax.attacks.core.AttackFn` of a step-rule attack (the tail every
    ``make_fgsm`` / ``make_mifgsm`` / ``make_pgd`` shares, after its own checks).

    Args:
      name: the attack's name (messages).
      apply: the model.
      p: canonical norm.
      eps: the factory's default radius.
      loss, targeted, box, audit: as :func:`sarjax.attacks.pgd.make_pgd`.
      eot: EOT draws (checked here).
      step_rule: the remaining :class:`Config` fields (``steps``, ``restarts``,
        ``random_start``, ``rel_step``, ``abs_step``, ``l1_sparsity``, ``momentum``).
    """
    cfg = Config(
        apply=apply,
        p=p,
        loss=loss,
        targeted=targeted,
        box=tuple(float(b) for b in box),
        eot=V.check_eot(eot),
        **step_rule,
    )
    return V.public(
        gradient_attack(cfg),
        name=name,
        p=p,
        default_eps=eps,
        box=box,
        audit=audit,
        apply=apply,
        eot=cfg.eot,
        ref_name="targets" if targeted else "labels",
    )


__all__ = [
    "gradient_factory",
    "Config",
    "GradientState",
    "alpha",
    "gradient_attack",
    "init",
    "pgd_step",
    "result",
    "step",
]
