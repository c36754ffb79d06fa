"""word_level_tokenizer gives the same tokenizer as the five hand-built ones it replaced (the LLM
demo's, tests/llm/conftest.py's, and those of test_autodan_mixed, test_text_exchange and
test_autodan_jit): same vocabulary, ids, decoding, special tokens, chat template and saved files."""

import json
import os

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")

from sarjax.models.llm.tokenizers import WordLevelOptions, word_level_tokenizer  # noqa: E402

INST = "{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "[INST]", "[/INST]"]
WORDS = "how to build a bomb tell me sure here is the answer sorry i cannot help with that please".split()
TEXTS = [
    "how to build a bomb",
    "How To BUILD a Bomb",  # upper case: unknown without lower-casing
    "sorry , i cannot help with that .",
    "sure here is the answer. please!",  # punctuation glued to words
    "tell me zzz unknownword x y z",
    "[INST] how to build a bomb [/INST] sure </s>",
    "i'm sorry, but i cannot",
    "",
]


def _hand_built(tokens, *, normalizer, pre, decoder, chat_template, **fast_kwargs):
    """The construction every call site spelled out before word_level_tokenizer."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(dict.fromkeys(tokens))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoder
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **fast_kwargs)
    if chat_template is not None:
        fast.chat_template = chat_template
    return fast


def _configs():
    """(name, tokens, the old hand-built tokenizer, the new call) for the five call sites."""
    from tokenizers import decoders, normalizers, pre_tokenizers

    from sarjax.experiments import llm_demo

    ws, wss = pre_tokenizers.Whitespace, pre_tokenizers.WhitespaceSplit
    full = dict(bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>")
    inst = dict(additional_special_tokens=["[INST]", "[/INST]"])
    demo_words = sorted({w for t in [*llm_demo.REFUSALS, llm_demo.TEACHER_REFUSAL] for w in llm_demo.words(t)})
    demo = list(llm_demo.SPECIALS) + demo_words + WORDS
    conftest = SPECIALS + WORDS + "x y z ! ? . , write tutorial on".split() + list("abcdefghijklmnopqrstuvwxyz")
    mixed = ["<unk>", "<|user|>", "<|bot|>", "</s>", "<pad>"] + WORDS[::-1] + list("zyxwvutsrqponmlkjihgfedcba")
    exchange = ["<pad>", "<unk>", "<s>", "</s>", "q0", "q1", "q2"] + [w for w in WORDS[::-1] if w != "bomb"]
    jit = SPECIALS + WORDS + "write tutorial on make thing do task go now ok no yes".split()
    mixed_template = "{% for m in messages %}<|user|> {{ m['content'] }} <|bot|>{% endfor %}"
    return [
        (
            "llm_demo",
            demo,
            lambda: _hand_built(
                demo, normalizer=normalizers.Lowercase(), pre=ws(), decoder=decoders.WordPiece(prefix="##", cleanup=False),
                chat_template=llm_demo.CHAT_TEMPLATE, **full, **inst,
            ),
            lambda: word_level_tokenizer(
                demo, unk="<unk>", bos="<s>", eos="</s>", pad="<pad>", extra_special=["[INST]", "[/INST]"],
                chat_template=llm_demo.CHAT_TEMPLATE,
                options=WordLevelOptions(lowercase=True, split="whitespace", cleanup=False),
            ),
        ),
        (
            "conftest",
            conftest,
            lambda: _hand_built(
                conftest, normalizer=None, pre=wss(), decoder=decoders.WordPiece(prefix="##"), chat_template=INST,
                **full, **inst,
            ),
            lambda: word_level_tokenizer(
                conftest, unk="<unk>", bos="<s>", eos="</s>", pad="<pad>", extra_special=["[INST]", "[/INST]"],
                chat_template=INST,
            ),
        ),
        (
            "autodan_mixed",
            mixed,
            lambda: _hand_built(
                mixed, normalizer=None, pre=wss(), decoder=decoders.WordPiece(prefix="##"), chat_template=mixed_template,
                eos_token="</s>", pad_token="<pad>", unk_token="<unk>", additional_special_tokens=["<|user|>", "<|bot|>"],
            ),
            lambda: word_level_tokenizer(
                mixed, unk="<unk>", eos="</s>", pad="<pad>", extra_special=["<|user|>", "<|bot|>"],
                chat_template=mixed_template,
            ),
        ),
        (
            "text_exchange",
            exchange,
            lambda: _hand_built(
                exchange, normalizer=None, pre=wss(), decoder=decoders.WordPiece(prefix="##"), chat_template=INST, **full
            ),
            lambda: word_level_tokenizer(exchange, unk="<unk>", bos="<s>", eos="</s>", pad="<pad>", chat_template=INST),
        ),
        (
            "autodan_jit",
            jit,
            lambda: _hand_built(
                jit, normalizer=None, pre=wss(), decoder=decoders.WordPiece(prefix="##", cleanup=False), chat_template=INST,
                clean_up_tokenization_spaces=False, **full, **inst,
            ),
            lambda: word_level_tokenizer(
                jit, unk="<unk>", bos="<s>", eos="</s>", pad="<pad>", extra_special=["[INST]", "[/INST]"],
                options=WordLevelOptions(cleanup=False, clean_up_tokenization_spaces=False), chat_template=INST,
            ),
        ),
    ]  # fmt: skip


def _saved(tok, path):
    tok.save_pretrained(str(path))
    return {f: json.load(open(os.path.join(path, f))) for f in sorted(os.listdir(path)) if f.endswith(".json")}


@pytest.mark.parametrize(
    "case", range(5), ids=["llm_demo", "conftest", "autodan_mixed", "text_exchange", "autodan_jit"]
)
def test_same_tokenizer_as_the_hand_built_one(case, tmp_path):
    name, tokens, old_fn, new_fn = _configs()[case]
    old, new = old_fn(), new_fn()
    assert new.get_vocab() == old.get_vocab()
    assert len(new.get_vocab()) == len(dict.fromkeys(tokens))
    assert new.all_special_tokens == old.all_special_tokens
    assert (new.bos_token, new.eos_token, new.pad_token, new.unk_token) == (
        old.bos_token, old.eos_token, old.pad_token, old.unk_token,
    )  # fmt: skip
    assert new.chat_template == old.chat_template
    unk = old.unk_token_id
    for text in TEXTS:
        ids = old.encode(text, add_special_tokens=False)
        assert new.encode(text, add_special_tokens=False) == ids, (name, text)
        assert new.decode(ids) == old.decode(ids), (name, text)
        assert new.decode(ids, skip_special_tokens=True) == old.decode(ids, skip_special_tokens=True), (name, text)
    # the texts do exercise unknown words, and the decoders' clean-up where the config has it
    assert any(unk in old.encode(t, add_special_tokens=False) for t in TEXTS)
    messages = [{"role": "user", "content": "how to build a bomb"}]
    assert new.apply_chat_template(messages, tokenize=False) == old.apply_chat_template(messages, tokenize=False)
    assert new.backend_tokenizer.to_str() == old.backend_tokenizer.to_str()
    assert _saved(new, tmp_path / "new") == _saved(old, tmp_path / "old")


def test_options_change_what_they_say():
    """The options are not no-ops (so the equalities above check something)."""
    base = SPECIALS + WORDS + [",", "."]
    plain = word_level_tokenizer(base, bos="<s>", eos="</s>", pad="<pad>")
    assert plain.encode("How to", add_special_tokens=False) == [plain.unk_token_id, plain.convert_tokens_to_ids("to")]
    low = word_level_tokenizer(base, options=WordLevelOptions(lowercase=True))
    assert low.encode("How to", add_special_tokens=False) == low.convert_tokens_to_ids(["how", "to"])
    assert plain.encode("that.", add_special_tokens=False) == [plain.unk_token_id]
    split = word_level_tokenizer(base, options=WordLevelOptions(split="whitespace"))
    assert split.encode("that.", add_special_tokens=False) == split.convert_tokens_to_ids(["that", "."])
    ids = plain.convert_tokens_to_ids(["sorry", ",", "i", "cannot", "."])
    assert plain.decode(ids) == "sorry, i cannot."
    assert word_level_tokenizer(base, options=WordLevelOptions(cleanup=False)).decode(ids) == "sorry , i cannot ."
    dup = word_level_tokenizer(["<unk>", "a", "b", "a", "c"])
    assert dup.get_vocab() == {"<unk>": 0, "a": 1, "b": 2, "c": 3}
    assert plain.chat_template is None and word_level_tokenizer(base, chat_template=INST).chat_template == INST
    assert word_level_tokenizer(base, extra_special=["[INST]"]).all_special_tokens != plain.all_special_tokens


@pytest.mark.parametrize(
    "tokens, kwargs, match",
    [
        ([], {}, "empty token list"),
        (["a", "b"], {}, "unk='<unk>'"),
        (["<unk>", "a"], {"eos": "</s>"}, "eos='</s>'"),
        (["<unk>", "a"], {"extra_special": ["[INST]"]}, r"extra_special\[0\]='\[INST\]'"),
    ],
)
def test_bad_input_raises_value_error(tokens, kwargs, match):
    with pytest.raises(ValueError, match=match):
        word_level_tokenizer(tokens, **kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"split": "bpe"}, "WordLevelOptions.split must be one of .* got 'bpe'"),
        ({"lowercase": 1}, "WordLevelOptions.lowercase must be a bool, got 1"),
        ({"cleanup": None}, "WordLevelOptions.cleanup must be a bool, got None"),
        (
            {"clean_up_tokenization_spaces": "no"},
            "WordLevelOptions.clean_up_tokenization_spaces must be a bool, got 'no'",
        ),
    ],
)
def test_bad_options_raise_value_error_when_built(kwargs, match):
    with pytest.raises(ValueError, match=match):
        WordLevelOptions(**kwargs)
    with pytest.raises(TypeError, match="options must be a WordLevelOptions"):
        word_level_tokenizer(["<unk>"], options={"split": "whitespace"})  # type: ignore[arg-type]


def test_bad_token_types_raise_type_error():
    with pytest.raises(TypeError, match="got the string"):
        word_level_tokenizer("<unk> a b")
    with pytest.raises(TypeError, match="must be a str"):
        word_level_tokenizer(["<unk>", 3])  # type: ignore[list-item]
