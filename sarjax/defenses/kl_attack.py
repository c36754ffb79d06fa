"""TRADES' inner maximisation: PGD on KL(f(x0) || f(x)), written against the attack protocol.

Zhang et al. 2019 (TRADES, Algorithm 1 and the reference ``trades.py``): start at
``x0 + 0.001 * N(0, I)``, then ``steps`` projected steepest-ascent steps on the KL divergence
between the model's clean prediction distribution ``softmax(f(x0))`` (held fixed) and
``softmax(f(x))``, each projected onto ``{x : ||x - x0||_p <= eps} ∩ [box]``.

Why not ``make_pgd(..., loss=...)``: the attacks' losses score a point against integer
references (labels or targets, ``Problem.ref [B, M]``); this objective scores it against the
clean prediction DISTRIBUTION, which ``init`` computes from ``x0`` and keeps in the state. So it
is its own state machine (:class:`sarjax.attacks.core.Attack`) built from the attack core's
pieces: :func:`~sarjax.attacks.core.make_problem`, :func:`~sarjax.attacks.core.run`, per-sample
keys (:func:`~sarjax.attacks.core.sample_keys`), the geometry's ``steepest`` / ``project`` and the
query accountant. It lives in ``defenses`` because only TRADES uses it.

Queries (one forward or backward pass of one member on one sample = 1): the clean evaluation
costs M, a step M forwards plus one backward per selected member, the final evaluation of
``x_adv`` in :func:`kl_result` M (under ``jit`` it is dropped when only ``x_adv`` is used). The
result reports them per member, ``[B, M]`` (:func:`sarjax.attacks.queries.per_member`): member
``m`` was queried ``steps_taken + 2`` times forward and ``steps_taken`` times backward where
selected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.attacks import project, steepest
from sarjax.attacks import queries as Q
from sarjax.attacks.audit import check
from sarjax.attacks.core import Attack, AttackFn, Problem, make_problem, sample_keys
from sarjax.attacks.losses import fooled
from sarjax.attacks.threat import Threat, canonical_norm


class KLConfig(NamedTuple):
    """Static config (hashable: equal factories share one compiled kernel)."""

    apply: Callable
    p: float
    rel_step: float
    init_std: float
    box: tuple


class KLState(NamedTuple):
    """State of the KL attack.

    Attributes:
      x: ``[B, *S]`` current iterate (inside the ball of ``x0`` and the box).
      x0: ``[B, *S]`` the ORIGINAL inputs.
      eps: ``[B]`` radii.
      mask: ``[B, M]`` selected members.
      log_p: ``[B, M, C]`` clean log-probabilities ``log_softmax(f(x0))`` (constant).
      count: ``[B]`` int32 queries spent.
      grads: ``[B]`` int32 steps taken (each one backward pass per selected member).
      cap: ``[B]`` int32 query caps.
      ref: ``[B, M]`` int32 reference labels (not in the objective; ``success`` is read against them).
    """

    x: jax.Array
    x0: jax.Array
    eps: jax.Array
    mask: jax.Array
    log_p: jax.Array
    count: jax.Array
    grads: jax.Array
    cap: jax.Array
    ref: jax.Array


class KLResult(NamedTuple):
    """Result of the KL attack; satisfies :class:`~sarjax.attacks.core.AttackOutput` (``x_adv``
    ``[B, *S]``, one point shared by every member, the fixed-budget form).

    Attributes:
      x_adv: ``[B, *S]`` the last iterate.
      success: ``[B, M]`` bool, member ``m``'s prediction at ``x_adv`` differs from its
        reference label ``ref[b, m]`` (every member, masked ones included). The objective does
        not read the labels; this is the verdict the other attacks report.
      queries: ``[B, M]`` int32 queries spent on member ``m`` for sample ``b`` (the clean and
        final evaluations included); ``queries.sum(-1)`` is the sample's total.
      kl: ``[B, M]`` KL(softmax(f_m(x0)) || softmax(f_m(x_adv))) per member.
      objective: ``[B]`` mask-weighted mean of ``kl`` over the selected members.
    """

    x_adv: jax.Array
    success: jax.Array
    queries: jax.Array
    kl: jax.Array
    objective: jax.Array


def _logits(apply: Callable, params, x) -> jax.Array:
    """``[B, M, C]`` logits (``[B, C]`` models are one member)."""
    z = apply(params, x)
    if z.ndim == 2:
        z = z[None]
    return jnp.swapaxes(z, 0, 1)


def _kl(log_p, z) -> jax.Array:
    """``[B, M]`` KL(p || softmax(z)) with ``p = exp(log_p)``."""
    return jnp.sum(jnp.exp(log_p) * (log_p - jax.nn.log_softmax(z, axis=-1)), axis=-1)


def _mean_over(mask, v) -> jax.Array:
    return jnp.sum(mask * v, axis=-1) / jnp.maximum(jnp.sum(mask, axis=-1), 1.0)


def kl_init(cfg: KLConfig, params, problem: Problem) -> KLState:
    """Clean log-probabilities and the start ``x0 + init_std * N(0, I)`` projected into the ball
    (or the projected warm start ``x_init``); sample b draws from ``fold_in(key, sample_ids[b])``."""
    x0, eps = problem.x0, problem.eps
    log_p = jax.nn.log_softmax(_logits(cfg.apply, params, x0), axis=-1)
    keys = sample_keys(problem)
    noise = jax.vmap(lambda k: jax.random.normal(k, x0.shape[1:], x0.dtype))(keys)
    proj = jax.vmap(lambda x, c, e: project(x, c, e, cfg.p, cfg.box))
    start = jnp.where(problem.has_init, problem.x_init, x0 + cfg.init_std * noise)
    m = problem.mask.shape[1]
    count = jnp.full(x0.shape[:1], m, jnp.int32)
    grads = jnp.zeros(x0.shape[:1], jnp.int32)
    return KLState(
        proj(start, x0, eps),
        x0,
        eps,
        problem.mask,
        jax.lax.stop_gradient(log_p),
        count,
        grads,
        problem.cap,
        problem.ref,
    )


def kl_step(cfg: KLConfig, s: KLState, params) -> KLState:
    """One projected steepest-ascent step of size ``rel_step * eps`` on the mean selected KL."""
    m = s.mask.shape[1]
    n_sel = jnp.sum(s.mask > 0, axis=1).astype(jnp.int32)
    cost = m + n_sel
    ok = (n_sel > 0) & Q.allowed(s.count, cost + m, s.cap)  # the final evaluation stays affordable

    def total(x):
        return jnp.sum(_mean_over(s.mask, _kl(s.log_p, _logits(cfg.apply, params, x))))

    g = jax.grad(total)(s.x)

    def move(x, g, x0, e):
        return project(x + cfg.rel_step * e * steepest(g, cfg.p), x0, e, cfg.p, cfg.box)

    x = Q.freeze(ok, jax.vmap(move)(s.x, g, s.x0, s.eps), s.x)
    return s._replace(x=x, count=Q.charge(s.count, cost, ok), grads=Q.charge(s.grads, 1, ok))


def kl_result(cfg: KLConfig, s: KLState, params) -> KLResult:
    """``x_adv`` = the last iterate, with each member's KL and verdict there (one more forward
    pass of every member)."""
    z = _logits(cfg.apply, params, s.x)
    kl = _kl(s.log_p, z)
    m = s.mask.shape[1]
    queries = Q.per_member(s.count + m, s.grads, s.mask)
    return KLResult(s.x, fooled(z, s.ref, False), queries, kl, _mean_over(s.mask, kl))


def _validate(cfg: KLConfig, default_eps):
    def validate(params, x0, ref, mask, key, eps, max_queries, x_init, sample_ids) -> Problem:
        x0h = np.asarray(x0)
        if x0h.ndim < 2 or not np.issubdtype(x0h.dtype, np.floating):
            raise ValueError(f"x0 must be a float batch [B, *S], got dtype {x0h.dtype} shape {list(x0h.shape)}")
        bad = np.flatnonzero(
            ~np.isfinite(x0h.reshape(len(x0h), -1)).all(1)
            | (x0h.reshape(len(x0h), -1) < cfg.box[0]).any(1)
            | (x0h.reshape(len(x0h), -1) > cfg.box[1]).any(1)
        )
        if bad.size:
            raise ValueError(f"x0 must be finite and inside the box {cfg.box}: samples {bad[:10].tolist()} are not")
        if eps is None:
            raise ValueError("eps is required (scalar or [B]) at construction or call time")
        Threat(cfg.p, eps, cfg.box).eps_for(len(x0h))  # finite, >= 0, scalar or [B]
        if x_init is not None and np.shape(x_init) != x0h.shape:
            raise ValueError(f"x_init must have the shape of x0 {list(x0h.shape)}, got {list(np.shape(x_init))}")
        if sample_ids is not None:
            sid = np.asarray(sample_ids)
            if sid.shape != (len(x0h),) or not np.issubdtype(sid.dtype, np.integer) or (sid < 0).any():
                raise ValueError(
                    f"sample_ids must be non-negative ints of shape [{len(x0h)}], got {sid.dtype} {list(sid.shape)}"
                )
        return make_problem(
            cfg.apply,
            params,
            x0h.astype(np.float32),
            ref,
            key=key,
            mask=mask,
            eps=eps,
            max_queries=max_queries,
            sample_ids=sample_ids,
            x_init=x_init,
        )

    return validate


def _audit(cfg: KLConfig):
    def audit(problem: Problem, res: KLResult) -> None:
        check(
            np.asarray(problem.x0),
            np.asarray(res.x_adv),
            Threat(cfg.p, np.asarray(problem.eps), cfg.box),
            what="trades_kl (x_adv)",
        )

    return audit


def make_kl_attack(
    apply: Callable,
    *,
    norm="linf",
    eps=None,
    steps: int = 10,
    rel_step: float = 0.25,
    init_std: float = 0.001,
    box=(0.0, 1.0),
) -> AttackFn:
    """TRADES' inner maximisation (Zhang et al. 2019) as an attack with the two protocol entries.

    Defaults from the TRADES paper and reference code: start at ``x0 + 0.001 * N(0, I)``;
    10 steps (their CIFAR-10 setting; MNIST used 40 steps of 0.01 at eps 0.3); step
    ``eps / 4`` (CIFAR-10: 0.007 at eps 0.031). l2 steps are normalised gradients (the reference
    code's l2 branch runs SGD on the normalised gradient with a renorm; the projection here is
    the exact one of :func:`sarjax.attacks.project`).

    Args:
      apply: ``apply(params, x [B, *S]) -> logits [M, B, C]`` or ``[B, C]``.
      norm: ``"linf"`` or ``"l2"`` (or ``inf``, 2).
      eps: default radius (scalar or ``[B]``); may be given per call.
      steps: ascent steps (static).
      rel_step: step as a fraction of eps.
      init_std: standard deviation of the Gaussian start around ``x0``.
      box: input bounds.

    Returns:
      An :class:`~sarjax.attacks.core.AttackFn`: ``fn(params, x0, ref, *, key, mask=None, eps,
      max_queries, x_init, sample_ids) -> KLResult`` audited against ``x0``, and the jit-safe
      ``fn.jit(...)``. ``ref`` (``[B]`` or ``[B, M]`` ints) is not used by the objective (it moves
      away from the clean prediction distribution, not from a label); pass the labels: the
      result's ``success`` is read against them.

    Raises:
      ValueError: a norm other than linf / l2, steps < 1, a step or init_std not > 0 / >= 0.
    """
    p = canonical_norm(norm)
    if p not in (2.0, float("inf")):
        raise ValueError(f"the TRADES KL attack supports norms linf and l2, got {norm!r}")
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    if not (isinstance(rel_step, (int, float)) and rel_step > 0):
        raise ValueError(f"rel_step must be a float > 0, got {rel_step!r}")
    if not (isinstance(init_std, (int, float)) and init_std >= 0):
        raise ValueError(f"init_std must be a float >= 0, got {init_std!r}")
    cfg = KLConfig(apply, p, float(rel_step), float(init_std), tuple(float(b) for b in box))
    attack = Attack(kl_init, kl_step, kl_result, int(steps), cfg)
    return AttackFn(
        attack, name="trades_kl", apply=apply, validate=_validate(cfg, eps), audit=_audit(cfg), default_eps=eps
    )


__all__ = ["KLConfig", "KLResult", "KLState", "kl_init", "kl_result", "kl_step", "make_kl_attack"]
