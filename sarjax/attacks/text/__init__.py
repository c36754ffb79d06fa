"""Attacks on LLM pools (docs/llm.md, "Attacks on LLM pools"): joint GCG
(:mod:`~sarjax.attacks.text.gcg`) and joint BEAST (:mod:`~sarjax.attacks.text.beast`) on the
attack protocol (state machines, query counting, a required key), model-agnostic through a
:class:`~sarjax.attacks.text.model.TextModel` and member masks. The shared pieces, one concept
per module: :mod:`~sarjax.attacks.text.requests` (the request layout and the text around each
suffix slot), :mod:`~sarjax.attacks.text.model` (the pool adapter and the per-member scoring),
:mod:`~sarjax.attacks.text.losses` (losses and success criteria),
:mod:`~sarjax.attacks.text.retokenize` (the text that is sent, the re-tokenization filter, suffixes
passed as text across tokenizers) and :mod:`~sarjax.attacks.text.entry` (the entry, its
validation, the threat-model audit); :mod:`~sarjax.attacks.text.autodan`
is the black-box AutoDAN-style rewriting, one factory whose pool and judge pick the host loop on
text or the state machine on token ids (:mod:`~sarjax.attacks.text.autodan_jit`, with a jit-safe
entry; :mod:`~sarjax.attacks.text.autodan_judge`: how both judge and rank a candidate;
:mod:`~sarjax.attacks.text.autodan_options`: its rare knobs);
one factory per attack, the pool first: :func:`~sarjax.attacks.text.gcg.make_gcg` and
:func:`~sarjax.attacks.text.beast.make_beast` given a :class:`~sarjax.models.llm.pool.LLMPool`
return the host-driven searches on text (:mod:`~sarjax.attacks.text.gcg_joint`,
:mod:`~sarjax.attacks.text.beast_cross`: any tokenizers), given a
:class:`~sarjax.attacks.text.model.TextModel` the compiled state machines on token ids;
:mod:`~sarjax.attacks.text.pool` holds the host-side helpers both share.

Every attack is an :class:`~sarjax.attacks.core.entry.Entry` called
``fn(params, inputs, ref, *, key, mask=None, max_queries=None, sample_ids=None, **family)``;
every result starts with ``x_adv``, ``success [B, M]`` and ``queries [B, M]``.
"""

from sarjax.attacks.text import (
    autodan,
    autodan_jit,
    autodan_judge,
    autodan_options,
    beast,
    beast_cross,
    entry,
    gcg,
    gcg_joint,
    losses,
    model,
    pool,
    requests,
    retokenize,
)
from sarjax.attacks.text.autodan import AutoDANAttack, AutoDANBatch, AutoDANResult, PoolEvaluator, make_autodan
from sarjax.attacks.text.autodan_jit import AutoDANTokenFn, AutoDANTokenResult
from sarjax.attacks.text.autodan_options import AutoDANOptions
from sarjax.attacks.text.beast import BEASTOptions, make_beast, seed_suffixes
from sarjax.attacks.text.beast_cross import CrossBEAST, CrossBEASTResult
from sarjax.attacks.text.entry import TextAttackFn, TextAttackResult, audit_text
from sarjax.attacks.text.gcg import GCGOptions, make_gcg
from sarjax.attacks.text.gcg_joint import JointGCG, JointGCGResult
from sarjax.attacks.text.losses import joint_loss, member_success, refusal_loss, target_loss
from sarjax.attacks.text.model import TextModel, llm_text_model
from sarjax.attacks.text.requests import TextBatch, TextRequests, slot_texts, text_batch, text_requests
from sarjax.attacks.text.retokenize import allowed_vocab, exchange_suffix, sent_ids, suffix_text_violations

__all__ = [
    "AutoDANAttack",
    "AutoDANBatch",
    "AutoDANOptions",
    "AutoDANResult",
    "AutoDANTokenFn",
    "AutoDANTokenResult",
    "BEASTOptions",
    "CrossBEAST",
    "CrossBEASTResult",
    "GCGOptions",
    "JointGCG",
    "JointGCGResult",
    "PoolEvaluator",
    "TextAttackFn",
    "TextAttackResult",
    "TextBatch",
    "TextRequests",
    "TextModel",
    "allowed_vocab",
    "audit_text",
    "autodan",
    "autodan_jit",
    "autodan_judge",
    "autodan_options",
    "beast",
    "beast_cross",
    "entry",
    "losses",
    "model",
    "requests",
    "retokenize",
    "exchange_suffix",
    "gcg",
    "gcg_joint",
    "joint_loss",
    "llm_text_model",
    "make_autodan",
    "make_beast",
    "make_gcg",
    "member_success",
    "pool",
    "refusal_loss",
    "seed_suffixes",
    "sent_ids",
    "slot_texts",
    "suffix_text_violations",
    "target_loss",
    "text_batch",
    "text_requests",
]
