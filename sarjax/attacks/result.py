"""The result every sarjax fixed-budget and joint attack returns."""

from __future__ import annotations

from typing import NamedTuple

import jax


class AttackResult(NamedTuple):
    """Output of an attack on a batch against M members (a pytree of arrays); an
    :class:`~sarjax.attacks.core.output.AttackOutput` (``x_adv``, ``success``, ``queries``: the
    base's shapes are documented there, the fields below say what they hold here).

    For single-model attacks ``M = 1``. Member mode (:func:`sarjax.attacks.members.make_member_attack`)
    has the same ``[B, M]`` fields, and per-member points ``x_adv`` / ``best_x`` ``[B, M, *S]``.

    Attributes:
      x_adv: ``[B, *S]`` the returned point: for restarts, the final iterate of
        the restart with the highest final objective.
      success: ``[B, M]`` bool, member m is fooled at ``x_adv`` (prediction
        differs from its reference label; equals the target when targeted).
      objective: ``[B]`` float32 attack objective at ``x_adv`` (mean loss over
        the selected members).
      member_loss: ``[B, M]`` float32 each member's loss at ``x_adv``.
      queries: ``[B, M]`` int32 queries spent on member m for sample b (one forward or
        backward pass of one member on one sample = 1); ``queries.sum(-1)`` is the sample's
        total, which the per-sample cap ``max_queries`` bounds.
      best_x: ``[B, *S]`` best-so-far point over all steps and restarts, ranked
        by the number of selected members fooled, then by objective.
      best_success: ``[B, M]`` bool, success at ``best_x``.
      best_objective: ``[B]`` float32 objective at ``best_x``.
    """

    x_adv: jax.Array
    success: jax.Array
    objective: jax.Array
    member_loss: jax.Array
    queries: jax.Array
    best_x: jax.Array
    best_success: jax.Array
    best_objective: jax.Array
