"""The offline LLM demo's pieces (sarjax.experiments.llm_demo): corpus, tokenizer, data mixes, checkpoints."""

import os

import jax
import numpy as np
import pytest

from sarjax.experiments import llm_demo as D

HB = os.environ.get("SARJAX_HARMBENCH_DIR", "/work/shared/data/harmbench")
TRAIN = os.path.join(HB, "harmbench_behaviors_text_test.csv")
EVAL = os.path.join(HB, "harmbench_behaviors_text_val.csv")
FULL = pytest.mark.skipif(not os.environ.get("SARJAX_LLM_FULL"), reason="set SARJAX_LLM_FULL=1 (compiles training)")


@pytest.fixture(scope="module")
def corpus():
    if not (os.path.isfile(TRAIN) and os.path.isfile(EVAL)):
        pytest.skip(f"no HarmBench CSVs under {HB}")
    return D.build_corpus(TRAIN, EVAL)


@pytest.fixture(scope="module")
def tok(corpus):
    return D.build_tokenizer(corpus)


def test_corpus_held_out_and_clipped(corpus):
    assert not set(corpus.eval_harmful) & set(corpus.train_harmful)
    assert max(len(r.split()) for r in corpus.train_harmful + corpus.eval_harmful) <= D.MAX_REQUEST_TOKENS
    assert len(corpus.benign) == len(D.BENIGN_TEMPLATES) * len(D.TOPICS)
    assert all(a.startswith("sure , here") for _, _, a in corpus.benign)


def test_tokenizer_round_trips_and_renders_the_template(tok, corpus):
    from sarjax.models.llm.prompts import retokenizes, split_chat_template

    special = set(tok.all_special_ids)
    ids = [i for i in range(len(tok)) if i not in special]
    assert all(retokenizes(tok, [i]) for i in ids)
    rng = np.random.default_rng(0)
    assert all(retokenizes(tok, rng.choice(ids, 8).tolist()) for _ in range(20))
    before, after = split_chat_template(tok, corpus.eval_harmful[0])
    assert before.startswith("[INST] ") and after.strip() == "[/INST]"
    assert tok.unk_token_id not in D.prompt_ids(tok, corpus.eval_harmful[0])  # held-out words are in the vocabulary


def test_member_data_mixes(corpus):
    spec = D.MEMBERS[2]  # 60% of the behaviors, refusal 2, one noisy copy
    ex = D.member_examples(spec, corpus, np.random.default_rng(0))
    n_h = round(spec.harmful_share * len(corpus.train_harmful))
    n_b = sum(i in spec.templates for i, _, _ in corpus.benign)
    assert len(ex) == 2 * (n_h + n_b)
    assert sum(a == D.REFUSALS[spec.refusal] for _, a in ex) == 2 * n_h
    noisy = ex[n_h + n_b :]
    assert all(q.startswith(q0 + " ") and a == a0 for (q, a), (q0, a0) in zip(noisy, ex[: n_h + n_b]))


def test_sft_arrays_mark_the_response(tok):
    data = D.sft_arrays(tok, [("write a story about rain", "sure , here is a story")], 24)
    real = data.ids[0][data.mask[0] == 1]
    resp = data.ids[0][data.loss_mask[0] == 1]
    assert tok.decode(resp) == "sure , here is a story </s>"
    assert tok.decode(real).startswith("[INST] write a story about rain [/INST]")


@pytest.mark.parametrize("spec", [D.MEMBERS[0], D.MEMBERS[3]], ids=["llama", "qwen2"])
def test_checkpoint_round_trip(tmp_path, tok, spec):
    from sarjax.models.llm.decoder import init_params
    from sarjax.models.llm.loader import load_model

    hf = D.hf_config(spec, len(tok))
    cfg = D.decoder_config(hf)
    params = init_params(cfg, jax.random.key(0))
    if cfg.qkv_bias:  # non-zero biases so a dropped or misplaced bias fails
        params["layers"]["bq"] = params["layers"]["bq"] + 0.5
    D.save_checkpoint(tmp_path, hf, params, tok)
    cfg2, back = load_model(str(tmp_path))
    assert cfg2 == cfg
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, back)


@FULL
def test_saved_checkpoint_matches_transformers(tmp_path, tok):
    """transformers reads the written folder and gives sarjax's logits (the writer's layout)."""
    import torch
    from transformers import AutoModelForCausalLM

    from sarjax.models.llm import decoder
    from sarjax.models.llm.loader import load_model

    for spec in (D.MEMBERS[0], D.MEMBERS[3]):
        hf = D.hf_config(spec, len(tok))
        cfg = D.decoder_config(hf)
        params = jax.tree.map(lambda a: a * 10, decoder.init_params(cfg, jax.random.key(1)))
        path = tmp_path / spec.name
        D.save_checkpoint(path, hf, params, tok)
        ids = np.asarray(D.prompt_ids(tok, "write a short poem about rain"), np.int32)
        ours = np.asarray(decoder.logits(load_model(str(path))[1], cfg, ids))
        model = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager").eval()
        with torch.no_grad():
            ref = model(torch.tensor(ids[None], dtype=torch.long)).logits[0].numpy()
        # float32 rounding grows with the logits' scale (|logits| up to ~30 here); a layout error is O(1)
        np.testing.assert_allclose(ours, ref, atol=1e-5 * np.abs(ref).max() + 1e-5, rtol=0)


@FULL
def test_train_stack_uses_each_members_own_data(tok):
    from sarjax.models.llm import generate
    from sarjax.models.llm.decoder import init_params

    cfg = D.decoder_config(D.hf_config(D.MEMBERS[3], len(tok)))
    params = jax.vmap(lambda k: init_params(cfg, k))(D.jnp_keys([0, 1]))
    d0 = D.sft_arrays(tok, [("tell me about rain", "sure , here is rain")], 16)
    d1 = D.sft_arrays(tok, [("tell me about rain", "i cannot help")] * 3, 16)
    params, losses = D.train_stack(params, cfg, [d0, d1], 60, 4, jax.random.key(0), 1e-2)
    assert np.asarray(losses)[:, -1].max() < 0.1
    ids = np.asarray([D.prompt_ids(tok, "tell me about rain")], np.int32)
    out = np.asarray(generate.stack_greedy_generate(params, cfg, ids, None, 3))
    assert tok.decode(out[0, 0]) == "sure , here" and tok.decode(out[1, 0]) == "i cannot help"
