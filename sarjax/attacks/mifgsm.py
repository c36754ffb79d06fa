"""MI-FGSM: momentum iterative fast gradient method."""

from __future__ import annotations

from collections.abc import Callable

from sarjax.attacks.core import AttackFn
from sarjax.attacks.core import validate as V
from sarjax.attacks.core.gradient import gradient_factory
from sarjax.attacks.threat import canonical_norm


def make_mifgsm(
    apply: Callable,
    *,
    norm="linf",
    eps=None,
    steps: int = 10,
    decay: float = 1.0,
    step_size: float | None = None,
    loss: str = "ce",
    targeted: bool = False,
    box=(0.0, 1.0),
    audit: bool = True,
    eot: int = 1,
) -> AttackFn:
    """MI-FGSM (Dong et al. 2018): ``g <- mu g + grad / ||grad||_1``, step along steepest(g).

    Defaults from Dong et al. 2018 (Sec. 3.1 / Algorithm 1): ``T = 10``
    iterations, decay ``mu = 1.0``, step ``alpha = eps / T``, start at x0.

    Args:
      apply: ``apply(params, x [B, *S]) -> logits [M, B, C]`` (or ``[B, C]``).
      norm: ``"linf"`` (sign step, the paper's) or ``"l2"`` (normalised step).
      eps: default radius.
      steps: T.
      decay: mu.
      step_size: absolute step; default ``eps / steps`` per sample.
      loss, targeted, box, audit, eot: as in :func:`sarjax.attacks.pgd.make_pgd`.

    Returns:
      An AttackFn (as :func:`sarjax.attacks.pgd.make_pgd`):
      ``fn(params, x0, ref, *, key, mask=None, eps=None, max_queries=None)
      -> AttackResult``.
    """
    p = canonical_norm(norm)
    if p not in (2.0, float("inf")):
        raise ValueError(f"MI-FGSM supports l2 and linf, got {norm!r}")
    steps = V.check_positive_int("steps", steps)
    V.check_loss(loss, targeted)
    step_rule = dict(
        steps=steps,
        restarts=1,
        random_start=False,
        rel_step=1.0 / steps,
        abs_step=V.check_step(step_size),
        momentum=float(decay),
    )
    return gradient_factory("mifgsm", apply, p, eps, loss, targeted, box, audit, eot, step_rule)
