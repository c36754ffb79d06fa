"""Attacks on LLM pools (docs/llm.md, "Attacks on LLM pools"): joint GCG
(:mod:`~sarjax.attacks.text.gcg`) and joint BEAST (:mod:`~sarjax.attacks.text.beast`) on the
attack protocol (state machines, query counting, a required key), model-agnostic through a
:class:`~sarjax.attacks.text.core.TextModel` and member masks; :mod:`~sarjax.attacks.text.core`
holds the request layout, the losses, the success criteria, the pool adapter, the threat-model
audit and the re-tokenization of the prompts that are sent; :mod:`~sarjax.attacks.text.autodan`
is the black-box AutoDAN-style rewriting on text (:mod:`~sarjax.attacks.text.autodan_jit`: on
token ids with a jit-safe entry; :mod:`~sarjax.attacks.text.autodan_judge`: how both judge and
rank a candidate);
:mod:`~sarjax.attacks.text.beast_cross` is joint BEAST on pools whose members use different
tokenizers, as :func:`~sarjax.attacks.text.gcg_joint.make_joint_gcg` is joint GCG;
:mod:`~sarjax.attacks.text.pool` holds the host-side helpers both share.

Every attack is an :class:`~sarjax.attacks.core.entry.Entry` called
``fn(params, inputs, ref, *, key, mask=None, max_queries=None, sample_ids=None, **family)``;
every result starts with ``x_adv``, ``success [B, M]`` and ``queries [B, M]``.
"""

from sarjax.attacks.text import autodan, autodan_jit, autodan_judge, beast, beast_cross, core, gcg, gcg_joint, pool
from sarjax.attacks.text.autodan import AutoDANAttack, AutoDANBatch, AutoDANResult, PoolEvaluator, make_autodan
from sarjax.attacks.text.autodan_jit import AutoDANTokenFn, AutoDANTokenResult, make_autodan_jit
from sarjax.attacks.text.beast import make_beast, seed_suffixes
from sarjax.attacks.text.beast_cross import CrossBEAST, CrossBEASTResult, make_cross_beast
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
    member_success,
    refusal_loss,
    sent_ids,
    slot_texts,
    suffix_text_violations,
    target_loss,
    text_batch,
)
from sarjax.attacks.text.gcg import make_gcg
from sarjax.attacks.text.gcg_joint import JointGCG, JointGCGResult, make_joint_gcg

__all__ = [
    "AutoDANAttack",
    "AutoDANBatch",
    "AutoDANResult",
    "AutoDANTokenFn",
    "AutoDANTokenResult",
    "CrossBEAST",
    "CrossBEASTResult",
    "JointGCG",
    "JointGCGResult",
    "PoolEvaluator",
    "TextAttackFn",
    "TextAttackResult",
    "TextBatch",
    "TextModel",
    "allowed_vocab",
    "audit_text",
    "autodan",
    "autodan_jit",
    "autodan_judge",
    "beast",
    "beast_cross",
    "core",
    "exchange_suffix",
    "gcg",
    "gcg_joint",
    "joint_loss",
    "llm_text_model",
    "make_autodan",
    "make_autodan_jit",
    "make_beast",
    "make_cross_beast",
    "make_gcg",
    "make_joint_gcg",
    "member_success",
    "pool",
    "refusal_loss",
    "seed_suffixes",
    "sent_ids",
    "slot_texts",
    "suffix_text_violations",
    "target_loss",
    "text_batch",
]
