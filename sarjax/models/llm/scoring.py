"""Per-token target NLL of candidate prompts, for one model or a stacked pool.

This is the inner loop of BEAST / GCG: for N candidate prompts and one target
continuation, the negative log-likelihood of every target token under every
member of a stack, in one compiled call. Prompts are left-padded, so the target
always occupies the last ``Tt`` positions of each row.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.models.llm import decoder
from sarjax.models.llm.config import DecoderConfig
from sarjax.models.llm.decoder import KVBlock, Params


def target_nll_from_embeds(
    params: Params,
    cfg: DecoderConfig,
    x,
    mask,
    target,
    target_mask=None,
    prefix: Sequence[KVBlock] = (),
):
    """Per-token NLL of ``target`` after ONE prompt given as embeddings (differentiable).

    Args:
      params: parameter tree of one model.
      cfg: static configuration.
      x: [T, d] prompt embeddings (left padding allowed).
      mask: [T] 0/1 prompt padding mask.
      target: [Tt] int32 target token ids (right padding allowed).
      target_mask: [Tt] 0/1 (default all ones); padded target tokens get NLL 0.
      prefix: optional read-only KV blocks before the prompt (shared-prefix cache).

    Returns:
      [Tt] float32 NLL of each target token.
    """
    if target_mask is None:
        target_mask = jnp.ones(target.shape, jnp.int32)
    t = x.shape[0]
    tt = target.shape[0]
    xs = jnp.concatenate([x, decoder.embed_tokens(params, target).astype(x.dtype)], axis=0)
    full_mask = jnp.concatenate([mask.astype(jnp.int32), target_mask.astype(jnp.int32)])
    offset = sum((jnp.sum(b.mask.astype(jnp.int32)) for b in prefix), 0)
    pos = decoder.positions_from_mask(full_mask, offset)
    h, _ = decoder.hidden_states(params, cfg, xs, full_mask, pos, prefix, return_kv=False)
    lg = decoder.lm_head(params, cfg, jax.lax.dynamic_slice_in_dim(h, t - 1, tt, axis=0))
    nll = jax.nn.logsumexp(lg, axis=-1) - jnp.take_along_axis(lg, target[:, None], axis=-1)[:, 0]
    return nll * target_mask.astype(nll.dtype)


def target_nll(params: Params, cfg: DecoderConfig, ids, mask, target, target_mask=None, prefix: Sequence[KVBlock] = ()):
    """Per-token NLL of ``target`` after ONE prompt of token ids.

    Args:
      ids: [T] int32 prompt ids; other arguments as in ``target_nll_from_embeds``.

    Returns:
      [Tt] float32 NLL of each target token.
    """
    return target_nll_from_embeds(params, cfg, decoder.embed_tokens(params, ids), mask, target, target_mask, prefix)


def _batch_nll(params, cfg, ids, mask, target, target_mask, prefix):
    tgt_axis = 0 if target.ndim == 2 else None
    return jax.vmap(
        lambda i, m, t, tm: target_nll(params, cfg, i, m, t, tm, prefix),
        in_axes=(0, 0, tgt_axis, tgt_axis),
    )(ids, mask, target, target_mask)


@partial(jax.jit, static_argnames=("cfg",))
def _stack_nll(params, cfg, ids, mask, target, target_mask, prefix):
    if prefix is None:
        return jax.vmap(lambda p: _batch_nll(p, cfg, ids, mask, target, target_mask, ()))(params)
    return jax.vmap(lambda p, pre: _batch_nll(p, cfg, ids, mask, target, target_mask, (pre,)))(params, prefix)


def _check_ids(name, a, ndim):
    a = np.asarray(a)
    if a.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-d array, got shape {a.shape}")
    if not np.issubdtype(a.dtype, np.integer) and not np.issubdtype(a.dtype, np.bool_):
        raise TypeError(f"{name}: expected integer ids/mask, got dtype {a.dtype}")
    return a


def stack_target_nll(
    params: Params,
    cfg: DecoderConfig,
    ids,
    mask,
    target,
    target_mask=None,
    prefix: KVBlock | None = None,
):
    """Per-member, per-candidate, per-token target NLL for a stack of M members.

    Args:
      params: stacked parameter tree, leading axis [M].
      cfg: the stack's configuration.
      ids: [N, T] int32 candidate prompts, left-padded.
      mask: [N, T] 0/1 padding mask.
      target: [Tt] (shared) or [N, Tt] int32 target ids, right-padded.
      target_mask: like ``target``, 0/1 (default all ones).
      prefix: optional shared-prefix cache from ``stack_prefix_cache`` (leading [M]),
        placed before every candidate.

    Returns:
      [M, N, Tt] float32 NLLs (0 at padded target tokens).

    Raises:
      ValueError / TypeError: shapes or dtypes not as above; an id outside ``[0, V)``; a prompt
        row that is not left-padded or has no real token, a target row that is not right-padded;
        (GPT-2) a row whose prefix + prompt + target tokens exceed ``max_position_embeddings``.
        Each names the row and position.
    """
    ids = _check_ids("ids", ids, 2)
    mask = _check_ids("mask", mask, 2)
    if mask.shape != ids.shape:
        raise ValueError(f"mask: expected shape {ids.shape}, got {mask.shape}")
    target = _check_ids("target", target, np.ndim(target))
    if target.ndim not in (1, 2) or (target.ndim == 2 and target.shape[0] != ids.shape[0]):
        raise ValueError(f"target: expected [Tt] or [N={ids.shape[0]}, Tt], got shape {target.shape}")
    if target_mask is None:
        target_mask = np.ones(target.shape, np.int32)
    elif np.shape(target_mask) != target.shape:
        raise ValueError(f"target_mask: expected shape {target.shape}, got {np.shape(target_mask)}")
    decoder.check_token_ids("ids", ids, cfg.vocab_size)
    decoder.check_token_ids("target", target, cfg.vocab_size)
    # the target follows the prompt's last slot: prompts left-padded, targets right-padded
    offset = decoder.prefix_length(prefix)
    m = decoder.check_padding("mask", mask, "left")
    tm = decoder.check_padding("target_mask", target_mask, "right", allow_empty=True)
    decoder.check_positions(cfg, "ids + target", m.sum(-1) + tm.sum(-1), offset)
    return _stack_nll(
        params,
        cfg,
        jnp.asarray(ids, jnp.int32),
        jnp.asarray(mask, jnp.int32),
        jnp.asarray(target, jnp.int32),
        jnp.asarray(target_mask, jnp.int32),
        prefix,
    )


@partial(jax.jit, static_argnames=("cfg",))
def _stack_prefix(params, cfg, ids, mask):
    return jax.vmap(lambda p: decoder.prefill(p, cfg, ids, mask)[1])(params)


def stack_prefix_cache(params: Params, cfg: DecoderConfig, ids, mask=None) -> KVBlock:
    """Shared-prefix KV cache of ONE prompt prefix for every member of a stack.

    Args:
      params: stacked parameter tree [M, ...].
      cfg: configuration.
      ids: [P] int32 prefix ids.
      mask: [P] 0/1 (default all ones).

    Returns:
      KVBlock with k, v [M, L, P, Hkv, D], mask [M, P], pos [M, P].

    Raises:
      ValueError: an id outside ``[0, V)`` (a cache built from it would make every later score
        NaN), or (GPT-2) more tokens than ``max_position_embeddings``.
    """
    ids = _check_ids("ids", ids, 1)
    mask = np.ones(ids.shape, np.int32) if mask is None else _check_ids("mask", mask, 1)
    if mask.shape != ids.shape:
        raise ValueError(f"mask: expected shape {ids.shape}, got {mask.shape}")
    decoder.check_token_ids("ids", ids, cfg.vocab_size)
    decoder.check_positions(cfg, "ids", int(np.asarray(mask != 0).sum()))
    return _stack_prefix(params, cfg, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32))
