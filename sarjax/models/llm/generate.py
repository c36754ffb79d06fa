"""Deterministic greedy decoding with a preallocated KV cache.

The prompt is run once (prefill); its keys/values go into a cache of
``P + max_new_tokens`` slots, and each new token attends to the cache and is
written into it with ``lax.dynamic_update_slice`` inside one ``lax.scan``.
Written for one sequence and vmapped over the batch (left padding with masks)
and over the members of a stack. An optional shared-prefix ``KVBlock`` (see
``scoring.stack_prefix_cache`` / ``decoder.prefill``) sits before every prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import jax
import jax.core  # jax.core.Tracer: a concrete value can be checked on the host
import jax.numpy as jnp
import numpy as np

from sarjax.models.llm import decoder
from sarjax.models.llm.config import DecoderConfig
from sarjax.models.llm.decoder import KVBlock, Params


def greedy_one(
    params: Params,
    cfg: DecoderConfig,
    ids,
    mask,
    max_new_tokens: int,
    eos_id=-1,
    pad_id: int = 0,
    prefix: Sequence[KVBlock] = (),
):
    """Greedy continuation of ONE (left-padded) prompt.

    Args:
      params: one model's parameters.
      cfg: static configuration.
      ids: [P] int32 prompt.
      mask: [P] 0/1 padding mask.
      max_new_tokens: static number of tokens to produce (>= 1).
      eos_id: int or [K] ints; tokens after the first of them are replaced by ``pad_id`` (-1: none).
      pad_id: filler after EOS.
      prefix: read-only KV blocks before the prompt.

    Returns:
      [max_new_tokens] int32 generated ids.
    """
    if _concrete(ids, mask, prefix):
        decoder.check_padding("mask", mask, "left")
        decoder.check_positions(cfg, "ids", int(np.asarray(mask).sum()) + max_new_tokens, decoder.prefix_length(prefix))
    p_len = ids.shape[0]
    offset = sum((jnp.sum(b.mask.astype(jnp.int32)) for b in prefix), 0)
    pos = decoder.positions_from_mask(mask, offset)
    h, (k, v) = decoder.hidden_states(params, cfg, decoder.embed_tokens(params, ids), mask, pos, prefix)
    first = jnp.argmax(decoder.lm_head(params, cfg, h[-1])).astype(jnp.int32)
    s = p_len + max_new_tokens
    kshape = (cfg.num_layers, s) + k.shape[2:]
    kc = jax.lax.dynamic_update_slice(jnp.zeros(kshape, k.dtype), k, (0, 0, 0, 0))
    vc = jax.lax.dynamic_update_slice(jnp.zeros(kshape, v.dtype), v, (0, 0, 0, 0))
    cmask = jnp.zeros((s,), bool).at[:p_len].set(mask.astype(bool))
    cpos = jnp.zeros((s,), jnp.int32).at[:p_len].set(pos)
    n_real = offset + jnp.sum(mask.astype(jnp.int32))

    def step(carry, t):
        kc, vc, cmask, cpos, tok = carry
        p = (n_real + t)[None].astype(jnp.int32)
        blocks = tuple(prefix) + (KVBlock(kc, vc, cmask, cpos),)
        x = decoder.embed_tokens(params, tok[None])
        h, (kn, vn) = decoder.hidden_states(params, cfg, x, jnp.ones((1,), jnp.int32), p, blocks)
        slot = p_len + t
        kc = jax.lax.dynamic_update_slice(kc, kn, (0, slot, 0, 0))
        vc = jax.lax.dynamic_update_slice(vc, vn, (0, slot, 0, 0))
        cmask = jax.lax.dynamic_update_slice(cmask, jnp.ones((1,), bool), (slot,))
        cpos = jax.lax.dynamic_update_slice(cpos, p, (slot,))
        nxt = jnp.argmax(decoder.lm_head(params, cfg, h[0])).astype(jnp.int32)
        return (kc, vc, cmask, cpos, nxt), nxt

    _, rest = jax.lax.scan(step, (kc, vc, cmask, cpos, first), jnp.arange(max_new_tokens - 1))
    out = jnp.concatenate([first[None], rest])
    eos = jnp.atleast_1d(jnp.asarray(eos_id, jnp.int32))
    is_eos = (out[:, None] == eos[None, :]).any(axis=-1)
    after = (jnp.cumsum(is_eos) - is_eos) > 0
    return jnp.where(after, pad_id, out)


@partial(jax.jit, static_argnames=("cfg", "max_new_tokens"))
def _batch_greedy(params, cfg, ids, mask, max_new_tokens, eos_id, pad_id, prefix):
    pre = () if prefix is None else (prefix,)
    return jax.vmap(lambda i, m: greedy_one(params, cfg, i, m, max_new_tokens, eos_id, pad_id, pre))(ids, mask)


@partial(jax.jit, static_argnames=("cfg", "max_new_tokens"))
def _stack_greedy(params, cfg, ids, mask, max_new_tokens, eos_id, pad_id, prefix):
    def member(p, pre):
        pre = () if pre is None else (pre,)
        return jax.vmap(lambda i, m: greedy_one(p, cfg, i, m, max_new_tokens, eos_id, pad_id, pre))(ids, mask)

    if prefix is None:
        return jax.vmap(lambda p: member(p, None))(params)
    return jax.vmap(member)(params, prefix)


def _concrete(*xs) -> bool:
    return not any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(xs))


def _eos_array(cfg, eos_id) -> jax.Array:
    """eos_id (None, an int, or a list of ints as in Llama-3 / Qwen2.5 ``generation_config.json``)
    -> [K] int32 (``[-1]`` for None: never matches)."""
    if eos_id is None:
        return jnp.asarray([-1], jnp.int32)
    e = np.asarray(eos_id)
    if e.dtype == bool or not np.issubdtype(e.dtype, np.integer) or e.ndim > 1 or e.size == 0:
        raise ValueError(f"eos_id: expected None, an int or a non-empty list of ints, got {eos_id!r}")
    e = np.atleast_1d(e)
    bad = (e < 0) | (e >= cfg.vocab_size)
    if bad.any():
        raise ValueError(
            f"eos_id: {e[bad].tolist()} outside the vocabulary [0, {cfg.vocab_size}) (generation would never stop on it)"
        )
    return jnp.asarray(e, jnp.int32)


def _validate(cfg, ids, mask, max_new_tokens, prefix=None):
    """Boundary checks of the batched entries (outside jit); every error names the row and position."""
    ids = np.asarray(ids)
    if ids.ndim != 2:
        raise ValueError(f"ids: expected [B, P] int32, got shape {ids.shape}")
    if not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"ids: expected integer dtype, got {ids.dtype}")
    mask = np.ones(ids.shape, np.int32) if mask is None else np.asarray(mask)
    if mask.shape != ids.shape:
        raise ValueError(f"mask: expected shape {ids.shape}, got {mask.shape}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: expected a positive int, got {max_new_tokens!r}")
    decoder.check_token_ids("ids", ids, cfg.vocab_size)
    # the first new token is read from the last prompt slot: a right-padded row would continue
    # from a padding token (another continuation, silently)
    m = decoder.check_padding("mask", mask, "left")
    decoder.check_positions(
        cfg, f"ids + max_new_tokens={max_new_tokens}", m.sum(-1) + max_new_tokens, decoder.prefix_length(prefix)
    )
    return jnp.asarray(ids, jnp.int32), jnp.asarray(m, jnp.int32)


def greedy_generate(
    params: Params,
    cfg: DecoderConfig,
    ids,
    mask=None,
    max_new_tokens: int = 32,
    eos_id: int | Sequence[int] | None = None,
    pad_id: int = 0,
    prefix: KVBlock | None = None,
):
    """Greedy decoding of a left-padded batch with one model.

    Args:
      params: one model's parameters.
      cfg: configuration.
      ids: [B, P] int32 prompts, left-padded.
      mask: [B, P] 0/1 (default all ones).
      max_new_tokens: tokens to produce per prompt.
      eos_id: an int or a list of ints (the list form of Llama-3 / Qwen2.5
        ``generation_config.json``): tokens after the first of them become ``pad_id``
        (None: no EOS handling).
      pad_id: filler id.
      prefix: optional shared-prefix KVBlock (from ``decoder.prefill``) before every prompt.

    Returns:
      [B, max_new_tokens] int32.

    Raises:
      ValueError / TypeError: shapes or dtypes as above; an id outside ``[0, V)``; a mask row that
        is not left-padded (right padding would continue from a padding token) or has no real
        token; an ``eos_id`` outside ``[0, V)``; (GPT-2) a row whose prefix-cache + prompt + new
        tokens exceed ``max_position_embeddings``. Each names the row and position.
    """
    ids, mask = _validate(cfg, ids, mask, max_new_tokens, prefix)
    eos = _eos_array(cfg, eos_id)
    return _batch_greedy(params, cfg, ids, mask, max_new_tokens, eos, jnp.int32(pad_id), prefix)


def stack_greedy_generate(
    params: Params,
    cfg: DecoderConfig,
    ids,
    mask=None,
    max_new_tokens: int = 32,
    eos_id: int | Sequence[int] | None = None,
    pad_id: int = 0,
    prefix: KVBlock | None = None,
):
    """Greedy decoding of the same batch by every member of a stack.

    Args:
      params: stacked parameters [M, ...].
      ids, mask, max_new_tokens, eos_id, pad_id: as in ``greedy_generate``.
      prefix: optional stacked shared-prefix cache from ``scoring.stack_prefix_cache``.

    Returns:
      [M, B, max_new_tokens] int32.

    Raises:
      ValueError / TypeError: as ``greedy_generate``.
    """
    ids, mask = _validate(cfg, ids, mask, max_new_tokens, prefix)
    eos = _eos_array(cfg, eos_id)
    return _stack_greedy(params, cfg, ids, mask, max_new_tokens, eos, jnp.int32(pad_id), prefix)
