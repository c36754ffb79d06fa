"""sarjax.attacks: pure, jitted attacks on model pools, threat models and the bound audit.

See docs/attacks.md ("The protocol").  Every fixed-budget attack is a factory (optax-style) that
closes over hyperparameters and returns an :class:`~sarjax.attacks.core.entry.Entry`:
``fn(params, x0, ref, *, key, mask=None, max_queries=None, sample_ids=None, **family_keywords)``
(validated, audited against ``x0``; ``key`` keyword-only and required),
``fn.jit(...)`` (jit-safe, same arguments) and ``fn.attack`` (the state machine,
:class:`~sarjax.attacks.core.Attack`).

The narrative page (docs/attacks.md) follows.

.. include:: ../../docs/attacks.md
"""

# minimum-norm attacks (docs/minnorm.md): each module has spec(**hp) and a factory make_<name>(apply, *, norm, max_queries);
# AutoAttack (docs/autoattack.md) and the attacks on LLM pools (text, docs/llm.md) as modules
from sarjax.attacks import (  # noqa: E402
    alma,
    apgd_min,
    autoattack,
    core,
    ddn,
    fab,
    fmn,
    geometry,
    minnorm,
    pdgd,
    pdpgd,
    queries,
    sigma_zero,
    text,
)
from sarjax.attacks.alma import make_alma
from sarjax.attacks.apgd import APGDSchedule, make_apgd, make_apgd_t
from sarjax.attacks.apgd_min import make_apgd_min
from sarjax.attacks.audit import AuditReport, audit, check
from sarjax.attacks.autoattack import (
    AutoAttack,
    AutoAttackConfig,
    AutoAttackResult,
    AutoAttackSettings,
    autoattack_config,
    make_autoattack,
)
from sarjax.attacks.core import Attack, AttackFn, AttackOutput, Problem
from sarjax.attacks.core.entry import Entry
from sarjax.attacks.ddn import make_ddn
from sarjax.attacks.eot import with_input_noise
from sarjax.attacks.fab import make_fab
from sarjax.attacks.fgsm import make_fgsm
from sarjax.attacks.fmn import make_fmn
from sarjax.attacks.geometry import dual_norm, norm, project, random_in_ball, steepest
from sarjax.attacks.joint import JointPGDStep, make_joint_pgd
from sarjax.attacks.members import MemberAttack, attack_members, make_member_attack
from sarjax.attacks.mifgsm import MIFGSMStep, make_mifgsm
from sarjax.attacks.minnorm import MinNormResult  # noqa: E402
from sarjax.attacks.pdgd import make_pdgd
from sarjax.attacks.pdpgd import make_pdpgd
from sarjax.attacks.pgd import PGDStep, make_pgd
from sarjax.attacks.result import AttackResult
from sarjax.attacks.rounds import Rounds, make_rounds
from sarjax.attacks.sigma_zero import make_sigma_zero
from sarjax.attacks.square import make_square
from sarjax.attacks.text import (
    make_autodan,
    make_beast,
    make_gcg,
)
from sarjax.attacks.threat import Threat, canonical_norm, check_labels

__all__ = [
    "APGDSchedule",
    "Attack",
    "AttackFn",
    "AttackOutput",
    "AttackResult",
    "AutoAttack",
    "AutoAttackResult",
    "Entry",
    "JointPGDStep",
    "MemberAttack",
    "MIFGSMStep",
    "PGDStep",
    "Rounds",
    "make_alma",
    "make_apgd_min",
    "make_autoattack",
    "AutoAttackConfig",
    "AutoAttackSettings",
    "autoattack_config",
    "make_autodan",
    "make_beast",
    "make_ddn",
    "make_fab",
    "make_fmn",
    "make_gcg",
    "make_pdgd",
    "make_pdpgd",
    "make_sigma_zero",
    "AuditReport",
    "Problem",
    "Threat",
    "core",
    "attack_members",
    "audit",
    "canonical_norm",
    "check",
    "check_labels",
    "dual_norm",
    "geometry",
    "make_apgd",
    "make_apgd_t",
    "make_fgsm",
    "make_joint_pgd",
    "make_member_attack",
    "make_mifgsm",
    "make_pgd",
    "make_rounds",
    "make_square",
    "norm",
    "project",
    "queries",
    "random_in_ball",
    "steepest",
    "with_input_noise",
    "MinNormResult",
    "alma",
    "apgd_min",
    "autoattack",
    "text",
    "ddn",
    "fab",
    "fmn",
    "minnorm",
    "pdgd",
    "pdpgd",
    "sigma_zero",
]
