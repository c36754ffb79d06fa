"""The pool as the text attacks see it: :class:`TextModel` (pure functions over a parameter
pytree holding every member), :func:`llm_text_model` for stacked sarjax decoders, and the
per-member scoring of candidate suffixes and whole prompts (one request; vmap over ``B``
outside). Queries: one forward (or one backward) pass of one member on one candidate prompt is 1
query. Members are selected by a ``mask [B, M]`` exactly like the image attacks.
"""

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.attacks.text.requests import (
    TextBatch,
    assemble,
    row,
)
from sarjax.models.llm import decoder, nll_batch, scoring


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


__all__ = [
    "TextModel",
    "has_prefix_cache",
    "llm_text_model",
    "member_count",
    "member_losses",
    "member_losses_cached",
    "prefix_cache",
    "prompt_losses",
]
