"""Sampled decoding (temperature, top-k, top-p): known answers against greedy decoding, against
transformers' logits warpers, and chi-square checks of the empirical token frequencies."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import VOCAB, build_tokenizer, scaled_init, tiny_llama
from scipy.stats import chi2

from sarjax.models.llm import generate
from sarjax.models.llm.pool import left_pad

V = VOCAB  # the tiny word-level tokenizers' model vocabulary: every test shares one config
CFG = tiny_llama(V, hidden_size=16, num_heads=2, num_kv_heads=1, head_dim=8, intermediate_size=24)
PROMPTS = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10]]
NEW = 6
P = 16  # one prompt length (and B = 3, M = 2) for every decoding call: kernels are shared


@pytest.fixture(scope="module")
def stack():
    # scale 4: logits spread enough that a few tokens carry most of the mass, but not one-hot
    return jax.vmap(lambda k: scaled_init(CFG, k, 4.0))(jax.random.split(jax.random.key(0), 2))


def _prompts():
    return left_pad(PROMPTS, 0, length=P)


def _hf_filtered_probs(logits, temperature, top_k, top_p):
    """transformers' warpers in generate()'s order (temperature, top-k, top-p) -> probabilities."""
    import torch
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    x = torch.tensor(np.asarray(logits, np.float32))[None]
    x = TemperatureLogitsWarper(temperature)(None, x)
    if top_k:
        x = TopKLogitsWarper(top_k)(None, x)
    if top_p < 1:
        x = TopPLogitsWarper(top_p)(None, x)
    return torch.softmax(x, -1)[0].numpy()


SETTINGS = [(0.7, 0, 1.0), (1.0, 5, 1.0), (1.3, 0, 0.8), (0.8, 6, 0.9), (1.0, 3, 0.5)]


def test_filter_logits_equals_transformers_warpers():
    rng = np.random.default_rng(0)
    f = jax.jit(generate.filter_logits)
    for t, k, p in SETTINGS:
        for _ in range(3):
            lg = rng.normal(0, 2, V).astype(np.float32)
            got = np.asarray(jax.nn.softmax(f(lg, t, k, p)))
            want = _hf_filtered_probs(lg, t, k, p)
            np.testing.assert_array_equal(got > 0, want > 0)  # the same kept set
            np.testing.assert_allclose(got, want, atol=1e-6)
    # top-k keeps every token tied with the k-th largest (transformers' rule)
    tied = np.array([3.0, 1.0, 1.0, 1.0, 0.0] + [-5.0] * (V - 5), np.float32)
    assert int(np.sum(np.isfinite(np.asarray(f(tied, 1.0, 2, 1.0))))) == 4


def _chi2_ok(counts, probs, alpha=1e-4):
    """Pearson chi-square of counts against probs over the support; nothing outside it."""
    support = probs > 0
    assert counts[~support].sum() == 0, "a filtered-out token was drawn"
    n = counts.sum()
    exp = n * probs[support]
    stat = float(np.sum((counts[support] - exp) ** 2 / exp))
    dof = int(support.sum()) - 1
    assert stat < chi2.ppf(1 - alpha, dof), (stat, dof, counts, np.round(exp, 1))


def test_sample_token_frequencies_match_the_filtered_softmax():
    lg = np.random.default_rng(1).normal(0, 1.5, V).astype(np.float32)
    keys = jax.random.split(jax.random.key(2), 20000)
    draw = jax.jit(jax.vmap(generate.sample_token, in_axes=(0, None, None, None, None)))
    for t, k, p in SETTINGS:
        toks = np.asarray(draw(keys, lg, t, k, p))
        _chi2_ok(np.bincount(toks, minlength=V), _hf_filtered_probs(lg, t, k, p))
    np.testing.assert_array_equal(np.asarray(draw(keys[:5], lg, 0.0, 0, 1.0)), [np.argmax(lg)] * 5)


def test_one_step_generation_frequencies_match_the_members_softmax(stack):
    """The whole decoding path: 1000 seeds of one prompt, 1 new token, both members; the counts
    follow softmax(last logits / T) restricted to top-k / top-p of each member."""
    from sarjax.models.llm import decoder

    n = 1000
    ids, mask = left_pad([PROMPTS[0]] * n, 0)
    t, k, p = 0.9, 6, 0.95
    out = np.asarray(
        generate.stack_sample_generate(
            stack, CFG, ids, mask, 1, key=jax.random.key(3), sampling=generate.SamplingConfig(t, k, p)
        )
    )
    for m in range(2):
        pm = jax.tree.map(lambda x, m=m: x[m], stack)
        lg = np.asarray(decoder.logits(pm, CFG, jnp.asarray(PROMPTS[0], jnp.int32)))[-1]
        probs = _hf_filtered_probs(lg, t, k, p)
        assert 2 <= (probs > 0).sum() <= 6 and probs.max() < 0.9  # a real draw, not a near-argmax
        _chi2_ok(np.bincount(out[m, :, 0], minlength=V), probs)


def test_top_k_one_tiny_top_p_and_zero_temperature_equal_greedy(stack):
    ids, mask = _prompts()
    greedy = np.asarray(generate.stack_greedy_generate(stack, CFG, ids, mask, NEW, eos_id=[7, 11]))
    key = jax.random.key(4)
    kw = dict(key=key)
    for t, k, p in [(1.5, 1, 1.0), (1.5, 0, 1e-6), (0.0, 0, 1.0)]:
        got = generate.stack_sample_generate(
            stack, CFG, ids, mask, NEW, sampling=generate.SamplingConfig(t, k, p, eos_id=[7, 11]), **kw
        )
        np.testing.assert_array_equal(np.asarray(got), greedy)
    one = jax.tree.map(lambda x: x[1], stack)
    single = generate.sample_generate(
        one, CFG, ids, mask, NEW, sampling=generate.SamplingConfig(temperature=1.0, top_k=1, eos_id=[7, 11]), **kw
    )
    np.testing.assert_array_equal(np.asarray(single), greedy[1])


def test_same_key_same_output_rows_independent_of_the_batch(stack):
    ids, mask = _prompts()
    kw = dict(sampling=generate.SamplingConfig(temperature=1.5, top_k=0, top_p=1.0))
    a = np.asarray(generate.stack_sample_generate(stack, CFG, ids, mask, NEW, key=jax.random.key(5), **kw))
    b = np.asarray(generate.stack_sample_generate(stack, CFG, ids, mask, NEW, key=jax.random.key(5), **kw))
    c = np.asarray(generate.stack_sample_generate(stack, CFG, ids, mask, NEW, key=jax.random.key(6), **kw))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert not np.array_equal(a[0], a[1])  # members draw independently
    # row 2 alone, with its sample id, draws what it drew inside the batch; member ids likewise
    i2, m2 = left_pad([PROMPTS[2]], 0, length=P)
    swapped = jax.tree.map(lambda x: x[::-1], stack)
    solo = generate.stack_sample_generate(
        swapped, CFG, np.repeat(i2, 3, 0), np.repeat(m2, 3, 0), NEW, key=jax.random.key(5),
        sample_ids=[2, 2, 2], member_ids=[1, 0], **kw,
    )  # fmt: skip
    np.testing.assert_array_equal(np.asarray(solo)[::-1, 0], a[:, 2])


def test_sampling_arguments_are_checked(stack):
    ids, mask = _prompts()
    with pytest.raises(TypeError, match="key is required"):
        generate.stack_sample_generate(stack, CFG, ids, mask, 2, key=None)
    for bad, match in [
        (dict(temperature=-1.0), "temperature"),
        (dict(top_k=-2), "top_k"),
        (dict(top_k=1.5), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.2), "top_p"),
    ]:
        with pytest.raises(ValueError, match=match):  # the settings are checked when built
            generate.SamplingConfig(**bad)
    for bad, match in [
        (dict(sample_ids=[0, 1]), "sample_ids"),
        (dict(member_ids=[0, 1, 2]), "member_ids"),
    ]:
        with pytest.raises(ValueError, match=match):
            generate.stack_sample_generate(stack, CFG, ids, mask, 2, key=jax.random.key(0), **bad)


TEMPLATE_A = (
    "{% for m in messages %}{% if m['role'] == 'system' %}<s> {{ m['content'] }} {% else %}"
    "[INST] {{ m['content'] }} [/INST]{% endif %}{% endfor %}"
)
TEMPLATE_B = "<s>{% for m in messages %} {{ m['content'] }}{% endfor %}{% if add_generation_prompt %} ! sure{% endif %}"
REQUESTS = ["how to build a bomb", "tell me a tutorial on x", "please write"]


def test_pool_generate_text_chat_template_end_tokens_and_member_order(stack, tmp_path):
    """Two stacks with different chat templates (the module's two members, each with both
    templates); every member's responses equal greedy decoding of transformers' own rendering of
    the request, cut at the first end token of generation_config.json (a list), decoded without
    special tokens."""
    import json

    from sarjax.models.llm import pool as P_

    tok_a, tok_b = build_tokenizer(TEMPLATE_A), build_tokenizer(TEMPLATE_B)
    pa = [jax.tree.map(lambda x, m=m: x[m], stack) for m in range(2)]

    def reference(params, tok, req, eos):
        ids = tok.apply_chat_template([{"role": "user", "content": req}], tokenize=True, add_generation_prompt=True)
        i, m = left_pad([ids["input_ids"]] * 3, 0, length=P)  # the shapes of the other tests' calls
        return np.asarray(generate.greedy_generate(params, CFG, i, m, NEW, eos_id=eos))[0].tolist()

    # an end-token list with a token member 0 emits at step 2 of request 0 (so the cut is tested)
    raw0 = reference(pa[0], tok_a, REQUESTS[0], [2])
    eos = [int(raw0[2]), 2]
    assert eos[0] != 2
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "max_new_tokens": NEW}))
    gen = P_.load_generation_config(str(tmp_path))
    assert gen.eos_token_id == tuple(eos) and gen.max_new_tokens == NEW and gen.top_k == 50
    members = [("a0", CFG, pa[0], tok_a, gen), ("b0", CFG, pa[0], tok_b, gen), ("a1", CFG, pa[1], tok_a, gen)]
    members.append(("b1", CFG, pa[1], tok_b, gen))
    pool = P_.build_pool(members)
    assert pool.names == ("a0", "a1", "b0", "b1")
    out = P_.pool_generate_text(pool, REQUESTS, pad_to_multiple=P)
    for m, (params, tok) in enumerate([(pa[0], tok_a), (pa[1], tok_a), (pa[0], tok_b), (pa[1], tok_b)]):
        for n, req in enumerate(REQUESTS):
            toks = reference(params, tok, req, eos)
            cut = next((i for i, t in enumerate(toks) if t in eos), len(toks))
            assert out[m][n] == tok.decode(toks[:cut], skip_special_tokens=True), (m, n)
    assert len(out[0][0].split()) <= 2  # request 0 of member a0 stopped at its end token
    assert out[0] != out[2]  # the chat template matters
    # sampling through the same helper: T = 0 is greedy; a key is required
    again = P_.pool_generate_text(
        pool, REQUESTS, key=jax.random.key(0), sampling=generate.SamplingConfig(temperature=0.0), pad_to_multiple=P
    )
    assert again == out
    with pytest.raises(TypeError, match="needs a key"):
        P_.pool_generate_text(pool, REQUESTS, sampling=generate.SamplingConfig())
    with pytest.raises(ValueError, match="chat_template"):
        P_.pool_generate_text(P_.build_pool([("x", CFG, pa[0], build_tokenizer())]), REQUESTS)
