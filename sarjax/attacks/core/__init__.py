"""The attack core: the protocol every attack implements and its two entries (docs/attacks.md).

``Attack`` (init / step / result over a NamedTuple state), ``Problem`` (one normalised call),
``run`` (a ``lax.scan`` over ``step``; jit-safe), ``AttackFn`` (the audited public entry and the
jit-safe ``.jit`` entry over one code path).

``AttackOutput`` (the one result base every result satisfies: ``x_adv``, ``success [B, M]``,
``queries [B, M]``).

Modules: ``output`` (AttackOutput), ``protocol`` (Attack, Problem, run, make_problem), ``entry``
(AttackFn), ``evaluate`` (Evaluation, scorers, best-so-far, EOT evaluators, the ``prepare``
hook), ``validate`` (host-side checks and the bound audit of the public entry), ``gradient`` (the
step-rule attacks' state machine: FGSM, PGD, MI-FGSM, joint PGD).
"""

from sarjax.attacks.core.entry import AttackFn
from sarjax.attacks.core.output import AttackOutput
from sarjax.attacks.core.protocol import Attack, Problem, make_problem, member_count, run, run_jit, sample_keys

__all__ = [
    "Attack",
    "AttackFn",
    "AttackOutput",
    "Problem",
    "make_problem",
    "member_count",
    "run",
    "run_jit",
    "sample_keys",
]
