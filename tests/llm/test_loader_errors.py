"""Checkpoint folders whose tokenizer is missing or does not fit the model: one-line errors naming
the folder, the member and the sizes (they failed inside transformers, loaded a one-token GPT-2
tokenizer silently, or loaded a tokenizer whose ids run past the embedding)."""

import os
import re
import shutil

import pytest
from conftest import VOCAB, build_tokenizer

from sarjax.models.llm.pool import load_pool
from sarjax.models.llm.prompts import load_tokenizer


def _copy(checkpoints, kind, dest):
    shutil.copytree(checkpoints[kind][0], dest)
    return str(dest)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_a_folder_without_tokenizer_files_is_named(checkpoints, tmp_path, kind):
    """llama: a transformers error about sentencepiece; gpt2: a one-token tokenizer, silently."""
    path = _copy(checkpoints, kind, tmp_path / f"{kind}-no-tokenizer")
    for load in (lambda: load_tokenizer(path), lambda: load_pool([path])):
        with pytest.raises(
            ValueError, match=rf"no tokenizer in checkpoint folder {re.escape(path)}: expected tokenizer\.json"
        ) as e:
            load()
        msg = str(e.value)
        assert "\n" not in msg and "tokenizer.model" in msg and "vocab.json" in msg and "config.json" in msg


def test_a_tokenizer_larger_than_the_vocabulary_names_member_and_sizes(checkpoints, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    path = _copy(checkpoints, "llama", tmp_path / "big-tokenizer")
    vocab = {f"w{i}": i for i in range(VOCAB + 4)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", pad_token="w1").save_pretrained(path)
    with pytest.raises(
        ValueError,
        match=rf"member 'victim' \({re.escape(path)}\): its tokenizer has {VOCAB + 4} tokens .* vocab_size {VOCAB}",
    ) as e:
        load_pool([path], names=["victim"])
    assert "\n" not in str(e.value)


def test_a_fitting_tokenizer_loads(checkpoints, tmp_path):
    path = _copy(checkpoints, "llama", tmp_path / "fits")
    build_tokenizer().save_pretrained(path)
    assert os.path.isfile(os.path.join(path, "tokenizer.json"))
    pool = load_pool([path])
    assert pool.names == ("fits",) and len(pool.stacks[0].tokenizer) <= VOCAB


def test_the_cover_loader_checks_the_tokenizer_too(checkpoints, tmp_path):
    from sarjax.sar.llm_requests import load_llm_pool

    path = _copy(checkpoints, "gpt2", tmp_path / "gpt2-no-tokenizer")
    with pytest.raises(ValueError, match=rf"no tokenizer in checkpoint folder {re.escape(path)}"):
        load_llm_pool([path])
