"""Logit parity of sarjax's JAX decoder with transformers' PyTorch models (f32)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sarjax.models.llm import decoder, loader


def _torch_logits(model, ids, mask=None):
    import torch

    with torch.no_grad():
        kw = {}
        if mask is not None:
            kw["attention_mask"] = torch.tensor(mask)
            pos = np.maximum(np.cumsum(mask, -1) - 1, 0)
            kw["position_ids"] = torch.tensor(pos)
        return model(torch.tensor(ids), **kw).logits.numpy()


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral", "gpt2"])
def test_logit_parity(checkpoints, kind):
    path, model = checkpoints[kind]
    cfg, params = loader.load_model(path)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, cfg.vocab_size, size=(2, 11))
    fwd = jax.jit(jax.vmap(lambda i, m: decoder.logits(params, cfg, i, m)))
    want = _torch_logits(model, ids)
    got = fwd(jnp.asarray(ids), jnp.ones(ids.shape, jnp.int32))
    assert np.max(np.abs(np.asarray(got) - want)) <= 1e-4
    # left padding: the padded rows' real tokens must match too
    mask = np.ones_like(ids)
    mask[0, :3] = 0
    want = _torch_logits(model, ids, mask)
    got = fwd(jnp.asarray(ids), jnp.asarray(mask))
    sel = mask.astype(bool)
    assert np.max(np.abs(np.asarray(got)[sel] - want[sel])) <= 1e-4
