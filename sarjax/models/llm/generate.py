"""Greedy and sampled decoding with a preallocated KV cache.

The prompt is run once (prefill); its keys/values go into a cache of
``P + max_new_tokens`` slots, and each new token attends to the cache and is
written into it with ``lax.dynamic_update_slice`` inside one ``lax.scan``.
Written for one sequence and vmapped over the batch (left padding with masks)
and over the members of a stack. An optional shared-prefix ``KVBlock`` (see
``scoring.stack_prefix_cache`` / ``decoder.prefill``) sits before every prompt. Greedy is the
default for judging (the SAR paper decodes deterministically); sampling (temperature, top-k,
top-p, seeded per sample and per member) shares the same loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import NamedTuple

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
    return _decode_one(params, cfg, ids, mask, max_new_tokens, eos_id, pad_id, prefix, _argmax)


def _argmax(lg, t):
    return jnp.argmax(lg).astype(jnp.int32)


def filter_logits(logits, temperature=1.0, top_k=0, top_p=1.0):
    """Temperature, then top-k, then top-p (nucleus) filtering of ONE logit vector.

    The order and the tie rules are transformers' logits warpers (``TemperatureLogitsWarper``,
    ``TopKLogitsWarper``: every token tied with the k-th largest is kept; ``TopPLogitsWarper``:
    the smallest set of most likely tokens whose probability reaches ``top_p``, at least one;
    top-p is computed on the top-k-filtered, temperature-scaled distribution). Holtzman et al.
    2020 define nucleus sampling. Every argument may be traced (no recompilation per setting).

    Args:
      logits: [V] float logits.
      temperature: scalar > 0 (the caller handles 0 = greedy; see :func:`sample_token`).
      top_k: scalar int; 0 (or < 0) keeps every token.
      top_p: scalar in (0, 1]; 1 keeps every token.

    Returns:
      [V] float32 logits divided by the temperature, ``-inf`` at the filtered-out tokens.
    """
    z = logits.astype(jnp.float32) / jnp.maximum(jnp.asarray(temperature, jnp.float32), 1e-20)
    v = z.shape[-1]
    order = jnp.argsort(-z)  # descending, stable
    zs = z[order]
    top_k = jnp.asarray(top_k, jnp.int32)
    kth = zs[jnp.clip(top_k - 1, 0, v - 1)]
    keep = (top_k <= 0) | (zs >= kth)
    p = jax.nn.softmax(jnp.where(keep, zs, -jnp.inf))
    before = jnp.cumsum(p) - p  # probability of the more likely tokens
    top_p = jnp.asarray(top_p, jnp.float32)
    # top_p >= 1 is off (transformers skips the warper): float32 cumulative sums reach 1 before the
    # tail, which would otherwise drop its least likely tokens
    keep = keep & ((before < top_p) | (top_p >= 1.0) | (jnp.arange(v) == 0))
    return jnp.full((v,), -jnp.inf, jnp.float32).at[order].set(jnp.where(keep, zs, -jnp.inf))


def sample_token(key, logits, temperature=1.0, top_k=0, top_p=1.0):
    """One token drawn from ``softmax(filter_logits(logits, temperature, top_k, top_p))``.

    Args:
      key: PRNG key.
      logits: [V] float logits.
      temperature: scalar; ``<= 0`` is greedy (the argmax; no draw).
      top_k, top_p: as in :func:`filter_logits`.

    Returns:
      int32 scalar token id.
    """
    drawn = jax.random.categorical(key, filter_logits(logits, temperature, top_k, top_p)).astype(jnp.int32)
    return jnp.where(jnp.asarray(temperature) > 0, drawn, jnp.argmax(logits).astype(jnp.int32))


class _SamplingFields(NamedTuple):
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    eos_id: int | Sequence[int] | None = None
    pad_id: int = 0


class SamplingConfig(_SamplingFields):
    """The sampling settings of :func:`sample_one`, :func:`sample_generate`,
    :func:`stack_sample_generate` and :func:`sarjax.models.llm.pool.pool_generate_text`.

    A NamedTuple (a pytree: its fields may be traced inside ``jit``, one compile for every
    setting); concrete values are checked when it is built.

    Attributes:
      temperature: ``>= 0``; 0 is greedy (transformers' default 1.0).
      top_k: an int ``>= 0``, 0 = off (transformers' ``GenerationConfig`` default is 50; here 0, so
        that a call samples ``softmax(logits / T)`` unless asked otherwise).
      top_p: in ``(0, 1]``, 1 = off (transformers' default 1.0).
      eos_id: None (no end token), an int, or a non-empty list of ints (the list form of
        Llama-3 / Qwen2.5 ``generation_config.json``): tokens after the first of them become
        ``pad_id``. Checked against the vocabulary when a decoder uses it.
      pad_id: an int, the filler after the end token (a checkpoint's ``pad_token_id`` may be -1).

    Fields may also be arrays (one setting per row under ``vmap``): every element is checked.

    Raises:
      ValueError: a concrete field out of range or not an int where one is expected (naming the
        field and the value).
      TypeError: ``temperature`` / ``top_p`` not a number.
    """

    __slots__ = ()

    def __new__(
        cls,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        eos_id: int | Sequence[int] | None = None,
        pad_id: int = 0,
    ) -> SamplingConfig:
        _check_sampling(temperature, top_k, top_p, eos_id, pad_id)
        return super().__new__(cls, temperature, top_k, top_p, eos_id, pad_id)


def _traced(v) -> bool:
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(v))


def _numbers(name: str, v, integer: bool):
    """``v`` as a numpy array of numbers (any shape: a batch of settings under ``vmap``), or None
    when it is traced (checked by nobody: one compile for every setting)."""
    if _traced(v):
        return None
    a = None if isinstance(v, (bool, str, bytes)) else np.asarray(v)
    kind = "an int" if integer else "a number"
    if a is None or a.dtype == bool or not np.issubdtype(a.dtype, np.integer if integer else np.number):
        err = ValueError if integer else TypeError  # a float top_k is a bad value, a string temperature a bad type
        raise err(f"SamplingConfig.{name}: expected {kind}, got {v!r}")
    return a


def _check_sampling(temperature, top_k, top_p, eos_id, pad_id) -> None:
    """Host checks of the concrete fields of a :class:`SamplingConfig` (traced ones are skipped)."""
    t = _numbers("temperature", temperature, False)
    if t is not None and not (np.all(np.isfinite(t)) and np.all(t >= 0)):
        raise ValueError(f"SamplingConfig.temperature: expected a finite number >= 0 (0: greedy), got {temperature!r}")
    p = _numbers("top_p", top_p, False)
    if p is not None and not np.all((p > 0) & (p <= 1)):
        raise ValueError(f"SamplingConfig.top_p: expected a number in (0, 1] (1: no nucleus filter), got {top_p!r}")
    k = _numbers("top_k", top_k, True)
    if k is not None and np.any(k < 0):
        raise ValueError(f"SamplingConfig.top_k: expected an int >= 0 (0: no top-k filter), got {top_k!r}")
    _numbers("pad_id", pad_id, True)
    if eos_id is not None and not _traced(eos_id):
        e = np.asarray(eos_id)
        ints = not isinstance(eos_id, bool) and e.dtype != bool and np.issubdtype(e.dtype, np.integer)
        if not ints or e.ndim > 1 or e.size == 0 or np.any(e < 0):
            raise ValueError(
                f"SamplingConfig.eos_id: expected None, an int >= 0 or a non-empty list of ints >= 0, got {eos_id!r}"
            )


def sample_one(
    params: Params,
    cfg: DecoderConfig,
    ids,
    mask,
    max_new_tokens: int,
    key,
    sampling: SamplingConfig | None = None,
    prefix: Sequence[KVBlock] = (),
):
    """Sampled continuation of ONE (left-padded) prompt (same KV-cache path as :func:`greedy_one`).

    Token ``t`` is drawn with :func:`sample_token` from ``fold_in(key, t)``.

    Args:
      params, cfg, ids, mask, max_new_tokens, prefix: as in :func:`greedy_one`.
      key: PRNG key of this sequence.
      sampling: a :class:`SamplingConfig` (temperature, top-k, top-p, end tokens, pad id; its
        fields may be traced scalars, ``eos_id`` an int or ``[K]`` ints); None: ``SamplingConfig()``.

    Returns:
      [max_new_tokens] int32 generated ids.
    """
    if sampling is None:
        sampling = SamplingConfig()
    t, k, p = sampling.temperature, sampling.top_k, sampling.top_p
    eos_id = -1 if sampling.eos_id is None else sampling.eos_id

    def pick(lg, step):
        return sample_token(jax.random.fold_in(key, step), lg, t, k, p)

    return _decode_one(params, cfg, ids, mask, max_new_tokens, eos_id, sampling.pad_id, prefix, pick)


def _decode_one(params, cfg, ids, mask, max_new_tokens, eos_id, pad_id, prefix, pick):
    """The KV-cache decoding loop of one prompt; ``pick(logits [V], t) -> int32`` chooses token t."""
    if _concrete(ids, mask, prefix):
        decoder.check_padding("mask", mask, "left")
        decoder.check_positions(cfg, "ids", int(np.asarray(mask).sum()) + max_new_tokens, decoder.prefix_length(prefix))
    p_len = ids.shape[0]
    offset = sum((jnp.sum(b.mask.astype(jnp.int32)) for b in prefix), 0)
    pos = decoder.positions_from_mask(mask, offset)
    h, (k, v) = decoder.hidden_states(params, cfg, decoder.embed_tokens(params, ids), mask, pos, prefix)
    first = pick(decoder.lm_head(params, cfg, h[-1]), 0)
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
        nxt = pick(decoder.lm_head(params, cfg, h[0]), t + 1)
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


@partial(jax.jit, static_argnames=("cfg", "max_new_tokens"))
def _stack_sample(params, cfg, ids, mask, max_new_tokens, key, sample_ids, member_ids, knobs, eos_id, pad_id, prefix):
    temperature, top_k, top_p = knobs

    def member(p, mid, pre):
        pre = () if pre is None else (pre,)

        def row(i, m, sid):
            k = jax.random.fold_in(jax.random.fold_in(key, sid), mid)
            return sample_one(
                p, cfg, i, m, max_new_tokens, k, SamplingConfig(temperature, top_k, top_p, eos_id, pad_id), pre
            )

        return jax.vmap(row)(ids, mask, sample_ids)

    if prefix is None:
        return jax.vmap(lambda p, mid: member(p, mid, None))(params, member_ids)
    return jax.vmap(member)(params, member_ids, prefix)


@partial(jax.jit, static_argnames=("cfg", "max_new_tokens"))
def _batch_sample(params, cfg, ids, mask, max_new_tokens, key, sample_ids, knobs, eos_id, pad_id, prefix):
    temperature, top_k, top_p = knobs
    pre = () if prefix is None else (prefix,)

    def row(i, m, sid):
        k = jax.random.fold_in(key, sid)
        return sample_one(
            params, cfg, i, m, max_new_tokens, k, SamplingConfig(temperature, top_k, top_p, eos_id, pad_id), pre
        )

    return jax.vmap(row)(ids, mask, sample_ids)


def _sampling_args(cfg, sampling):
    """A :class:`SamplingConfig` (checked when built) -> ``(knobs, eos [K], pad)`` as the compiled
    decoders take them (traced scalars: one compile for every setting)."""
    if sampling is None:
        sampling = SamplingConfig()
    if not isinstance(sampling, SamplingConfig):
        raise TypeError(f"sampling: expected a SamplingConfig or None, got {type(sampling).__name__}")
    knobs = (jnp.float32(sampling.temperature), jnp.int32(sampling.top_k), jnp.float32(sampling.top_p))
    return knobs, _eos_array(cfg, sampling.eos_id), jnp.int32(sampling.pad_id)


def _ids_vector(name, v, n, default):
    a = np.arange(n, dtype=np.int64) if v is None else np.asarray(v)
    if a.shape != (n,) or not np.issubdtype(a.dtype, np.integer) or np.any(a < 0):
        raise ValueError(f"{name}: expected [{n}] non-negative ints ({default}), got {v!r}")
    return jnp.asarray(a, jnp.uint32)


def sample_generate(
    params: Params,
    cfg: DecoderConfig,
    ids,
    mask=None,
    max_new_tokens: int = 32,
    *,
    key,
    sampling: SamplingConfig | None = None,
    prefix: KVBlock | None = None,
    sample_ids=None,
):
    """Sampled decoding of a left-padded batch with one model (temperature, top-k, top-p).

    Row ``b`` draws from ``fold_in(key, sample_ids[b])`` (token ``t`` from a further
    ``fold_in(., t)``), so a row's output does not depend on the batch it is in, and the same key
    gives the same output. ``SamplingConfig(temperature=0)`` is greedy (equal to
    :func:`greedy_generate`).

    Args:
      params, cfg, ids, mask, max_new_tokens, prefix: as in :func:`greedy_generate`.
      key: PRNG key (required).
      sampling: a :class:`SamplingConfig` (temperature, top_k, top_p, eos_id, pad_id; default
        None: ``SamplingConfig()``, temperature 1, no top-k / top-p filter, no end token, pad 0).
      sample_ids: [B] non-negative ints (default ``arange(B)``).

    Returns:
      [B, max_new_tokens] int32.

    Raises:
      TypeError: ``key`` is None; ``sampling`` not a :class:`SamplingConfig`.
      ValueError / TypeError: as :func:`greedy_generate` (``sampling.eos_id`` outside the vocabulary).
    """
    if key is None:
        raise TypeError("sample_generate: key is required (a jax.random key); sarjax never defaults it")
    knobs, eos, pad = _sampling_args(cfg, sampling)
    ids, mask = _validate(cfg, ids, mask, max_new_tokens, prefix)
    sid = _ids_vector("sample_ids", sample_ids, ids.shape[0], "one per prompt")
    return _batch_sample(params, cfg, ids, mask, max_new_tokens, key, sid, knobs, eos, pad, prefix)


def stack_sample_generate(
    params: Params,
    cfg: DecoderConfig,
    ids,
    mask=None,
    max_new_tokens: int = 32,
    *,
    key,
    sampling: SamplingConfig | None = None,
    prefix: KVBlock | None = None,
    sample_ids=None,
    member_ids=None,
):
    """Sampled decoding of the same batch by every member of a stack, in one compiled call.

    Member ``m``, row ``b`` draws from ``fold_in(fold_in(key, sample_ids[b]), member_ids[m])``:
    members draw independently, and a member's output depends only on its own id (pass its
    index in the whole pool as ``member_ids`` so that a pool's stacks do not share draws).

    Args:
      params: stacked parameters [M, ...].
      ids, mask, max_new_tokens, key, sampling, sample_ids: as in :func:`sample_generate`.
      prefix: optional stacked shared-prefix cache from ``scoring.stack_prefix_cache``.
      member_ids: [M] non-negative ints (default ``arange(M)``).

    Returns:
      [M, B, max_new_tokens] int32.

    Raises:
      TypeError / ValueError: as :func:`sample_generate`.
    """
    if key is None:
        raise TypeError("stack_sample_generate: key is required (a jax.random key); sarjax never defaults it")
    knobs, eos, pad = _sampling_args(cfg, sampling)
    ids, mask = _validate(cfg, ids, mask, max_new_tokens, prefix)
    sid = _ids_vector("sample_ids", sample_ids, ids.shape[0], "one per prompt")
    m = int(jax.tree.leaves(params)[0].shape[0])
    mid = _ids_vector("member_ids", member_ids, m, "one per member")
    return _stack_sample(params, cfg, ids, mask, max_new_tokens, key, sid, mid, knobs, eos, pad, prefix)


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
