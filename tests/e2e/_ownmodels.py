"""A user's own models (copied to a temporary folder as ownmodels.py by test_own_models.py): one pool
of all four kinds (plain function, flax linen, flax nnx, PyTorch).

Every member is a linear classifier of 28x28x1 images near one base model, so the members agree
on most images (labels: the base model's predictions).
"""

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from sarjax.models.pool import Pool

SHAPE = (28, 28, 1)
D, C = 28 * 28, 10


def weights(seed):
    base = np.random.default_rng(0)
    w0, b0 = base.normal(0, 0.05, (D, C)), base.normal(0, 0.1, C)
    if seed == 0:
        return w0.astype(np.float32), b0.astype(np.float32)
    rng = np.random.default_rng(seed)
    return (w0 + rng.normal(0, 0.01, (D, C))).astype(np.float32), (b0 + rng.normal(0, 0.02, C)).astype(np.float32)


def labels(x):
    w, b = weights(0)
    return np.argmax(np.asarray(x, np.float64).reshape(len(x), -1) @ w + b, axis=1)


def plain_apply(params, x):
    return x.reshape(x.shape[0], -1) @ params["w"] + params["b"]


class LinenNet(nn.Module):
    classes: int = C

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.classes)(x.reshape(x.shape[0], -1))


class NnxNet(nnx.Module):
    def __init__(self, rngs):
        self.dense = nnx.Linear(D, C, rngs=rngs)

    def __call__(self, x):
        return self.dense(x.reshape(x.shape[0], -1))


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(D, C)

    def forward(self, x):  # [B, 1, 28, 28]: one channel, so flattening matches NHWC
        return self.fc(x.flatten(1))


def nnx_builder():
    return NnxNet(nnx.Rngs(0))


def torch_builder():
    return TorchNet()


def make_pool():
    fn = Pool.from_functions(
        [(plain_apply, {"w": w, "b": b}) for w, b in (weights(1), weights(2))], ["fn0", "fn1"], input_shape=SHAPE
    )
    w, b = weights(3)
    linen = Pool.from_flax(
        LinenNet(), [{"params": {"Dense_0": {"kernel": w, "bias": b}}}], ["linen0"], input_shape=SHAPE
    )
    net = NnxNet(nnx.Rngs(0))
    w, b = weights(4)
    net.dense.kernel.value = jnp.asarray(w)
    net.dense.bias.value = jnp.asarray(b)
    nnx_pool = Pool.from_nnx([net], ["nnx0"], input_shape=SHAPE)
    tnet = TorchNet().eval()
    w, b = weights(5)
    with torch.no_grad():
        tnet.fc.weight.copy_(torch.tensor(w.T))
        tnet.fc.bias.copy_(torch.tensor(b))
    torch_pool = Pool.from_torch([tnet], ["torch0"], input_shape=SHAPE)
    return Pool.concat(fn, linen, nnx_pool, torch_pool)
