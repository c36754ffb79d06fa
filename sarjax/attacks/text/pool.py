"""Host-side helpers of the pool attacks across tokenizers (:mod:`~sarjax.attacks.text.gcg_joint`,
:mod:`~sarjax.attacks.text.beast_cross`): the checked call, each stack's rendering of the requests,
the batched scoring of candidate suffixes, the default allowed vocabulary and the prompts as they
are sent.
"""

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, NamedTuple, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.attacks import queries as Q
from sarjax.attacks.core.validate import check_sample_ids
from sarjax.attacks.text import losses as TL
from sarjax.attacks.text import model as TM
from sarjax.attacks.text import requests as TR
from sarjax.attacks.text import retokenize as TK
from sarjax.models.llm.pool import LLMPool, left_pad

_O = TypeVar("_O")


@functools.partial(jax.jit, static_argnames=("cfg", "loss"))
def score_texts(params, batch: TR.TextBatch, cands, cmask, *, cfg, loss):
    """Every member of a stack on ``N`` candidate suffixes per request: ``[B, M_s, N]``."""
    model = TM.llm_text_model(cfg)
    return jax.vmap(lambda r, c, cm: TM.member_losses(model, loss, params, r, c, cm))(batch, cands, cmask)


@functools.partial(jax.jit, static_argnames=("cfg", "loss"))
def score_prompts(params, ids, mask, target, target_mask, *, cfg, loss):
    """Every member of a stack on ``N`` whole prompts per request: ``[B, M_s, N]``.

    Args:
      ids, mask: ``[B, N, W]`` left-padded prompts (e.g. the ids of the text that is sent).
      target, target_mask: ``[B, Tt]`` right-padded.
    """
    model = TM.llm_text_model(cfg)
    return jax.vmap(lambda i, m, t, tm: TM.prompt_losses(model, loss, params, TR.TextBatch(i, m, i, m, t, tm), i, m))(
        ids, mask, target, target_mask
    )


def score_sent(
    stack, req: "PoolRequests", texts: Sequence[Sequence[str | None]], n: int, loss, slots: int
) -> np.ndarray:
    """Every member of a stack on ``n`` candidate suffix texts per request, each scored on the ids of
    the whole prompt TEXT that is sent (``before text + suffix + after text`` tokenized at once,
    :func:`~sarjax.attacks.text.retokenize.sent_ids`; host side).

    Args:
      stack: the :class:`~sarjax.models.llm.pool.LLMStack`.
      req: its :class:`PoolRequests`.
      texts: ``texts[b][j]``, the suffix text of candidate ``j`` of request ``b`` (None: a hole,
        scored on the request without a suffix; the caller ignores it).
      n: candidates per request.
      loss: the per-member loss.
      slots: the suffix slots: prompts are padded to the blocks' width ``Pb + slots + Pa`` (one
        compile per call shape), wider in multiples of 8 only when a prompt needs it.

    Returns:
      ``[B, M_s, n]`` float64.
    """
    tok, b = stack.tokenizer, req.batch
    bsz = len(req.before)
    rows = [[TK.sent_ids(tok, req.before[i], texts[i][j] or "", req.after[i]) for j in range(n)] for i in range(bsz)]
    width = max(b.before.shape[1] + slots + b.after.shape[1], _round_up(max(len(q) for r in rows for q in r)))
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids = np.full((bsz, n, width), pad, np.int32)
    mask = np.zeros((bsz, n, width), np.int32)
    for i in range(bsz):
        ids[i], mask[i] = _pad_rows(rows[i], True, pad, width)
    out = score_prompts(
        stack.params, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(b.target, jnp.int32),
        jnp.asarray(b.target_mask, jnp.int32), cfg=stack.cfg, loss=loss,
    )  # fmt: skip
    return np.asarray(out, np.float64)


def start_text(tokenizers: Sequence[Any], allowed: Sequence[Any], slots: Sequence[int], words: int) -> str:
    """GCG's start suffix for a pool (host side): ``"!"`` repeated ``words`` times with spaces (Zou
    et al. 2023) when every tokenizer reproduces it within its allowed vocabulary and slots
    (:func:`~sarjax.attacks.text.retokenize.suffix_text_violations`); else the text of the first allowed
    id of the first tokenizer (in id order; its decoded text stripped of spaces) repeated the same
    way, the first that every tokenizer reproduces (e.g. SentencePiece-style tokenizers without
    ``"▁!"``, where ``"!"`` is unknown).

    Raises:
      ValueError: no allowed token of the first tokenizer gives such a text.
    """

    def ok(text: str) -> bool:
        return not TK.suffix_text_violations(text, tokenizers, allowed, slots)[1]

    if ok(text := " ".join(["!"] * words)):
        return text
    tried: set = set()
    for i in np.flatnonzero(np.asarray(allowed[0], bool)):
        piece = tokenizers[0].decode([int(i)], skip_special_tokens=False, clean_up_tokenization_spaces=False).strip()
        if piece and piece not in tried:
            tried.add(piece)
            if ok(text := " ".join([piece] * words)):
                return text
    raise ValueError(
        f"no start suffix of {words} repeated words that every tokenizer reproduces: '!' and every allowed token of "
        "the first tokenizer fail (pass suffix_init)"
    )


_ALLOWED_CACHE: dict = {}


def allowed_for(tok, vocab_size: int, ascii_only: bool) -> np.ndarray:
    key = (id(tok), vocab_size, ascii_only)
    if key not in _ALLOWED_CACHE:
        _ALLOWED_CACHE[key] = (tok, TK.allowed_vocab(tok, vocab_size, ascii_only))
    return _ALLOWED_CACHE[key][1]


def _round_up(n: int, k: int = 8) -> int:
    return max(k, -(-n // k) * k)


def _pad_rows(seqs, left: bool, pad_id: int, length: int):
    ids = np.full((len(seqs), length), pad_id, np.int32)
    mask = np.zeros((len(seqs), length), np.int32)
    for i, q in enumerate(seqs):
        if len(q):
            sl = slice(length - len(q), length) if left else slice(0, len(q))
            ids[i, sl] = q
            mask[i, sl] = 1
    return ids, mask


class PoolRequests(NamedTuple):
    """One stack's rendering of a pool attack's requests (host side).

    Attributes:
      batch: the :class:`~sarjax.attacks.text.requests.TextBatch` (blocks padded to multiples of 8).
      before, after: ``B`` texts around each suffix slot (:func:`~sarjax.attacks.text.requests.slot_texts`).
    """

    batch: TR.TextBatch
    before: list
    after: list


def pool_requests(name: str, stack, requests: TR.TextRequests, targets: Sequence[str]) -> PoolRequests:
    """Stack ``stack``'s :class:`PoolRequests`: the requests rendered by its tokenizer and chat
    template (:func:`~sarjax.attacks.text.requests.render_requests`), every block padded to a
    multiple of 8 tokens.

    Args:
      name: the caller, for messages.
      stack: the :class:`~sarjax.models.llm.pool.LLMStack`.
      requests: checked :class:`~sarjax.attacks.text.requests.TextRequests` (prompts, system
        message, chat template or none).
      targets: ``B`` target strings.

    Raises:
      ValueError: a block that encodes to no token; some requests with a template tail, others none.
    """
    tok = stack.tokenizer
    r = TR.render_requests(name, tok, requests, targets, where=f"stack {stack.names}: ")
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    b, bm = _pad_rows(r.before, True, pad, _round_up(max(map(len, r.before))))
    la = max(map(len, r.after))
    a, am = _pad_rows(r.after, True, pad, _round_up(la) if la else 0)
    t, tm = _pad_rows(r.target, False, pad, _round_up(max(map(len, r.target))))
    return PoolRequests(TR.TextBatch(b, bm, a, am, t, tm), r.before_text, r.after_text)


class PoolCall(NamedTuple):
    """The checked arguments of a pool attack's call (host side)."""

    stacks: tuple
    requests: TR.TextRequests
    mask: Any  # [B, M] float64 0/1
    targets: list
    sample_ids: Any  # [B] int64
    cap: Any  # [B] int64


def check_pool(name: str, pool: Any) -> LLMPool:
    """A pool attack's model, checked at the factory: an :class:`~sarjax.models.llm.pool.LLMPool`
    whose every stack has a tokenizer (the attack renders and exchanges text).

    Raises:
      TypeError: not an ``LLMPool``; a stack without a tokenizer.
    """
    if not isinstance(pool, LLMPool) or not pool.stacks:
        raise TypeError(f"{name}: the model must be an LLMPool with at least one stack, got {type(pool).__name__}")
    for st in pool.stacks:
        if st.tokenizer is None:
            raise TypeError(f"{name}: stack {st.names} has no tokenizer; the text exchange needs one")
    return pool


def check_suffix_factory(
    name: str, model: Any, options: _O | None, options_type: type[_O], sizes: list, vocab_size, tokenizer
) -> tuple[_O, int]:
    """The checks :func:`~sarjax.attacks.text.gcg.make_gcg` and
    :func:`~sarjax.attacks.text.beast.make_beast` share (host side): the options record, the model
    (an :class:`~sarjax.models.llm.pool.LLMPool` brings its own vocabulary and tokenizers; a
    :class:`~sarjax.attacks.text.model.TextModel` needs ``vocab_size``) and every size >= 1.

    Args:
      name: the factory, for messages.
      model: the factory's model.
      options: the factory's options (None: ``options_type()``).
      options_type: :class:`~sarjax.attacks.text.gcg.GCGOptions` or
        :class:`~sarjax.attacks.text.beast.BEASTOptions` (both with ``slots``).
      sizes: ``(name, value)`` pairs that must be >= 1, ``("suffix_len", Ls)`` among them.
      vocab_size, tokenizer: the factory's (a ``TextModel``'s only).

    Returns:
      ``(options, slots)``: ``slots`` is the suffix token slots of every stack of an ``LLMPool``
      (``options.slots``; None: ``2 * suffix_len``; a ``TextModel`` does not read it).

    Raises:
      TypeError: options of another type; a model that is neither; ``vocab_size`` / ``tokenizer``
        with an ``LLMPool``; a ``TextModel`` without ``vocab_size``; a stack without a tokenizer.
      ValueError: a size < 1.
    """
    opts = options_type() if options is None else options
    if not isinstance(opts, options_type):
        raise TypeError(f"{name}: options must be a {options_type.__name__}, got {type(opts).__name__}")
    given = getattr(opts, "slots", None)
    slots = int(given) if given is not None else 2 * int(dict(sizes)["suffix_len"])
    if isinstance(model, LLMPool):
        if vocab_size is not None or tokenizer is not None:
            raise TypeError(f"{name}: an LLMPool brings its own vocab_size and tokenizers; pass neither")
        check_pool(name, model)
        checks = list(sizes) + [("options.slots", slots)]
    else:
        if not isinstance(model, TM.TextModel):
            raise TypeError(f"{name}: the model must be an LLMPool or a TextModel, got {type(model).__name__}")
        if vocab_size is None:
            raise TypeError(f"{name}: a TextModel needs vocab_size (V, the embedding rows)")
        checks = [("vocab_size", vocab_size)] + list(sizes)
    for n, val in checks:
        if int(val) < 1:
            raise ValueError(f"{name}: {n} must be >= 1, got {val}")
    return opts, slots


def pool_params(pool: LLMPool) -> tuple:
    """The ``params`` of a pool attack's call: each stack's stacked parameter tree ``[M_s, ...]``, in
    ``pool.stacks`` order (e.g. ``make_gcg(pool)(pool_params(pool), requests, None, key=k)``)."""
    return tuple(st.params for st in pool.stacks)


def bind_params(name: str, pool: LLMPool, params: Any) -> LLMPool:
    """``pool`` with the call's ``params`` (one stacked tree per stack, :func:`pool_params`'s layout).

    Raises:
      TypeError: ``params`` is not one tree per stack (e.g. the ``LLMPool`` itself).
      ValueError: a stack's tree of another structure or leaf shapes than the factory's pool.
    """
    if isinstance(params, LLMPool) or not isinstance(params, Sequence) or len(params) != len(pool.stacks):
        raise TypeError(
            f"{name}: params must be one stacked parameter tree per stack ({len(pool.stacks)}, "
            f"pool_params(pool)), got {type(params).__name__}"
        )
    stacks = []
    for s, (st, p) in enumerate(zip(pool.stacks, params)):
        want, got = jax.tree.structure(st.params), jax.tree.structure(p)
        if want != got:
            raise ValueError(f"{name}: params of stack {s} have another tree structure than the pool's")
        for a, b in zip(jax.tree.leaves(st.params), jax.tree.leaves(p)):
            if tuple(np.shape(a)) != tuple(np.shape(b)):
                raise ValueError(
                    f"{name}: params of stack {s}: a leaf of shape {tuple(np.shape(b))}, the pool's is "
                    f"{tuple(np.shape(a))}"
                )
        stacks.append(dataclasses.replace(st, params=p))
    return LLMPool(tuple(stacks))


def pool_call(name, pool, inputs, ref, default_target, key, mask, sample_ids, max_queries) -> PoolCall:
    """Checks a pool attack's call: a key, a pool with a tokenizer per stack, the requests
    (:class:`~sarjax.attacks.text.requests.TextRequests`, or ``B >= 1`` request strings as
    shorthand; :func:`~sarjax.attacks.text.requests.text_requests`), ``ref`` = the targets (the
    refusal or target string, one or ``B``; None: ``default_target``), the member mask (bool or
    0/1), sample ids and caps.

    Raises:
      TypeError: no key, a stack without a tokenizer, requests that are not strings.
      ValueError: an empty batch, bad shapes or values (naming them).
    """
    if key is None:
        raise TypeError(f"{name}: key is required (a jax.random key); sarjax never defaults it")
    stacks: tuple[Any, ...] = tuple(getattr(pool, "stacks", ()))
    if not stacks:
        raise TypeError(
            f"{name}: params must be an LLMPool (the attack renders each stack's prompts), got {type(pool).__name__}"
        )
    for st in stacks:
        if st.tokenizer is None:
            raise TypeError(f"{name}: stack {st.names} has no tokenizer; the text exchange needs one")
    req = TR.text_requests(name, inputs)
    bsz = len(req.prompts)
    m_total = sum(st.size for st in stacks)
    mk = TR.check_member_mask(name, mask, bsz, m_total).astype(np.float64)
    targets = TR.request_targets(name, ref, default_target, bsz)
    sid = np.asarray(check_sample_ids(sample_ids, bsz)).astype(np.int64)
    cap = np.asarray(Q.normalize_cap(max_queries, bsz)).astype(np.int64)
    return PoolCall(stacks, req, mk, targets, sid, cap)


def sent_prompts(name, stacks, reqs: Sequence[PoolRequests], texts: Sequence[str], ids, masks, params_of, criterion):
    """Every stack's prompt of each suffix text as it is SENT (the whole text tokenized), every
    member judged on it, and the rows whose ids changed (host side).

    Args:
      reqs: each stack's :class:`PoolRequests`.
      texts: ``B`` suffix texts.
      ids, masks: each stack's searched prompts ``[B, T_s]``.
      params_of: ``params_of(s)``, stack ``s``'s stacked parameters.
      criterion: the success criterion.

    Returns:
      ``(sent, sent_mask, success [B, M], retokenized [B, M])``: one ``[B, S_s]`` array per stack
      (``S_s = T_s`` unless a row needs more).
    """
    sent, smask, success, retok = [], [], [], []
    for s, st in enumerate(stacks):
        tok, r = st.tokenizer, reqs[s]
        rows = [TK.sent_ids(tok, r.before[b], x, r.after[b]) for b, x in enumerate(texts)]
        t = ids[s].shape[1]
        n = max(map(len, rows))
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        si, sm = left_pad(rows, int(pad), t if n <= t else _round_up(n))
        changed = np.array([rows[b] != ids[s][b][masks[s][b] != 0].tolist() for b in range(len(texts))])
        ok = TL.judge_prompts(
            params_of(s), jnp.asarray(si), jnp.asarray(sm), jnp.asarray(r.batch.target, jnp.int32),
            jnp.asarray(r.batch.target_mask, jnp.int32), model=TM.llm_text_model(st.cfg), criterion=criterion,
        )  # fmt: skip
        sent.append(si)
        smask.append(sm)
        success.append(np.asarray(ok, bool))
        retok.append(np.repeat(changed[:, None], st.size, axis=1))
    return tuple(sent), tuple(smask), np.concatenate(success, axis=1), np.concatenate(retok, axis=1)


__all__ = [
    "allowed_for",
    "bind_params",
    "check_pool",
    "check_suffix_factory",
    "pool_params",
    "pool_call",
    "pool_requests",
    "PoolCall",
    "PoolRequests",
    "score_prompts",
    "score_sent",
    "score_texts",
    "start_text",
    "sent_prompts",
]
