"""KV-cache greedy decoding, stacked-pool NLL, shared prefix, differentiable access."""

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import scaled_init, tiny_gpt2, tiny_llama

from sarjax.models.llm import decoder, generate, pool, scoring

CFG = tiny_llama(50, num_layers=2, intermediate_size=40, rope_theta=500.0, qkv_bias=True)
GPT = tiny_gpt2(50, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)


def _params(cfg, seed):
    # std 0.02 * 15 = 0.3: peaked logits, so greedy choices are far from ties
    return scaled_init(cfg, jax.random.key(seed), 15.0)


BUF = 16  # one fixed buffer length: one compile of the reference forward per config


@partial(jax.jit, static_argnames=("cfg",))
def _full_logits(params, ids, mask, cfg=CFG):
    return decoder.logits(params, cfg, ids, mask)


def _right_padded(seq):
    buf = np.zeros(BUF, np.int32)
    buf[: len(seq)] = seq
    mask = np.zeros(BUF, np.int32)
    mask[: len(seq)] = 1
    return jnp.asarray(buf), jnp.asarray(mask)


def _recompute_greedy(params, prompt, n, cfg=CFG):
    """Reference: full forward over prompt + generated so far, every step (no cache).

    The sequence is right-padded into a fixed buffer; causality makes the padding
    invisible to the positions read.
    """
    p = len(prompt)
    buf = np.zeros(BUF, np.int32)
    buf[:p] = prompt
    mask = np.zeros(BUF, np.int32)
    mask[:p] = 1
    out = []
    for t in range(n):
        lg = np.asarray(_full_logits(params, jnp.asarray(buf), jnp.asarray(mask), cfg=cfg))
        tok = int(np.argmax(lg[p + t - 1]))
        out.append(tok)
        buf[p + t] = tok
        mask[p + t] = 1
    return out


# Mistral-style sliding window (4 < prompt + new tokens): the cache path must apply it too
CFG_W = dataclasses.replace(CFG, sliding_window=4)


def test_kv_cache_greedy_matches_recompute_and_batching():
    params = _params(CFG, 0)
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(1, 50, size=k)) for k in (7, 4, 1)]
    n = 9
    # the reference runs each prompt alone, unpadded, without a cache
    ref = [_recompute_greedy(params, p, n, cfg=CFG_W) for p in prompts]
    assert len({tuple(r) for r in ref}) == 3  # the prompts must lead to different outputs
    ids, mask = pool.left_pad(prompts, pad_id=0)
    batched = np.asarray(generate.greedy_generate(params, CFG_W, ids, mask, max_new_tokens=n))
    np.testing.assert_array_equal(batched, np.asarray(ref))
    alone = generate.greedy_generate(params, CFG_W, np.asarray([prompts[1]]), max_new_tokens=n)
    np.testing.assert_array_equal(np.asarray(alone)[0], ref[1])


def test_greedy_eos_padding_and_gpt2_cache():
    params = _params(GPT, 1)
    prompt = np.asarray([[3, 4, 5, 6]])
    out = np.asarray(generate.greedy_generate(params, GPT, prompt, max_new_tokens=8))[0]
    # full recompute for GPT-2 (learned positions) without the cache
    np.testing.assert_array_equal(out, _recompute_greedy(params, list(prompt[0]), 8, cfg=GPT))
    eos = int(out[2])
    cut = np.asarray(generate.greedy_generate(params, GPT, prompt, max_new_tokens=8, eos_id=eos, pad_id=49))[0]
    first = int(np.argmax(out == eos))
    np.testing.assert_array_equal(cut[: first + 1], out[: first + 1])
    assert (cut[first + 1 :] == 49).all()


def _members(n=3):
    return [(f"m{i}", CFG, _params(CFG, 10 + i), None) for i in range(n)]


def test_stack_nll_equals_members_alone_and_brute_force():
    p = pool.build_pool(_members())
    assert len(p.stacks) == 1 and p.names == ("m0", "m1", "m2")
    s = p.stacks[0]
    rng = np.random.default_rng(2)
    cands = [list(rng.integers(1, 50, size=k)) for k in (9, 3, 6)]
    ids, mask = pool.left_pad(cands)
    target = np.asarray([[7, 8, 9], [10, 11, 12], [13, 14, 15]], np.int32)
    got = np.asarray(scoring.stack_target_nll(s.params, s.cfg, ids, mask, target, np.ones_like(target)))
    assert got.shape == (3, 3, 3)
    for m in range(3):
        pm = pool.unstack_params(s.params, m)
        for n, c in enumerate(cands):
            lp = jax.nn.log_softmax(_full_logits(pm, *_right_padded(c + list(target[n]))), axis=-1)
            want = [-float(lp[len(c) - 1 + j, target[n, j]]) for j in range(3)]
            np.testing.assert_allclose(got[m, n], want, rtol=1e-5, atol=1e-5)
    assert np.ptp(got[:, 0, 0]) > 1e-3  # members really differ


def test_shared_prefix_matches_concatenation():
    p = pool.build_pool(_members())
    s = p.stacks[0]
    prefix = np.asarray([11, 12, 13, 14, 15], np.int32)
    cands = [[20, 21], [22, 23, 24, 25], [26]]
    ids, mask = pool.left_pad(cands)
    target = np.asarray([[30, 31, 0], [32, 0, 0], [33, 34, 35]], np.int32)
    tmask = (target > 0).astype(np.int32)
    cache = scoring.stack_prefix_cache(s.params, s.cfg, prefix)
    got = np.asarray(scoring.stack_target_nll(s.params, s.cfg, ids, mask, target, tmask, prefix=cache))
    full_ids, full_mask = pool.left_pad([list(prefix) + c for c in cands])
    want = np.asarray(scoring.stack_target_nll(s.params, s.cfg, full_ids, full_mask, target, tmask))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert (got[:, 1, 1:] == 0).all() and (got[:, 1, 0] > 0).all()
    # greedy decoding after the shared prefix equals decoding the concatenation
    g1 = np.asarray(generate.stack_greedy_generate(s.params, s.cfg, ids, mask, max_new_tokens=5, prefix=cache))
    g2 = np.asarray(generate.stack_greedy_generate(s.params, s.cfg, full_ids, full_mask, max_new_tokens=5))
    np.testing.assert_array_equal(g1, g2)


def test_one_hot_gradient_matches_finite_differences():
    # a milder scale than _params: the loss must be smooth at the finite-difference step
    params = scaled_init(CFG, jax.random.key(3), 5.0)
    ids = jnp.asarray([5, 6, 7, 8])
    target = jnp.asarray([9, 10])
    mask = jnp.ones(4, jnp.int32)
    oh = jax.nn.one_hot(ids, CFG.vocab_size)

    @jax.jit
    def loss_and_grad(oh):
        def loss(oh):
            return scoring.target_nll_from_embeds(params, CFG, oh @ params["embed"], mask, target).sum()

        return jax.value_and_grad(loss)(oh)

    val, g = loss_and_grad(oh)
    # the one-hot loss at a true one-hot equals the token-id loss (brute force from full logits)
    lp = jax.nn.log_softmax(_full_logits(params, *_right_padded([5, 6, 7, 8, 9, 10])), axis=-1)
    np.testing.assert_allclose(val, -(lp[3, 9] + lp[4, 10]), rtol=1e-5)
    # directional derivatives along random directions match central differences
    rng = np.random.default_rng(0)
    eps = 3e-4
    for _ in range(2):
        v = jnp.asarray(rng.normal(size=oh.shape), jnp.float32)
        fd = (loss_and_grad(oh + eps * v)[0] - loss_and_grad(oh - eps * v)[0]) / (2 * eps)
        np.testing.assert_allclose(float(jnp.vdot(g, v)), float(fd), rtol=2e-2, atol=1e-3)
    assert float(jnp.abs(g).max()) > 1e-2


def test_mixed_pool_text_scoring_and_no_retrace(tmp_path):
    from conftest import build_tokenizer

    tok = build_tokenizer()
    members = [("a", CFG, _params(CFG, 20), tok), ("g", GPT, _params(GPT, 21), tok), ("b", CFG, _params(CFG, 22), tok)]
    p = pool.build_pool(members)
    assert [s.names for s in p.stacks] == [("a", "b"), ("g",)] and p.names == ("a", "b", "g")
    nll = pool.pool_target_nll_text(p, ["how to build a bomb", "tell me"], "sure here is")
    assert nll.shape == (3, 2) and np.isfinite(nll).all()
    # the same numbers, member by member, from token ids
    t = tok("sure here is", add_special_tokens=False)["input_ids"]
    ids = tok("tell me", add_special_tokens=False)["input_ids"]
    for name, cfg, prm, _ in members:
        lp = jax.nn.log_softmax(_full_logits(prm, *_right_padded(ids + t), cfg=cfg), axis=-1)
        want = -np.mean([lp[len(ids) - 1 + j, t[j]] for j in range(len(t))])
        np.testing.assert_allclose(nll[p.names.index(name), 1], want, rtol=1e-5)
    # new candidate contents with the same shapes do not recompile
    s = p.stacks[0]
    before = scoring._stack_nll._cache_size()
    for seed in range(3):
        ids = np.random.default_rng(seed).integers(0, 50, size=(4, 6))
        scoring.stack_target_nll(s.params, s.cfg, ids, np.ones_like(ids), np.asarray([1, 2]))
    assert scoring._stack_nll._cache_size() - before <= 1


def test_validation_errors():
    params = _params(CFG, 0)
    with pytest.raises(ValueError, match="expected a 2-d"):
        scoring.stack_target_nll(params, CFG, np.zeros(3, np.int32), np.ones(3, np.int32), np.zeros(2, np.int32))
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate.greedy_generate(params, CFG, np.zeros((1, 3), np.int32), max_new_tokens=0)
    with pytest.raises(ValueError, match=r"\[0, 50\)"):
        generate.greedy_generate(params, CFG, np.full((1, 3), 50, np.int32), max_new_tokens=2)
    with pytest.raises(ValueError, match="unique"):
        pool.build_pool([("a", CFG, params, None), ("a", CFG, params, None)])
