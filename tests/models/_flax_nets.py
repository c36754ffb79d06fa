"""Small flax models for the stack tests (imported by the tests and by their fresh-process scripts).

``LinenCNN`` and ``NnxMLP`` carry batch norm and dropout so that evaluation mode matters;
``linen_twin`` / ``nnx_twin`` compute a zoo CNN / MLP member exactly (same layers, weights copied).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

SHAPE = (8, 8, 1)
CLASSES = 3


class LinenCNN(nn.Module):
    """conv 3x3 -> batch norm -> relu -> 2x2 max-pool -> dropout -> dense -> logits."""

    channels: int = 3
    dense: int = 8

    @nn.compact
    def __call__(self, x, train: bool = True):
        x = nn.Conv(self.channels, (3, 3))(x)
        x = nn.BatchNorm(use_running_average=not train)(x)
        x = nn.max_pool(nn.relu(x), (2, 2), (2, 2))
        x = x.reshape(x.shape[0], -1)
        x = nn.Dropout(0.5, deterministic=not train)(x)
        return nn.Dense(CLASSES)(nn.relu(nn.Dense(self.dense)(x)))


def fill(abstract, seed: int):
    """Numpy values for a tree of ``jax.ShapeDtypeStruct`` (nothing compiles): kernels / ``w`` scaled
    normal, biases small, batch-norm scales near 1, non-trivial running means and variances."""
    rng = np.random.default_rng(seed)

    def leaf(path, a):
        name = jax.tree_util.keystr(path)
        if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
            return jax.random.key(seed)
        if not jnp.issubdtype(a.dtype, jnp.floating):
            return np.zeros(a.shape, a.dtype)
        if "kernel" in name or "'w'" in name:
            v = rng.normal(0, 1 / np.sqrt(np.prod(a.shape[:-1])), a.shape)
        elif "scale" in name:
            v = 1 + 0.1 * rng.normal(size=a.shape)
        elif "var" in name:
            v = rng.uniform(0.5, 2.0, a.shape)
        else:  # biases, running means
            v = 0.3 * rng.normal(size=a.shape)
        return v.astype(np.float32)

    return jax.tree_util.tree_map_with_path(leaf, abstract)


def linen_variables(module, seed: int):
    """Variables of ``module`` (numpy values, no compilation) with non-trivial batch statistics."""
    abstract = jax.eval_shape(lambda: module.init({"params": jax.random.key(0)}, jnp.zeros((1, *SHAPE)), train=False))
    return fill(abstract, seed)


def zoo_params(arch, k: int, seed: int):
    """Stacked params of ``k`` members of a zoo architecture (numpy values, no compilation)."""
    one = jax.eval_shape(arch.init, jax.random.key(0))
    return fill(jax.tree.map(lambda a: jax.ShapeDtypeStruct((k, *a.shape), a.dtype), one), seed)


class NnxMLP(nnx.Module):
    """dense -> batch norm -> relu -> dropout -> dense."""

    def __init__(self, hidden: int = 6, *, rngs: nnx.Rngs):
        self.l1 = nnx.Linear(int(np.prod(SHAPE)), hidden, rngs=rngs)
        self.bn = nnx.BatchNorm(hidden, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)
        self.l2 = nnx.Linear(hidden, CLASSES, rngs=rngs)

    def __call__(self, x):
        h = self.bn(self.l1(x.reshape(x.shape[0], -1)))
        return self.l2(self.drop(nnx.relu(h)))


def nnx_member(seed: int, hidden: int = 6) -> NnxMLP:
    """An :class:`NnxMLP` in training mode (numpy values, no compilation)."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: NnxMLP(hidden, rngs=nnx.Rngs(0))))
    return nnx.merge(graphdef, fill(state, seed))


class LinenZooCNN(nn.Module):
    """The zoo's ``cnn((c,), dense=d)``: conv 3x3 SAME -> relu -> 2x2 max-pool -> dense -> relu -> dense."""

    channels: int
    dense: int

    @nn.compact
    def __call__(self, x):
        x = nn.max_pool(nn.relu(nn.Conv(self.channels, (3, 3), name="conv0")(x)), (2, 2), (2, 2))
        x = nn.relu(nn.Dense(self.dense, name="dense")(x.reshape(x.shape[0], -1)))
        return nn.Dense(CLASSES, name="out")(x)


def linen_twin_variables(zoo_params):
    """Variables of :class:`LinenZooCNN` holding one zoo CNN member's weights."""
    return {
        "params": {k: {"kernel": zoo_params[k]["w"], "bias": zoo_params[k]["b"]} for k in ("conv0", "dense", "out")}
    }


class NnxZooMLP(nnx.Module):
    """The zoo's ``mlp((h,))``: dense -> relu -> dense."""

    def __init__(self, hidden: int, *, rngs: nnx.Rngs):
        self.dense0 = nnx.Linear(int(np.prod(SHAPE)), hidden, rngs=rngs)
        self.out = nnx.Linear(hidden, CLASSES, rngs=rngs)

    def __call__(self, x):
        return self.out(nnx.relu(self.dense0(x.reshape(x.shape[0], -1))))


def nnx_twin(params, hidden: int) -> NnxZooMLP:
    """An :class:`NnxZooMLP` holding one zoo MLP member's weights."""
    m = nnx.eval_shape(lambda: NnxZooMLP(hidden, rngs=nnx.Rngs(0)))
    for k in ("dense0", "out"):
        layer = getattr(m, k)
        layer.kernel.set_value(jnp.asarray(params[k]["w"]))
        layer.bias.set_value(jnp.asarray(params[k]["b"]))
    return m


def plain_apply(p, x):
    """A plain-function member: a two-layer tanh network on the flattened image."""
    return jnp.tanh(x.reshape(x.shape[0], -1) @ p["w1"] + p["b1"]) @ p["w2"]


def plain_params(seed: int, hidden: int = 5):
    rng = np.random.default_rng(seed)
    d = int(np.prod(SHAPE))
    return {
        "w1": jnp.asarray(rng.normal(0, 1 / np.sqrt(d), (d, hidden)), jnp.float32),
        "b1": jnp.asarray(rng.normal(0, 0.1, (hidden,)), jnp.float32),
        "w2": jnp.asarray(rng.normal(0, 1 / np.sqrt(hidden), (hidden, CLASSES)), jnp.float32),
    }
