"""``zoo.window_max`` (the max-pool of the zoo's CNNs and of converted PyTorch modules): the value is
``jnp.max``'s bit for bit, the derivative goes to one maximal element per window, and a converted
batch-norm -> ReLU -> max-pool CNN keeps finite input gradients where ``jnp.max``'s rule gave NaN."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sarjax.models.zoo import max_pool2, window_max

HERE = Path(__file__).parent


def test_value_is_jnp_max_and_gradient_equals_it_without_ties():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((3, 4, 2, 5, 2, 6)), jnp.float32)
    np.testing.assert_array_equal(np.asarray(window_max(x, (2, 4))), np.asarray(jnp.max(x, axis=(2, 4))))
    w = jnp.asarray(np.random.default_rng(1).standard_normal((3, 4, 5, 6)), jnp.float32)
    ours = jax.grad(lambda a: jnp.sum(window_max(a, (2, 4)) * w))(x)
    ref = jax.grad(lambda a: jnp.sum(jnp.max(a, axis=(2, 4)) * w))(x)  # no ties in Gaussian samples
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(ref))


def test_gradient_goes_to_the_first_maximal_element_row_major():
    # one window over axes (1, 2) of shape [2, 2]: elements (0,1) and (1,0) tie at the maximum 3
    x = jnp.asarray([[[1.0, 3.0], [3.0, 2.0]]])
    g = jax.grad(lambda a: window_max(a, (1, 2)).sum())(x)
    np.testing.assert_array_equal(np.asarray(g), [[[0.0, 1.0], [0.0, 0.0]]])
    g_ref = jax.grad(lambda a: jnp.max(a, axis=(1, 2)).sum())(x)  # jnp.max shares it between the ties
    np.testing.assert_array_equal(np.asarray(g_ref), [[[0.0, 0.5], [0.5, 0.0]]])
    # negative axes, forward-mode, and under vmap (a pool's member axis)
    t = jnp.asarray([[[10.0, 20.0], [30.0, 40.0]]])
    _, dt = jax.jvp(lambda a: window_max(a, (-2, -1)), (x,), (t,))
    np.testing.assert_array_equal(np.asarray(dt), [20.0])
    xs = jnp.stack([x, x[:, ::-1, ::-1]])
    gs = jax.vmap(jax.grad(lambda a: window_max(a, (1, 2)).sum()))(xs)
    np.testing.assert_array_equal(np.asarray(gs[1]), [[[0.0, 1.0], [0.0, 0.0]]])  # [[2,3],[3,1]]: (0,1) first


def test_max_pool2_gradient_is_one_hot_per_window():
    x = jnp.asarray(np.random.default_rng(2).random((2, 5, 7, 3)), jnp.float32)  # odd sizes: floor crop
    g = np.asarray(jax.grad(lambda a: max_pool2(a).sum())(x))
    assert g.shape == x.shape and set(np.unique(g)) <= {0.0, 1.0}
    assert g[:, 4:].sum() == 0 and g[:, :, 6:].sum() == 0  # the cropped row and column
    windows = g[:, :4, :6].reshape(2, 2, 2, 3, 2, 3).sum(axis=(2, 4))
    np.testing.assert_array_equal(windows, np.ones((2, 2, 3, 3)))


_O0_CHECK = """
import sys
sys.path.insert(0, {here!r})
import jax, jax.numpy as jnp, numpy as np, torch
from _torch_nets import SmallCNN, randomize_bn, whiten_head
from sarjax.models.pool import Pool
torch.manual_seed(0)
m = randomize_bn(SmallCNN(in_ch=1, width=2, classes=3, size=8), seed=0)
whiten_head(m, m.fc, np.random.default_rng(5).random((64, 8, 8, 1), dtype=np.float32), seed=0)
s = Pool.from_torch([m], input_shape=(8, 8, 1)).stacks[0]
x = jnp.asarray(np.random.default_rng(1).random((6, 8, 8, 1), dtype=np.float32))
g = jax.jit(jax.grad(lambda x: jnp.sum(jax.nn.log_softmax(s.apply(s.params, x)))))(x)
print("NONFINITE", int((~np.isfinite(np.asarray(g))).sum()), g.size)
"""


def test_converted_bn_relu_maxpool_gradient_is_finite_at_xla_opt_level_0():
    """Regression: with ``jnp.max`` in the converter's 2x2 max-pool, this gradient had 99 NaN of 384
    at XLA's lowest backend optimisation level (jax 0.10.2, CPU; 155 in tests/models/test_torch_pool's
    pool), because the pool's operand was recomputed with other rounding where ``jnp.max``'s rule
    counts the maximal elements."""
    pytest.importorskip("torch")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_backend_optimization_level=0"}
    code = _O0_CHECK.format(here=str(HERE))
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "NONFINITE 0 384" in r.stdout, r.stdout
