"""Config forms (v4/v5), sharded safetensors, bf16 loading, error messages."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sarjax.models.llm import config as cfg_mod
from sarjax.models.llm import decoder, loader


def test_v4_and_v5_config_forms_agree():
    v5 = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "intermediate_size": 96,
        "vocab_size": 100,
        "rms_norm_eps": 1e-5,
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    }
    v4 = dict(v5)
    del v4["rope_parameters"]
    v4["rope_theta"] = 500000.0
    v4["rope_scaling"] = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    a, b = cfg_mod.config_from_hf(v5), cfg_mod.config_from_hf(v4)
    assert a == b and a.rope_type == "llama3" and a.rope_theta == 500000.0 and a.head_dim == 16
    # llama3 scaling: high frequencies untouched, lowest divided by the factor
    inv = cfg_mod.rope_inv_freq(a)
    base = 1.0 / (500000.0 ** (np.arange(0, 16, 2) / 16))
    np.testing.assert_allclose(inv[0], base[0], rtol=1e-6)
    np.testing.assert_allclose(inv[-1], base[-1] / 8.0, rtol=1e-5)
    with pytest.raises(ValueError, match="unsupported architecture model_type='falcon'"):
        cfg_mod.config_from_hf({"model_type": "falcon"})
    with pytest.raises(ValueError, match="rope type 'yarn'"):
        cfg_mod.config_from_hf(dict(v4, rope_scaling={"rope_type": "yarn", "factor": 2.0}))


def test_sharded_bf16_and_missing_tensor(checkpoints, tmp_path):
    path, model = checkpoints["llama"]
    sharded = str(tmp_path / "sharded")
    model.save_pretrained(sharded, max_shard_size="20KB")
    assert os.path.isfile(os.path.join(sharded, "model.safetensors.index.json"))
    cfg, p1 = loader.load_model(path)
    _, p2 = loader.load_model(sharded)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), p1, p2)
    _, pb = loader.load_model(path, dtype="bf16")
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(pb))
    ids = jnp.arange(1, 9)
    f32 = jax.jit(lambda p: decoder.logits(p, cfg, ids))
    diff = np.abs(np.asarray(f32(p1)) - np.asarray(jax.jit(lambda p: decoder.logits(p, cfg, ids))(pb)))
    assert diff.max() < 0.05  # bf16 weights and activations, f32 softmax/norms
    with pytest.raises(ValueError, match="dtype"):
        loader.load_params(path, dtype="float16")
    # drop one tensor from the index: the error names it
    broken = str(tmp_path / "broken")
    shutil.copytree(sharded, broken)
    idx_f = os.path.join(broken, "model.safetensors.index.json")
    idx = json.load(open(idx_f))
    del idx["weight_map"]["model.layers.1.mlp.up_proj.weight"]
    json.dump(idx, open(idx_f, "w"))
    with pytest.raises(KeyError, match="layers.1.mlp.up_proj.weight"):
        loader.load_model(broken)
