"""Pool adapters: how each text attack runs inside :func:`sarjax.sar.pool_llm_sar`.

:func:`sarjax.sar.pool_llm_sar` knows no attack by name. It builds a :class:`PoolRequest` (the
pool, the requests, the responder and judge, the caller's settings) and hands it to the adapter
registered under the attack's name in :data:`POOL_ADAPTERS`; the adapter builds the attack,
its batch and call arguments and returns them as a :class:`PoolAttack`, which is everything
:func:`sarjax.sar.run_llm_sar` needs and the run's fingerprint records. A new text attack joins
the LLM SAR by writing one adapter and adding it to the table.

The adapters here:

- ``"beast"``: joint BEAST (:func:`~sarjax.attacks.text.beast.make_beast`, one tokenizer) or
  BEAST across tokenizers (:func:`~sarjax.attacks.text.beast.make_beast`, the first
  stack's tokenizer proposing), :data:`ATTACK_DEFAULTS` ``["beast"]``, the target's mean per-token
  NLL minimised, an optional warm start from a seed generator;
- ``"gcg"``: joint GCG (:func:`~sarjax.attacks.text.gcg.make_gcg`, one tokenizer, or
  :func:`~sarjax.attacks.text.gcg.make_gcg` across tokenizers),
  :data:`ATTACK_DEFAULTS` ``["gcg"]``, the refusal's NLL maximised;
- ``"autodan"``: the AutoDAN-style rewriter on text (:func:`~sarjax.attacks.text.autodan.make_autodan`),
  judging its own candidates on every member.
"""

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from sarjax.attacks.text.autodan import AutoDANBatch, AutoDANOptions, make_autodan
from sarjax.attacks.text.beast import BEASTOptions, make_beast, seed_suffixes
from sarjax.attacks.text.gcg import GCGOptions, make_gcg
from sarjax.attacks.text.losses import refusal_loss, target_loss
from sarjax.attacks.text.model import llm_text_model
from sarjax.attacks.text.pool import allowed_for, pool_params
from sarjax.attacks.text.requests import TextRequests, slot_texts
from sarjax.attacks.text.retokenize import allowed_vocab, suffix_text_violations
from sarjax.models.llm.prompts import retokenizes
from sarjax.runtime import fingerprint as fingerprints
from sarjax.sar.llm_judging import Judge, PoolResponder
from sarjax.sar.llm_requests import behavior_batch, clean_prompt_ids

ATTACK_DEFAULTS: dict[str, dict[str, Any]] = {
    # the SAR paper Table 2 (joint BEAST): beam 10, suffix 30, temperature 1, 15,000 queries per call,
    # at most 4 calls
    "beast": {"suffix_len": 30, "beam_width": 10, "max_queries": 15_000, "calls": 4},
    # the SAR paper Table 3 (joint GCG): 20 steps per round, 64 candidates, top-256; suffix of 20
    # tokens (Zou et al. 2023); one call per round
    "gcg": {"suffix_len": 20, "num_steps": 20, "topk": 256, "num_candidates": 64, "max_queries": None, "calls": 1},
}
AUTODAN_DEFAULTS: dict[str, Any] = {"proposals": 4, "anchors": 2, "num_steps": 5, "max_queries": None, "calls": 1}


@dataclasses.dataclass(frozen=True)
class PoolRequest:
    """What :func:`sarjax.sar.pool_llm_sar` hands an attack's pool adapter.

    Attributes:
      pool: the target :class:`~sarjax.models.llm.pool.LLMPool` (every stack with a tokenizer).
      behaviors: ``[B]`` requests.
      respond: the pool's id-level responder (:class:`~sarjax.sar.llm_judging.PoolResponder`).
      judge: ``judge(behaviors, generations) -> [N] bool``.
      mixed: whether the stacks use several tokenizers.
      settings: the caller's overrides of the attack's defaults (a copy; the adapter may change it).
      target, refusal: the scored responses of BEAST and GCG.
      system: optional system message of the chat template.
      max_new_tokens: greedy response length judged.
      attacker: AutoDAN's attacker (an LLM pool, a proposer, or None).
      seed_fn, seed_tokens: BEAST's warm start (``seed_fn(request) -> suffix texts``, or None).
    """

    pool: Any
    behaviors: list[str]
    respond: PoolResponder
    judge: Judge
    mixed: bool
    settings: dict[str, Any]
    target: str
    refusal: str
    system: str | None
    max_new_tokens: int
    attacker: Any = None
    seed_fn: Callable[[str], Sequence[str]] | None = None
    seed_tokens: int = 20


class PoolAttack(NamedTuple):
    """What a pool adapter returns: the arguments of :func:`sarjax.sar.run_llm_sar` and what the
    run's fingerprint records.

    Attributes:
      attack: ``attack(params, batch, None, *, key, mask, **attack_kwargs)``.
      params: passed to ``attack`` untouched.
      batch: the requests as the attack reads them.
      attack_kwargs: extra keyword arguments of every call.
      calls: attack calls per round and oracle.
      settings: the attack's settings as the fingerprint records them.
      response: the scored response the fingerprint records (None: none).
      self_judged: the result's ``success`` is the coverage (see :func:`sarjax.sar.make_llm_oracles`).
      clean_prompts: the unmodified requests as sent (None: the batch's own).
    """

    attack: Callable
    params: Any
    batch: Any
    attack_kwargs: dict[str, Any]
    calls: int
    settings: dict[str, Any]
    response: str | None
    self_judged: bool = False
    clean_prompts: tuple[Any, Any] | None = None


PoolAdapter = Callable[[PoolRequest], PoolAttack]


def _suffix_settings(name: str, req: PoolRequest) -> tuple[dict[str, Any], int, Any]:
    """``(settings, calls, max_queries)`` of a suffix attack: its defaults with the caller's
    overrides, ``calls`` and ``max_queries`` taken out."""
    st = {**ATTACK_DEFAULTS[name], **req.settings}
    unknown = set(st) - set(ATTACK_DEFAULTS[name]) - {"candidates", "temperature"}
    if unknown:
        raise ValueError(f"unknown {name} settings {sorted(unknown)}; known: {sorted(ATTACK_DEFAULTS[name])}")
    calls = int(st.pop("calls"))
    mq = st.pop("max_queries")
    if req.seed_fn is not None and name != "beast":
        raise ValueError(f"seed_fn is BEAST's warm start, got attack={name!r}")
    return st, calls, mq


def _one_tokenizer(req: PoolRequest) -> tuple[Any, Any, Any, int, np.ndarray]:
    """``(params, model, tokenizer, vocab, allowed)`` of a pool whose stacks share one tokenizer."""
    pool = req.pool
    cfgs = tuple(s.cfg for s in pool.stacks)
    params = pool.stacks[0].params if len(cfgs) == 1 else tuple(s.params for s in pool.stacks)
    model = llm_text_model(cfgs[0] if len(cfgs) == 1 else cfgs)
    tok = pool.stacks[0].tokenizer
    vocab = cfgs[0].vocab_size
    return params, model, tok, vocab, allowed_vocab(tok, vocab)


def _one_tokenizer_kwargs(req: PoolRequest, tok: Any, allowed: np.ndarray, mq: Any) -> dict[str, Any]:
    # the rendered text around each suffix slot: the audited entry re-tokenizes the whole
    # prompt (the ids that are sent) and the adapter records and judges those
    return {"allowed": allowed, "max_queries": mq, "texts": slot_texts(tok, req.behaviors, system=req.system)}


def _mixed_requests(req: PoolRequest) -> TextRequests:
    """The requests of a pool attack across tokenizers (system message, chat template or none)."""
    templates = {getattr(s.tokenizer, "chat_template", None) is not None for s in req.pool.stacks}
    if len(templates) != 1:
        raise ValueError("pool_llm_sar: some stacks' tokenizers have a chat template and others none")
    return TextRequests(tuple(req.behaviors), req.system, templates.pop())


def _seed_record(seed_tokens: int, ids: Any, lens: Any) -> dict[str, Any]:
    return {"tokens": int(seed_tokens), "digest": fingerprints.array_digest(ids, lens)}


def beast_pool_attack(req: PoolRequest) -> PoolAttack:
    """Joint BEAST on the pool (one tokenizer: :func:`~sarjax.attacks.text.beast.make_beast`; several:
    :func:`~sarjax.attacks.text.beast.make_beast`, the first stack's tokenizer
    proposing, called with the stacks' params (:func:`~sarjax.attacks.text.pool.pool_params`) and the
    requests as :class:`~sarjax.attacks.text.requests.TextRequests`)."""
    st, calls, mq = _suffix_settings("beast", req)
    tok = req.pool.stacks[0].tokenizer
    if req.mixed:
        requests = _mixed_requests(req)
        call: dict[str, Any] = {}
        fn = make_beast(req.pool, **st, options=BEASTOptions(target=req.target))
        if req.seed_fn is not None:
            ids, lens = seed_suffixes(req.seed_fn, list(req.behaviors), tok, fn.suffix_len, req.seed_tokens)
            kw_dec = dict(skip_special_tokens=False, clean_up_tokenization_spaces=False)
            texts = [
                tok.decode(ids[b, fn.suffix_len - n :].tolist(), **kw_dec) if n else "" for b, n in enumerate(lens)
            ]
            # a seed that another tokenizer cannot reproduce (or that does not re-tokenize) is dropped:
            # that request's beams start empty, and the report lists it
            dropped = [b for b, x in enumerate(texts) if x and fn.seed_violations(x)]
            call["suffix_init"] = ["" if b in dropped else x for b, x in enumerate(texts)]
            st["seeds"] = {**_seed_record(req.seed_tokens, ids, lens), "dropped": dropped}
        call["max_queries"] = mq
        clean = clean_prompt_ids(tok, req.behaviors, req.system, chat_template=requests.chat_template)
        settings = {**st, "calls": calls, "max_queries": mq}
        return PoolAttack(fn, pool_params(req.pool), requests, call, calls, settings, req.target, clean_prompts=clean)
    params, model, tok, vocab, allowed = _one_tokenizer(req)
    fn = make_beast(model, vocab_size=vocab, loss=target_loss, tokenizer=tok, **st)
    batch = behavior_batch(tok, req.behaviors, req.target, req.system)
    kw = _one_tokenizer_kwargs(req, tok, allowed, mq)
    clean = clean_prompt_ids(tok, req.behaviors, req.system)
    if req.seed_fn is not None:
        kw["suffix_init"], kw["init_len"] = seed_suffixes(
            req.seed_fn, list(req.behaviors), tok, st["suffix_len"], req.seed_tokens
        )
        st["seeds"] = _seed_record(req.seed_tokens, kw["suffix_init"], kw["init_len"])
    settings = {**st, "calls": calls, "max_queries": mq}
    return PoolAttack(fn, params, batch, kw, calls, settings, req.target, clean_prompts=clean)


def common_start_text(pool: Any, words: int, slots: int) -> str:
    """GCG's start (``"!"`` x ``words``, Zou et al. 2023) when every stack's tokenizer reproduces it;
    else the first allowed token of the first stack's vocabulary whose text, repeated, does."""
    toks = [s.tokenizer for s in pool.stacks]
    als = [allowed_for(s.tokenizer, s.cfg.vocab_size, True) for s in pool.stacks]

    def ok(text: str) -> bool:
        return not suffix_text_violations(text, toks, als, [slots] * len(toks))[1]

    if ok(text := " ".join(["!"] * words)):
        return text
    for i in np.flatnonzero(als[0])[:5000]:
        piece = toks[0].decode([int(i)]).strip()
        if piece and ok(text := " ".join([piece] * words)):
            return text
    raise ValueError(
        "pool_llm_sar: no start suffix for joint GCG that every tokenizer reproduces ('!' and the first 5,000 "
        "allowed tokens of the first stack fail)"
    )


def gcg_pool_attack(req: PoolRequest) -> PoolAttack:
    """Joint GCG on the pool (one tokenizer: :func:`~sarjax.attacks.text.gcg.make_gcg`, starting from
    ``"!"`` when the vocabulary has it; several: :func:`~sarjax.attacks.text.gcg.make_gcg`
    from :func:`common_start_text`, called with the stacks' params
    (:func:`~sarjax.attacks.text.pool.pool_params`) and the requests as
    :class:`~sarjax.attacks.text.requests.TextRequests`)."""
    st, calls, mq = _suffix_settings("gcg", req)
    if req.mixed:
        tok = req.pool.stacks[0].tokenizer
        requests = _mixed_requests(req)
        call: dict[str, Any] = {}
        fn = make_gcg(req.pool, **st, options=GCGOptions(target=req.refusal))
        fn.init_text = common_start_text(req.pool, fn.suffix_len, fn.slots)
        st["init_text"] = fn.init_text
        call["max_queries"] = mq
        clean = clean_prompt_ids(tok, req.behaviors, req.system, chat_template=requests.chat_template)
        settings = {**st, "calls": calls, "max_queries": mq}
        return PoolAttack(fn, pool_params(req.pool), requests, call, calls, settings, req.refusal, clean_prompts=clean)
    params, model, tok, vocab, allowed = _one_tokenizer(req)
    init = _gcg_start_id(tok, allowed, int(st["suffix_len"]))
    fn = make_gcg(model, vocab_size=vocab, loss=refusal_loss, tokenizer=tok, **st, options=GCGOptions(init_id=init))
    batch = behavior_batch(tok, req.behaviors, req.refusal, req.system)
    kw = _one_tokenizer_kwargs(req, tok, allowed, mq)
    clean = clean_prompt_ids(tok, req.behaviors, req.system)
    settings = {**st, "calls": calls, "max_queries": mq}
    return PoolAttack(fn, params, batch, kw, calls, settings, req.refusal, clean_prompts=clean)


def _gcg_start_id(tok: Any, allowed: np.ndarray, suffix_len: int) -> int | None:
    """The start token of GCG on one tokenizer: ``"!"`` (GCG starts from ``"!"`` x 20, Zou et al.
    2023), else the first allowed id (in id order), whose ``suffix_len`` repetitions re-tokenize to
    themselves (the search scores the text that is sent and drops a suffix that does not; e.g.
    byte-level BPE merges ``"!!"``); None when no id of the first 4096 allowed ones does (the
    attack then raises, naming the start)."""
    bang = tok("!", add_special_tokens=False)["input_ids"]
    first = [int(bang[0])] if len(bang) == 1 and allowed[bang[0]] else []
    for i in first + [int(j) for j in np.flatnonzero(allowed)[:4096]]:
        if retokenizes(tok, [i] * suffix_len):
            return i
    return None


def autodan_pool_attack(req: PoolRequest) -> PoolAttack:
    """The AutoDAN-style rewriter (:func:`~sarjax.attacks.text.autodan.make_autodan`) on the pool.

    With one tokenizer the members answer through the pool's id-level responder; with several,
    the responder is not used and every stack renders the rewrite in its own tokenizer and chat
    template and decodes ``max_new_tokens`` greedy tokens (:class:`~sarjax.attacks.text.autodan.PoolEvaluator`
    with ``respond=None``); the judge reads text: the text path of
    :func:`~sarjax.attacks.text.autodan.make_autodan` (``AutoDANOptions(path="text")``). Either way
    a candidate's coverage is the attack's own judgement of its best rewrite
    (:attr:`~sarjax.attacks.text.autodan.AutoDANResult.success`, every member: ``self_judged``) and
    the clean judgement is :meth:`~sarjax.attacks.text.autodan.AutoDANBatch.judge_clean`.
    ``req.attacker``: an LLM pool (its first member rewrites; None: the target pool's first
    member) or a proposer ``propose(anchors, key, sample_ids) -> texts``. ``req.seed_fn`` is not used.
    """
    st = {**AUTODAN_DEFAULTS, **req.settings}
    unknown = set(st) - set(AUTODAN_DEFAULTS) - {"max_new_tokens"}
    if unknown:
        raise ValueError(f"unknown autodan settings {sorted(unknown)}")
    opts = AutoDANOptions(
        path="text", respond=None if req.mixed else req.respond, requests=tuple(req.behaviors), system=req.system
    )
    fn = make_autodan(
        req.pool, req.judge, attacker=req.attacker, proposals=st["proposals"], anchors=st["anchors"],
        num_steps=st["num_steps"], max_new_tokens=st.get("max_new_tokens", 48), response_tokens=req.max_new_tokens,
        options=opts,
    )  # fmt: skip
    batch = AutoDANBatch(req.behaviors, fn.evaluate.encode, fn.evaluate)
    return PoolAttack(fn, None, batch, {"max_queries": st["max_queries"]}, int(st["calls"]), st, None, self_judged=True)


# the one table pool_llm_sar reads: attack name -> its pool adapter
POOL_ADAPTERS: dict[str, PoolAdapter] = {
    "beast": beast_pool_attack,
    "gcg": gcg_pool_attack,
    "autodan": autodan_pool_attack,
}

__all__ = [
    "ATTACK_DEFAULTS",
    "AUTODAN_DEFAULTS",
    "POOL_ADAPTERS",
    "PoolAdapter",
    "PoolAttack",
    "PoolRequest",
    "autodan_pool_attack",
    "beast_pool_attack",
    "common_start_text",
    "gcg_pool_attack",
]
