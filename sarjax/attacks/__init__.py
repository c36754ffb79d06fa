"""sarjax.attacks: pure, jitted attacks on model pools, threat models and the bound audit."""

from sarjax.attacks import geometry, queries
from sarjax.attacks.audit import AuditReport, audit, check
from sarjax.attacks.geometry import dual_norm, norm, project, random_in_ball, steepest
from sarjax.attacks.result import AttackResult
from sarjax.attacks.threat import Threat, canonical_norm

__all__ = [
    "AttackResult", "AuditReport", "Threat", "audit", "canonical_norm", "check", "dual_norm",
    "geometry", "norm", "project", "queries", "random_in_ball", "steepest",
]
