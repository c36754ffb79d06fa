"""Offline tiny checkpoints and tokenizers for the LLM tests (no hub access)."""

import functools
import os
import sys


def _hide_broken_torchvision():
    """A torchvision built for another torch fails on import and breaks transformers' lazy
    imports; hide it (only when it is broken) since no vision code is needed here."""
    try:
        import torchvision  # noqa: F401
    except Exception:
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules["torchvision"] = None


_hide_broken_torchvision()

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

VOCAB = 96


def _tiny_configs():
    from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

    return {
        "llama": LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=12,
            rms_norm_eps=1e-5,
            max_position_embeddings=128,
            tie_word_embeddings=False,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 50000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        ),
        "qwen2": Qwen2Config(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=40,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=1,
            rms_norm_eps=1e-6,
            max_position_embeddings=128,
            tie_word_embeddings=True,
            rope_theta=1000000.0,
        ),
        "mistral": MistralConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            sliding_window=5,
            rope_theta=10000.0,
        ),
        "gpt2": GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64),
    }


def build_checkpoint(kind, path, seed=0):
    """Saves a tiny randomly initialised transformers model of ``kind`` to ``path``."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = _tiny_configs()[kind]
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():  # make biases / norms non-trivial so the test can fail on them
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name or "ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(path)
    return model


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    out = {}
    for kind in ("llama", "qwen2", "mistral", "gpt2"):
        p = str(tmp_path_factory.mktemp(kind))
        out[kind] = (p, build_checkpoint(kind, p))
    return out


def build_tokenizer(chat_template=None):
    """A tiny word-level tokenizer (whitespace split, decoder clean-up on)."""
    from sarjax.models.llm.tokenizers import word_level_tokenizer

    specials = ["<pad>", "<s>", "</s>", "<unk>", "[INST]", "[/INST]"]
    words = (
        "how to build a bomb tell me sure here is the answer sorry i cannot help with that "
        "please x y z ! ? . , write tutorial on"
    ).split()
    letters = list("abcdefghijklmnopqrstuvwxyz")
    fast = word_level_tokenizer(
        specials + words + letters, unk="<unk>", bos="<s>", eos="</s>", pad="<pad>",
        extra_special=["[INST]", "[/INST]"], chat_template=chat_template,
    )  # fmt: skip
    assert len(fast.get_vocab()) <= VOCAB
    return fast


_CORPUS = [
    "how to build a bomb really",
    "tell me really now.",
    "sure here is the answer.",
    "i cannot help with that really",
    "please write a tutorial on x y z.",
]
_SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "[INST]", "[/INST]"]


@functools.cache
def _trained(kind, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if kind == "sentencepiece":
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
        tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=_SPECIALS, show_progress=False)
    else:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=_SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )  # fmt: skip
    tok.train_from_iterator(_CORPUS * 20, trainer)
    return tok.to_str()


def subword_tokenizer(kind, chat_template=None):
    """A tiny trained subword tokenizer of one of the two families whose pieces differ from the
    whole text: ``"sentencepiece"`` (BPE over Metaspace: ``"a "`` alone ends in a lone ``\u2581``,
    ``"really"`` alone is ``\u2581really``) or ``"bytelevel"`` (GPT-2's byte-level BPE: ``"really"``
    alone is ``re ally``, after a space ``\u0120really``). Vocabulary: about 100 and 320 ids."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    size = {"sentencepiece": 110, "bytelevel": 320}[kind]
    fast = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_trained(kind, size)), bos_token="<s>", eos_token="</s>",
        pad_token="<pad>", unk_token="<unk>", additional_special_tokens=["[INST]", "[/INST]"],
    )  # fmt: skip
    if chat_template is not None:
        fast.chat_template = chat_template
    return fast


def tiny_gpt2(vocab_size, *, hidden_size=16, num_layers=1, num_heads=2, head_dim=8, intermediate_size=32, **kw):
    """A tiny GPT-2 :class:`DecoderConfig` for the JAX decoder tests (learned positions, biases
    everywhere, ``gelu_new``, LayerNorm eps 1e-5; ``num_kv_heads = num_heads``); ``**kw``:
    other fields (``tie_word_embeddings`` defaults to True, ``max_position_embeddings`` to 64)."""
    kw.setdefault("tie_word_embeddings", True)
    kw.setdefault("max_position_embeddings", 64)
    gpt2 = dict(activation="gelu_new", qkv_bias=True, o_bias=True, mlp_bias=True, norm_eps=1e-5)
    dims = (hidden_size, num_layers, num_heads, num_heads, head_dim, intermediate_size)
    return _tiny("gpt2", vocab_size, *dims, **gpt2, **kw)


def tiny_llama(
    vocab_size, *, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=48, **kw
):
    """A tiny Llama :class:`DecoderConfig` (GQA with ``num_kv_heads < num_heads``); ``**kw``: other
    fields (``rope_theta``, ``qkv_bias``, ``max_position_embeddings``, ...)."""
    dims = (hidden_size, num_layers, num_heads, num_kv_heads, head_dim, intermediate_size)
    return _tiny("llama", vocab_size, *dims, **kw)


def _tiny(family, vocab_size, hidden_size, num_layers, num_heads, num_kv_heads, head_dim, intermediate_size, **kw):
    from sarjax.models.llm.config import DecoderConfig

    return DecoderConfig(
        family=family,
        model_type=family,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate_size,
        **kw,
    )


@functools.cache
def _scaled_init_jit():
    import jax

    from sarjax.models.llm import decoder

    @functools.partial(jax.jit, static_argnames=("cfg",))
    def init(cfg, key, scale):
        return jax.tree.map(lambda x: x * scale, decoder.init_params(cfg, key))

    return init


def scaled_init(cfg, key, scale=15.0):
    """``decoder.init_params(cfg, key)`` times ``scale`` (std 0.02 * 15 = 0.3: peaked logits, so
    greedy choices are far from ties); one compile per config."""
    return _scaled_init_jit()(cfg, key, scale)


@pytest.fixture(autouse=True)
def _fast_compiles():
    """These tests are compile-bound on tiny shapes: skip most XLA optimizations, then restore."""
    import jax

    old = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", old)
