"""Losses and success criteria of the suffix attacks on LLM pools: the per-member objectives
(:func:`target_loss`, :func:`refusal_loss`), the joint objective over the covered members
(:func:`joint_loss`), and the criterion a result's ``success`` is read with (the members' greedy
tokens against the target, :func:`member_success`).
"""

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from sarjax.attacks.text.model import (
    TextModel,
)


def target_loss(nll, target_mask):
    """Mean per-token NLL of the target (minimised: BEAST's objective, Sadasivan et al. 2024;
    the SAR paper "joint BEAST").

    Args:
      nll: ``[..., Tt]`` per-token NLL; target_mask: ``[Tt]`` 0/1.

    Returns:
      ``[...]`` float32.
    """
    w = target_mask.astype(jnp.float32)
    return jnp.sum(nll * w, axis=-1) / jnp.maximum(jnp.sum(w), 1.0)


def refusal_loss(nll, target_mask):
    """Minus the mean per-token NLL of a fixed refusal (minimising it MAXIMISES the refusal's
    NLL: the SAR paper, "GCG maximizes the average negative log-likelihood for a fixed refusal").

    Args/returns as :func:`target_loss`.
    """
    return -target_loss(nll, target_mask)


def joint_loss(member_loss, mask):
    """The joint objective: the mean of the covered members' losses.

    Args:
      member_loss: ``[M, ...]``; mask: ``[M]`` 0/1 (covered = 1).

    Returns:
      ``[...]``: ``sum_m mask_m * loss_m / max(sum_m mask_m, 1)``.
    """
    w = mask.astype(jnp.float32).reshape(mask.shape + (1,) * (member_loss.ndim - 1))
    return jnp.sum(w * member_loss, axis=0) / jnp.maximum(jnp.sum(mask.astype(jnp.float32)), 1.0)


CRITERIA = ("target", "refusal")


def default_criterion(loss: Callable) -> str:
    """The success criterion that goes with a loss: ``"refusal"`` for :func:`refusal_loss` (the
    attack pushes the members away from a fixed refusal), ``"target"`` otherwise (the attack pulls
    them towards the target)."""
    return "refusal" if loss is refusal_loss else "target"


def check_criterion(name: str, criterion: str | None, loss: Callable) -> str:
    """``criterion`` (None: :func:`default_criterion` of ``loss``), checked.

    Raises:
      ValueError: a criterion outside :data:`CRITERIA`.
    """
    c = default_criterion(loss) if criterion is None else criterion
    if c not in CRITERIA:
        raise ValueError(f"{name}: criterion must be one of {CRITERIA}, got {criterion!r}")
    return c


def target_hits(model: "TextModel", params, ids, mask, target, target_mask):
    """``[M, Tt]`` bool: each member's argmax next token equals the target token after ``ids``
    (teacher forcing); padded target tokens count as hits. Uses ``model.hits`` when the model has
    it, else ``model.logits`` of ``ids | target``."""
    tm = target_mask.astype(bool)
    if model.hits is not None:
        h = model.hits(params, ids, mask, target, target_mask)
    else:
        t, tt = ids.shape[0], target.shape[0]
        full = jnp.concatenate([ids, target]).astype(jnp.int32)
        fm = jnp.concatenate([mask, target_mask]).astype(jnp.int32)
        lg = jax.lax.dynamic_slice_in_dim(model.logits(params, full, fm), t - 1, tt, axis=1)  # [M, Tt, V]
        h = jnp.argmax(lg, axis=-1) == target[None]
    return h | ~tm[None]


def member_success(model: "TextModel", criterion: str, params, ids, mask, target, target_mask):
    """``[M]`` bool: every member judged by ``criterion`` on one prompt (see
    :attr:`TextAttackResult.success`)."""
    full = jnp.all(target_hits(model, params, ids, mask, target, target_mask), axis=-1)
    return full if criterion == "target" else ~full


@functools.partial(jax.jit, static_argnames=("model", "criterion"))
def judge_prompts(params, ids, mask, target, target_mask, *, model, criterion):
    """``[B, M]`` bool: :func:`member_success` of ``B`` prompts ``ids [B, S]`` (left-padded) with
    their targets ``[B, Tt]`` (host helper of the audited entries, compiled per shape)."""
    return jax.vmap(lambda i, m, t, tm: member_success(model, criterion, params, i, m, t, tm))(
        ids, mask, target, target_mask
    )


__all__ = [
    "CRITERIA",
    "check_criterion",
    "default_criterion",
    "joint_loss",
    "judge_prompts",
    "member_success",
    "refusal_loss",
    "target_hits",
    "target_loss",
]
