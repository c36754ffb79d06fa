"""Shared pieces of the suffix attacks on LLM pools (joint GCG, joint BEAST).

A request is three token blocks around an adversarial suffix::

    before (left-padded) | suffix (right-aligned, Ls slots) | after (left-padded) | target

``before`` is everything up to the suffix (chat template head + request), ``after`` the template
tail (it may be empty: ``Pa = 0``) and ``target`` the response whose NLL is scored. Padding
slots are holes (mask 0): positions come from the mask (``cumsum(mask) - 1``), so a hole changes
nothing. The suffix is right-aligned in its ``Ls`` slots, so a suffix of ``n < Ls`` tokens
(BEAST while it grows) is ``Ls - n`` holes followed by the tokens.

The attacks see the models only through a :class:`TextModel` (three pure functions over a
parameter pytree holding every member), so any model with those functions can be attacked;
:func:`llm_text_model` builds one for stacked sarjax decoders. Members are selected by a
``mask [B, M]`` exactly like the image attacks. Queries: one forward (or one backward) pass of
one member on one candidate prompt is 1 query.

The text that is sent. The blocks are tokenized apart, so ``before | suffix | after`` need not be
the ids the tokenizer gives for the whole rendered prompt (SentencePiece-style tokenizers keep a
lone ``▁`` for the space before the suffix; byte-level BPE splits ``" really"`` as ``Ġ re ally``
instead of ``Ġreally``). With a tokenizer, the audited entry re-tokenizes the whole prompt text
(``before text + decode(suffix) + after text``) and judges every member again on those ids
(:attr:`TextAttackResult.sent`); a break that does not survive is not reported as a success,
and :attr:`TextAttackResult.retokenized` lists the rows whose ids changed. A search may also score
what is sent: :class:`Retokenizer` gives a compiled step the sent ids of its candidates (with GCG's
re-tokenization filter) through a host callback, and :func:`prompt_losses` scores whole prompts
(joint BEAST with a tokenizer; the pool attacks score each member's whole-text ids on the host).
"""

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.attacks import queries as Q
from sarjax.attacks.core.entry import Entry, host
from sarjax.attacks.core.validate import check_mask, check_sample_ids
from sarjax.models.llm import decoder, nll_batch, scoring
from sarjax.models.llm.pool import left_pad
from sarjax.models.llm.prompts import encode_text, retokenizes, split_chat_template


class TextBatch(NamedTuple):
    """B requests, padded (build with :func:`text_batch`).

    Attributes:
      before: ``[B, Pb]`` int32 ids before the suffix, left-padded (>= 1 real token per row).
      before_mask: ``[B, Pb]`` 0/1.
      after: ``[B, Pa]`` int32 ids between the suffix and the target, left-padded (``Pa`` may be
        0; when ``Pa > 0`` every row has >= 1 real token).
      after_mask: ``[B, Pa]`` 0/1.
      target: ``[B, Tt]`` int32 target (or refusal) ids, right-padded (>= 1 real token).
      target_mask: ``[B, Tt]`` 0/1.
    """

    before: Any
    before_mask: Any
    after: Any
    after_mask: Any
    target: Any
    target_mask: Any


class TextProblem(NamedTuple):
    """One call of a suffix attack, normalised (every field traced, shapes static).

    Attributes:
      batch: the :class:`TextBatch`.
      mask: ``[B, M]`` float32, the members the objective covers (the uncovered ones).
      allowed: ``[V]`` bool, the token ids a suffix may use.
      cap: ``[B]`` int32 query cap (``queries.NO_CAP``: none).
      key: PRNG key of the call (required).
      sample_ids: ``[B]`` int32; sample ``b`` draws from ``fold_in(key, sample_ids[b])``.
      suffix_init: ``[B, Ls]`` int32 start suffix, right-aligned (slots before the last
        ``init_len`` are ignored).
      init_len: ``[B]`` int32 real tokens of the start suffix (GCG: ``Ls``; BEAST: 0 unless seeded).
      texts: optional :class:`SlotTexts`, the rendered text around each request's suffix slot as
        UTF-8 bytes (read by a search that scores the ids of the text that is sent,
        :class:`Retokenizer`); None: each block's ids decoded on the host.
    """

    batch: TextBatch
    mask: Any
    allowed: Any
    cap: Any
    key: Any
    sample_ids: Any
    suffix_init: Any
    init_len: Any
    texts: Any = None


class SlotTexts(NamedTuple):
    """The text before and after each request's suffix slot, as traced UTF-8 bytes (build with
    :func:`slot_text_bytes`).

    Attributes:
      before: ``[B, Lb]`` uint8, zero-padded on the right; before_len: ``[B]`` int32 bytes.
      after: ``[B, La]`` uint8 (``La >= 1``); after_len: ``[B]`` int32 bytes.
    """

    before: Any
    before_len: Any
    after: Any
    after_len: Any


class TextModel(NamedTuple):
    """A pool seen by the text attacks: pure functions of a parameter pytree holding ALL members.

    Attributes:
      nll: ``nll(params, ids [T], mask [T], target [Tt], target_mask [Tt]) -> [M, Tt]`` per-token
        NLL of the target after one prompt (0 at padded target tokens), every member.
      nll_one_hot: same with the prompt given as ``one_hot [T, V]`` float32 (differentiable).
      logits: ``logits(params, ids [T], mask [T]) -> [M, T, V]`` next-token logits.
      prefill: optional ``prefill(params, ids [P], mask [P]) -> cache``: every member's keys and
        values of a shared prompt prefix (None: the model has no cache; scoring runs full prompts).
      nll_cached: optional ``nll_cached(params, cache, ids [T], mask [T], target, target_mask) ->
        [M, Tt]``: :attr:`nll` of ``prefix | ids`` with the prefix read from ``cache`` (equal to
        :attr:`nll` on the concatenation up to float rounding).
      nll_one_hot_cached: optional, :attr:`nll_cached` with ``ids`` given as ``one_hot [T, V]``
        float32 (differentiable; GCG's token gradient without re-running the prefix).
      nll_cached_many: optional, :attr:`nll_cached` of ``N`` prompts at once: ``(params, cache,
        ids [N, T], mask [N, T], target, target_mask) -> [M, N, Tt]`` (None: ``nll_cached`` is
        vmapped over the prompts).
      hits: optional ``hits(params, ids [T], mask [T], target [Tt], target_mask [Tt]) -> [M, Tt]``
        bool: each member's greedy (argmax) next token equals the target token under teacher
        forcing (None: read off :attr:`logits` of ``ids | target``).
    """

    nll: Callable
    nll_one_hot: Callable
    logits: Callable
    prefill: Callable | None = None
    nll_cached: Callable | None = None
    nll_one_hot_cached: Callable | None = None
    nll_cached_many: Callable | None = None
    hits: Callable | None = None


class TextAttackResult(NamedTuple):
    """Best-so-far suffix of a call (member axis ``[B, M]``).

    Attributes:
      x_adv: ``[B, T]`` int32, the searched prompt ``before | suffix | after`` (``T = Pb + Ls +
        Pa``; holes where :attr:`mask` is 0): the ids the attack scored.
      success: ``[B, M]`` bool, member ``m`` is broken on request ``b`` by the attack's criterion
        (``criterion`` of the factory), judged on the ids that are SENT (:attr:`sent`):
        ``"target"``: its greedy (argmax) token reproduces every target token under teacher
        forcing (its greedy response starts with the target); ``"refusal"``: it does not (the
        greedy response is not the refusal). Every member, covered or not.
      queries: ``[B, M]`` int32 queries spent on member ``m`` for request ``b`` (one forward or
        backward pass of one member on one candidate prompt = 1; uncovered members 0).
      mask: ``[B, T]`` int32, the real slots of :attr:`x_adv`.
      suffix: ``[B, Ls]`` int32, the best suffix, right-aligned (holes 0).
      suffix_mask: ``[B, Ls]`` int32, its real slots (a right-aligned block).
      loss: ``[B]`` float32, the joint loss of the best suffix (lower is better for the attacker).
      member_loss: ``[B, M]`` float32, each member's loss on :attr:`x_adv` (all members).
      sent: ``[B, S]`` int32, left-padded: the ids of the whole prompt as it is sent. With the
        factory's tokenizer, the audited entry's re-tokenization of the prompt text (``before text
        + decode(suffix) + after text``; ``S = T`` unless a row needs more); otherwise (no
        tokenizer, or :meth:`TextAttackFn.jit`) :attr:`x_adv` without its holes (``S = T``).
      sent_mask: ``[B, S]`` int32.
      retokenized: ``[B, M]`` bool, member ``m``'s :attr:`sent` ids differ from its searched
        :attr:`x_adv` on request ``b`` (the members share one tokenizer, so a row is all True or
        all False; the pool attacks across tokenizers have the same field per member); those
        rows' :attr:`success` was judged again on :attr:`sent`. All False where nothing was
        re-tokenized (no tokenizer, or the jit entry).
    """

    x_adv: Any
    success: Any
    queries: Any
    mask: Any
    suffix: Any
    suffix_mask: Any
    loss: Any
    member_loss: Any
    sent: Any
    sent_mask: Any
    retokenized: Any


# ---------------------------------------------------------------------------------------------
# losses


def target_loss(nll, target_mask):
    """Mean per-token NLL of the target (minimised: BEAST's objective, Sadasivan et al. 2024;
    the SAR paper "joint BEAST").

    Args:
      nll: ``[..., Tt]`` per-token NLL; target_mask: ``[Tt]`` 0/1.

    Returns:
      ``[...]`` float32.
    """
    w = target_mask.astype(jnp.float32)
    return jnp.sum(nll * w, axis=-1) / jnp.maximum(jnp.sum(w), 1.0)


def refusal_loss(nll, target_mask):
    """Minus the mean per-token NLL of a fixed refusal (minimising it MAXIMISES the refusal's
    NLL: the SAR paper, "GCG maximizes the average negative log-likelihood for a fixed refusal").

    Args/returns as :func:`target_loss`.
    """
    return -target_loss(nll, target_mask)


def joint_loss(member_loss, mask):
    """The joint objective: the mean of the covered members' losses.

    Args:
      member_loss: ``[M, ...]``; mask: ``[M]`` 0/1 (covered = 1).

    Returns:
      ``[...]``: ``sum_m mask_m * loss_m / max(sum_m mask_m, 1)``.
    """
    w = mask.astype(jnp.float32).reshape(mask.shape + (1,) * (member_loss.ndim - 1))
    return jnp.sum(w * member_loss, axis=0) / jnp.maximum(jnp.sum(mask.astype(jnp.float32)), 1.0)


# ---------------------------------------------------------------------------------------------
# success: the attack's own criterion, read off the members' greedy tokens

CRITERIA = ("target", "refusal")


def default_criterion(loss: Callable) -> str:
    """The success criterion that goes with a loss: ``"refusal"`` for :func:`refusal_loss` (the
    attack pushes the members away from a fixed refusal), ``"target"`` otherwise (the attack pulls
    them towards the target)."""
    return "refusal" if loss is refusal_loss else "target"


def check_criterion(name: str, criterion: str | None, loss: Callable) -> str:
    """``criterion`` (None: :func:`default_criterion` of ``loss``), checked.

    Raises:
      ValueError: a criterion outside :data:`CRITERIA`.
    """
    c = default_criterion(loss) if criterion is None else criterion
    if c not in CRITERIA:
        raise ValueError(f"{name}: criterion must be one of {CRITERIA}, got {criterion!r}")
    return c


def target_hits(model: "TextModel", params, ids, mask, target, target_mask):
    """``[M, Tt]`` bool: each member's argmax next token equals the target token after ``ids``
    (teacher forcing); padded target tokens count as hits. Uses ``model.hits`` when the model has
    it, else ``model.logits`` of ``ids | target``."""
    tm = target_mask.astype(bool)
    if model.hits is not None:
        h = model.hits(params, ids, mask, target, target_mask)
    else:
        t, tt = ids.shape[0], target.shape[0]
        full = jnp.concatenate([ids, target]).astype(jnp.int32)
        fm = jnp.concatenate([mask, target_mask]).astype(jnp.int32)
        lg = jax.lax.dynamic_slice_in_dim(model.logits(params, full, fm), t - 1, tt, axis=1)  # [M, Tt, V]
        h = jnp.argmax(lg, axis=-1) == target[None]
    return h | ~tm[None]


def member_success(model: "TextModel", criterion: str, params, ids, mask, target, target_mask):
    """``[M]`` bool: every member judged by ``criterion`` on one prompt (see
    :attr:`TextAttackResult.success`)."""
    full = jnp.all(target_hits(model, params, ids, mask, target, target_mask), axis=-1)
    return full if criterion == "target" else ~full


@functools.partial(jax.jit, static_argnames=("model", "criterion"))
def judge_prompts(params, ids, mask, target, target_mask, *, model, criterion):
    """``[B, M]`` bool: :func:`member_success` of ``B`` prompts ``ids [B, S]`` (left-padded) with
    their targets ``[B, Tt]`` (host helper of the audited entries, compiled per shape)."""
    return jax.vmap(lambda i, m, t, tm: member_success(model, criterion, params, i, m, t, tm))(
        ids, mask, target, target_mask
    )


# ---------------------------------------------------------------------------------------------
# the pool adapter


@functools.cache
def llm_text_model(cfgs) -> TextModel:
    """A :class:`TextModel` over stacks of sarjax decoders.

    Args:
      cfgs: one :class:`~sarjax.models.llm.config.DecoderConfig` (then ``params`` is one stacked
        tree ``[M, ...]``) or a tuple of them (then ``params`` is a tuple of stacked trees, one per
        stack, members in stack order). Every stack must share one vocabulary (one tokenizer:
        cross-tokenizer pools are not supported yet).

    Returns:
      The model (cached per ``cfgs``, so equal configs give equal attacks and share kernels).

    Raises:
      ValueError: stacks with different vocabulary sizes.
    """
    single = not isinstance(cfgs, tuple)
    cs = (cfgs,) if single else cfgs
    if len({c.vocab_size for c in cs}) != 1:
        raise ValueError(f"llm_text_model: stacks must share one vocabulary, got sizes {[c.vocab_size for c in cs]}")

    def each(params, f):
        ps = (params,) if single else params
        return jnp.concatenate([jax.vmap(lambda p, c=c: f(p, c))(p) for p, c in zip(ps, cs, strict=True)], axis=0)

    def nll(params, ids, mask, target, target_mask):
        return each(params, lambda p, c: scoring.target_nll(p, c, ids, mask, target, target_mask))

    def nll_one_hot(params, one_hot, mask, target, target_mask):
        def f(p, c):
            x = one_hot.astype(p["embed"].dtype) @ p["embed"]
            return scoring.target_nll_from_embeds(p, c, x, mask, target, target_mask)

        return each(params, f)

    def logits(params, ids, mask):
        return each(params, lambda p, c: decoder.logits(p, c, ids, mask))

    def prefill(params, ids, mask):
        ps = (params,) if single else params
        return tuple(
            jax.vmap(lambda p, c=c: decoder.prefill(p, c, ids, mask)[1])(p) for p, c in zip(ps, cs, strict=True)
        )

    def nll_cached(params, cache, ids, mask, target, target_mask):
        ps = (params,) if single else params
        out = [
            jax.vmap(lambda p, kv, c=c: scoring.target_nll(p, c, ids, mask, target, target_mask, (kv,)))(p, kv)
            for p, kv, c in zip(ps, cache, cs, strict=True)
        ]
        return jnp.concatenate(out, axis=0)

    def nll_one_hot_cached(params, cache, one_hot, mask, target, target_mask):
        ps = (params,) if single else params

        def f(p, kv, c):
            x = one_hot.astype(p["embed"].dtype) @ p["embed"]
            return scoring.target_nll_from_embeds(p, c, x, mask, target, target_mask, (kv,))

        out = [jax.vmap(lambda p, kv, c=c: f(p, kv, c))(p, kv) for p, kv, c in zip(ps, cache, cs, strict=True)]
        return jnp.concatenate(out, axis=0)

    def nll_cached_many(params, cache, ids, mask, target, target_mask):
        ps = (params,) if single else params
        out = []
        for p, kv, c in zip(ps, cache, cs, strict=True):
            if nll_batch.batched_llama_ok(c):
                out.append(nll_batch.stack_nll_many(p, kv, ids, mask, target, target_mask, cfg=c))
            else:
                one = lambda p, kv, i, m, c=c: scoring.target_nll(p, c, i, m, target, target_mask, (kv,))  # noqa: E731
                out.append(jax.vmap(lambda p, kv, one=one: jax.vmap(lambda i, m: one(p, kv, i, m))(ids, mask))(p, kv))
        return jnp.concatenate(out, axis=0)

    def hits(params, ids, mask, target, target_mask):
        return each(params, lambda p, c: _decoder_hits(p, c, ids, mask, target, target_mask))

    return TextModel(nll, nll_one_hot, logits, prefill, nll_cached, nll_one_hot_cached, nll_cached_many, hits)


def _decoder_hits(p, cfg, ids, mask, target, target_mask):
    """``[Tt]`` bool: the argmax next token equals the target token after ``ids`` (one member;
    the logits of :func:`~sarjax.models.llm.scoring.target_nll` at the target positions only)."""
    t, tt = ids.shape[0], target.shape[0]
    x = decoder.embed_tokens(p, jnp.concatenate([ids, target]).astype(jnp.int32))
    fm = jnp.concatenate([mask, target_mask]).astype(jnp.int32)
    h, _ = decoder.hidden_states(p, cfg, x, fm, decoder.positions_from_mask(fm), (), return_kv=False)
    lg = decoder.lm_head(p, cfg, jax.lax.dynamic_slice_in_dim(h, t - 1, tt, axis=0))
    return jnp.argmax(lg, axis=-1) == target


# ---------------------------------------------------------------------------------------------
# prompt assembly and scoring (one request; vmap over B outside)


def row(batch: TextBatch, b) -> TextBatch:
    """Request ``b`` of a batch (every field indexed on its leading axis)."""
    return TextBatch(*(a[b] for a in batch))


def suffix_mask(ls: int, n):
    """``[Ls]`` int32 mask of a right-aligned suffix of ``n`` tokens."""
    return (jnp.arange(ls) >= ls - n).astype(jnp.int32)


def assemble(r: TextBatch, suffix, smask):
    """``before | suffix | after`` of one request: ids ``[T]``, mask ``[T]`` int32."""
    ids = jnp.concatenate([r.before, suffix, r.after]).astype(jnp.int32)
    mask = jnp.concatenate([r.before_mask, smask, r.after_mask]).astype(jnp.int32)
    return ids, mask


def member_losses(model: TextModel, loss_fn: Callable, params, r: TextBatch, suffixes, smasks):
    """Every member's loss on N candidate suffixes of one request.

    Args:
      suffixes: ``[N, Ls]`` int32; smasks: ``[N, Ls]`` (or ``[Ls]``, shared) 0/1.

    Returns:
      ``[M, N]`` float32 (``loss_fn`` of each member's per-token NLL).
    """
    smasks = jnp.broadcast_to(smasks, suffixes.shape)

    def one(s, sm):
        ids, mask = assemble(r, s, sm)
        return loss_fn(model.nll(params, ids, mask, r.target, r.target_mask), r.target_mask)

    return jax.vmap(one, out_axes=1)(suffixes, smasks)


def has_prefix_cache(model: TextModel) -> bool:
    """Whether ``model`` scores from a KV cache of the ``before`` block (``prefill`` and ``nll_cached``)."""
    return model.prefill is not None and model.nll_cached is not None


def prefix_cache(model: TextModel, params, r: TextBatch):
    """Every member's KV cache of request ``r``'s ``before`` block (``model.prefill``), or None
    when the model has no cache."""
    prefill = model.prefill
    return prefill(params, r.before, r.before_mask) if prefill is not None and has_prefix_cache(model) else None


def member_losses_cached(model: TextModel, loss_fn: Callable, params, r: TextBatch, suffixes, smasks, cache=None):
    """:func:`member_losses` with the request's ``before`` block run once per member and read from
    a KV cache by every candidate (``model.prefill`` / ``model.nll_cached``); falls back to
    :func:`member_losses` when the model has no cache. Equal up to float rounding.

    Args:
      cache: optional, :func:`prefix_cache` of ``r`` computed by the caller (e.g. once per attack
        call); None: computed here.

    Returns:
      ``[M, N]`` float32.
    """
    nll_cached = model.nll_cached
    if not has_prefix_cache(model) or nll_cached is None:
        return member_losses(model, loss_fn, params, r, suffixes, smasks)
    smasks = jnp.broadcast_to(smasks, suffixes.shape)
    if cache is None:
        cache = prefix_cache(model, params, r)
    if model.nll_cached_many is not None:
        n = suffixes.shape[0]
        ids = jnp.concatenate([suffixes, jnp.broadcast_to(r.after, (n,) + r.after.shape)], 1).astype(jnp.int32)
        mask = jnp.concatenate([smasks, jnp.broadcast_to(r.after_mask, (n,) + r.after.shape)], 1).astype(jnp.int32)
        return loss_fn(model.nll_cached_many(params, cache, ids, mask, r.target, r.target_mask), r.target_mask)

    def one(s, sm):
        ids = jnp.concatenate([s, r.after]).astype(jnp.int32)
        mask = jnp.concatenate([sm, r.after_mask]).astype(jnp.int32)
        return loss_fn(nll_cached(params, cache, ids, mask, r.target, r.target_mask), r.target_mask)

    return jax.vmap(one, out_axes=1)(suffixes, smasks)


_MEMBER_COUNTS: dict = {}


def member_count(model: TextModel, params, batch: TextBatch) -> int:
    """``M``: the members ``model`` returns (read by tracing only; remembered per model and
    parameter shapes, so repeated calls do not trace again)."""
    leaves, tree = jax.tree.flatten(params)
    try:
        key = (model, tree, tuple((np.shape(x), str(getattr(x, "dtype", type(x)))) for x in leaves))
        hash(key)
    except TypeError:  # an unhashable model: trace every time
        key = None
    if key is not None and key in _MEMBER_COUNTS:
        return _MEMBER_COUNTS[key]
    r = row(batch, 0)
    t = r.before.shape[0] + 1 + r.after.shape[0]
    ids = jnp.zeros((t,), jnp.int32)
    m = int(jax.eval_shape(lambda p: model.logits(p, ids, jnp.ones((t,), jnp.int32)), params).shape[0])
    if key is not None:
        if len(_MEMBER_COUNTS) > 256:
            _MEMBER_COUNTS.clear()
        _MEMBER_COUNTS[key] = m
    return m


def sample_keys(problem: TextProblem):
    """``[B]`` keys ``fold_in(key, sample_id)``."""
    return jax.vmap(lambda s: jax.random.fold_in(problem.key, s))(problem.sample_ids.astype(jnp.uint32))


# ---------------------------------------------------------------------------------------------
# host side: building, validating, auditing


def text_batch(
    before: Sequence[Sequence[int]], after: Sequence[Sequence[int]], target: Sequence[Sequence[int]], pad_id: int = 0
) -> TextBatch:
    """Pads token-id lists into a :class:`TextBatch` (host side).

    Args:
      before: B lists of ids before the suffix (>= 1 each).
      after: B lists of ids after it (all empty, or >= 1 each).
      target: B lists of target ids (>= 1 each).
      pad_id: id of padding slots (never attended).

    Raises:
      ValueError: lengths differ, or a block is empty where it may not be (naming the row).
    """
    if not (len(before) == len(after) == len(target)) or len(before) == 0:
        raise ValueError(
            f"text_batch: before/after/target must have the same B >= 1 rows, got {len(before)}, {len(after)}, {len(target)}"
        )
    for name, seqs in (("before", before), ("target", target)):
        empty = [i for i, s in enumerate(seqs) if len(s) == 0]
        if empty:
            raise ValueError(f"text_batch: {name} rows {empty} are empty (each needs >= 1 token)")
    la = [len(s) for s in after]
    if max(la) > 0 and min(la) == 0:
        raise ValueError(
            f"text_batch: after rows {[i for i, n in enumerate(la) if n == 0]} are empty while others are not"
        )

    def pad(seqs, left):
        n = max(len(s) for s in seqs)
        ids = np.full((len(seqs), n), pad_id, np.int32)
        mask = np.zeros((len(seqs), n), np.int32)
        for i, s in enumerate(seqs):
            if len(s):
                sl = slice(n - len(s), n) if left else slice(0, len(s))
                ids[i, sl] = np.asarray(s, np.int32)
                mask[i, sl] = 1
        return ids, mask

    b, bm = pad(before, True)
    a, am = pad(after, True)
    t, tm = pad(target, False)
    return TextBatch(b, bm, a, am, t, tm)


def check_ref_none(name: str, ref) -> None:
    """A token-level call's ``ref`` must be None: the :class:`TextBatch` carries its targets.

    Raises:
      TypeError: another ``ref``.
    """
    if ref is not None:
        raise TypeError(
            f"{name}: ref must be None (the TextBatch carries each request's target ids), got {type(ref).__name__}"
        )


def check_member_mask(name: str, mask, bsz: int, m: int) -> np.ndarray:
    """The ``[B, M]`` float32 member mask of a call (host side): None (every member), ``[M]`` or
    ``[B, M]``, bool or {0, 1} (the members the objective covers), checked by the one validator
    (:func:`sarjax.attacks.core.validate.check_mask`).

    Raises:
      TypeError: a non-numeric mask. ValueError: a value other than 0 / 1 (NaN included), a shape
        other than ``[M]`` / ``[B, M]``.
    """
    a = check_mask(mask, bsz, m, name=name)
    if a is None:
        return np.ones((bsz, m), np.float32)
    mk = a.astype(np.float32)
    return np.ascontiguousarray(np.broadcast_to(mk[None] if mk.ndim == 1 else mk, (bsz, m)))


def slot_texts(
    tokenizer,
    instructions: Sequence[str],
    *,
    system: str | None = None,
    separator: str = " ",
    chat_template: bool | None = None,
) -> tuple[list[str], list[str]]:
    """``(before [B], after [B])``: the rendered text of each request before and after its suffix
    slot (host side). With a chat template, the user turn ``instruction + separator + suffix``
    rendered with the generation prompt and split at the suffix
    (:func:`~sarjax.models.llm.prompts.split_chat_template`); without one (a base model),
    ``instruction + separator`` before and nothing after.

    Args:
      chat_template: True / False; None: the tokenizer's template when it has one.
    """
    use = getattr(tokenizer, "chat_template", None) is not None if chat_template is None else chat_template
    before, after = [], []
    for instr in instructions:
        if use:
            b, a = split_chat_template(tokenizer, instr, system, separator)
        else:
            b, a = instr + separator, ""
        before.append(b)
        after.append(a)
    return before, after


_DECODE = dict(skip_special_tokens=False, clean_up_tokenization_spaces=False)


def sent_ids(tokenizer, before_text: str, suffix_text: str, after_text: str) -> list[int]:
    """The ids the tokenizer gives for the WHOLE prompt text ``before + suffix + after`` (no special
    tokens added; special tokens written in the template text are kept): what a user sending the
    suffix text gets, as opposed to the three blocks tokenized apart."""
    return encode_text(tokenizer, before_text + suffix_text + after_text)


def _texts_of(name: str, tokenizer, texts, batch: TextBatch) -> tuple[list[str], list[str]]:
    """The ``(before, after)`` texts of a call: checked against the batch's blocks when given,
    else decoded block by block."""
    b = TextBatch(*(np.asarray(a) for a in batch))
    bsz = b.before.shape[0]
    real = lambda ids, m: ids[m != 0].tolist()  # noqa: E731
    if texts is None:
        return (
            [tokenizer.decode(real(b.before[i], b.before_mask[i]), **_DECODE) for i in range(bsz)],
            [tokenizer.decode(real(b.after[i], b.after_mask[i]), **_DECODE) for i in range(bsz)],
        )
    if not (isinstance(texts, (tuple, list)) and len(texts) == 2):
        raise TypeError(f"{name}: texts must be (before [B] str, after [B] str), got {type(texts).__name__}")
    before, after = list(texts[0]), list(texts[1])
    if len(before) != bsz or len(after) != bsz or not all(isinstance(x, str) for x in before + after):
        raise ValueError(f"{name}: texts must hold B={bsz} before and after strings, got {len(before)}, {len(after)}")
    bad = [
        i
        for i in range(bsz)
        if encode_text(tokenizer, before[i]) != real(b.before[i], b.before_mask[i])
        or encode_text(tokenizer, after[i]) != real(b.after[i], b.after_mask[i])
    ]
    if bad:
        raise ValueError(f"{name}: texts rows {bad} do not encode to the batch's before / after blocks")
    return before, after


def slot_text_bytes(before: Sequence[str], after: Sequence[str]) -> SlotTexts:
    """The :class:`SlotTexts` of ``B`` before / after texts (host side): UTF-8 bytes, zero-padded."""

    def enc(xs):
        bs = [x.encode("utf-8") for x in xs]
        out = np.zeros((len(bs), max(1, max(map(len, bs), default=0))), np.uint8)
        for i, b in enumerate(bs):
            out[i, : len(b)] = np.frombuffer(b, np.uint8)
        return out, np.asarray([len(b) for b in bs], np.int32)

    b, bl = enc(before)
    a, al = enc(after)
    return SlotTexts(b, bl, a, al)


class Retokenizer:
    """The tokenizer as a compiled search sees it: a host callback (``jax.pure_callback``) that
    turns candidate suffix ids into the ids of the prompt TEXT that is sent, with GCG's
    re-tokenization filter (Zou et al. 2023, the reference's ``filter_cand``: a candidate whose
    decoded text does not encode back to its ids is dropped). Equal and hashed by the
    tokenizer's identity, so a static config may hold it.

    Args:
      tokenizer: a transformers tokenizer (``decode`` and ``__call__``).
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __eq__(self, other) -> bool:
        return isinstance(other, Retokenizer) and other.tokenizer is self.tokenizer

    def __hash__(self) -> int:
        return hash(("Retokenizer", id(self.tokenizer)))

    def __repr__(self) -> str:
        return f"Retokenizer({type(self.tokenizer).__name__})"

    def host_sent(self, width, before, before_mask, after, after_mask, tb, tbl, ta, tal, cands, n):
        """Host side of :meth:`sent` for one request (numpy in, numpy out)."""
        tok = self.tokenizer

        def text(raw, length, ids, mask):
            if int(length) >= 0:
                return bytes(np.asarray(raw, np.uint8)[: int(length)]).decode("utf-8")
            return tok.decode(np.asarray(ids)[np.asarray(mask) != 0].tolist(), **_DECODE)

        bt, at = text(tb, tbl, before, before_mask), text(ta, tal, after, after_mask)
        cands = np.asarray(cands)
        k, ls = int(n), cands.shape[1]
        ids = np.zeros((cands.shape[0], width), np.int32)
        mask = np.zeros((cands.shape[0], width), np.int32)
        ok = np.zeros((cands.shape[0],), bool)
        memo: dict = {}
        for j in range(cands.shape[0]):
            real = cands[j, ls - k :].tolist() if k > 0 else []
            key = tuple(real)
            if key not in memo:
                suffix = tok.decode(real, **_DECODE) if real else ""
                seq = sent_ids(tok, bt, suffix, at) if encode_text(tok, suffix) == real else []
                memo[key] = seq if 0 < len(seq) <= width else None
            seq = memo[key]
            if seq is not None:
                ids[j, width - len(seq) :], mask[j, width - len(seq) :], ok[j] = seq, 1, True
        return ids, mask, ok

    def sent(self, r: TextBatch, texts, cands, n, width: int):
        """The sent prompts of ``N`` candidate suffixes of one request (traced; vmap-safe).

        Args:
          r: the request (one row of the :class:`TextBatch`).
          texts: its row of the problem's :class:`SlotTexts`, or None (the blocks' ids decoded).
          cands: ``[N, Ls]`` int32 right-aligned suffixes; n: int32, their real tokens.
          width: ``W``, static.

        Returns:
          ``(ids [N, W] int32 left-padded, mask [N, W] int32, ok [N] bool)``: the ids of
          ``before text + decode(suffix) + after text`` tokenized whole; ``ok`` False (and the
          row empty) where the suffix ids do not re-tokenize to themselves or the prompt does
          not fit ``W`` tokens.
        """
        if texts is None:
            texts = SlotTexts(jnp.zeros((1,), jnp.uint8), jnp.int32(-1), jnp.zeros((1,), jnp.uint8), jnp.int32(-1))
        nc = cands.shape[0]
        shapes = (
            jax.ShapeDtypeStruct((nc, width), jnp.int32),
            jax.ShapeDtypeStruct((nc, width), jnp.int32),
            jax.ShapeDtypeStruct((nc,), jnp.bool_),
        )
        return jax.pure_callback(
            functools.partial(self.host_sent, width), shapes, r.before, r.before_mask, r.after, r.after_mask,
            texts.before, texts.before_len, texts.after, texts.after_len, cands.astype(jnp.int32),
            jnp.asarray(n, jnp.int32), vmap_method="sequential",
        )  # fmt: skip


def prompt_losses(model: TextModel, loss_fn: Callable, params, r: TextBatch, ids, mask):
    """Every member's loss on ``N`` whole prompts of one request (e.g. :meth:`Retokenizer.sent`).

    Args:
      ids: ``[N, W]`` int32 left-padded prompts (each with >= 1 real token); mask: ``[N, W]`` 0/1.

    Returns:
      ``[M, N]`` float32.
    """
    one = lambda i, m: loss_fn(model.nll(params, i, m, r.target, r.target_mask), r.target_mask)  # noqa: E731
    mask = mask.astype(jnp.int32).at[:, -1].set(1)  # a row left empty (a dropped candidate) reads one slot
    return jax.vmap(one, out_axes=1)(ids.astype(jnp.int32), mask)


def host_problem(
    name,
    model,
    params,
    batch,
    ref,
    mask,
    key,
    *,
    vocab_size,
    ls,
    max_queries,
    allowed,
    suffix_init,
    sample_ids,
    init_id,
    init_len,
    grows,
):
    """Validates a call on the host and builds its :class:`TextProblem`.

    Raises:
      TypeError: ``key`` is None, ``batch`` is not a TextBatch, ``ref`` is not None.
      ValueError: an id outside ``[0, V)``, a mask that is not bool or 0/1, a bad mask / allowed /
        cap / init shape, a disallowed init token (each naming what was expected and what came).
    """
    if key is None:
        raise TypeError(f"{name}: key is required (a jax.random key); sarjax never defaults it")
    if not isinstance(batch, TextBatch):
        raise TypeError(f"{name}: expected a TextBatch (see text_batch), got {type(batch).__name__}")
    check_ref_none(name, ref)
    batch = TextBatch(*(np.asarray(a) for a in batch))
    bsz = batch.before.shape[0]
    for f, a in zip(TextBatch._fields, batch, strict=True):
        if a.ndim != 2 or a.shape[0] != bsz:
            raise ValueError(f"{name}: batch.{f} must be [B={bsz}, n], got shape {a.shape}")
        if not np.issubdtype(a.dtype, np.integer):
            raise TypeError(f"{name}: batch.{f} must hold integers, got {a.dtype}")
    for f in ("before", "after", "target"):
        a = getattr(batch, f)
        bad = np.argwhere((a < 0) | (a >= vocab_size))
        if bad.size:
            raise ValueError(f"{name}: batch.{f} has ids outside [0, {vocab_size}) at (row, pos) {bad[:5].tolist()}")
    if np.any(batch.before_mask[:, -1] == 0) or np.any(batch.target_mask[:, 0] == 0):
        raise ValueError(f"{name}: before must be left-padded and target right-padded with >= 1 token (use text_batch)")
    if batch.after.shape[1] and np.any(batch.after_mask[:, -1] == 0):
        raise ValueError(f"{name}: after must be left-padded with >= 1 token per row when Pa > 0 (use text_batch)")
    m = member_count(model, params, batch)
    mk = check_member_mask(name, mask, bsz, m)
    al = np.ones((vocab_size,), bool) if allowed is None else np.asarray(allowed, bool)
    if al.shape != (vocab_size,):
        raise ValueError(f"{name}: allowed must be [V={vocab_size}] bool, got shape {al.shape}")
    if not al.any():
        raise ValueError(f"{name}: allowed excludes every token id")
    first = int(np.argmax(al)) if init_id is None else int(init_id)
    if suffix_init is None:
        si = np.full((bsz, ls), first, np.int32)
        n0 = np.full((bsz,), 0 if grows else ls, np.int32)
    else:
        si = np.asarray(suffix_init)
        if si.ndim == 1:
            si = np.broadcast_to(si[None], (bsz, si.shape[0]))
        if si.shape != (bsz, ls):
            raise ValueError(f"{name}: suffix_init must be [Ls={ls}] or [B={bsz}, Ls={ls}], got shape {si.shape}")
        n0 = np.broadcast_to(np.asarray(ls if init_len is None else init_len, np.int32), (bsz,))
    if suffix_init is None and init_len is not None:
        raise ValueError(f"{name}: init_len needs a suffix_init")
    if np.any((n0 < 0) | (n0 > ls)) or (not grows and np.any(n0 != ls)):
        lo = 0 if grows else ls
        raise ValueError(f"{name}: init_len must lie in [{lo}, {ls}], got {n0.tolist()}")
    real = np.arange(ls)[None] >= ls - n0[:, None]
    bad = np.argwhere(real & ((si < 0) | (si >= vocab_size) | ~al[np.clip(si, 0, vocab_size - 1)]))
    if bad.size:
        raise ValueError(
            f"{name}: the start suffix uses ids outside the allowed vocabulary at (row, pos) {bad[:5].tolist()}"
        )
    sid = check_sample_ids(sample_ids, bsz)
    cap = Q.normalize_cap(max_queries, bsz)
    jb = TextBatch(*(jnp.asarray(a, jnp.int32) for a in batch))
    si = np.where(real, si, 0)
    return TextProblem(jb, jnp.asarray(mk), jnp.asarray(al), cap, key, sid, jnp.asarray(si, jnp.int32), jnp.asarray(n0))


def traced_problem(
    batch, ref, mask, key, *, vocab_size, ls, max_queries, allowed, suffix_init, sample_ids, init_id, m, init_len, grows
):
    """The :class:`TextProblem` with ``jnp`` operations only (jit-safe; no validation but the
    static ones: a key, ``ref`` None)."""
    if key is None:
        raise TypeError("key is required (a jax.random key); sarjax never defaults it")
    check_ref_none("jit", ref)
    batch = TextBatch(*(jnp.asarray(a).astype(jnp.int32) for a in batch))
    bsz = batch.before.shape[0]
    mk = jnp.ones((bsz, m), jnp.float32) if mask is None else jnp.broadcast_to(jnp.asarray(mask, jnp.float32), (bsz, m))
    al = jnp.ones((vocab_size,), bool) if allowed is None else jnp.asarray(allowed, bool)
    first = jnp.argmax(al).astype(jnp.int32) if init_id is None else jnp.int32(init_id)
    si = (
        jnp.full((bsz, ls), first, jnp.int32)
        if suffix_init is None
        else jnp.broadcast_to(jnp.asarray(suffix_init, jnp.int32), (bsz, ls))
    )
    sid = jnp.arange(bsz, dtype=jnp.int32) if sample_ids is None else jnp.asarray(sample_ids).astype(jnp.int32)
    if suffix_init is None:
        n0 = jnp.full((bsz,), 0 if grows else ls, jnp.int32)
    else:
        n0 = jnp.broadcast_to(jnp.asarray(ls if init_len is None else init_len, jnp.int32), (bsz,))
    si = jnp.where(jnp.arange(ls)[None] >= ls - n0[:, None], si, 0)
    return TextProblem(batch, mk, al, Q.cap_array(max_queries, bsz), key, sid, si, n0)


def audit_text(name: str, problem: TextProblem, result: TextAttackResult, tokenizer=None) -> None:
    """The threat-model audit of a suffix attack's output (host side).

    Checks, per row: the prompt's ``before`` and ``after`` blocks equal the ORIGINAL request's
    (only the suffix changed); the suffix is one right-aligned block (possibly empty: a cap too
    small to score anything); every suffix token is in the allowed vocabulary; the loss is not NaN
    (``inf``: the cap allowed no scoring); queries are charged to covered members only and their
    sum stays within the cap; with a ``tokenizer``, the suffix ids re-tokenize to themselves
    (``encode(decode(ids)) == ids``; whether the whole prompt does is the re-tokenization of the
    audited entry, :attr:`TextAttackResult.retokenized`).

    Raises:
      ValueError: naming every offending row and why.
    """
    b = TextBatch(*(host(a) for a in problem.batch))
    al = host(problem.allowed)
    ids, mask = host(result.x_adv), host(result.mask)
    q, mk, cap = host(result.queries), host(problem.mask) > 0, host(problem.cap)
    suf, sm = host(result.suffix), host(result.suffix_mask)
    loss = host(result.loss)
    pb, ls = b.before.shape[1], suf.shape[1]
    problems = []
    for i in range(ids.shape[0]):
        why = []
        if not (np.array_equal(ids[i, :pb], b.before[i]) and np.array_equal(mask[i, :pb], b.before_mask[i])):
            why.append("the part before the suffix changed")
        if not (np.array_equal(ids[i, pb + ls :], b.after[i]) and np.array_equal(mask[i, pb + ls :], b.after_mask[i])):
            why.append("the part after the suffix changed")
        if not (np.array_equal(ids[i, pb : pb + ls], suf[i]) and np.array_equal(mask[i, pb : pb + ls], sm[i])):
            why.append("the prompt's suffix slots differ from the returned suffix")
        n = int(sm[i].sum())
        if not np.array_equal(sm[i], (np.arange(ls) >= ls - n).astype(sm.dtype)):
            why.append("the suffix is not one right-aligned block")
        real = suf[i][sm[i] != 0]
        if np.any((real < 0) | (real >= al.shape[0])) or not al[np.clip(real, 0, al.shape[0] - 1)].all():
            why.append(
                f"suffix ids outside the allowed vocabulary: {sorted({int(t) for t in real if not (0 <= t < al.shape[0] and al[t])})}"
            )
        if np.isnan(loss[i]):
            why.append("loss is NaN")
        if np.any(q[i] < 0) or np.any(q[i][~mk[i]] != 0) or int(q[i].sum()) > int(cap[i]):
            why.append(
                f"queries {q[i].tolist()} are negative, charged to uncovered members or above the cap {int(cap[i])}"
            )
        if tokenizer is not None and not why:
            if not retokenizes(tokenizer, real.tolist()):
                why.append("the suffix ids do not re-tokenize to themselves")
        if why:
            problems.append(f"row {i}: " + "; ".join(why))
    if problems:
        raise ValueError(f"{name}: output violates the threat model: " + " | ".join(problems))


def exchange_suffix(ids: Sequence[int], source, targets: Sequence[Any]) -> list[list[int]] | None:
    """Passes a suffix between tokenizers as TEXT (the SAR paper: joint GCG exchanges suffixes as
    text, not ids): decode with ``source``, re-encode with each of ``targets`` (host side).

    Args:
      ids: the suffix in ``source``'s ids.
      source: the proposer's tokenizer.
      targets: every member's tokenizer.

    Returns:
      One id list per target, or None when the text does not survive a target: its ids must
      decode back to the same text and re-tokenize to themselves (the re-tokenization filter).
    """
    kw = dict(skip_special_tokens=False, clean_up_tokenization_spaces=False)
    text = source.decode([int(i) for i in ids], **kw)
    out = []
    for tok in targets:
        enc = encode_text(tok, text)
        if not enc or tok.decode(enc, **kw) != text or not retokenizes(tok, enc):
            return None
        out.append(enc)
    return out


def suffix_text_violations(text: str, tokenizers: Sequence[Any], allowed: Sequence[Any], slots: Sequence[int]):
    """The threat-model check of a suffix exchanged as TEXT across a pool's tokenizers (host side).

    A suffix is valid for a member when its text encodes (no special tokens) to ids that decode
    back to the same text (so they re-tokenize to themselves: ``encode(decode(ids)) == ids``),
    every id is in that member's allowed vocabulary (no special tokens, no id past the tokenizer's
    vocabulary, see :func:`allowed_vocab`), and the ids fit the suffix slots.

    Args:
      text: the suffix text.
      tokenizers: one tokenizer per stack.
      allowed: one ``[V_s]`` bool per stack.
      slots: the suffix slots of each stack.

    Returns:
      ``(ids, reasons)``: one id list per stack (None where encoding failed) and the list of
      violations (empty: valid for every stack).
    """
    kw = dict(skip_special_tokens=False, clean_up_tokenization_spaces=False)
    ids, reasons = [], []
    for s, (tok, al, n) in enumerate(zip(tokenizers, allowed, slots, strict=True)):
        enc = encode_text(tok, text)
        ids.append(enc)
        if not enc:
            reasons.append(f"stack {s}: the text encodes to no token")
        elif tok.decode(enc, **kw) != text:
            reasons.append(f"stack {s}: the ids do not decode back to the text (no re-tokenization)")
        elif len(enc) > n:
            reasons.append(f"stack {s}: {len(enc)} tokens exceed the {n} suffix slots")
        else:
            a = np.asarray(enc)
            bad = sorted({int(t) for t in a if not (0 <= t < len(al) and al[t])})
            if bad:
                reasons.append(f"stack {s}: ids outside the allowed vocabulary: {bad}")
    return ids, reasons


def allowed_vocab(tokenizer, vocab_size: int, ascii_only: bool = True) -> np.ndarray:
    """``[V]`` bool: ids a suffix may use (GCG's filter: no special tokens, no ids past the
    tokenizer's vocabulary (padded embedding rows), and with ``ascii_only`` only tokens whose
    decoded text is printable ASCII; Zou et al. 2023 reference defaults, also nanoGCG's).

    Args:
      tokenizer: a transformers tokenizer.
      vocab_size: ``V`` of the model (the embedding rows; may exceed ``len(tokenizer)``).
    """
    al = np.zeros((vocab_size,), bool)
    n = min(len(tokenizer), vocab_size)
    al[:n] = True
    for i in getattr(tokenizer, "all_special_ids", []):
        if 0 <= i < vocab_size:
            al[i] = False
    if ascii_only:
        for i in range(n):
            if al[i]:
                s = tokenizer.decode([i])
                al[i] = bool(s) and s.isascii() and s.isprintable()
    return al


class TextAttackFn(Entry):
    """The entries of a token-level suffix attack (joint GCG, joint BEAST).

    - ``fn(params, batch, ref, *, key, mask=None, max_queries=None, sample_ids=None, allowed=None,
      suffix_init=None, init_len=None, texts=None) -> TextAttackResult``: the audited entry:
      validate on the host, run the compiled state machine
      (:func:`~sarjax.attacks.core.protocol.run_jit`), audit (:func:`audit_text`), then, with the
      factory's ``tokenizer``, re-tokenize every returned prompt as TEXT and judge every member
      again on those ids where they changed (:attr:`TextAttackResult.sent`,
      :attr:`TextAttackResult.retokenized`).
    - ``fn.jit(...)``, same arguments but ``texts``: the same state machine with the problem built
      by ``jnp`` operations only (no host call, no validation, no audit, no re-tokenization).
    - ``fn.attack``: the state machine.

    Arguments of a call:
      params: the pool's parameters (what ``model``'s functions read).
      batch: the requests, a :class:`TextBatch` (:func:`text_batch`).
      ref: None: the batch carries each request's target (or refusal) ids.
      key: PRNG key (keyword-only, required).
      mask: ``[M]`` or ``[B, M]`` bool or 0/1, the members the objective covers (None: all).
      max_queries: None, a scalar or ``[B]``: the cap of each request's queries summed over its
        members.
      sample_ids: ``[B]`` ints; request ``b`` draws from ``fold_in(key, sample_ids[b])``.
      allowed: ``[V]`` bool, the ids a suffix may use.
      suffix_init, init_len: the start suffix ``[Ls]`` or ``[B, Ls]`` (right-aligned) and its
        real tokens (BEAST's seed).
      texts: ``(before [B] str, after [B] str)``, the rendered text around each request's suffix
        slot (:func:`slot_texts`; each must encode to the batch's block): the prompt that is sent
        is ``before + decode(suffix) + after`` tokenized whole. None: each block's ids decoded
        (exact when a block's text round-trips through the tokenizer). Needs the tokenizer.

    A subclass of the image attacks' :class:`~sarjax.attacks.core.entry.Entry`: one code path
    through its hooks ``_host_problem`` / ``_traced_problem`` / ``_audit_result``; ``__call__``
    adds the re-tokenization after :meth:`Entry.__call__`.

    Args:
      attack: the state machine (:class:`~sarjax.attacks.core.Attack`).
      name: for messages.
      model: the :class:`TextModel`.
      vocab_size: ``V``.
      suffix_len: ``Ls``.
      tokenizer: optional; when given the audit also checks that the suffix re-tokenizes, and the
        audited entry re-tokenizes the whole prompt.
      init_id: default start token of a suffix (None: the first allowed id).
      grows: the attack appends tokens (BEAST: ``init_len`` may be < ``Ls``, default 0) rather
        than editing a full-length suffix (GCG: ``init_len == Ls``).
      criterion: the success criterion (:attr:`TextAttackResult.success`).
      scores_sent: the state machine scores the ids of the text that is sent (it holds a
        :class:`Retokenizer` of ``tokenizer``): the audited entry puts the call's ``texts`` into
        the problem (:attr:`TextProblem.texts`).
    """

    def __init__(
        self, attack, *, name, model, vocab_size, suffix_len, tokenizer=None, init_id=None, grows=False, criterion,
        scores_sent=False,
    ):  # fmt: skip
        self._attack = attack
        self.name = name
        self.__name__ = name
        self.apply = None
        self.model = model
        self.vocab_size = vocab_size
        self.suffix_len = suffix_len
        self.tokenizer = tokenizer
        self.init_id = init_id
        self.grows = grows
        self.criterion = criterion
        self.scores_sent = bool(scores_sent)

    @property
    def attack(self):
        """The state machine."""
        return self._attack

    def _host_problem(
        self, params, batch, ref, mask, key, *, max_queries=None, sample_ids=None, allowed=None, suffix_init=None,
        init_len=None, texts=None,
    ):  # fmt: skip
        problem = host_problem(
            self.name, self.model, params, batch, ref, mask, key, vocab_size=self.vocab_size, ls=self.suffix_len,
            max_queries=max_queries, allowed=allowed, suffix_init=suffix_init, sample_ids=sample_ids, init_id=self.init_id,
            init_len=init_len, grows=self.grows,
        )  # fmt: skip
        if not (self.scores_sent and self.tokenizer is not None):
            return problem
        si, n0 = host(problem.suffix_init), host(problem.init_len)
        bad = [
            i
            for i in range(si.shape[0])
            if n0[i] > 0 and not retokenizes(self.tokenizer, si[i, si.shape[1] - n0[i] :].tolist())
        ]
        if bad:
            raise ValueError(
                f"{self.name}: the start suffix of rows {bad} does not re-tokenize to itself (its decoded text encodes "
                "to other ids); the re-tokenization filter would drop it"
            )
        before, after = _texts_of(self.name, self.tokenizer, texts, batch)
        return problem._replace(texts=SlotTexts(*(jnp.asarray(a) for a in slot_text_bytes(before, after))))

    def _traced_problem(
        self, params, batch, ref, mask, key, *, max_queries=None, sample_ids=None, allowed=None, suffix_init=None,
        init_len=None, texts=None,
    ):  # fmt: skip
        if texts is not None:
            raise TypeError(
                f"{self.name}.jit: texts is read by the audited entry only (re-tokenization runs on the host)"
            )
        m = member_count(self.model, params, TextBatch(*(jnp.asarray(a) for a in batch)))
        return traced_problem(
            batch, ref, mask, key, vocab_size=self.vocab_size, ls=self.suffix_len, max_queries=max_queries,
            allowed=allowed, suffix_init=suffix_init, sample_ids=sample_ids, init_id=self.init_id, m=m,
            init_len=init_len, grows=self.grows,
        )  # fmt: skip

    def _audit_result(self, params, problem, result) -> None:
        audit_text(self.name, problem, result, self.tokenizer)

    def __call__(self, params, batch, ref, *, key, mask=None, texts=None, **call) -> TextAttackResult:
        """Validate -> the compiled state machine -> audit (:meth:`Entry.__call__`), then the
        re-tokenization of the returned prompts (see the class docstring)."""
        if texts is not None and self.tokenizer is None:
            raise TypeError(f"{self.name}: texts needs the factory's tokenizer (make_*(..., tokenizer=...))")
        result = super().__call__(params, batch, ref, key=key, mask=mask, texts=texts, **call)
        if self.tokenizer is None:
            return result
        return resend(self.name, self.model, self.criterion, self.tokenizer, params, batch, result, texts)

    def __repr__(self) -> str:
        return f"TextAttackFn({self.name}, steps={self.attack.num_steps}, Ls={self.suffix_len})"


def resend(name, model, criterion, tokenizer, params, batch, result: TextAttackResult, texts=None) -> TextAttackResult:
    """The result with every prompt re-tokenized as TEXT (host side): :attr:`TextAttackResult.sent`
    the ids of ``before text + decode(suffix) + after text``, :attr:`~TextAttackResult.retokenized`
    (``[B, M]``) the rows whose ids changed, and those rows' :attr:`~TextAttackResult.success` judged again on
    the new ids (:func:`judge_prompts`; the search's loss fields are left as they are)."""
    before, after = _texts_of(name, tokenizer, texts, batch)
    x, xm = host(result.x_adv), host(result.mask)
    suf, sm = host(result.suffix), host(result.suffix_mask)
    rows, changed = [], []
    for i in range(x.shape[0]):
        text = tokenizer.decode(suf[i][sm[i] != 0].tolist(), **_DECODE)
        ids = sent_ids(tokenizer, before[i], text, after[i])
        rows.append(ids)
        changed.append(ids != x[i][xm[i] != 0].tolist())
    t = x.shape[1]
    n = max(map(len, rows))
    pad = tokenizer.pad_token_id if getattr(tokenizer, "pad_token_id", None) is not None else 0
    sent, smask = left_pad(rows, int(pad), t if n <= t else -(-n // 8) * 8)
    retok = np.asarray(changed, bool)
    success = host(result.success)
    if retok.any():
        b = TextBatch(*(np.asarray(a) for a in batch))
        again = judge_prompts(
            params, jnp.asarray(sent), jnp.asarray(smask), jnp.asarray(b.target, jnp.int32),
            jnp.asarray(b.target_mask, jnp.int32), model=model, criterion=criterion,
        )  # fmt: skip
        success = np.where(retok[:, None], host(again), success)
    return result._replace(
        success=jnp.asarray(success),
        sent=jnp.asarray(sent),
        sent_mask=jnp.asarray(smask),
        retokenized=jnp.asarray(np.broadcast_to(retok[:, None], success.shape)),
    )


def compact_right(ids, mask):
    """``(ids, mask)`` of one row with its real tokens moved to the right end, in order (jit-safe;
    holes become 0 on the left)."""
    m = mask.astype(jnp.int32)
    order = jnp.argsort(m, stable=True)
    return jnp.where(m[order] > 0, ids[order], 0).astype(jnp.int32), m[order]


def finish(
    model, loss_fn, criterion, params, problem: TextProblem, best_suffix, best_len, best_loss, queries, retok=None
) -> TextAttackResult:
    """The :class:`TextAttackResult` of a best suffix per row: every member's loss and success on
    it (bookkeeping re-scoring, not counted as queries) and the queries split over the covered
    members (``queries [B]`` is every step's cost, charged equally to each covered member).

    With a :class:`Retokenizer` ``retok`` (a search that scores the text that is sent), the
    losses and the success are read on the sent ids of the best suffix (:attr:`TextAttackResult.sent`,
    width ``T``) and :attr:`~TextAttackResult.retokenized` marks the rows whose sent ids differ
    from the blocks; without one, on the blocks without their holes."""
    ls = best_suffix.shape[1]
    texts = problem.texts

    def one(r, s, n, tx):
        sm = suffix_mask(ls, n)
        s = s * sm
        ids, mask = assemble(r, s, sm)
        # judged on the prompt without holes: its last slot is a real token (an empty suffix with
        # no template tail would leave a hole where the first target token is predicted)
        blocks, bmask = compact_right(ids, mask)
        if retok is None:
            ml = member_losses(model, loss_fn, params, r, s[None], sm[None])[:, 0]
            sent, smask, changed = blocks, bmask, jnp.bool_(False)
        else:
            si, sk, good = retok.sent(r, tx, s[None], n, ids.shape[0])
            sent, smask = jnp.where(good[0], si[0], blocks), jnp.where(good[0], sk[0], bmask)
            ml = prompt_losses(model, loss_fn, params, r, sent[None], smask[None])[:, 0]
            changed = jnp.any((sent * smask != blocks * bmask) | (smask != bmask))
        ok = member_success(model, criterion, params, sent, smask, r.target, r.target_mask)
        return sm, ids, mask, ml, ok, sent, smask, changed

    sm, ids, mask, ml, ok, sent, smask, changed = jax.vmap(one)(problem.batch, best_suffix, best_len, texts)
    covered = problem.mask > 0
    nm = jnp.maximum(jnp.sum(covered, axis=1), 1).astype(jnp.int32)
    q = jnp.where(covered, (queries // nm)[:, None], 0).astype(jnp.int32)
    pb = problem.batch.before.shape[1]
    retokenized = jnp.broadcast_to(changed[:, None], ok.shape)  # [B, M]: one tokenizer for every member
    return TextAttackResult(ids, ok, q, mask, ids[:, pb : pb + ls], sm, best_loss, ml, sent, smask, retokenized)


__all__ = [
    "CRITERIA",
    "TextAttackFn",
    "TextAttackResult",
    "TextBatch",
    "TextModel",
    "TextProblem",
    "Retokenizer",
    "SlotTexts",
    "allowed_vocab",
    "audit_text",
    "check_member_mask",
    "default_criterion",
    "judge_prompts",
    "member_success",
    "prompt_losses",
    "resend",
    "sent_ids",
    "slot_texts",
    "slot_text_bytes",
    "target_hits",
    "exchange_suffix",
    "joint_loss",
    "llm_text_model",
    "refusal_loss",
    "suffix_text_violations",
    "target_loss",
    "text_batch",
]
