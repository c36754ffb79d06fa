"""Joint PGD: one input per sample that fools as many selected members as possible.

The SAR greedy cover (the SAR paper, Algorithm 1) calls this once per round with
each sample's uncovered-member mask; the mask is a traced argument, so a new
mask never recompiles.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sarjax.attacks.core import validate as V
from sarjax.attacks.pgd import PGDStep, make_pgd


@dataclass(frozen=True)
class JointPGDStep:
    """How :func:`make_joint_pgd` steps and restarts (defaults: the SAR paper, Table 1).

    Attributes:
      step_size: absolute step, a float > 0, or None (default): eps/16 of each call's eps per
        sample (Table 1's step).
      restarts: an int >= 1 (default 3, Table 1), each from a uniform random point of the
        eps-ball of x0; the restart with the highest final objective is returned.

    Raises:
      ValueError: a field of the wrong type or out of range (the message names the field and
        the value).
    """

    step_size: float | None = None
    restarts: int = 3

    def __post_init__(self) -> None:
        V.setting_float("JointPGDStep", "step_size", self.step_size, optional=True)
        V.setting_int("JointPGDStep", "restarts", self.restarts, 1)


def make_joint_pgd(
    apply: Callable,
    *,
    eps=None,
    steps: int = 40,
    norm="linf",
    loss: str = "ce",
    targeted: bool = False,
    box=(0.0, 1.0),
    audit: bool = True,
    eot: int = 1,
    step: JointPGDStep = JointPGDStep(),
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
      steps: gradient steps per restart (Table 1: 40).
      norm: ``"linf"`` (the paper's); ``"l2"``/``"l1"`` also work.
      loss: ``"ce"`` (the paper's), ``"dlr"`` or ``"margin"``.
      targeted: if True, ``ref`` are targets.
      box, audit, eot: see :func:`sarjax.attacks.pgd.make_pgd` (``eot > 1``: a stochastic pool,
        ``apply(params, x, key)``, attacked in expectation).
      step: the step rule (:class:`JointPGDStep`: step size, restarts; Table 1's eps/16 and 3 by
        default).

    Returns:
      ``fn(params, x0 [B, *S], ref [B, M] int32 (or [B]), *, key, mask [B, M] or [M]
      (bool/float) = all, eps=None, max_queries=None) -> AttackResult`` with
      ``success [B, M]`` for EVERY member (selected or not), ``objective [B]``,
      ``member_loss [B, M]``, ``queries [B]``.

    Raises:
      TypeError: ``step`` not a :class:`JointPGDStep`.
    """
    if not isinstance(step, JointPGDStep):
        raise TypeError(f"step must be a JointPGDStep, got {type(step).__name__}")
    return make_pgd(
        apply,
        norm=norm,
        eps=eps,
        steps=steps,
        loss=loss,
        targeted=targeted,
        box=box,
        audit=audit,
        eot=eot,
        step=PGDStep(step_size=step.step_size, rel_step=1.0 / 16, restarts=step.restarts, random_start=True),
    )
