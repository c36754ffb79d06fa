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
"""

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.attacks import queries as Q
from sarjax.attacks.core.entry import Entry


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
    """

    batch: TextBatch
    mask: Any
    allowed: Any
    cap: Any
    key: Any
    sample_ids: Any
    suffix_init: Any
    init_len: Any


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
    """

    nll: Callable
    nll_one_hot: Callable
    logits: Callable
    prefill: Callable | None = None
    nll_cached: Callable | None = None
    nll_one_hot_cached: Callable | None = None
    nll_cached_many: Callable | None = None


class TextAttackResult(NamedTuple):
    """Best-so-far suffix of a call (member axis ``[B, M]``).

    Attributes:
      suffix: ``[B, Ls]`` int32, the best suffix, right-aligned (holes are ``pad``-free: 0).
      suffix_mask: ``[B, Ls]`` int32, its real slots (a right-aligned block).
      ids: ``[B, T]`` int32 the whole prompt ``before | suffix | after`` (``T = Pb + Ls + Pa``).
      mask: ``[B, T]`` int32.
      loss: ``[B]`` float32, the joint loss of the best suffix (lower is better for the attacker).
      member_loss: ``[B, M]`` float32, each member's loss on the best suffix (all members,
        covered or not).
      queries: ``[B]`` int32 queries spent.
    """

    suffix: Any
    suffix_mask: Any
    ids: Any
    mask: Any
    loss: Any
    member_loss: Any
    queries: Any


# ---------------------------------------------------------------------------------------------
# losses


def target_loss(nll, target_mask):
    """Mean per-token NLL of the target (minimised: BEAST's objective, Sadasivan et al. 2024;
    papers/000 "joint BEAST").

    Args:
      nll: ``[..., Tt]`` per-token NLL; target_mask: ``[Tt]`` 0/1.

    Returns:
      ``[...]`` float32.
    """
    w = target_mask.astype(jnp.float32)
    return jnp.sum(nll * w, axis=-1) / jnp.maximum(jnp.sum(w), 1.0)


def refusal_loss(nll, target_mask):
    """Minus the mean per-token NLL of a fixed refusal (minimising it MAXIMISES the refusal's
    NLL: papers/000, "GCG maximizes the average negative log-likelihood for a fixed refusal").

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
    from sarjax.models.llm import decoder, scoring

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
            if _batched_llama_ok(c):
                cos, sin = _rope_halves(c, kv.mask[0], mask, target_mask)
                parts = []
                for sl in _chunks(ids.shape[0], _SCORE_CHUNKS):
                    f = functools.partial(_llama_nll_many, cfg=c, cos=cos[sl], sin=sin[sl])
                    parts.append(
                        jax.vmap(lambda p, kv, f=f, sl=sl: f(p, kv, ids[sl], mask[sl], target, target_mask))(p, kv)
                    )
                out.append(jnp.concatenate(parts, axis=1))
            else:
                one = lambda p, kv, i, m, c=c: scoring.target_nll(p, c, i, m, target, target_mask, (kv,))  # noqa: E731
                out.append(jax.vmap(lambda p, kv, one=one: jax.vmap(lambda i, m: one(p, kv, i, m))(ids, mask))(p, kv))
        return jnp.concatenate(out, axis=0)

    return TextModel(nll, nll_one_hot, logits, prefill, nll_cached, nll_one_hot_cached, nll_cached_many)


# ---------------------------------------------------------------------------------------------
# candidate scoring from a prefix cache, written for N prompts at once (llama family)
#
# The decoder is written for one sequence (``decoder.hidden_states``); vmapping it over N
# candidates makes XLA transpose every attention operand between the token-major layout of the
# projections and the head-major layout of batched attention, and evaluates the rotary tables
# once per member and candidate. This is the same computation laid out for N prompts of one
# member: token-major throughout (attention per key/value head, no transposes), the rotary
# tables computed once per call, the two key blocks (own tokens, cached prefix) soft-maxed
# together without concatenation, and the last target token not run (no scored position reads
# it). It uses the decoder's own pieces (norms, rotary tables, activations), so it follows
# them; tests/llm/test_text_attacks.py checks it against ``nll_cached`` per prompt.


# The prompts are scored in this many independent chunks: on XLA:CPU (this project's 2-core
# x86-64, benchmarks/gcg_throughput.py) two chunks of 32 candidates ran the scoring about 25% faster
# than one of 64 (smaller intermediates); more chunks were not faster.
_SCORE_CHUNKS = 2


def _chunks(n: int, k: int) -> list[slice]:
    """``k`` (at most ``n``) contiguous slices covering ``range(n)``, sizes differing by <= 1."""
    k = max(1, min(k, n))
    bounds = [round(i * n / k) for i in range(k + 1)]
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _batched_llama_ok(cfg) -> bool:
    return cfg.family != "gpt2" and cfg.head_dim % 2 == 0 and cfg.num_heads % cfg.num_kv_heads == 0


def _rope_halves(cfg, prefix_mask, mask, target_mask):
    """``cos, sin [N, T + Tt - 1, D/2]`` of the prompts' positions after a prefix (the decoder's
    tables repeat their first half, ``decoder._rope_tables``)."""
    from sarjax.models.llm import decoder

    n, t = mask.shape
    tt = target_mask.shape[0]
    fm = jnp.concatenate([mask.astype(jnp.int32), jnp.broadcast_to(target_mask[:-1].astype(jnp.int32), (n, tt - 1))], 1)
    offset = jnp.sum(prefix_mask.astype(jnp.int32))
    pos = jax.vmap(lambda m: decoder.positions_from_mask(m, offset))(fm)  # [N, T']
    cos, sin = decoder._rope_tables(cfg, jnp.arange(prefix_mask.shape[0] + t + tt - 1))
    h = cfg.head_dim // 2
    return cos[:, :h][pos], sin[:, :h][pos]


def _llama_nll_many(p, kv, ids, mask, target, target_mask, *, cfg, cos, sin):
    """Target NLL ``[N, Tt]`` of N prompts ``ids [N, T]`` after ONE member's prefix cache ``kv``
    (a :class:`~sarjax.models.llm.decoder.KVBlock`: k, v ``[L, S, Hkv, D]``, mask, pos ``[S]``)."""
    from sarjax.models.llm import decoder

    n, t = ids.shape
    tt = target.shape[0]
    nh, nkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    g = nh // nkv
    tp = t + tt - 1  # the last target token is no input of a scored position
    toks = jnp.concatenate([ids, jnp.broadcast_to(target[:-1], (n, tt - 1))], 1).astype(jnp.int32)
    fm = jnp.concatenate([mask.astype(jnp.int32), jnp.broadcast_to(target_mask[:-1].astype(jnp.int32), (n, tt - 1))], 1)
    x = jnp.take(p["embed"], toks, axis=0)  # [N, T', d]
    self_ok = jnp.tril(jnp.ones((tp, tp), bool))[None] & fm.astype(bool)[:, None, :]  # [N, T', T']
    pre_ok = jnp.broadcast_to(kv.mask.astype(bool)[None, None, :], (n, tp, kv.mask.shape[0]))
    if cfg.sliding_window is not None:
        offset = jnp.sum(kv.mask.astype(jnp.int32))
        pos = jax.vmap(lambda m: decoder.positions_from_mask(m, offset))(fm)
        self_ok = self_ok & ((pos[:, :, None] - pos[:, None, :]) < cfg.sliding_window)
        pre_ok = pre_ok & ((pos[:, :, None] - kv.pos[None, None, :]) < cfg.sliding_window)
    self_ok, pre_ok = self_ok[:, :, None, :], pre_ok[:, :, None, :]  # [N, T', 1, S]
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    scale = 1.0 / np.sqrt(hd)

    def rope(z):  # [N, T', h, D]: decoder._rope with its repeated halves
        zf = z.astype(jnp.float32)
        a, b = zf[..., : hd // 2], zf[..., hd // 2 :]
        return jnp.concatenate([a * c - b * s, b * c + a * s], axis=-1).astype(z.dtype)

    def lin(h, w, b=None):
        y = h @ w
        return y if b is None else y + b

    def layer(x, xs):
        lw, pk, pv = xs
        h = decoder._rms_norm(x, lw["attn_norm"], cfg.norm_eps)
        q = lin(h, lw["wq"], lw.get("bq")).reshape(n, tp, nh, hd)
        k = lin(h, lw["wk"], lw.get("bk")).reshape(n, tp, nkv, hd)
        v = lin(h, lw["wv"], lw.get("bv")).reshape(n, tp, nkv, hd)
        if cfg.qk_norm:
            q, k = decoder._rms_norm(q, lw["q_norm"], cfg.norm_eps), decoder._rms_norm(k, lw["k_norm"], cfg.norm_eps)
        q, k = rope(q), rope(k)
        heads = []
        for j in range(nkv):  # per key/value head: token-major operands, no transposes
            qj = q[:, :, j * g : (j + 1) * g].astype(jnp.float32) * scale  # [N, T', g, D]
            s1 = jnp.einsum("ntgd,nsd->ntgs", qj, k[:, :, j].astype(jnp.float32))
            s2 = jnp.einsum("ntgd,sd->ntgs", qj, pk[:, j].astype(jnp.float32))
            s1 = jnp.where(self_ok, s1, decoder._NEG)
            s2 = jnp.where(pre_ok, s2, decoder._NEG)
            mx = jnp.maximum(jnp.max(s1, -1, keepdims=True), jnp.max(s2, -1, keepdims=True))
            e1, e2 = jnp.exp(s1 - mx), jnp.exp(s2 - mx)
            den = jnp.sum(e1, -1, keepdims=True) + jnp.sum(e2, -1, keepdims=True)
            o = jnp.einsum("ntgs,nsd->ntgd", e1, v[:, :, j].astype(jnp.float32))
            o = o + jnp.einsum("ntgs,sd->ntgd", e2, pv[:, j].astype(jnp.float32))
            heads.append(o / den)
        a = jnp.concatenate(heads, axis=2).reshape(n, tp, nh * hd).astype(x.dtype)
        x = x + lin(a, lw["wo"], lw.get("bo"))
        h = decoder._rms_norm(x, lw["mlp_norm"], cfg.norm_eps)
        m = decoder._act(cfg, lin(h, lw["w_gate"], lw.get("b_gate"))) * lin(h, lw["w_up"], lw.get("b_up"))
        return x + lin(m, lw["w_down"], lw.get("b_down")), None

    x, _ = jax.lax.scan(layer, x, (p["layers"], kv.k, kv.v))
    h = decoder._rms_norm(x[:, t - 1 :], p["final_norm"], cfg.norm_eps)
    lg = decoder.lm_head(p, cfg, h)  # [N, Tt, V]
    tgt = jnp.broadcast_to(target, (n, tt))
    nll = jax.nn.logsumexp(lg, axis=-1) - jnp.take_along_axis(lg, tgt[..., None], axis=-1)[..., 0]
    return nll * target_mask.astype(nll.dtype)


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


def host_problem(
    name,
    model,
    params,
    batch,
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
      TypeError: ``key`` is None or ``batch`` is not a TextBatch.
      ValueError: an id outside ``[0, V)``, a bad mask / allowed / cap / init shape, a disallowed
        init token (each naming what was expected and what came).
    """
    if key is None:
        raise TypeError(f"{name}: key is required (a jax.random key); sarjax never defaults it")
    if not isinstance(batch, TextBatch):
        raise TypeError(f"{name}: expected a TextBatch (see text_batch), got {type(batch).__name__}")
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
    if mask is None:
        mk = np.ones((bsz, m), np.float32)
    else:
        mk = np.asarray(mask, np.float32)
        if mk.ndim == 1:
            mk = np.broadcast_to(mk[None], (bsz, mk.shape[0]))
        if mk.shape != (bsz, m):
            raise ValueError(f"{name}: mask must be [M={m}] or [B={bsz}, M={m}], got shape {np.shape(mask)}")
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
    sid = np.arange(bsz, dtype=np.int32) if sample_ids is None else np.asarray(sample_ids, np.int32)
    if sid.shape != (bsz,):
        raise ValueError(f"{name}: sample_ids must be [B={bsz}], got shape {sid.shape}")
    cap = Q.normalize_cap(max_queries, bsz)
    jb = TextBatch(*(jnp.asarray(a, jnp.int32) for a in batch))
    si = np.where(real, si, 0)
    return TextProblem(
        jb, jnp.asarray(mk), jnp.asarray(al), cap, key, jnp.asarray(sid), jnp.asarray(si, jnp.int32), jnp.asarray(n0)
    )


def traced_problem(
    batch, mask, key, *, vocab_size, ls, max_queries, allowed, suffix_init, sample_ids, init_id, m, init_len, grows
):
    """The :class:`TextProblem` with ``jnp`` operations only (jit-safe; no validation)."""
    if key is None:
        raise TypeError("key is required (a jax.random key); sarjax never defaults it")
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
    (only the suffix changed); the suffix is one right-aligned block (possibly empty: a cap too small to score anything); every suffix
    token is in the allowed vocabulary; the loss is not NaN (``inf``: the cap allowed no scoring); with a ``tokenizer``, the suffix ids
    re-tokenize to themselves (``encode(decode(ids)) == ids``).

    Raises:
      ValueError: naming every offending row and why.
    """
    from sarjax.attacks.core.entry import host

    b = TextBatch(*(host(a) for a in problem.batch))
    al = host(problem.allowed)
    ids, mask = host(result.ids), host(result.mask)
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
        if tokenizer is not None and not why:
            from sarjax.models.llm.prompts import retokenizes

            if not retokenizes(tokenizer, real.tolist()):
                why.append("the suffix ids do not re-tokenize to themselves")
        if why:
            problems.append(f"row {i}: " + "; ".join(why))
    if problems:
        raise ValueError(f"{name}: output violates the threat model: " + " | ".join(problems))


def exchange_suffix(ids: Sequence[int], source, targets: Sequence[Any]) -> list[list[int]] | None:
    """Passes a suffix between tokenizers as TEXT (papers/000: joint GCG exchanges suffixes as
    text, not ids): decode with ``source``, re-encode with each of ``targets`` (host side).

    Args:
      ids: the suffix in ``source``'s ids.
      source: the proposer's tokenizer.
      targets: every member's tokenizer.

    Returns:
      One id list per target, or None when the text does not survive a target: its ids must
      decode back to the same text and re-tokenize to themselves (the re-tokenization filter).
    """
    from sarjax.models.llm.prompts import _encode, retokenizes

    kw = dict(skip_special_tokens=False, clean_up_tokenization_spaces=False)
    text = source.decode([int(i) for i in ids], **kw)
    out = []
    for tok in targets:
        enc = _encode(tok, text)
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
    from sarjax.models.llm.prompts import _encode

    kw = dict(skip_special_tokens=False, clean_up_tokenization_spaces=False)
    ids, reasons = [], []
    for s, (tok, al, n) in enumerate(zip(tokenizers, allowed, slots, strict=True)):
        enc = _encode(tok, text)
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
    """The entries of a suffix attack: ``fn(params, batch, mask=None, key, *, max_queries=None,
    allowed=None, suffix_init=None, init_len=None, sample_ids=None) -> TextAttackResult`` (validated, audited),
    ``fn.jit(...)`` (same arguments; jit-safe, no validation or audit) and ``fn.attack``.

    A subclass of the image attacks' :class:`~sarjax.attacks.core.entry.Entry`: one code path
    (validate -> :func:`~sarjax.attacks.core.protocol.run_jit` -> audit) through its hooks
    ``_host_problem`` / ``_traced_problem`` / ``_audit_result``. Only the positional signature
    differs: a text request carries its own target, so there is no ``ref`` argument
    (``fn(params, batch, mask, key)``, not ``fn(params, x0, ref, mask, key)``); ``problem`` and
    ``jit`` pass ``ref=None`` to :class:`Entry`'s, and ``__call__`` repeats its three lines with
    the text signature.

    Args:
      attack: the state machine (:class:`~sarjax.attacks.core.Attack`).
      name: for messages.
      model: the :class:`TextModel`.
      vocab_size: ``V``.
      suffix_len: ``Ls``.
      tokenizer: optional; when given the audit also checks re-tokenization.
      init_id: default start token of a suffix (None: the first allowed id).
      grows: the attack appends tokens (BEAST: ``init_len`` may be < ``Ls``, default 0) rather
        than editing a full-length suffix (GCG: ``init_len == Ls``).
    """

    def __init__(self, attack, *, name, model, vocab_size, suffix_len, tokenizer=None, init_id=None, grows=False):
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

    @property
    def attack(self):
        """The state machine."""
        return self._attack

    def _host_problem(
        self,
        params,
        batch,
        ref,
        mask,
        key,
        *,
        max_queries=None,
        allowed=None,
        suffix_init=None,
        init_len=None,
        sample_ids=None,
    ):
        return host_problem(
            self.name, self.model, params, batch, mask, key, vocab_size=self.vocab_size, ls=self.suffix_len,
            max_queries=max_queries, allowed=allowed, suffix_init=suffix_init, sample_ids=sample_ids, init_id=self.init_id,
            init_len=init_len, grows=self.grows,
        )  # fmt: skip

    def _traced_problem(
        self,
        params,
        batch,
        ref,
        mask,
        key,
        *,
        max_queries=None,
        allowed=None,
        suffix_init=None,
        init_len=None,
        sample_ids=None,
    ):
        m = member_count(self.model, params, TextBatch(*(jnp.asarray(a) for a in batch)))
        return traced_problem(
            batch, mask, key, vocab_size=self.vocab_size, ls=self.suffix_len, max_queries=max_queries,
            allowed=allowed, suffix_init=suffix_init, sample_ids=sample_ids, init_id=self.init_id, m=m,
            init_len=init_len, grows=self.grows,
        )  # fmt: skip

    def _audit_result(self, params, problem, result) -> None:
        audit_text(self.name, problem, result, self.tokenizer)

    def problem(self, params, batch, mask=None, key=None, **call):  # pyright: ignore[reportIncompatibleMethodOverride]
        """The validated :class:`TextProblem` of a call (host side)."""
        return super().problem(params, batch, None, mask, key, **call)

    def __call__(self, params, batch, mask=None, key=None, **call) -> TextAttackResult:  # pyright: ignore[reportIncompatibleMethodOverride]
        """Validate -> the compiled state machine -> audit (see :func:`audit_text`); the flow of
        :meth:`Entry.__call__` with the text signature."""
        from sarjax.attacks.core.protocol import run_jit

        problem = self.problem(params, batch, mask, key, **call)
        result = run_jit(self._attack_for(params, problem), params, problem)
        self._audit_result(params, problem, result)
        return result

    def jit(self, params, batch, mask=None, key=None, **call):  # pyright: ignore[reportIncompatibleMethodOverride]
        """The jit-safe entry (no host call, no validation, no audit)."""
        return super().jit(params, batch, None, mask, key, **call)

    def __repr__(self) -> str:
        return f"TextAttackFn({self.name}, steps={self.attack.num_steps}, Ls={self.suffix_len})"


def finish(model, loss_fn, params, problem: TextProblem, best_suffix, best_len, best_loss, queries) -> TextAttackResult:
    """The :class:`TextAttackResult` of a best suffix per row (recomputes ``member_loss`` for all
    members; this re-scoring is bookkeeping and is not counted as queries)."""
    ls = best_suffix.shape[1]

    def one(r, s, n):
        sm = suffix_mask(ls, n)
        s = s * sm
        ids, mask = assemble(r, s, sm)
        ml = member_losses(model, loss_fn, params, r, s[None], sm[None])[:, 0]
        return sm, ids, mask, ml

    sm, ids, mask, ml = jax.vmap(one)(problem.batch, best_suffix, best_len)
    return TextAttackResult(
        ids[:, problem.batch.before.shape[1] : problem.batch.before.shape[1] + ls],
        sm,
        ids,
        mask,
        best_loss,
        ml,
        queries,
    )


__all__ = [
    "TextAttackFn",
    "TextAttackResult",
    "TextBatch",
    "TextModel",
    "TextProblem",
    "allowed_vocab",
    "audit_text",
    "exchange_suffix",
    "joint_loss",
    "llm_text_model",
    "refusal_loss",
    "suffix_text_violations",
    "target_loss",
    "text_batch",
]
