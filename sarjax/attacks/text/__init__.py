"""Suffix attacks on LLM pools (docs/llm.md, "Attacks on LLM pools"): joint GCG
(:mod:`~sarjax.attacks.text.gcg`) and joint BEAST (:mod:`~sarjax.attacks.text.beast`) on the
attack protocol (state machines, query counting, a required key), model-agnostic through a
:class:`~sarjax.attacks.text.core.TextModel` and member masks; :mod:`~sarjax.attacks.text.core`
holds the request layout, the losses, the pool adapter and the threat-model audit;
:mod:`~sarjax.attacks.text.autodan` is the black-box AutoDAN-style rewriting.
"""

from sarjax.attacks.text import autodan, beast, core, gcg
from sarjax.attacks.text.autodan import make_autodan
from sarjax.attacks.text.beast import make_beast, seed_suffixes
from sarjax.attacks.text.core import (
    TextAttackFn,
    TextAttackResult,
    TextBatch,
    TextModel,
    allowed_vocab,
    audit_text,
    exchange_suffix,
    joint_loss,
    llm_text_model,
    refusal_loss,
    suffix_text_violations,
    target_loss,
    text_batch,
)
from sarjax.attacks.text.gcg import JointGCG, JointGCGResult, make_gcg, make_joint_gcg

__all__ = [
    "JointGCG",
    "JointGCGResult",
    "TextAttackFn",
    "TextAttackResult",
    "TextBatch",
    "TextModel",
    "allowed_vocab",
    "audit_text",
    "autodan",
    "beast",
    "core",
    "exchange_suffix",
    "gcg",
    "joint_loss",
    "llm_text_model",
    "make_autodan",
    "make_beast",
    "make_gcg",
    "make_joint_gcg",
    "refusal_loss",
    "seed_suffixes",
    "suffix_text_violations",
    "target_loss",
    "text_batch",
]
