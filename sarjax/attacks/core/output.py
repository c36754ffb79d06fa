"""The one result base every sarjax attack returns (docs/attacks.md, "The protocol").

Each family keeps its own NamedTuple (``AttackResult``, ``MinNormResult``, ``AutoAttackResult``,
the text results, ``KLResult``), with the family's fields after or beside these three; every one
of them satisfies :class:`AttackOutput`, so code that only reads the point, the verdict and the
cost works on any attack. ``tests/attacks/test_attack_output_protocol.py`` runs every exported
factory and checks the shapes below.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class AttackOutput(Protocol):
    """What every attack result has (read-only attributes; ``B`` samples, ``M`` members).

    The shapes are documented here once; each result type documents only its family's fields.

    Attributes:
      x_adv: the returned adversarial input, in the attack's input space:

        * ``[B, *S]`` for fixed-budget and joint attacks (one point per sample shared by every
          member: PGD, FGSM, MI-FGSM, APGD, APGD-T, Square, joint PGD, rounds, the TRADES KL
          attack);
        * ``[B, M, *S]`` for per-member attacks (member mode, AutoAttack) and minimum-norm
          attacks (one point per sample and member; ``x0`` where none was found);
        * text attacks: their documented form (docs/llm.md), one entry per request: ``[B, T]``
          int32 prompt ids (GCG, BEAST), ``[B, W]`` int32 rewrite ids (the jitted AutoDAN) or
          ``B`` strings (the attacks across tokenizers, AutoDAN).
      success: ``[B, M]`` bool, member ``m`` is broken on sample ``b`` at ``x_adv`` (its
        ``[b, m]`` point for per-member results) by the attack's criterion: the prediction
        leaves the label (reaches the target when targeted); for text attacks the family's
        criterion (target, refusal or the judge's verdict). Reported for every member, masked
        ones included.
      queries: ``[B, M]`` non-negative integers (int32 in jitted kernels, int64 on the host):
        the queries spent on member ``m`` for sample ``b`` (one forward or backward pass of one
        member on one input = 1, docs/attacks.md "Query accounting"); ``queries.sum(-1)`` is
        sample ``b``'s total, which a per-sample ``max_queries`` caps.
    """

    @property
    def x_adv(self) -> Any: ...

    @property
    def success(self) -> Any: ...

    @property
    def queries(self) -> Any: ...


__all__ = ["AttackOutput"]
