"""Projected gradient descent (ascent) for linf, l2 and l1 (sparse l1 steps)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sarjax.attacks.core import AttackFn
from sarjax.attacks.core import validate as V
from sarjax.attacks.core.gradient import gradient_factory
from sarjax.attacks.threat import canonical_norm


@dataclass(frozen=True)
class PGDStep:
    """How :func:`make_pgd` steps and restarts: its rarely set step-rule knobs.

    The threat model (``norm``, ``eps``, ``box``), the objective (``loss``, ``targeted``), the
    budget (``steps``), the model's randomness (``eot``) and the output check (``audit``) stay
    arguments of :func:`make_pgd`.

    Attributes:
      step_size: absolute step, a float > 0, or None (default): ``rel_step * eps`` per sample.
      rel_step: the step as a fraction of eps, a float > 0, or None (default): 1/16 for linf
        (the SAR paper, Table 1: step eps/16) and 1/4 for l2 and l1 (a documented choice, not a
        paper value: torchattacks' ``PGDL2`` steps 0.2 at eps 1.0, a range that holds eps/4).
      restarts: runs of ``steps`` steps, an int >= 1 (default 1: Madry et al. 2018's single
        run); the restart with the highest final objective is returned.
      random_start: start each restart at a uniform random point of the eps-ball of x0 (default
        True, Madry et al. 2018) rather than at x0.
      l1_sparsity: l1 only: the quantile of the sparse l1 step, in [0, 1): each step moves the
        top ``1 - l1_sparsity`` share of coordinates by |gradient|, excluding those pinned at
        the box (SLIDE, Tramer & Boneh 2019). Default 0.99 (sarjax's choice: the top 1%).

    Raises:
      ValueError: a field of the wrong type or out of range (the message names the field and
        the value).
    """

    step_size: float | None = None
    rel_step: float | None = None
    restarts: int = 1
    random_start: bool = True
    l1_sparsity: float = 0.99

    def __post_init__(self) -> None:
        V.setting_float("PGDStep", "step_size", self.step_size, optional=True)
        V.setting_float("PGDStep", "rel_step", self.rel_step, optional=True)
        V.setting_int("PGDStep", "restarts", self.restarts, 1)
        V.setting_bool("PGDStep", "random_start", self.random_start)
        V.setting_float("PGDStep", "l1_sparsity", self.l1_sparsity, lo_closed=True, hi=1.0)


def make_pgd(
    apply: Callable,
    *,
    norm="linf",
    eps=None,
    steps: int = 40,
    loss: str = "ce",
    targeted: bool = False,
    box=(0.0, 1.0),
    audit: bool = True,
    eot: int = 1,
    step: PGDStep = PGDStep(),
) -> AttackFn:
    """PGD (Madry et al. 2018) against the mean loss of the selected members.

    With one member this is classic PGD; with a ``[B, M]`` mask it is the
    joint attack (one input per sample for all selected members).

    Defaults: 40 steps and linf step eps/16 from the SAR paper's Table 1; the other step-rule
    defaults (l2 / l1 step eps/4, one restart from a random start, the sparse l1 step) and
    their sources are :class:`PGDStep`'s.

    Args:
      apply: ``apply(params, x [B, *S]) -> logits [M, B, C]`` (or ``[B, C]``).
      norm: ``"linf"``, ``"l2"`` or ``"l1"`` (or 1, 2, inf).
      eps: default radius (scalar or ``[B]``); may be overridden per call.
      steps: gradient steps per restart.
      loss: ``"ce"``, ``"dlr"`` or ``"margin"``.
      targeted: if True ``ref`` holds targets and the loss moves toward them.
      box: input bounds.
      audit: audit every output against x0 (raise on violation).
      eot: Expectation over Transformation draws (Athalye et al. 2018). With ``eot > 1`` the
        model is stochastic, ``apply(params, x, key) -> logits``: every evaluation runs ``eot``
        draws, the step follows the mean gradient, losses are averaged, a member counts as fooled
        only if fooled on every draw, and queries are charged per draw.  1 (default): a
        deterministic ``apply(params, x)``.
      step: the step rule (:class:`PGDStep`: step size, restarts, random start, l1 sparsity).

    Returns:
      An :class:`~sarjax.attacks.core.AttackFn` ``fn``: ``fn(params, x0 [B, *S], ref [B] or
      [B, M] int, *, key, mask [M] or [B, M] = all, eps = None, max_queries = None, x_init =
      None, sample_ids = None) -> AttackResult`` (validated and audited; ``key`` is required,
      ``TypeError`` without it); ``fn.jit(...)``, same arguments, the jit-safe entry (no host
      call, no audit: use it inside your own ``jax.jit``); ``fn.attack``, the state machine
      (:mod:`sarjax.attacks.core.gradient`, ``step.restarts * steps`` steps).

    Raises:
      ValueError: on an unsupported norm (l0), negative steps, an unknown loss.
      TypeError: ``step`` not a :class:`PGDStep`.
    """
    p = canonical_norm(norm)
    if p == 0.0:
        raise ValueError("PGD supports norms l1, l2, linf; got l0")
    if not isinstance(step, PGDStep):
        raise TypeError(f"step must be a PGDStep, got {type(step).__name__}")
    steps = V.check_positive_int("steps", steps, 0)
    V.check_loss(loss, targeted)
    rel_step = step.rel_step
    if rel_step is None:
        rel_step = 1.0 / 16 if p == float("inf") else 0.25
    step_rule = dict(
        steps=steps,
        restarts=int(step.restarts),
        random_start=bool(step.random_start),
        rel_step=float(rel_step),
        abs_step=V.check_step(step.step_size),
        l1_sparsity=float(step.l1_sparsity),
    )
    return gradient_factory("pgd", apply, p, eps, loss, targeted, box, audit, eot, step_rule)
