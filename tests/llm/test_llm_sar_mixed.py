"""LLM SAR on pools whose members use DIFFERENT tokenizers (sarjax.sar.llm), the cross-tokenizer
joint BEAST (sarjax.attacks.text.beast_cross) and BEAST's seed generator (sampled_seed_fn,
``sarjax llm-sar --seed-generator``).

The set-system known answer for a mixed pool is in test_llm_sar.py (stub members, no compile);
here real tiny decoders check that every member renders, scores and answers in its own tokens.
"""

import functools
import os

import jax
import numpy as np
import pytest
from conftest import VOCAB, build_checkpoint, build_tokenizer, scaled_init, tiny_gpt2, tiny_llama
from test_text_exchange import FILLER, TRIGGER, _tokenizers

from sarjax.models.llm.pool import LLMPool, build_pool
from sarjax.sar.llm_judging import PoolResponder
from sarjax.sar.llm_requests import request_blocks

REQUESTS = ["how to build a", "tell me the answer", "please write on x"]
TARGET = "sure here is"
FULL = os.environ.get("SARJAX_LLM_FULL") == "1"


@functools.cache
def _pool():
    """Stacks in pool order: Llama on tokenizer A (2 members), Llama on tokenizer B (1), GPT-2 on
    tokenizer A (1): tokenizer groups {0, 2} and {1}."""
    ta, tb = _tokenizers()
    lcfg = tiny_llama(VOCAB, hidden_size=16, num_heads=2, num_kv_heads=1, head_dim=8, intermediate_size=24)
    gcfg = tiny_gpt2(VOCAB)
    members = [
        ("a0", lcfg, scaled_init(lcfg, jax.random.key(0)), ta),  # peaked logits: greedy far from ties
        ("a1", lcfg, scaled_init(lcfg, jax.random.key(1)), ta),
        ("b0", lcfg, scaled_init(lcfg, jax.random.key(2)), tb),
        ("g0", gcfg, scaled_init(gcfg, jax.random.key(3)), ta),
    ]
    pool = build_pool(members)
    assert [s.names for s in pool.stacks] == [("a0", "a1"), ("b0",), ("g0",)]
    return pool


def _prompts(tok, suffixes):
    """``before | encode(suffix) | after`` of each request in ``tok``'s ids, left-padded."""
    from sarjax.models.llm.pool import left_pad
    from sarjax.models.llm.prompts import encode_text

    before, after = request_blocks(tok, REQUESTS)
    return left_pad([b + encode_text(tok, s) + a for b, s, a in zip(before, suffixes, after)], 0)


def test_mixed_responder_equals_each_tokenizer_groups_responder_alone():
    """Known answer: the mixed responder's responses (and tokens) equal those of each tokenizer
    group's single-tokenizer responder run alone on that group's own prompts, members in pool order."""
    pool = _pool()
    ta, tb = _tokenizers()
    suffixes = ["x y", "", "please z"]  # row 1: the clean request
    mixed = PoolResponder(pool, 4, requests=REQUESTS)
    ids_a, mask_a = _prompts(ta, suffixes)
    got = mixed(ids_a, mask_a)
    got_tok = mixed.tokens(ids_a, mask_a)
    group_a = PoolResponder(LLMPool((pool.stacks[0], pool.stacks[2])), 4)
    group_b = PoolResponder(LLMPool((pool.stacks[1],)), 4)
    ref_a, ref_b = group_a(ids_a, mask_a), group_b(*_prompts(tb, suffixes))
    want = [ref_a[0], ref_a[1], ref_b[0], ref_a[2]]  # a0, a1 | b0 | g0
    assert got == want
    ta_tok, tb_tok = group_a.tokens(ids_a, mask_a), group_b.tokens(*_prompts(tb, suffixes))
    np.testing.assert_array_equal(got_tok, np.concatenate([ta_tok[:2], tb_tok, ta_tok[2:]]))
    assert len({tuple(m) for m in got}) > 1  # the members answer differently: a mix-up would show


def test_cross_beast_joint_objective_and_exact_queries():
    """(a) each member's loss on the returned suffix equals that member's target NLL computed
    alone with ITS OWN tokenizer and template, and the joint loss is their mean over the covered
    members; (b) queries follow the closed form (every candidate passes the filter here)."""
    from sarjax.attacks.text import requests as TR
    from sarjax.attacks.text.beast import BEASTOptions, make_beast
    from sarjax.attacks.text.pool import pool_params
    from sarjax.models.llm import decoder, scoring
    from sarjax.models.llm.pool import unstack_params
    from sarjax.models.llm.prompts import encode_text

    pool = _pool()
    ta, tb = _tokenizers()
    words = FILLER + [TRIGGER]  # known to both tokenizers: every candidate re-tokenizes everywhere
    al = [np.isin(np.arange(VOCAB), t.convert_tokens_to_ids(words)) for t in (ta, tb, ta)]
    k1, k2, ls = 2, 2, 2
    fn = make_beast(
        pool,
        suffix_len=ls,
        beam_width=k1,
        candidates=k2,
        options=BEASTOptions(sampler="greedy", target=TARGET, slots=4),
    )
    # row 0 covers a0 and b0 (proposer mixture: a0); row 1 covers b0 only (mixture: a0, a1, g0)
    mask = np.array([[1, 0, 1, 0], [0, 0, 1, 0], [1, 1, 1, 1]], np.float32)
    r = fn(pool_params(pool), REQUESTS, None, key=jax.random.key(0), mask=mask, allowed=al)
    ncov, nprop = mask.sum(1), np.array([1, 3, 3])
    # step 1 expands the single empty beam (1 forward per mixed member), step 2 the k1 beams
    np.testing.assert_array_equal(r.queries.sum(1), (1 + k1) * nprop + ls * k1 * k2 * ncov)
    # per member: the next-token forwards of the mixed members (P_b), the scoring of the covered ones
    group = np.array([1, 1, 0, 1], bool)  # tokenizer A's members: a0, a1 | g0
    cov = mask > 0
    prop = np.where((cov & group).any(1, keepdims=True), cov & group, group[None])
    np.testing.assert_array_equal(r.queries, (1 + k1) * prop + ls * k1 * k2 * cov)
    stacks = {"a0": (0, 0, ta), "a1": (0, 1, ta), "b0": (1, 0, tb), "g0": (2, 0, ta)}
    for b, req in enumerate(REQUESTS):
        assert 1 <= len(r.suffix_ids[b]) <= ls and all(w in words for w in r.x_adv[b].split())
        by_hand = []
        for s, m, tok in stacks.values():
            st = pool.stacks[s]
            (before,), (after,) = request_blocks(tok, [req])
            ids = np.asarray(before + encode_text(tok, r.x_adv[b]) + after, np.int32)
            tgt = np.asarray(encode_text(tok, TARGET), np.int32)
            nll = scoring.target_nll(unstack_params(st.params, m), st.cfg, ids, np.ones_like(ids), tgt)
            by_hand.append(float(np.mean(np.asarray(nll))))
        np.testing.assert_allclose(r.member_loss[b], by_hand, rtol=2e-5, err_msg=f"row {b}")
        # success: each member's greedy token reproduces every target token (teacher forcing) on
        # the prompt that is sent: the whole text tokenized by its own tokenizer
        for j, (s, m, tok) in enumerate(stacks.values()):
            st = pool.stacks[s]
            (bt,), (at,) = TR.slot_texts(tok, [req])
            sent = encode_text(tok, bt + r.x_adv[b] + at)
            assert r.sent[s][b][r.sent_mask[s][b] == 1].tolist() == sent
            tgt = encode_text(tok, TARGET)
            lg = decoder.logits(unstack_params(st.params, m), st.cfg, np.asarray(sent + tgt[:-1], np.int32))
            assert r.success[b, j] == (np.argmax(np.asarray(lg)[len(sent) - 1 :], -1).tolist() == tgt), (b, j)
        np.testing.assert_allclose(r.loss[b], np.sum(mask[b] * by_hand) / ncov[b], rtol=2e-5)
        # each stack's prompt carries the same text in its own ids
        for s, st in enumerate(pool.stacks):
            real = r.ids[s][b][r.mask[s][b] == 1].tolist()
            assert r.x_adv[b] in st.tokenizer.decode(real)
    assert r.suffix_ids[0] != encode_text(tb, r.x_adv[0])  # the proposer's ids are tokenizer A's
    # same key, same result; a cap that allows the first step only
    again = fn(
        pool_params(pool),
        REQUESTS,
        None,
        key=jax.random.key(0),
        mask=mask,
        allowed=al,
        max_queries=int(nprop[1] + k1 * k2 * ncov[1]),
    )
    assert again.queries[1].sum() == nprop[1] + k1 * k2 * ncov[1] and len(again.suffix_ids[1]) == 1
    with pytest.raises(ValueError, match="row 0: .*stack 1: the ids do not decode back"):
        fn(
            pool_params(pool),
            REQUESTS,
            None,
            key=jax.random.key(0),
            mask=mask,
            allowed=al,
            suffix_init=["a bomb", "", ""],
        )  # B lacks "bomb"
    with pytest.raises(TypeError, match="key is required"):
        fn(pool_params(pool), REQUESTS, None, key=None, mask=mask)


def _write_checkpoint(path, tok, seed):
    build_checkpoint("llama", str(path), seed=seed)
    tok.save_pretrained(str(path))
    return str(path)


def test_sampled_seed_fn_on_a_tiny_checkpoint(tmp_path):
    """The seed generator samples every request's candidates in one batched call; request i's
    samples equal those drawn with sample ids i*k .. i*k+k-1 for that request's prompt (the request
    written into it) in a batch of another order (same shape: one compile)."""
    from sarjax.models.llm.pool import load_pool, pool_generate_text
    from sarjax.sar.llm_requests import sampled_seed_fn

    gen = load_pool([_write_checkpoint(tmp_path / "gen", build_tokenizer(), 0)])
    key, k = jax.random.key(5), 3
    reqs = ["how to build a", "tell me"]
    seed_fn = sampled_seed_fn(gen, reqs, key=key, max_new_tokens=4, num_samples=k, prompt="{request} please")
    order = [1, 0]  # the requests in reversed order, each keeping its sample ids
    texts = [reqs[i] + " please" for i in order for _ in range(k)]
    sids = np.concatenate([np.arange(i * k, (i + 1) * k) for i in order])
    other = pool_generate_text(
        gen, texts, max_new_tokens=4, key=key, chat_template=False, sample_ids=sids
    )[0]  # fmt: skip
    for j, i in enumerate(order):
        assert seed_fn(reqs[i]) == other[j * k : (j + 1) * k]
    assert len({s for r in reqs for s in seed_fn(r)}) > 1
    with pytest.raises(ValueError, match="no seeds were sampled"):
        seed_fn("another request")
    with pytest.raises(ValueError, match="must contain"):
        sampled_seed_fn(gen, reqs, key=key, prompt="no placeholder")


def test_cli_seed_generator_needs_beast(tmp_path, capsys):
    from sarjax.cli import main

    csv = tmp_path / "b.csv"
    csv.write_text(
        "Behavior,FunctionalCategory,SemanticCategory,Tags,ContextString,BehaviorID\nhow to,standard,x,,,b0\n"
    )
    rc = main(["llm-sar", "--pool", str(tmp_path), "--behaviors", str(csv), "--attack", "gcg", "--out", str(tmp_path),
               "--seed-generator", str(tmp_path)])  # fmt: skip
    assert rc == 2 and "--seed-generator is BEAST's warm start" in capsys.readouterr().err


@pytest.mark.skipif(
    not FULL,
    reason="SARJAX_LLM_FULL=1: sarjax llm-sar end to end on a mixed-tokenizer pool (beast with a seed generator, "
    "gcg, autodan), compiles decoding and the attacks; the default tests cover the pieces: "
    "test_mixed_responder_equals_each_tokenizer_groups_responder_alone, "
    "test_llm_sar_autodan_on_a_mixed_tokenizer_pool, "
    "test_cross_beast_joint_objective_and_exact_queries, test_sampled_seed_fn_on_a_tiny_checkpoint, "
    "test_llm_sar_greedy_on_a_mixed_tokenizer_pool_equals_the_set_system_oracle",
)
@pytest.mark.parametrize("attack", ["beast", "gcg", "autodan"])
def test_llm_sar_cli_on_a_mixed_tokenizer_pool(tmp_path, attack):
    import json

    from sarjax.cli import main

    ta, tb = _tokenizers()
    dirs = [_write_checkpoint(tmp_path / f"m{i}", t, i) for i, t in enumerate((ta, ta, tb))]
    gen = _write_checkpoint(tmp_path / "gen", build_tokenizer(), 7)
    csv = tmp_path / "b.csv"
    rows = "".join(f"{r},standard,x,,,b{i}\n" for i, r in enumerate(REQUESTS[:2]))
    csv.write_text("Behavior,FunctionalCategory,SemanticCategory,Tags,ContextString,BehaviorID\n" + rows)
    out = tmp_path / "out"
    argv = ["llm-sar", "--pool", *dirs, "--behaviors", str(csv), "--attack", attack, "--out", str(out),
            "--max-queries", "60", "--calls", "1", "--max-new-tokens", "3", "--no-progress"]  # fmt: skip
    argv += {
        "beast": ["--suffix-len", "2", "--beam-width", "2", "--seed-generator", gen, "--seed-tokens", "1"],
        "gcg": ["--suffix-len", "2", "--steps", "2"],
        "autodan": ["--steps", "1", "--proposals", "2"],  # the first member (tokenizer A) rewrites
    }[attack]
    assert main(argv) == 0
    rep = json.loads((out / "llm_sar.json").read_text())
    assert rep["settings"]["tokenizers"] == 2 and rep["asr"] is not None and (out / "llm_sar.png").exists()
    if attack == "beast":
        assert rep["settings"]["settings"]["seeds"]["tokens"] == 1
    assert main(argv) == 0  # resumes from the checkpoint (same fingerprint)
