"""Qwen3 (per-head q/k RMSNorm) in the loader: logit parity with transformers on a tiny random
checkpoint built offline, and the clear errors of what stays unsupported."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import VOCAB

from sarjax.models.llm import config as C
from sarjax.models.llm import decoder, loader


def _tiny_qwen3(**kw):
    from transformers import Qwen3Config

    base = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=40,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=12,  # != hidden / heads, as in the real Qwen3 configs
        rms_norm_eps=1e-6,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        attention_bias=True,
        rope_theta=1000000.0,
    )
    base.update(kw)
    return Qwen3Config(**base)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_tiny_qwen3(), attn_implementation="eager").eval()
    with torch.no_grad():  # non-trivial norms (q_norm / k_norm included) and biases: the test can fail on them
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
            if "q_proj.weight" in name or "k_proj.weight" in name:
                p.mul_(20.0)  # peaked attention: the q/k norms change the logits a lot
    path = str(tmp_path_factory.mktemp("qwen3"))
    model.save_pretrained(path)
    return path, model


def _torch_logits(model, ids, mask):
    import torch

    with torch.no_grad():
        pos = np.maximum(np.cumsum(mask, -1) - 1, 0)
        return model(
            torch.tensor(ids), attention_mask=torch.tensor(mask), position_ids=torch.tensor(pos)
        ).logits.numpy()


def test_qwen3_logit_parity_with_transformers(qwen3):
    path, model = qwen3
    cfg, params = loader.load_model(path)
    assert cfg.model_type == "qwen3" and cfg.qk_norm and cfg.qkv_bias and cfg.o_bias and cfg.head_dim == 12
    assert params["layers"]["q_norm"].shape == (2, 12) and params["layers"]["k_norm"].shape == (2, 12)
    ids = np.random.default_rng(1).integers(0, VOCAB, size=(2, 11))
    mask = np.ones_like(ids)
    mask[0, :3] = 0  # left padding: the real tokens must match too
    fwd = jax.jit(jax.vmap(lambda i, m: decoder.logits(params, cfg, i, m)))
    got = np.asarray(fwd(jnp.asarray(ids), jnp.asarray(mask)))
    want = _torch_logits(model, ids, mask)
    sel = mask.astype(bool)
    assert np.max(np.abs(got[sel] - want[sel])) <= 1e-4
    # the parity depends on the q/k norms: transformers' own model without them differs by > 1e-2
    import torch

    saved = [(a.q_norm, a.k_norm) for a in (layer.self_attn for layer in model.model.layers)]
    try:
        for layer in model.model.layers:
            layer.self_attn.q_norm, layer.self_attn.k_norm = torch.nn.Identity(), torch.nn.Identity()
        plain = _torch_logits(model, ids, mask)
    finally:
        for layer, (q, k) in zip(model.model.layers, saved):
            layer.self_attn.q_norm, layer.self_attn.k_norm = q, k
    assert np.max(np.abs(plain[sel] - got[sel])) > 1e-2


def test_qwen3_config_and_unsupported_errors():
    cfg = C.config_from_hf(_tiny_qwen3(attention_bias=False).to_dict())
    assert cfg.qk_norm and not cfg.qkv_bias and not cfg.o_bias
    init = jax.eval_shape(lambda: decoder.init_params(cfg, jax.random.key(0)))
    assert init["layers"]["q_norm"].shape == (2, 12)
    with pytest.raises(ValueError, match="use_sliding_window"):
        C.config_from_hf(dict(_tiny_qwen3().to_dict(), use_sliding_window=True))
    with pytest.raises(ValueError, match="layer_types"):
        C.config_from_hf(dict(_tiny_qwen3().to_dict(), layer_types=["full_attention", "sliding_attention"]))
    with pytest.raises(ValueError, match="unsupported architecture model_type='qwen3_moe'"):
        C.config_from_hf({"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"]})
