"""MI-FGSM: momentum iterative fast gradient method."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sarjax.attacks.core import AttackFn
from sarjax.attacks.core import validate as V
from sarjax.attacks.core.gradient import gradient_factory
from sarjax.attacks.threat import canonical_norm


@dataclass(frozen=True)
class MIFGSMStep:
    """How :func:`make_mifgsm` steps (defaults: Dong et al. 2018, Sec. 3.1 / Algorithm 1).

    Attributes:
      decay: the momentum decay ``mu``, a finite float >= 0 (default 1.0, Dong et al. 2018).
      step_size: absolute step ``alpha``, a float > 0, or None (default): ``eps / steps`` per
        sample (Dong et al. 2018: ``alpha = eps / T``).

    Raises:
      ValueError: a field of the wrong type or out of range (the message names the field and
        the value).
    """

    decay: float = 1.0
    step_size: float | None = None

    def __post_init__(self) -> None:
        V.setting_float("MIFGSMStep", "decay", self.decay, lo_closed=True)
        V.setting_float("MIFGSMStep", "step_size", self.step_size, optional=True)


def make_mifgsm(
    apply: Callable,
    *,
    norm="linf",
    eps=None,
    steps: int = 10,
    loss: str = "ce",
    targeted: bool = False,
    box=(0.0, 1.0),
    audit: bool = True,
    eot: int = 1,
    step: MIFGSMStep = MIFGSMStep(),
) -> AttackFn:
    """MI-FGSM (Dong et al. 2018): ``g <- mu g + grad / ||grad||_1``, step along steepest(g).

    Defaults from Dong et al. 2018 (Sec. 3.1 / Algorithm 1): ``T = 10``
    iterations, decay ``mu = 1.0``, step ``alpha = eps / T``, start at x0.

    Args:
      apply: ``apply(params, x [B, *S]) -> logits [M, B, C]`` (or ``[B, C]``).
      norm: ``"linf"`` (sign step, the paper's) or ``"l2"`` (normalised step).
      eps: default radius.
      steps: T.
      loss, targeted, box, audit, eot: as in :func:`sarjax.attacks.pgd.make_pgd`.
      step: the step rule (:class:`MIFGSMStep`: decay ``mu`` and step ``alpha``).

    Returns:
      An AttackFn (as :func:`sarjax.attacks.pgd.make_pgd`):
      ``fn(params, x0, ref, *, key, mask=None, eps=None, max_queries=None)
      -> AttackResult``.

    Raises:
      ValueError: a norm other than l2 / linf, non-positive steps, an unknown loss.
      TypeError: ``step`` not a :class:`MIFGSMStep`.
    """
    p = canonical_norm(norm)
    if p not in (2.0, float("inf")):
        raise ValueError(f"MI-FGSM supports l2 and linf, got {norm!r}")
    if not isinstance(step, MIFGSMStep):
        raise TypeError(f"step must be an MIFGSMStep, got {type(step).__name__}")
    steps = V.check_positive_int("steps", steps)
    V.check_loss(loss, targeted)
    step_rule = dict(
        steps=steps,
        restarts=1,
        random_start=False,
        rel_step=1.0 / steps,
        abs_step=V.check_step(step.step_size),
        momentum=float(step.decay),
    )
    return gradient_factory("mifgsm", apply, p, eps, loss, targeted, box, audit, eot, step_rule)
