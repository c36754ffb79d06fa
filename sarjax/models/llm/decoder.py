"""A pure decoder-only transformer (Llama family and GPT-2), written for one sequence.

Parameters are a plain dict pytree; per-layer weights are stacked on a leading
``[L, ...]`` axis and the layers run inside one ``lax.scan``. Every function here
takes ONE sequence (``[T]`` ids, ``[T, d]`` embeddings); batches and pools are
``jax.vmap`` of these.

Attention is written over *blocks* of keys/values: the sequence's own block
(causal, masked by the padding mask) plus any number of read-only external blocks
(a shared-prefix cache, a preallocated decoding cache). Each block has its own
validity mask and key positions, so one code path serves full forward passes,
shared-prefix scoring and KV-cache decoding.

Parameter tree (llama family)::

    embed [V, d], final_norm [d], lm_head [d, V] (absent when tied),
    layers: attn_norm [L, d], wq [L, d, H*D], wk/wv [L, d, Hkv*D], wo [L, H*D, d],
            (bq [L, H*D], bk/bv [L, Hkv*D] if qkv_bias; bo [L, d] if o_bias;
            q_norm/k_norm [L, D] if qk_norm),
            mlp_norm [L, d], w_gate/w_up [L, d, F], w_down [L, F, d]
            (b_gate/b_up [L, F], b_down [L, d] if mlp_bias)

Parameter tree (gpt2)::

    embed [V, d], pos_embed [P, d], final_norm [d], final_norm_b [d],
    layers: ln1 [L, d], ln1_b [L, d], w_qkv [L, d, 3d], b_qkv [L, 3d], wo [L, d, d], bo [L, d],
            ln2 [L, d], ln2_b [L, d], w_fc [L, d, F], b_fc [L, F], w_proj [L, F, d], b_proj [L, d]
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, Literal, NamedTuple, overload

import jax
import jax.core  # jax.core.Tracer: a concrete value can be checked on the host
import jax.numpy as jnp
import numpy as np

from sarjax.models.llm.config import DecoderConfig, rope_inv_freq

Params = dict[str, Any]
_NEG = float(np.finfo(np.float32).min)


# ----------------------------------------------------------------------------- boundary checks
# The model functions below are pure and run under jit / vmap; these checks run only when their
# inputs are concrete (an eager call), and are skipped while tracing. The batched public entries
# (scoring.stack_*, generate.*) run their own checks before entering jit.


def _concrete(*xs) -> bool:
    return not any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(xs))


def _where(idx: tuple[int, ...]) -> str:
    """'position 5' (one sequence) or 'row 2, position 5' (a batch)."""
    return f"position {idx[-1]}" if len(idx) == 1 else f"row {', '.join(map(str, idx[:-1]))}, position {idx[-1]}"


def check_token_ids(name: str, ids, vocab_size: int) -> None:
    """Raises ValueError naming the first id outside ``[0, vocab_size)``: ids [..., T] integer.

    ``jnp.take`` would turn such an id into a NaN embedding, and every later score into NaN.
    """
    a = np.asarray(ids)
    bad = (a < 0) | (a >= vocab_size)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"{name}: token id {int(a[idx])} at {_where(idx)} is outside the vocabulary "
            f"[0, {vocab_size}) ({int(bad.sum())} such id(s))"
        )


def prefix_length(prefix) -> int:
    """Real tokens in read-only KV blocks (a KVBlock, a sequence of them or None; stacked ones count
    the largest member)."""
    blocks = () if prefix is None else (prefix,) if isinstance(prefix, KVBlock) else tuple(prefix)
    total = 0
    for b in blocks:
        m = np.asarray(b.mask).astype(np.int64)
        total += int(m.reshape(-1, m.shape[-1]).sum(-1).max()) if m.size else 0
    return total


def check_positions(cfg: DecoderConfig, name: str, needed, offset: int = 0) -> None:
    """GPT-2's learned position table has ``max_position_embeddings`` rows; a position past it
    would read a NaN embedding. Raises ValueError naming the first row that does not fit.

    Args:
      cfg: configuration (only ``family == "gpt2"`` is checked: RoPE positions are computed, so
        llama-family models give finite logits past ``max_position_embeddings``, as transformers).
      name: what the rows are (e.g. "ids").
      needed: int or [N] ints, positions each row needs after the prefix (its real tokens, plus
        target / generated tokens).
      offset: real tokens of a prefix cache before every row.
    """
    if cfg.family != "gpt2":
        return
    need = np.atleast_1d(np.asarray(needed, np.int64)) + int(offset)
    over = np.flatnonzero(need > cfg.max_position_embeddings)
    if over.size:
        r = int(over[0])
        row = f"row {r}" if np.ndim(needed) else "the sequence"
        raise ValueError(
            f"{name}: {row} needs {int(need[r])} positions ({int(offset)} prefix-cache tokens + "
            f"{int(need[r]) - int(offset)}), but GPT-2 has {cfg.max_position_embeddings} learned positions "
            f"(max_position_embeddings); {over.size} row(s) too long"
        )


def check_padding(name: str, mask, side: str = "left", allow_empty: bool = False) -> np.ndarray:
    """Checks a 0/1 mask [..., T]: every row padded on ``side`` only (left: zeros then ones).

    Returns:
      The mask as int8 numpy.

    Raises:
      ValueError: naming the row and position of a value other than 0/1, of padding on the wrong
        side of a real token (e.g. a right-padded prompt, or a hole), or of a row without real
        tokens (unless ``allow_empty``).
    """
    m = np.asarray(mask)
    bad = (m != 0) & (m != 1)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name}: expected 0/1 values, got {m[idx].item()!r} at {_where(idx)}")
    m = m.astype(np.int8)
    if m.shape[-1] > 1:
        step = np.diff(m, axis=-1)
        wrong = np.argwhere(step < 0) if side == "left" else np.argwhere(step > 0)
        if wrong.size:
            idx = tuple(int(i) for i in wrong[0])
            at = idx[:-1] + (idx[-1] + 1,) if side == "left" else idx
            want = (
                "left-padded (zeros before ones, e.g. left_pad())"
                if side == "left"
                else "right-padded (ones before zeros)"
            )
            raise ValueError(
                f"{name}: padding at {_where(at)} is on the wrong side of a real token; rows must be "
                f"{want}, got a {'right' if side == 'left' else 'left'}-padded row or a hole"
            )
    if not allow_empty:
        empty = np.argwhere(m.sum(-1) == 0)
        if empty.size:
            where = f"row {', '.join(map(str, empty[0]))}" if m.ndim > 1 else "the sequence"
            raise ValueError(f"{name}: {where} has no real token (all padding)")
    return m


class KVBlock(NamedTuple):
    """Read-only keys/values of earlier tokens for ONE sequence.

    Attributes:
      k: [L, S, Hkv, D] keys (rotary already applied).
      v: [L, S, Hkv, D] values.
      mask: [S] bool, which slots hold real tokens.
      pos: [S] int32 positions of the slots (for sliding windows).
    """

    k: jax.Array
    v: jax.Array
    mask: jax.Array
    pos: jax.Array


# ----------------------------------------------------------------------------- pieces


def _act(cfg: DecoderConfig, x):
    if cfg.activation == "silu":
        return jax.nn.silu(x)
    if cfg.activation in ("gelu_new", "gelu_pytorch_tanh"):
        return jax.nn.gelu(x, approximate=True)
    if cfg.activation == "gelu":
        return jax.nn.gelu(x, approximate=False)
    return jax.nn.relu(x)


def _rms_norm(x, w, eps):
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return w * xf.astype(x.dtype)


def _layer_norm(x, w, b, eps):
    xf = x.astype(jnp.float32)
    mu = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mu), axis=-1, keepdims=True)
    y = (xf - mu) * jax.lax.rsqrt(var + eps)
    return (y * w.astype(jnp.float32) + b.astype(jnp.float32)).astype(x.dtype)


def _rope(x, cos, sin):
    """x: [T, H, D]; cos/sin: [T, D] float32."""
    xf = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rot = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
    return (xf * cos[:, None, :] + rot * sin[:, None, :]).astype(x.dtype)


def _rope_tables(cfg: DecoderConfig, pos):
    inv = jnp.asarray(rope_inv_freq(cfg))
    freqs = pos.astype(jnp.float32)[:, None] * inv[None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def _attention(cfg: DecoderConfig, q, blocks):
    """q: [T, H, D]; blocks: list of (k [S, Hkv, D], v [S, Hkv, D], allowed [T, S]) -> [T, H*D]."""
    t, h, d = q.shape
    g = h // cfg.num_kv_heads
    qg = q.reshape(t, cfg.num_kv_heads, g, d).astype(jnp.float32) * (1.0 / np.sqrt(d))
    scores = []
    for k, _, allowed in blocks:
        s = jnp.einsum("tkgd,skd->kgts", qg, k.astype(jnp.float32))
        scores.append(jnp.where(allowed[None, None], s, _NEG))
    s = jnp.concatenate(scores, axis=-1)
    p = jax.nn.softmax(s, axis=-1)
    out = None
    start = 0
    for k, v, _ in blocks:
        pb = p[..., start : start + k.shape[0]]
        start += k.shape[0]
        term = jnp.einsum("kgts,skd->tkgd", pb.astype(v.dtype), v)
        out = term if out is None else out + term
    if out is None:
        raise ValueError("attention needs at least one key/value block")
    return out.reshape(t, h * d).astype(q.dtype)


def _lin(x, w, b=None):
    y = x @ w
    return y if b is None else y + b


def _llama_layer(cfg, p, x, cos, sin, self_allowed, ext):
    t = x.shape[0]
    h = _rms_norm(x, p["attn_norm"], cfg.norm_eps)
    q = _lin(h, p["wq"], p.get("bq")).reshape(t, cfg.num_heads, cfg.head_dim)
    k = _lin(h, p["wk"], p.get("bk")).reshape(t, cfg.num_kv_heads, cfg.head_dim)
    v = _lin(h, p["wv"], p.get("bv")).reshape(t, cfg.num_kv_heads, cfg.head_dim)
    if cfg.qk_norm:  # Qwen3: RMSNorm over each head's D before the rotary embedding
        q, k = _rms_norm(q, p["q_norm"], cfg.norm_eps), _rms_norm(k, p["k_norm"], cfg.norm_eps)
    q, k = _rope(q, cos, sin), _rope(k, cos, sin)
    a = _attention(cfg, q, [(k, v, self_allowed)] + ext)
    x = x + _lin(a, p["wo"], p.get("bo"))
    h = _rms_norm(x, p["mlp_norm"], cfg.norm_eps)
    m = _act(cfg, _lin(h, p["w_gate"], p.get("b_gate"))) * _lin(h, p["w_up"], p.get("b_up"))
    x = x + _lin(m, p["w_down"], p.get("b_down"))
    return x, (k, v)


def _gpt2_layer(cfg, p, x, self_allowed, ext):
    t = x.shape[0]
    h = _layer_norm(x, p["ln1"], p["ln1_b"], cfg.norm_eps)
    qkv = _lin(h, p["w_qkv"], p["b_qkv"])
    q, k, v = jnp.split(qkv, 3, axis=-1)
    q = q.reshape(t, cfg.num_heads, cfg.head_dim)
    k = k.reshape(t, cfg.num_heads, cfg.head_dim)
    v = v.reshape(t, cfg.num_heads, cfg.head_dim)
    a = _attention(cfg, q, [(k, v, self_allowed)] + ext)
    x = x + _lin(a, p["wo"], p["bo"])
    h = _layer_norm(x, p["ln2"], p["ln2_b"], cfg.norm_eps)
    x = x + _lin(_act(cfg, _lin(h, p["w_fc"], p["b_fc"])), p["w_proj"], p["b_proj"])
    return x, (k, v)


def _window_ok(cfg, qpos, kpos):
    if cfg.sliding_window is None:
        return True
    return (qpos[:, None] - kpos[None, :]) < cfg.sliding_window


# ----------------------------------------------------------------------------- core


def positions_from_mask(mask, offset: int | jax.Array = 0):
    """Positions of a left- (or right-) padded sequence: real token i gets offset + i.

    Args:
      mask: [T] 0/1 padding mask.
      offset: int scalar, number of real tokens before this block (e.g. a prefix).

    Returns:
      [T] int32; left-pad slots get ``offset`` (their outputs are never used).
    """
    m = mask.astype(jnp.int32)
    return offset + jnp.maximum(jnp.cumsum(m) - 1, 0) * (jnp.sum(m) > 0)


def embed_tokens(params: Params, ids):
    """Token embeddings: ids [T] int32 -> [T, d] (no position embedding).

    Raises:
      ValueError: (eager calls only) an id outside ``[0, V)``, naming its position.
    """
    if _concrete(ids):
        check_token_ids("ids", ids, params["embed"].shape[0])
    return jnp.take(params["embed"], ids, axis=0)


@overload
def hidden_states(
    params: Params, cfg: DecoderConfig, x, mask, pos, prefix: Sequence[KVBlock] = (), return_kv: Literal[True] = True
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]: ...


@overload
def hidden_states(
    params: Params, cfg: DecoderConfig, x, mask, pos, prefix: Sequence[KVBlock] = (), *, return_kv: Literal[False]
) -> tuple[jax.Array, None]: ...


def hidden_states(
    params: Params,
    cfg: DecoderConfig,
    x,
    mask,
    pos,
    prefix: Sequence[KVBlock] = (),
    return_kv: bool = True,
):
    """Runs the decoder stack on ONE sequence of input embeddings.

    Args:
      params: parameter tree (see module docstring).
      cfg: static configuration.
      x: [T, d] token embeddings (GPT-2 position embeddings are added here).
      mask: [T] 0/1, real (1) vs padding (0) tokens of this block.
      pos: [T] int32 positions of this block's tokens.
      prefix: read-only KV blocks of earlier tokens (shared prefix, decoding cache).
      return_kv: static; False skips collecting this block's keys/values (scoring).

    Returns:
      (h, (k, v)): h [T, d] after the final norm; k, v [L, T, Hkv, D] of this block
      (None when ``return_kv`` is False).
    """
    if cfg.family == "gpt2" and _concrete(pos, prefix):
        over = np.flatnonzero(np.asarray(pos) >= cfg.max_position_embeddings)
        if over.size:
            i = int(over[0])
            raise ValueError(
                f"token {i} of the sequence would get position {int(np.asarray(pos)[i])} "
                f"(after {prefix_length(prefix)} prefix-cache tokens), but GPT-2 has "
                f"{cfg.max_position_embeddings} learned positions (max_position_embeddings)"
            )
    mask = mask.astype(bool)
    t = x.shape[0]
    causal = jnp.tril(jnp.ones((t, t), bool))
    self_allowed = causal & mask[None, :] & _window_ok(cfg, pos, pos)
    ext_allowed = [
        jnp.broadcast_to(b.mask.astype(bool)[None, :] & _window_ok(cfg, pos, b.pos), (t, b.mask.shape[0]))
        for b in prefix
    ]
    if cfg.family == "gpt2":
        x = x + jnp.take(params["pos_embed"], pos, axis=0).astype(x.dtype)
    else:
        cos, sin = _rope_tables(cfg, pos)

    def body(x, xs):
        p, eks, evs = xs
        ext = [(ek, ev, al) for ek, ev, al in zip(eks, evs, ext_allowed)]
        if cfg.family == "gpt2":
            x, kv = _gpt2_layer(cfg, p, x, self_allowed, ext)
        else:
            x, kv = _llama_layer(cfg, p, x, cos, sin, self_allowed, ext)
        return x, (kv if return_kv else None)

    xs = (params["layers"], tuple(b.k for b in prefix), tuple(b.v for b in prefix))
    x, kv = jax.lax.scan(body, x, xs)
    if cfg.family == "gpt2":
        x = _layer_norm(x, params["final_norm"], params["final_norm_b"], cfg.norm_eps)
    else:
        x = _rms_norm(x, params["final_norm"], cfg.norm_eps)
    return x, kv


def lm_head(params: Params, cfg: DecoderConfig, h):
    """Final-normed hidden states [..., d] -> float32 logits [..., V]."""
    w = params["embed"].T if cfg.tie_word_embeddings else params["lm_head"]
    return (h @ w).astype(jnp.float32)


def logits_from_embeds(params: Params, cfg: DecoderConfig, x, mask=None, prefix: Sequence[KVBlock] = ()):
    """Logits of ONE sequence as a differentiable function of its input embeddings.

    Args:
      params: parameter tree.
      cfg: static configuration.
      x: [T, d] input embeddings.
      mask: [T] 0/1 padding mask (default all ones).
      prefix: optional read-only KV blocks before this sequence.

    Returns:
      [T, V] float32 logits.
    """
    if mask is None:
        mask = jnp.ones(x.shape[:1], jnp.int32)
    offset = sum((jnp.sum(b.mask.astype(jnp.int32)) for b in prefix), 0)
    pos = positions_from_mask(mask, offset)
    h, _ = hidden_states(params, cfg, x, mask, pos, prefix, return_kv=False)
    return lm_head(params, cfg, h)


def logits_from_one_hot(params: Params, cfg: DecoderConfig, one_hot, mask=None, prefix: Sequence[KVBlock] = ()):
    """Logits of ONE sequence as a function of a (relaxed) one-hot matrix.

    Args:
      one_hot: [T, V] rows of (relaxed) one-hot vectors; embeddings are one_hot @ E.
      mask, prefix: as in ``logits_from_embeds``.

    Returns:
      [T, V] float32 logits; differentiable in ``one_hot`` (GCG's token gradient).
    """
    x = (one_hot.astype(params["embed"].dtype)) @ params["embed"]
    return logits_from_embeds(params, cfg, x, mask, prefix)


def logits(params: Params, cfg: DecoderConfig, ids, mask=None, prefix: Sequence[KVBlock] = ()):
    """Logits of ONE sequence of token ids: ids [T] int32 -> [T, V] float32."""
    return logits_from_embeds(params, cfg, embed_tokens(params, ids), mask, prefix)


def prefill(params: Params, cfg: DecoderConfig, ids, mask=None) -> tuple[jax.Array, KVBlock]:
    """Runs ONE prompt and returns its last-position logits and its KV cache block.

    Args:
      ids: [P] int32 prompt (left padding allowed).
      mask: [P] 0/1 padding mask (default all ones).

    Returns:
      (last_logits [V] float32, KVBlock with k, v [L, P, Hkv, D]).
    """
    if mask is None:
        mask = jnp.ones(ids.shape, jnp.int32)
    pos = positions_from_mask(mask)
    h, (k, v) = hidden_states(params, cfg, embed_tokens(params, ids), mask, pos)
    return lm_head(params, cfg, h[-1]), KVBlock(k, v, mask.astype(bool), pos)


# ----------------------------------------------------------------------------- init


def init_params(cfg: DecoderConfig, key, dtype=jnp.float32) -> Params:
    """Random parameters (normal, std 0.02; norms at 1) with the loader's tree layout.

    The std 0.02 is transformers' ``initializer_range`` default for Llama and GPT-2.
    Compiled once per (cfg, dtype); vmap it over keys to initialise a stack.

    Args:
      cfg: configuration.
      key: PRNG key.
      dtype: parameter dtype.

    Returns:
      The parameter tree (per-layer weights stacked on [L, ...]).
    """
    return _init_params(cfg, key, jnp.dtype(dtype))


@partial(jax.jit, static_argnames=("cfg", "dtype"))
def _init_params(cfg: DecoderConfig, key, dtype) -> Params:
    L, d, F, V = cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    H, Hk, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    shapes: dict[str, tuple[int, ...]]
    ones = set()
    zeros = set()
    if cfg.family == "gpt2":
        shapes = {
            "ln1": (L, d),
            "ln1_b": (L, d),
            "w_qkv": (L, d, 3 * d),
            "b_qkv": (L, 3 * d),
            "wo": (L, d, d),
            "bo": (L, d),
            "ln2": (L, d),
            "ln2_b": (L, d),
            "w_fc": (L, d, F),
            "b_fc": (L, F),
            "w_proj": (L, F, d),
            "b_proj": (L, d),
        }
        ones = {"ln1", "ln2"}
        zeros = {"ln1_b", "ln2_b"}
    else:
        shapes = {
            "attn_norm": (L, d),
            "wq": (L, d, H * D),
            "wk": (L, d, Hk * D),
            "wv": (L, d, Hk * D),
            "wo": (L, H * D, d),
            "mlp_norm": (L, d),
            "w_gate": (L, d, F),
            "w_up": (L, d, F),
            "w_down": (L, F, d),
        }
        if cfg.qkv_bias:
            shapes.update(bq=(L, H * D), bk=(L, Hk * D), bv=(L, Hk * D))
        if cfg.o_bias:
            shapes.update(bo=(L, d))
        if cfg.mlp_bias:
            shapes.update(b_gate=(L, F), b_up=(L, F), b_down=(L, d))
        ones = {"attn_norm", "mlp_norm"}
        if cfg.qk_norm:
            shapes.update(q_norm=(L, D), k_norm=(L, D))
            ones |= {"q_norm", "k_norm"}
    normal = {name: shp for name, shp in sorted(shapes.items()) if name not in ones and name not in zeros}
    top = {"embed": (V, d)}
    if cfg.family == "gpt2":
        top["pos_embed"] = (cfg.max_position_embeddings, d)
    if not cfg.tie_word_embeddings:
        top["lm_head"] = (d, V)
    # one random draw for everything, then sliced: a single RNG kernel to compile
    sizes = [int(np.prod(s)) for s in list(normal.values()) + list(top.values())]
    flat = 0.02 * jax.random.normal(key, (sum(sizes),))
    pieces = jnp.split(flat, np.cumsum(sizes)[:-1])
    drawn = {n: p.reshape(s).astype(dtype) for (n, s), p in zip(list(normal.items()) + list(top.items()), pieces)}
    layers = {n: drawn[n] for n in normal}
    layers.update({n: jnp.ones(shapes[n], dtype) for n in ones})
    layers.update({n: jnp.zeros(shapes[n], dtype) for n in zeros})
    params: Params = {"embed": drawn["embed"], "final_norm": jnp.ones((d,), dtype), "layers": layers}
    if cfg.family == "gpt2":
        params["pos_embed"] = drawn["pos_embed"]
        params["final_norm_b"] = jnp.zeros((d,), dtype)
    if not cfg.tie_word_embeddings:
        params["lm_head"] = drawn["lm_head"]
    return params
