"""Candidate scoring from a prefix cache, written for N prompts at once (llama family): the
per-member target NLL of many candidate prompts after one shared prefix, as the suffix attacks
(:mod:`~sarjax.attacks.text`) score their candidates.

The decoder is written for one sequence (``decoder.hidden_states``); vmapping it over N
candidates makes XLA transpose every attention operand between the token-major layout of the
projections and the head-major layout of batched attention, and evaluates the rotary tables
once per member and candidate. This is the same computation laid out for N prompts of one
member: token-major throughout (attention per key/value head, no transposes), the rotary
tables computed once per call, the two key blocks (own tokens, cached prefix) soft-maxed
together without concatenation, and the last target token not run (no scored position reads
it). It uses the decoder's own pieces (norms, rotary tables, activations), so it follows
them; tests/llm/test_text_attacks.py checks it against ``nll_cached`` per prompt.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.models.llm import decoder

# The prompts are scored in this many independent chunks: on XLA:CPU (this project's 2-core
# x86-64, benchmarks/gcg_throughput.py) two chunks of 32 candidates ran the scoring about 25% faster
# than one of 64 (smaller intermediates); more chunks were not faster.
_SCORE_CHUNKS = 2


def _chunks(n: int, k: int) -> list[slice]:
    """``k`` (at most ``n``) contiguous slices covering ``range(n)``, sizes differing by <= 1."""
    k = max(1, min(k, n))
    bounds = [round(i * n / k) for i in range(k + 1)]
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def batched_llama_ok(cfg) -> bool:
    """Whether :func:`stack_nll_many` handles ``cfg`` (llama-style decoders: not GPT-2, even head
    size, query heads a multiple of the key/value heads)."""
    return cfg.family != "gpt2" and cfg.head_dim % 2 == 0 and cfg.num_heads % cfg.num_kv_heads == 0


def _rope_halves(cfg, prefix_mask, mask, target_mask):
    """``cos, sin [N, T + Tt - 1, D/2]`` of the prompts' positions after a prefix (the decoder's
    tables repeat their first half, ``decoder._rope_tables``)."""
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


def stack_nll_many(params, kv, ids, mask, target, target_mask, *, cfg):
    """Target NLL ``[M, N, Tt]`` of N prompts ``ids [N, T]`` (``mask [N, T]``) for every member
    of a stack, each after its own prefix cache (``params`` and ``kv`` stacked ``[M, ...]``; the
    prefix mask is the same for every member); ``cfg`` must pass :func:`batched_llama_ok`."""
    cos, sin = _rope_halves(cfg, kv.mask[0], mask, target_mask)
    parts = []
    for sl in _chunks(ids.shape[0], _SCORE_CHUNKS):
        f = functools.partial(_llama_nll_many, cfg=cfg, cos=cos[sl], sin=sin[sl])
        parts.append(jax.vmap(lambda p, kv, f=f, sl=sl: f(p, kv, ids[sl], mask[sl], target, target_mask))(params, kv))
    return jnp.concatenate(parts, axis=1)


__all__ = ["batched_llama_ok", "stack_nll_many"]
