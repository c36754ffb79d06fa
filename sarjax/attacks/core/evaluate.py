"""Evaluation of an attack's iterates: scorers, best-so-far points, EOT evaluators.

Shared by the fixed-budget attacks (PGD family, APGD, Square): the model runs ONCE per
evaluation on the whole batch (``apply(params, x [B, *S]) -> logits [M, B, C]``); the per-sample
logic (losses, success, the objective) is written for ONE example and vmapped over the batch.

* :class:`Evaluation` -- one example at one point: objective, member losses ``[M]``, member
  success ``[M]``, selected members fooled;
* :func:`scorer` / :func:`evaluation` -- per-example scorers built from :mod:`sarjax.attacks.losses`;
* :class:`Best`, :func:`better`, :func:`update_best` -- the best-so-far point, ranked by
  (selected members fooled, objective);
* :func:`evaluators` -- ``(evaluate, value_and_grad)`` over the batch, averaged over ``eot``
  draws of a stochastic ``apply(params, x, key)`` when ``eot > 1`` (Expectation over
  Transformation, :func:`make_eot_evaluators`);
* :func:`prepare` / :func:`prepare_cfg` -- a pool's x-independent weight layouts computed once
  per attack (the ``prepare`` hook of :class:`~sarjax.attacks.core.protocol.Attack`), not on every step.

Query accounting lives in :mod:`sarjax.attacks.queries`; every function here is pure and jit-safe.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from sarjax.attacks.losses import fooled, member_loss


class Evaluation(NamedTuple):
    """One example evaluated at one point."""

    obj: jax.Array  # []
    losses: jax.Array  # [M]
    success: jax.Array  # [M] bool
    n_fooled: jax.Array  # [] int32, selected members fooled


def batch_logits(apply: Callable, params, x: jax.Array) -> jax.Array:
    """Logits ``[B, M, C]`` of every member on a batch ``x: [B, *S]``.

    ``apply`` is evaluated ONCE on the whole batch (the model is naturally
    batched; XLA runs it faster than a per-example vmap of ``apply(x[None])``).
    """
    z = apply(params, x)
    if z.ndim == 2:
        z = z[None]
    if z.ndim != 3 or z.shape[1] != x.shape[0]:
        raise ValueError(f"apply must return logits [M, B, C] or [B, C] with B={x.shape[0]}, got {z.shape}")
    return jnp.swapaxes(z, 0, 1)


def prepare(apply: Callable, params) -> tuple[Callable, Any]:
    """``(apply, params)`` to use inside an attack kernel's loops.

    When ``apply`` is a bound method of an object with ``prepare_apply`` (e.g. ``pool.apply``),
    its x-independent weight layouts are computed once, here, instead of on every step (XLA does
    not hoist them out of ``lax.scan``); any other ``apply`` is returned as is.
    """
    owner = getattr(apply, "__self__", None)
    prep: Callable[[Any], tuple[Callable, Any]] | None = getattr(owner, "prepare_apply", None)
    if prep is not None and callable(prep) and getattr(apply, "__name__", "") == "apply":
        return prep(params)
    return apply, params


def make_batch_evaluate(apply: Callable, per_example: Callable):
    """Batched evaluation built from a per-example scorer.

    ``per_example(z [M, C], ref [M], mask [M], *extra) -> (obj, Evaluation)``
    is vmapped over the batch; the returned ``evaluate(params, x [B, *S], ref
    [B, M], mask [B, M], *extra) -> (sum of obj, Evaluation with batch axis)``
    has the per-sample gradients as its gradient in ``x`` (samples are
    independent).
    """

    def evaluate(params, x, ref, mask, *extra):
        z = batch_logits(apply, params, x)
        if z.shape[1] != ref.shape[1]:
            raise ValueError(f"apply returned {z.shape[1]} members but ref/mask have {ref.shape[1]}")
        obj, ev = jax.vmap(per_example)(z, ref, mask, *extra)
        return jnp.sum(obj), ev

    return evaluate


def evaluation(losses: jax.Array, succ: jax.Array, mask: jax.Array) -> Evaluation:
    """One example's :class:`Evaluation` from its member losses ``[M]`` and success ``[M]``:
    the objective is the mask-weighted mean loss, ``n_fooled`` counts the selected members fooled."""
    w = mask.astype(losses.dtype)
    obj = jnp.sum(w * losses) / jnp.maximum(jnp.sum(w), 1.0)
    n = jnp.sum(succ & (mask > 0)).astype(jnp.int32)
    return Evaluation(obj, losses, succ, n)


def scorer(loss: str, targeted: bool) -> Callable:
    """Per-example ``(z [M, C], ref [M], mask [M], source [M]) -> (obj, Evaluation)``."""

    def score(z, ref, mask, source):
        ev = evaluation(member_loss(z, ref, loss, targeted, source), fooled(z, ref, targeted), mask)
        return ev.obj, ev

    return score


class Best(NamedTuple):
    """Best-so-far point of one example, ranked by (n_fooled, obj)."""

    x: jax.Array
    ev: Evaluation


def better(new: Evaluation, old: Evaluation) -> jax.Array:
    """Whether ``new`` beats ``old``: more selected members fooled, then higher objective."""
    return (new.n_fooled > old.n_fooled) | ((new.n_fooled == old.n_fooled) & (new.obj > old.obj))


def select(pred, a, b):
    """``a`` if ``pred`` else ``b`` for pytrees (scalar predicate)."""
    return jax.tree.map(lambda u, v: jnp.where(pred, u, v), a, b)


def update_best(best: Best, x: jax.Array, ev: Evaluation, valid) -> Best:
    """Replaces ``best`` by ``(x, ev)`` where valid and better."""
    return select(valid & better(ev, best.ev), Best(x, ev), best)


# Per-sample streams are ``fold_in(key, sample_id)`` with sample ids in [0, 2**31); the other
# streams of an attack key are folded in with constants above that range, so no sample's stream
# can coincide with them (0x0E07, the old EOT salt, was sample 3591's stream). The limit,
# SAMPLE_ID_LIMIT = 2**31, lives in sarjax.data.images: the image files' ids are checked against it too.
EOT_SALT = 0xE07E_0E07  # folded into the attack key for the EOT draws (independent of the random starts)


def at_key(apply: Callable, eot: int, key) -> Callable:
    """A deterministic ``apply(params, x)``: ``apply`` itself when ``eot == 1``, else the
    stochastic ``apply(params, x, key)`` at the fixed ``key`` (one draw)."""
    if eot == 1:
        return apply
    return lambda params, x: apply(params, x, key)


def prepare_cfg(cfg, params):
    """The ``prepare`` hook of the fixed-budget attacks: ``(cfg, params)`` with ``cfg.apply``
    replaced by the prepared apply (:func:`prepare`), once per run, outside the step loop.
    With ``cfg.eot > 1`` (a stochastic ``apply(params, x, key)``) nothing is prepared."""
    if getattr(cfg, "eot", 1) > 1:
        return cfg, params
    apply, params = prepare(cfg.apply, params)
    return cfg._replace(apply=apply), params


def evaluators(apply: Callable, per_example: Callable, eot: int):
    """``(evaluate, value_and_grad)`` for an attack's loops.

    ``evaluate(params, x, ref, mask, *extra, key)`` and ``value_and_grad(...)`` (same arguments)
    take the EOT draws' key last.  With ``eot == 1`` the key is ignored and ``apply`` is
    deterministic; otherwise they average over ``eot`` draws (:func:`make_eot_evaluators`).
    ``apply`` is used as given (prepare it once with :func:`prepare_cfg`).
    """
    if eot > 1:
        return make_eot_evaluators(apply, per_example, eot)
    evaluate_1 = make_batch_evaluate(apply, per_example)
    vg_1 = jax.value_and_grad(evaluate_1, argnums=1, has_aux=True)

    def evaluate(params, x, ref, mask, *extra_and_key):
        return evaluate_1(params, x, ref, mask, *extra_and_key[:-1])

    def value_and_grad(params, x, ref, mask, *extra_and_key):
        return vg_1(params, x, ref, mask, *extra_and_key[:-1])

    return evaluate, value_and_grad


def make_eot_evaluators(apply: Callable, per_example: Callable, eot: int):
    """Evaluation and gradient averaged over ``eot`` draws of a stochastic ``apply(params, x, key)``.

    Draw ``d`` of a call with key ``k`` runs ``apply(params, x, fold_in(k, d))`` on the whole batch.
    Per example and member: the loss is the mean over the draws, a member counts as fooled only if
    it is fooled on EVERY draw (success is never claimed on a lucky draw), and the objective is the
    mask-weighted mean of the averaged losses (= the mean of the per-draw objectives).  The
    gradient is the mean of the per-draw gradients (EOT, Athalye et al. 2018; AutoAttack's
    ``eot_iter`` averages gradients the same way).  Draws run in a ``lax.scan`` (memory of one).

    ``per_example`` must build its Evaluation with :func:`evaluation` (as :func:`scorer` does).  Returns ``(evaluate, value_and_grad)`` with the signatures of
    :func:`make_batch_evaluate`'s ``evaluate`` and its ``jax.value_and_grad(..., argnums=1,
    has_aux=True)``, with the draws' key as the last argument.
    """

    def draw(k):
        return make_batch_evaluate(lambda params, x: apply(params, x, k), per_example)

    def run(params, x, ref, mask, extra, key, with_grad):
        def one(carry, d):
            k = jax.random.fold_in(key, d)
            if with_grad:
                (_, ev), g = jax.value_and_grad(draw(k), argnums=1, has_aux=True)(params, x, ref, mask, *extra)
            else:
                _, ev = draw(k)(params, x, ref, mask, *extra)
                g = None
            gs, ls, ss = carry
            return (
                None if g is None else gs + g.astype(gs.dtype),
                ls + ev.losses.astype(ls.dtype),
                ss & ev.success,
            ), None

        B, M = ref.shape
        init = (jnp.zeros_like(x) if with_grad else None, jnp.zeros((B, M), jnp.float32), jnp.ones((B, M), bool))
        (gs, ls, ss), _ = jax.lax.scan(one, init, jnp.arange(eot))
        ev = jax.vmap(evaluation)(ls / eot, ss, mask)
        return ev, (None if gs is None else gs / eot)

    def evaluate(params, x, ref, mask, *extra_and_key):
        *extra, key = extra_and_key
        ev, _ = run(params, x, ref, mask, extra, key, False)
        return jnp.sum(ev.obj), ev

    def value_and_grad(params, x, ref, mask, *extra_and_key):
        *extra, key = extra_and_key
        ev, g = run(params, x, ref, mask, extra, key, True)
        return (jnp.sum(ev.obj), ev), g

    return evaluate, value_and_grad
