"""Torch-free loading of Hugging Face decoder checkpoints (config.json + safetensors).

Reads ``config.json`` (transformers v4 or v5 form), single-file ``model.safetensors``
or sharded ``model.safetensors.index.json`` checkpoints, maps parameter names onto
sarjax's stacked tree (see ``decoder``), transposes torch ``Linear`` weights
``[out, in] -> [in, out]`` (GPT-2's ``Conv1D`` is already ``[in, out]``) and casts to
float32 or bfloat16.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open

from sarjax.models.llm.config import DecoderConfig, config_from_hf
from sarjax.models.llm.decoder import init_params

_DTYPES = {"float32": jnp.float32, "f32": jnp.float32, "bfloat16": jnp.bfloat16, "bf16": jnp.bfloat16}


def load_config(path: str) -> DecoderConfig:
    """Reads ``<path>/config.json`` into a ``DecoderConfig``.

    Raises:
      FileNotFoundError: no config.json in ``path``.
      ValueError: unknown architecture (named in the message).
    """
    f = os.path.join(path, "config.json")
    if not os.path.isfile(f):
        raise FileNotFoundError(f"expected a Hugging Face config at {f}")
    with open(f) as fh:
        return config_from_hf(json.load(fh))


class _TensorSource:
    """Lazy name -> numpy array access over one or several safetensors files."""

    def __init__(self, path: str):
        single = os.path.join(path, "model.safetensors")
        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.isfile(index):
            with open(index) as fh:
                weight_map = json.load(fh)["weight_map"]
            files = sorted(set(weight_map.values()))
        elif os.path.isfile(single):
            files = ["model.safetensors"]
            weight_map = None
        else:
            raise FileNotFoundError(f"expected model.safetensors or model.safetensors.index.json in {path}")
        self._handles = {f: safe_open(os.path.join(path, f), framework="numpy") for f in files}
        if weight_map is None:
            weight_map = {k: files[0] for k in self._handles[files[0]].keys()}
        self.weight_map = weight_map

    def names(self):
        return self.weight_map.keys()

    def get(self, name: str) -> np.ndarray:
        return self._handles[self.weight_map[name]].get_tensor(name)


def _resolver(src: _TensorSource, prefixes: tuple[str, ...], path: str) -> Callable[[str], np.ndarray]:
    names = set(src.names())

    def get(name: str) -> np.ndarray:
        for pre in prefixes:
            if pre + name in names:
                return src.get(pre + name)
        raise KeyError(f"missing tensor {name!r} (tried prefixes {prefixes}) in checkpoint {path}")

    def has(name: str) -> bool:
        return any(pre + name in names for pre in prefixes)

    get.has = has  # type: ignore[attr-defined]
    return get


def _stack(get, names: list[str], transpose: bool) -> np.ndarray:
    arrs = [get(n) for n in names]
    if transpose:
        arrs = [a.T for a in arrs]
    return np.stack(arrs)


def _llama_params(cfg: DecoderConfig, get) -> dict[str, Any]:
    L = range(cfg.num_layers)
    lp = "layers.{}."
    table = {
        "attn_norm": ("input_layernorm.weight", False),
        "wq": ("self_attn.q_proj.weight", True),
        "wk": ("self_attn.k_proj.weight", True),
        "wv": ("self_attn.v_proj.weight", True),
        "wo": ("self_attn.o_proj.weight", True),
        "mlp_norm": ("post_attention_layernorm.weight", False),
        "w_gate": ("mlp.gate_proj.weight", True),
        "w_up": ("mlp.up_proj.weight", True),
        "w_down": ("mlp.down_proj.weight", True),
    }
    if cfg.qkv_bias:
        table.update(
            bq=("self_attn.q_proj.bias", False),
            bk=("self_attn.k_proj.bias", False),
            bv=("self_attn.v_proj.bias", False),
        )
    if cfg.o_bias:
        table.update(bo=("self_attn.o_proj.bias", False))
    if cfg.mlp_bias:
        table.update(
            b_gate=("mlp.gate_proj.bias", False), b_up=("mlp.up_proj.bias", False), b_down=("mlp.down_proj.bias", False)
        )
    if cfg.qk_norm:
        table.update(q_norm=("self_attn.q_norm.weight", False), k_norm=("self_attn.k_norm.weight", False))
    layers = {k: _stack(get, [lp.format(i) + n for i in L], t) for k, (n, t) in table.items()}
    out = {"embed": get("embed_tokens.weight"), "final_norm": get("norm.weight"), "layers": layers}
    if not cfg.tie_word_embeddings:
        out["lm_head"] = get("lm_head.weight").T
    return out


def _gpt2_params(cfg: DecoderConfig, get) -> dict[str, Any]:
    L = range(cfg.num_layers)
    table = {
        "ln1": "ln_1.weight",
        "ln1_b": "ln_1.bias",
        "w_qkv": "attn.c_attn.weight",
        "b_qkv": "attn.c_attn.bias",
        "wo": "attn.c_proj.weight",
        "bo": "attn.c_proj.bias",
        "ln2": "ln_2.weight",
        "ln2_b": "ln_2.bias",
        "w_fc": "mlp.c_fc.weight",
        "b_fc": "mlp.c_fc.bias",
        "w_proj": "mlp.c_proj.weight",
        "b_proj": "mlp.c_proj.bias",
    }
    layers = {k: _stack(get, [f"h.{i}.{n}" for i in L], False) for k, n in table.items()}
    out = {
        "embed": get("wte.weight"),
        "pos_embed": get("wpe.weight"),
        "final_norm": get("ln_f.weight"),
        "final_norm_b": get("ln_f.bias"),
        "layers": layers,
    }
    if not cfg.tie_word_embeddings:
        out["lm_head"] = get("lm_head.weight").T
    return out


def load_params(path: str, cfg: DecoderConfig | None = None, dtype: str | Any = "float32") -> dict[str, Any]:
    """Loads safetensors weights from a Hugging Face checkpoint folder, without torch.

    Args:
      path: folder with ``config.json`` and ``model.safetensors`` (or a sharded
        ``model.safetensors.index.json``).
      cfg: configuration (read from ``path`` when None).
      dtype: ``"float32"``/``"f32"`` or ``"bfloat16"``/``"bf16"`` (or the jnp dtype).

    Returns:
      The parameter tree of ``decoder`` as jax arrays of ``dtype``.

    Raises:
      KeyError: a tensor the architecture needs is missing (named).
      ValueError: bad dtype; a tensor with an unexpected shape (named).
    """
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        dtype = _DTYPES[dtype]
    elif jnp.dtype(dtype) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
        raise ValueError(f"dtype must be float32 or bfloat16, got {dtype}")
    cfg = cfg or load_config(path)
    src = _TensorSource(path)
    if cfg.family == "gpt2":
        get = _resolver(src, ("transformer.", "", "model."), path)
        tree = _gpt2_params(cfg, get)
    else:
        get = _resolver(src, ("model.", "", "model.language_model."), path)
        tree = _llama_params(cfg, _lm_head_aware(get, src))
    _check_shapes(cfg, tree)
    return jax.tree.map(lambda a: jnp.asarray(a).astype(dtype), tree)


def _lm_head_aware(get, src):
    names = set(src.names())

    def g(name):
        if name == "lm_head.weight":
            if name in names:
                return src.get(name)
            raise KeyError("missing tensor 'lm_head.weight' (config says tie_word_embeddings=False)")
        return get(name)

    return g


def _check_shapes(cfg: DecoderConfig, tree) -> None:
    want = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    flat_w = dict(jax.tree_util.tree_flatten_with_path(want)[0])
    flat_t = dict(jax.tree_util.tree_flatten_with_path(tree)[0])
    for p, w in flat_w.items():
        name = jax.tree_util.keystr(p)
        if p not in flat_t:
            raise KeyError(f"missing parameter {name}")
        if tuple(flat_t[p].shape) != tuple(w.shape):
            raise ValueError(f"parameter {name}: expected shape {tuple(w.shape)}, got {tuple(flat_t[p].shape)}")


TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tekken.json",
)
"""Files that hold a tokenizer's vocabulary in a Hugging Face folder (one of them is required;
``vocab.json`` goes with ``merges.txt``). ``tokenizer_config.json`` alone holds none."""


def check_tokenizer_files(path: str | os.PathLike) -> None:
    """Raises ValueError naming ``path`` and the files expected when the folder holds no
    tokenizer vocabulary (:data:`TOKENIZER_FILES`, or a ``*.tiktoken`` file).

    Without one, transformers fails with a message that names neither (Llama: "Couldn't
    instantiate the backend tokenizer"), or builds a one-token tokenizer silently (GPT-2).
    """
    path = os.fspath(path)
    found = sorted(os.listdir(path))
    if any(f in TOKENIZER_FILES or f.endswith(".tiktoken") for f in found):
        return
    expected = ", ".join(TOKENIZER_FILES[:-1]).replace("vocab.json", "vocab.json (with merges.txt)")
    raise ValueError(
        f"no tokenizer in checkpoint folder {path}: expected {expected} or {TOKENIZER_FILES[-1]} "
        f"(save the tokenizer with tokenizer.save_pretrained(folder)); found {found}"
    )


def tokenizer_size(tokenizer) -> int:
    """Ids a tokenizer can produce: ``max(len(tokenizer), largest id + 1)`` (added tokens included)."""
    ids = tokenizer.get_vocab().values()
    return max(len(tokenizer), max(ids, default=-1) + 1)


def check_tokenizer_vocab(tokenizer, cfg: DecoderConfig, member: str, path: str | None = None) -> None:
    """Raises ValueError naming ``member`` (and ``path``) and both sizes when the tokenizer has more
    tokens than the model's vocabulary (``cfg.vocab_size`` embedding rows): its larger ids would
    index past the embedding (clamped silently by a gather). Smaller tokenizers are fine (padded
    embeddings are common)."""
    if tokenizer is None:
        return
    n = tokenizer_size(tokenizer)
    if n > cfg.vocab_size:
        where = f"member {member!r}" + (f" ({path})" if path is not None else "")
        raise ValueError(
            f"{where}: its tokenizer has {n} tokens but the model's vocabulary has vocab_size "
            f"{cfg.vocab_size} (config.json): ids >= {cfg.vocab_size} have no embedding row; "
            "use the tokenizer the checkpoint was trained with"
        )


def load_model(path: str, dtype: str | Any = "float32") -> tuple[DecoderConfig, dict[str, Any]]:
    """``(load_config(path), load_params(path, dtype=dtype))``."""
    cfg = load_config(path)
    return cfg, load_params(path, cfg, dtype)
