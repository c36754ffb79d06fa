"""Inputs that used to give NaN or another continuation silently now raise ValueError at the
public boundary, naming the row and position: GPT-2 positions past its learned table (prefix
cache included), token ids outside the vocabulary, right-padded prompts; eos_id takes a list."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import scaled_init, tiny_gpt2, tiny_llama

from sarjax.models.llm import decoder, generate, scoring

V = 50
GPT = tiny_gpt2(V, max_position_embeddings=16)
LLAMA = tiny_llama(
    V, hidden_size=16, num_heads=2, num_kv_heads=1, intermediate_size=24, rope_theta=500.0, max_position_embeddings=8
)


@pytest.fixture(scope="module")
def gpt():
    return scaled_init(GPT, jax.random.key(0))  # peaked logits: greedy choices far from ties


@pytest.fixture(scope="module")
def gpt_stack(gpt):
    return jax.tree.map(lambda x: jnp.stack([x, x * 0.9]), gpt)


def test_gpt2_positions_past_the_table_raise(gpt, gpt_stack):
    # old code: all-NaN logits / NLLs (jnp.take past pos_embed fills NaN)
    with pytest.raises(ValueError, match=r"token 16 of the sequence would get position 16 .*16 learned positions"):
        decoder.logits(gpt, GPT, jnp.arange(17) % V)
    with pytest.raises(ValueError, match=r"token 16 .*position 16"):
        decoder.prefill(gpt, GPT, jnp.arange(17) % V)
    ok = np.asarray(decoder.logits(gpt, GPT, jnp.arange(16) % V))  # exactly the table: fine
    assert ok.shape == (16, V) and np.isfinite(ok).all()
    # a batch: row 1 (9 prompt + 8 target tokens = 17) is named, row 0 (left-padded, 3 + 8) fits
    ids = np.ones((2, 9), np.int32)
    mask = np.ones((2, 9), np.int32)
    mask[0, :6] = 0
    with pytest.raises(ValueError, match=r"row 1 needs 17 positions \(0 prefix-cache tokens \+ 17\).*1 row\(s\)"):
        scoring.stack_target_nll(gpt_stack, GPT, ids, mask, np.arange(8, dtype=np.int32))
    # greedy decoding counts the prefix cache: 10 prefix + 5 prompt + 8 new > 16 (old: token 0s)
    cache = scoring.stack_prefix_cache(gpt_stack, GPT, np.arange(1, 11, dtype=np.int32))
    with pytest.raises(ValueError, match=r"row 0 needs 23 positions \(10 prefix-cache tokens \+ 13\)"):
        generate.stack_greedy_generate(gpt_stack, GPT, np.ones((1, 5), np.int32), max_new_tokens=8, prefix=cache)
    with pytest.raises(ValueError, match=r"needs 23 positions"):
        generate.greedy_generate(
            gpt, GPT, np.ones((1, 5), np.int32), max_new_tokens=8, prefix=jax.tree.map(lambda a: a[0], cache)
        )
    out = np.asarray(
        generate.stack_greedy_generate(gpt_stack, GPT, np.ones((1, 5), np.int32), max_new_tokens=1, prefix=cache)
    )
    assert out.shape == (2, 1, 1)
    with pytest.raises(ValueError, match=r"needs 17 positions"):
        scoring.stack_prefix_cache(gpt_stack, GPT, np.ones(17, np.int32))


def test_rope_models_run_past_max_position_embeddings():
    # documented choice: RoPE positions are computed, not looked up; finite (transformers does not raise)
    params = scaled_init(LLAMA, jax.random.key(1))
    out = np.asarray(decoder.logits(params, LLAMA, jnp.arange(12) % V))
    assert out.shape == (12, V) and np.isfinite(out).all()


def test_token_ids_outside_the_vocabulary_raise(gpt, gpt_stack):
    with pytest.raises(ValueError, match=r"ids: token id 50 at position 1 is outside the vocabulary \[0, 50\)"):
        decoder.logits(gpt, GPT, jnp.asarray([1, 50, 2]))
    with pytest.raises(ValueError, match=r"token id -1 at position 0"):
        decoder.prefill(gpt, GPT, jnp.asarray([-1, 3]))
    with pytest.raises(ValueError, match=r"token id 70 at position 2"):  # old: a NaN cache
        scoring.stack_prefix_cache(gpt_stack, GPT, np.asarray([1, 2, 70], np.int32))
    ids = np.ones((3, 4), np.int32)
    ids[2, 3] = 99
    with pytest.raises(ValueError, match=r"ids: token id 99 at row 2, position 3"):
        scoring.stack_target_nll(gpt_stack, GPT, ids, np.ones_like(ids), np.asarray([1, 2], np.int32))
    with pytest.raises(ValueError, match=r"target: token id 60 at row 1, position 0"):
        scoring.stack_target_nll(
            gpt_stack,
            GPT,
            np.ones((2, 4), np.int32),
            np.ones((2, 4), np.int32),
            np.asarray([[1, 2], [60, 3]], np.int32),
        )
    with pytest.raises(ValueError, match=r"ids: token id 99 at row 2, position 3"):
        generate.greedy_generate(gpt, GPT, ids, max_new_tokens=2)


def test_right_padded_or_empty_prompts_raise(gpt, gpt_stack):
    ids = np.asarray([[0, 3, 4, 5], [3, 4, 5, 0]], np.int32)
    right = np.asarray([[0, 1, 1, 1], [1, 1, 1, 0]], np.int32)
    msg = r"mask: padding at row 1, position 3 is on the wrong side of a real token; rows must be left-padded"
    with pytest.raises(ValueError, match=msg):  # old: another continuation
        generate.greedy_generate(gpt, GPT, ids, right, max_new_tokens=2)
    with pytest.raises(ValueError, match=msg):
        generate.stack_greedy_generate(gpt_stack, GPT, ids, right, max_new_tokens=2)
    with pytest.raises(ValueError, match=msg):
        scoring.stack_target_nll(gpt_stack, GPT, ids, right, np.asarray([1, 2], np.int32))
    hole = np.asarray([[1, 0, 1, 1], [0, 1, 1, 1]], np.int32)
    with pytest.raises(ValueError, match=r"row 0, position 1 is on the wrong side"):
        generate.greedy_generate(gpt, GPT, ids, hole, max_new_tokens=2)
    with pytest.raises(ValueError, match=r"mask: row 1 has no real token"):
        generate.greedy_generate(gpt, GPT, ids, np.asarray([[0, 1, 1, 1], [0, 0, 0, 0]]), max_new_tokens=2)
    with pytest.raises(ValueError, match=r"expected 0/1 values, got 2 at row 0, position 3"):
        generate.greedy_generate(gpt, GPT, ids, np.asarray([[0, 1, 1, 2], [0, 1, 1, 1]]), max_new_tokens=2)
    # targets are right-padded: a left-padded target row is named
    with pytest.raises(
        ValueError, match=r"target_mask: padding at row 1, position 0 is on the wrong side.*right-padded"
    ):
        scoring.stack_target_nll(
            gpt_stack,
            GPT,
            np.ones((2, 3), np.int32),
            np.ones((2, 3), np.int32),
            np.ones((2, 2), np.int32),
            np.asarray([[1, 0], [0, 1]], np.int32),
        )
    # greedy_one on concrete inputs checks too
    with pytest.raises(ValueError, match=r"mask: padding at position 2"):
        generate.greedy_one(gpt, GPT, jnp.asarray([3, 4, 0]), jnp.asarray([1, 1, 0]), 2)


def test_eos_id_list_stops_on_any(gpt, gpt_stack):
    prompt = np.asarray([[3, 4, 5, 6]], np.int32)
    out = np.asarray(generate.greedy_generate(gpt, GPT, prompt, max_new_tokens=6))[0]
    a = int(out[3])
    b = next(int(t) for t in out[:3] if t != a) if len(set(out[:3].tolist()) - {a}) else None
    assert b is not None, out  # two distinct tokens to stop on
    first = min(int(np.argmax(out == a)), int(np.argmax(out == b)))
    want = np.where(np.arange(6) > first, 49, out)
    got = np.asarray(generate.greedy_generate(gpt, GPT, prompt, max_new_tokens=6, eos_id=[a, b], pad_id=49))[0]
    np.testing.assert_array_equal(got, want)
    # the same as the int form with whichever comes first
    single = np.asarray(
        generate.greedy_generate(gpt, GPT, prompt, max_new_tokens=6, eos_id=int(out[first]), pad_id=49)
    )[0]
    np.testing.assert_array_equal(got, single)
    st = np.asarray(generate.stack_greedy_generate(gpt_stack, GPT, prompt, max_new_tokens=6, eos_id=(a, b), pad_id=49))
    np.testing.assert_array_equal(st[0, 0], want)
    for bad in ([2, 60], [], 2.5, [[1]], True):
        with pytest.raises(ValueError, match="eos_id"):
            generate.greedy_generate(gpt, GPT, prompt, max_new_tokens=2, eos_id=bad)
