"""Joint PGD: one input per sample that fools as many selected members as possible.

The SAR greedy cover (the SAR paper, Algorithm 1) calls this once per round with
each sample's uncovered-member mask; the mask is a traced argument, so a new
mask never recompiles.
"""

from __future__ import annotations

from collections.abc import Callable

from sarjax.attacks.pgd import make_pgd


def make_joint_pgd(
    apply: Callable,
    *,
    eps=None,
    steps: int = 40,
    step_size: float | None = None,
    restarts: int = 3,
    norm="linf",
    loss: str = "ce",
    targeted: bool = False,
    box=(0.0, 1.0),
    audit: bool = True,
    eot: int = 1,
) -> Callable:
    """Joint PGD of the SAR paper's Table 1 (the SAR paper).

    Untargeted, maximises the average cross-entropy of the selected
    (uncovered) members relative to their reference labels (on MNIST each
    member's own clean prediction), linf projected gradient ascent, 40 steps,
    step eps/16, 3 random restarts from the eps-ball of x0, returning the
    restart with the highest final objective (``x_adv``).  ``best_x`` keeps the
    iterate that fooled the most selected members (ties: higher objective).

    Args:
      apply: ``apply(params, x [B, *S]) -> logits [M, B, C]``, e.g. ``pool.apply``.
      eps: default linf radius (scalar or ``[B]``), overridable per call.
      steps, step_size, restarts: Table 1's 40, eps/16, 3 by default.
      norm: ``"linf"`` (the paper's); ``"l2"``/``"l1"`` also work.
      loss: ``"ce"`` (the paper's), ``"dlr"`` or ``"margin"``.
      targeted: if True, ``ref`` are targets.
      box, audit, eot: see :func:`sarjax.attacks.pgd.make_pgd` (``eot > 1``: a stochastic pool,
        ``apply(params, x, key)``, attacked in expectation).

    Returns:
      ``fn(params, x0 [B, *S], ref [B, M] int32 (or [B]), *, key, mask [B, M] or [M]
      (bool/float) = all, eps=None, max_queries=None) -> AttackResult`` with
      ``success [B, M]`` for EVERY member (selected or not), ``objective [B]``,
      ``member_loss [B, M]``, ``queries [B]``.
    """
    return make_pgd(
        apply,
        norm=norm,
        eps=eps,
        steps=steps,
        step_size=step_size,
        rel_step=1.0 / 16,
        restarts=restarts,
        random_start=True,
        loss=loss,
        targeted=targeted,
        box=box,
        audit=audit,
        eot=eot,
    )
