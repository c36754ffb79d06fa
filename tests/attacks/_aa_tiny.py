"""A tiny pool and image set for the AutoAttack runner, CLI and multi-process tests.

``make_pool`` is also the ``--model _aa_tiny:make_pool`` of the command tests (this folder on
``PYTHONPATH``): two stacks (two linear members; one member with a ReLU layer), 5 classes, 4x4x1 inputs.
"""

import jax.numpy as jnp
import numpy as np

from sarjax.models import Pool

C = 5
SHAPE = (4, 4, 1)
EPS = 0.05  # linf: some (image, member) pairs broken, some robust at the budgets below
BUDGET = dict(n_iter=4, fab_iter=3, square_queries=8)


def linear(p, x):
    return x.reshape(x.shape[0], -1) @ p["W"] + p["b"]


def hidden(p, x):
    return jnp.maximum(x.reshape(x.shape[0], -1) @ p["W1"], 0.0) @ p["W2"]


def make_pool(stacks: int = 2) -> Pool:
    """Two linear members (one stack) and, with ``stacks=2``, a ReLU member (a second stack)."""
    rng = np.random.default_rng(0)

    def w(*shape):
        return jnp.asarray(rng.normal(size=shape) / 4, jnp.float32)

    members = [(linear, {"W": w(16, C), "b": jnp.zeros(C, jnp.float32)}) for _ in range(2)]
    members.append((hidden, {"W1": w(16, 8), "W2": w(8, C)}))
    return Pool.from_functions(members[: 1 + stacks], ["lin0", "lin1", "relu"][: 1 + stacks], input_shape=SHAPE)


def make_linear_pool() -> Pool:
    """The two linear members only (one stack): ``--model _aa_tiny:make_linear_pool``."""
    return make_pool(stacks=1)


def images(n=20, seed=1):
    """``(x [n, 4, 4, 1] in [0.3, 0.7], y [n])``: ``y`` is member ``lin0``'s prediction, one label flipped."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.3, 0.7, size=(n, *SHAPE)).astype(np.float32)
    y = np.asarray(make_pool().predict(x))[0].astype(np.int32)
    y[0] = (y[0] + 1) % C
    return x, y


def logits64(pool: Pool, x) -> np.ndarray:
    """``[M, B, C]`` every member's logits in float64 (numpy), from the pool's own params."""
    x = np.asarray(x, np.float64).reshape(len(x), -1)
    out = []
    for stack in pool.stacks:
        p = {k: np.asarray(v, np.float64) for k, v in stack.params.items()}
        for j in range(len(stack.names)):
            if "W" in p:
                out.append(x @ p["W"][j] + p["b"][j])
            else:
                out.append(np.maximum(x @ p["W1"][j], 0.0) @ p["W2"][j])
    return np.stack(out)
