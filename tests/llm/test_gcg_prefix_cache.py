"""GCG's prefix cache and batched candidate scoring (sarjax.attacks.text.model / gcg).

The cached paths must give what full prompts give: every candidate's per-token NLL (the batched
llama scorer, ``TextModel.nll_cached_many``), the token gradient (``nll_one_hot_cached``), and a
whole GCG call (same suffixes and queries as a model without any cache).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import scaled_init, tiny_gpt2, tiny_llama

from sarjax.attacks.text import llm_text_model, make_gcg, refusal_loss, target_loss, text_batch
from sarjax.attacks.text import model as TM
from sarjax.attacks.text import requests as TR

V = 24
BEFORE = [[1, 2, 3, 4], [5, 6]]  # row 1: a left-padded (holed) before block
AFTER = [[7], [8, 9]]
TARGET = [[10, 11, 12], [13]]  # row 1: a right-padded target
MASK = np.array([1.0, 0.0, 1.0])


def _stack(cfg, seed, m=3):
    return jax.vmap(lambda k: scaled_init(cfg, k, 3.0))(jax.random.split(jax.random.key(seed), m))


def _uncached(model):
    return model._replace(prefill=None, nll_cached=None, nll_one_hot_cached=None, nll_cached_many=None)


CONFIGS = {
    "gqa": dict(hidden_size=16, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=24, num_layers=2),
    "bias_qknorm": dict(hidden_size=16, num_heads=2, num_kv_heads=1, head_dim=8, intermediate_size=24,
                        qkv_bias=True, o_bias=True, mlp_bias=True, qk_norm=True),
    "window": dict(hidden_size=16, num_heads=2, num_kv_heads=2, head_dim=8, intermediate_size=24, sliding_window=4),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CONFIGS))
def test_batched_cached_scoring_equals_full_prompts(name):
    cfg = tiny_llama(V, **CONFIGS[name])
    params = _stack(cfg, 0)
    model = llm_text_model(cfg)
    assert model.nll_cached_many is not None
    batch = TR.TextBatch(*(np.asarray(a) for a in text_batch(BEFORE, AFTER, TARGET)))
    sufs = np.array([[3, 4, 5], [0, 7, 7], [20, 21, 22], [9, 9, 1]], np.int32)
    sm = np.array([[1, 1, 1], [0, 1, 1], [1, 1, 1], [0, 0, 1]], np.int32)  # holes in the suffix slots
    full = jax.jit(TM.member_losses, static_argnums=(0, 1))
    cached = jax.jit(TM.member_losses_cached, static_argnums=(0, 1))
    for b in range(2):
        r = TR.row(batch, b)
        want = np.asarray(full(model, target_loss, params, r, sufs, sm))  # [M, N], full prompts
        got = np.asarray(cached(model, target_loss, params, r, sufs, sm))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert np.ptp(want) > 1e-2  # the candidates differ: the comparison can fail
        for n in (1, 3):  # one chunk; two uneven chunks
            part = np.asarray(cached(model, target_loss, params, r, sufs[:n], sm[:n]))
            np.testing.assert_allclose(part, want[:, :n], rtol=1e-5, atol=1e-5)
        # the per-token NLLs too (the padded target token gets 0)
        ids = np.concatenate([sufs, np.broadcast_to(r.after, (4, r.after.shape[0]))], 1)
        msk = np.concatenate([sm, np.broadcast_to(r.after_mask, (4, r.after.shape[0]))], 1)
        cache = model.prefill(params, r.before, r.before_mask)
        many = np.asarray(model.nll_cached_many(params, cache, ids, msk, r.target, r.target_mask))
        one = np.stack(
            [np.asarray(model.nll_cached(params, cache, i, m, r.target, r.target_mask)) for i, m in zip(ids, msk)], 1
        )
        np.testing.assert_allclose(many, one, rtol=1e-5, atol=1e-5)
        assert np.all(many[:, :, np.asarray(r.target_mask) == 0] == 0)


def test_batched_cached_scoring_two_stacks_llama_and_gpt2():
    cfg, gcfg = (
        tiny_llama(V, hidden_size=16, num_heads=2, num_kv_heads=1, head_dim=8, intermediate_size=24),
        tiny_gpt2(V),
    )
    params = (_stack(cfg, 0, 2), _stack(gcfg, 1, 1))
    model = llm_text_model((cfg, gcfg))
    r = TR.row(TR.TextBatch(*(np.asarray(a) for a in text_batch(BEFORE, AFTER, TARGET))), 1)
    sufs = np.array([[3, 4, 5], [0, 7, 7]], np.int32)
    want = np.asarray(TM.member_losses(model, target_loss, params, r, sufs, np.ones(3, np.int32)))
    got = np.asarray(TM.member_losses_cached(model, target_loss, params, r, sufs, np.ones(3, np.int32)))
    assert want.shape == (3, 2)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_token_gradient_from_the_cache_equals_full_prompt_gradient():
    cfg = tiny_llama(V, **CONFIGS["gqa"])
    params = _stack(cfg, 2)
    model = llm_text_model(cfg)
    r = TR.row(TR.TextBatch(*(np.asarray(a) for a in text_batch(BEFORE, AFTER, TARGET))), 1)
    suffix = jnp.array([3, 9, 14], jnp.int32)
    full = jnp.ones(3, jnp.int32)
    pb = r.before.shape[0]

    def g_full(params):
        ids, pm = TR.assemble(r, suffix, full)
        oh = jax.nn.one_hot(ids, V)

        def f(s):
            x = oh.at[pb : pb + 3].set(s)
            return jnp.sum(refusal_loss(model.nll_one_hot(params, x, pm, r.target, r.target_mask), r.target_mask))

        return jax.grad(f)(oh[pb : pb + 3])

    def g_cached(params):
        cache = model.prefill(params, r.before, r.before_mask)
        ids = jnp.concatenate([suffix, r.after])
        pm = jnp.concatenate([full, r.after_mask])
        oh = jax.nn.one_hot(ids, V)

        def f(s):
            x = oh.at[:3].set(s)
            nll = model.nll_one_hot_cached(params, cache, x, pm, r.target, r.target_mask)
            return jnp.sum(refusal_loss(nll, r.target_mask))

        return jax.grad(f)(oh[:3])

    want, got = np.asarray(jax.jit(g_full)(params)), np.asarray(jax.jit(g_cached)(params))
    assert want.shape == (3, V) and np.abs(want).max() > 1e-2
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_gcg_with_the_cache_equals_gcg_on_full_prompts():
    cfg = tiny_llama(V, **CONFIGS["gqa"])
    params = _stack(cfg, 3)
    model = llm_text_model(cfg)
    batch = text_batch(BEFORE, AFTER, TARGET)
    kw = dict(vocab_size=V, num_steps=3, suffix_len=3, topk=5, num_candidates=16)
    cached, plain = make_gcg(model, **kw), make_gcg(_uncached(model), **kw)
    call = dict(suffix_init=[2, 2, 2], max_queries=[10**6, 2 + 2 * 17 * 2 + 1])
    a = cached(params, batch, None, key=jax.random.key(1), mask=MASK, **call)
    b = plain(params, batch, None, key=jax.random.key(1), mask=MASK, **call)
    np.testing.assert_array_equal(np.asarray(a.suffix), np.asarray(b.suffix))
    np.testing.assert_array_equal(np.asarray(a.queries), np.asarray(b.queries))
    assert np.asarray(a.queries).sum(1).tolist() == [2 + 3 * 17 * 2, 2 + 2 * 17 * 2]
    np.testing.assert_allclose(np.asarray(a.loss), np.asarray(b.loss), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(a.member_loss), np.asarray(b.member_loss), rtol=1e-5, atol=1e-5)
    assert not np.array_equal(np.asarray(a.suffix)[0], [2, 2, 2])  # the search moved


def test_member_count_traces_once_per_model_and_shapes():
    cfg = tiny_llama(V, hidden_size=16, num_heads=2, num_kv_heads=1, head_dim=8, intermediate_size=24)
    base = llm_text_model(cfg)
    traces = []

    def logits(params, ids, mask):
        traces.append(1)
        return base.logits(params, ids, mask)

    model = base._replace(logits=logits)
    batch = text_batch(BEFORE, AFTER, TARGET)
    p3, p2 = _stack(cfg, 4, 3), _stack(cfg, 5, 2)
    assert TM.member_count(model, p3, batch) == 3
    assert TM.member_count(model, p3, batch) == 3
    assert len(traces) == 1  # remembered
    assert TM.member_count(model, p2, batch) == 2  # other shapes: traced again
    assert len(traces) == 2
