"""Fast Gradient (Sign) Method: one steepest-ascent step of size eps."""

from __future__ import annotations

from collections.abc import Callable

from sarjax.attacks.core import AttackFn
from sarjax.attacks.core import validate as V
from sarjax.attacks.core.gradient import gradient_factory
from sarjax.attacks.threat import canonical_norm


def make_fgsm(
    apply: Callable,
    *,
    norm="linf",
    eps=None,
    loss: str = "ce",
    targeted: bool = False,
    box=(0.0, 1.0),
    audit: bool = True,
    eot: int = 1,
) -> AttackFn:
    """FGSM (Goodfellow et al. 2015) and its l2 / l1 analogues (fast gradient method).

    One step ``x0 + eps * steepest(grad, p)`` projected onto the ball and the
    box, from ``x0`` (no random start; Goodfellow et al.).  For l1 the step
    is the signed one-hot at the largest ``|grad|`` coordinate (the l1-ball
    vertex that maximises the linearised loss).

    Args:
      apply: ``apply(params, x [B, *S]) -> logits [M, B, C]`` (or ``[B, C]``).
      norm: ``"linf"``, ``"l2"`` or ``"l1"``.
      eps: default radius (scalar or ``[B]``).
      loss: ``"ce"``, ``"dlr"`` or ``"margin"``.
      targeted: move toward ``ref`` instead of away from it.
      box: input bounds.
      audit: audit outputs against x0.
      eot: EOT draws of a stochastic ``apply(params, x, key)`` (see :func:`sarjax.attacks.pgd.make_pgd`).

    Returns:
      An AttackFn (as :func:`sarjax.attacks.pgd.make_pgd`):
      ``fn(params, x0, ref, *, key, mask=None, eps=None, max_queries=None)
      -> AttackResult`` (see :func:`sarjax.attacks.pgd.make_pgd`).
    """
    p = canonical_norm(norm)
    if p == 0.0:
        raise ValueError("FGSM supports norms l1, l2, linf; got l0")
    V.check_loss(loss, targeted)
    # l1: the plain one-hot steepest step, i.e. sparsity = all but one coordinate.
    step_rule = dict(
        steps=1,
        restarts=1,
        random_start=False,
        rel_step=1.0,
        l1_sparsity=1.0 - 1e-9,
    )
    return gradient_factory("fgsm", apply, p, eps, loss, targeted, box, audit, eot, step_rule)
