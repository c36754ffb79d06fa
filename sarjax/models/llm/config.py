"""Decoder configuration: one frozen dataclass for the Llama family and GPT-2.

The configuration is hashable so that it can be a static argument of ``jax.jit``.
``config_from_hf`` reads a Hugging Face ``config.json`` dictionary in either the
transformers v4 form (``rope_theta`` / ``rope_scaling``) or the v5 form
(``rope_parameters``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED_MODEL_TYPES = LLAMA_FAMILY + ("gpt2",)
_ROPE_TYPES = ("default", "linear", "llama3")
_ACTIVATIONS = ("silu", "gelu_new", "gelu", "gelu_pytorch_tanh", "relu")


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Static description of a decoder-only transformer.

    Attributes:
      family: ``"llama"`` (pre-norm RMSNorm, rotary positions, gated MLP, separate
        q/k/v projections; Llama 2/3, Mistral, Qwen2, Qwen3) or ``"gpt2"`` (pre-norm
        LayerNorm, learned positions, GELU MLP, fused qkv).
      model_type: the ``model_type`` of the source config (for messages and loading).
      vocab_size: V.
      hidden_size: d.
      num_layers: L.
      num_heads: query heads H.
      num_kv_heads: key/value heads (GQA when smaller than ``num_heads``).
      head_dim: per-head width D (may differ from d / H when the config says so).
      intermediate_size: MLP width F.
      norm_eps: RMSNorm / LayerNorm epsilon from the config.
      activation: MLP activation name.
      qkv_bias: q/k/v projections carry biases (Qwen2, Llama ``attention_bias``).
      o_bias: output projection carries a bias (Llama ``attention_bias``).
      mlp_bias: MLP projections carry biases (Llama ``mlp_bias``).
      tie_word_embeddings: the LM head is the transposed token embedding.
      max_position_embeddings: learned position table size (GPT-2) / context length.
      rope_theta: rotary base.
      rope_type: ``"default"``, ``"linear"`` or ``"llama3"``.
      rope_factor: scaling factor for ``linear`` and ``llama3``.
      rope_low_freq_factor: llama3 scaling parameter.
      rope_high_freq_factor: llama3 scaling parameter.
      rope_original_max_position: llama3 scaling parameter.
      sliding_window: Mistral-style attention window, or None.
      qk_norm: per-head RMSNorm of the queries and keys (over ``head_dim``, before the rotary
        embedding), as in Qwen3.
    """

    family: str
    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    norm_eps: float = 1e-6
    activation: str = "silu"
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position: int = 8192
    sliding_window: int | None = None
    qk_norm: bool = False

    def __post_init__(self):
        if self.family not in ("llama", "gpt2"):
            raise ValueError(f"family must be 'llama' or 'gpt2', got {self.family!r}")
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {_ACTIVATIONS}, got {self.activation!r}")
        if self.rope_type not in _ROPE_TYPES:
            raise ValueError(f"rope_type must be one of {_ROPE_TYPES}, got {self.rope_type!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "head_dim", "intermediate_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


def rope_inv_freq(cfg: DecoderConfig) -> np.ndarray:
    """Rotary inverse frequencies, float32 [D/2], including ``linear``/``llama3`` scaling.

    Follows transformers' ``modeling_rope_utils`` (default, linear, llama3), which
    follows Meta's llama3.1 reference for the llama3 smoothing.
    """
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / d))
    inv = inv.astype(np.float32)
    if cfg.rope_type == "linear":
        return (inv / cfg.rope_factor).astype(np.float32)
    if cfg.rope_type == "llama3":
        factor = cfg.rope_factor
        lo, hi = cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
        old = cfg.rope_original_max_position
        low_wl, high_wl = old / lo, old / hi
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > low_wl, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
        return np.where(medium, smoothed, scaled).astype(np.float32)
    return inv


def _rope_fields(raw: Mapping[str, Any]) -> dict[str, Any]:
    params = raw.get("rope_parameters")
    if isinstance(params, Mapping) and params and not any(isinstance(v, Mapping) for v in params.values()):
        theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
        scaling = params
    elif isinstance(params, Mapping) and params:
        raise ValueError(
            f"per-layer-type rope_parameters are not supported; expected one flat dict, got keys {sorted(params)}"
        )
    else:
        theta = raw.get("rope_theta", 10000.0)
        scaling = raw.get("rope_scaling") or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default")) or "default"
    if rope_type not in _ROPE_TYPES:
        raise ValueError(f"rope type {rope_type!r} is not supported; expected one of {_ROPE_TYPES}")
    out: dict[str, Any] = {"rope_theta": float(theta), "rope_type": rope_type}
    if rope_type in ("linear", "llama3"):
        out["rope_factor"] = float(scaling["factor"])
    if rope_type == "llama3":
        out["rope_low_freq_factor"] = float(scaling["low_freq_factor"])
        out["rope_high_freq_factor"] = float(scaling["high_freq_factor"])
        out["rope_original_max_position"] = int(scaling["original_max_position_embeddings"])
    return out


def config_from_hf(raw: Mapping[str, Any]) -> DecoderConfig:
    """Builds a ``DecoderConfig`` from a Hugging Face ``config.json`` dictionary.

    Args:
      raw: the parsed ``config.json``; v4 (``rope_theta``/``rope_scaling``) and v5
        (``rope_parameters``) forms are both accepted.

    Returns:
      The static decoder configuration.

    Raises:
      ValueError: unknown ``model_type`` or an unsupported feature, naming it.
      TypeError: ``raw`` is not a mapping.
    """
    if not isinstance(raw, Mapping):
        raise TypeError(f"expected a config mapping, got {type(raw).__name__}")
    mt = raw.get("model_type")
    if mt not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"unsupported architecture model_type={mt!r} (architectures={raw.get('architectures')}); "
            f"supported: {SUPPORTED_MODEL_TYPES}"
        )
    if mt == "gpt2":
        d = int(raw["n_embd"])
        h = int(raw["n_head"])
        if raw.get("scale_attn_by_inverse_layer_idx") or raw.get("reorder_and_upcast_attn"):
            raise ValueError("GPT-2 scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn are not supported")
        if raw.get("scale_attn_weights", True) is False:
            raise ValueError("GPT-2 scale_attn_weights=False is not supported")
        return DecoderConfig(
            family="gpt2",
            model_type=mt,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=d,
            num_layers=int(raw["n_layer"]),
            num_heads=h,
            num_kv_heads=h,
            head_dim=d // h,
            intermediate_size=int(raw.get("n_inner") or 4 * d),
            norm_eps=float(raw.get("layer_norm_epsilon", 1e-5)),
            activation=raw.get("activation_function", "gelu_new"),
            qkv_bias=True,
            o_bias=True,
            mlp_bias=True,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
            max_position_embeddings=int(raw["n_positions"]),
        )
    d = int(raw["hidden_size"])
    h = int(raw["num_attention_heads"])
    head_dim = raw.get("head_dim") or d // h
    if float(raw.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError("partial_rotary_factor != 1 is not supported")
    attn_bias = bool(raw.get("attention_bias", False))
    sliding = None
    if mt == "mistral":
        sliding = raw.get("sliding_window")
    elif mt in ("qwen2", "qwen3") and raw.get("use_sliding_window", False):
        raise ValueError(f"{mt} use_sliding_window=True is not supported")
    layer_types = raw.get("layer_types")
    if layer_types and any(t != "full_attention" for t in layer_types):
        raise ValueError(f"layer_types other than 'full_attention' are not supported, got {sorted(set(layer_types))}")
    return DecoderConfig(
        family="llama",
        model_type=mt,
        vocab_size=int(raw["vocab_size"]),
        hidden_size=d,
        num_layers=int(raw["num_hidden_layers"]),
        num_heads=h,
        num_kv_heads=int(raw.get("num_key_value_heads") or h),
        head_dim=int(head_dim),
        intermediate_size=int(raw["intermediate_size"]),
        norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        activation=raw.get("hidden_act", "silu"),
        qkv_bias=True if mt == "qwen2" else attn_bias,
        o_bias=False if mt == "qwen2" else attn_bias,
        mlp_bias=bool(raw.get("mlp_bias", False)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        sliding_window=None if sliding is None else int(sliding),
        qk_norm=mt == "qwen3",
        **_rope_fields(raw),
    )
