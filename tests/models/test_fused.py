"""The fused CNN pool kernel (conv_impl="fused") against the generic formulation.

Known answers: the same logits as ``jax.vmap(arch.apply)`` with ``conv_impl="xla"``, and, in
float64 (where no pooling window holds a near-tie), the same input gradient as ``jax.grad`` of
that formulation; params gradients go through the generic path.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sarjax.attacks.joint import JointPGDStep, make_joint_pgd
from sarjax.models import fused, zoo
from sarjax.models.pool import Pool, Stack

CASES = [
    # (channels, act, kernel, input_shape): relu and non-monotone acts, one or three conv layers,
    # an even kernel, odd maps (floor pooling), two and three input channels, a 5x5x3 first layer
    # (75 taps: the matmul path)
    ((4, 8), "relu", 3, (12, 12, 1)),
    ((3,), "gelu", 2, (8, 8, 1)),
    ((3, 4, 3), "swish", 3, (11, 9, 2)),
    ((3, 4), "tanh", 5, (7, 7, 3)),
]


@functools.cache
def _params(channels, act, kernel, shape, m):
    """Stacked params, initialised once per module (eager init compiles take seconds per arch)."""
    arch = zoo.cnn(channels, act=act, kernel=kernel, dense=12, input_shape=shape)
    return Stack.from_keys(arch, jax.random.split(jax.random.key(7), m))


def _pools(channels, act, kernel, shape, m=3, dtype=jnp.float32):
    st = _params(channels, act, kernel, shape, m)
    out = {}
    for impl in ("xla", "fused"):
        arch = zoo.cnn(channels, act=act, kernel=kernel, dense=12, conv_impl=impl, input_shape=shape)
        out[impl] = Pool([Stack(arch, jax.tree.map(lambda v: v.astype(dtype), st.params), st.names)])
    return out


def _x(shape, b=4, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).random((b, *shape)).astype(dtype)


def _loss(pool, ref):
    def f(x):
        z = pool.apply(pool.params, x)
        return -jnp.sum(jnp.take_along_axis(jax.nn.log_softmax(z), ref[..., None], -1))

    return f


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[1]}-k{c[2]}-{len(c[0])}conv")
def test_fused_logits_and_input_gradient_equal_xla(case):
    pools = _pools(*case)
    x = _x(case[3])
    a, b = np.asarray(pools["xla"].logits(x)), np.asarray(pools["fused"].logits(x))
    assert a.shape == b.shape == (3, 4, 10)
    np.testing.assert_allclose(b, a, atol=2e-5, rtol=1e-5)
    # float64: no pooling window holds a near-tie, so the routed gradient must equal autodiff's
    with jax.enable_x64(True):
        pools = _pools(*case, dtype=jnp.float64)
        x = jnp.asarray(_x(case[3], dtype=np.float64))
        ref = jnp.asarray(np.argmax(a, -1))  # any labels do; these need no eager float64 forward
        want = jax.jit(jax.grad(_loss(pools["xla"], ref)))(x)
        got = jax.jit(jax.grad(_loss(pools["fused"], ref)))(x)
        assert got.dtype == jnp.float64
        assert float(jnp.abs(want).max()) > 1e-3
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-11, rtol=1e-9)


def test_exact_ties_route_to_the_first_maximal_phase_in_both_formulations():
    """A blank block makes every pooling window inside it an exact tie (each phase sees only zeros
    and the bias); gelu passes a non-zero derivative there. Both formulations send the cotangent to
    the first maximal phase (fused: ``_max4_first``; xla: ``zoo.window_max``), so the input
    gradients agree at the ties too (before 2026-12-04 xla shared it between the four phases)."""
    case = CASES[1]  # gelu, kernel 2, one conv layer
    with jax.enable_x64(True):
        pools = _pools(*case, dtype=jnp.float64)
        x = _x(case[3], dtype=np.float64)
        x[:, :5, :5] = 0.0
        x = jnp.asarray(x)
        ref = jnp.zeros((3, 4), jnp.int32)
        want = np.asarray(jax.jit(jax.grad(_loss(pools["xla"], ref)))(x))
        got = np.asarray(jax.jit(jax.grad(_loss(pools["fused"], ref)))(x))
        assert np.abs(want[:, :4, :4]).max() > 1e-3  # the tied windows pass a gradient
        np.testing.assert_allclose(got, want, atol=1e-11, rtol=1e-9)
    taps = [jnp.asarray(v, jnp.float32) for v in ([1.0, 5.0], [3.0, 5.0], [3.0, 5.0], [2.0, 5.0])]
    m, first = fused._max4_first(taps)  # phases 1 and 2 tie at 3; all four tie at 5
    np.testing.assert_array_equal(np.asarray(m), [3.0, 5.0])
    np.testing.assert_array_equal(np.asarray(first), [1, 0])


def test_fused_params_gradient_and_vmap():
    pools = _pools(*CASES[0])
    x = _x(CASES[0][3])
    ref = jnp.argmax(pools["xla"].logits(x), -1)

    def loss_p(pool):
        def f(params, x):
            z = pool.apply(params, x)
            return -jnp.sum(jnp.take_along_axis(jax.nn.log_softmax(z), ref[..., None], -1))

        return f

    # jitted: one compile each (eager autodiff compiles every primitive on its own)
    gp_x, gx_x = jax.jit(jax.grad(loss_p(pools["xla"]), argnums=(0, 1)))(pools["xla"].params, x)
    gp_f, gx_f = jax.jit(jax.grad(loss_p(pools["fused"]), argnums=(0, 1)))(pools["fused"].params, x)
    for a, b in zip(jax.tree.leaves(gp_x), jax.tree.leaves(gp_f)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(gx_f), np.asarray(gx_x), atol=1e-4)
    # per-sample gradients by vmap over single examples (batching the custom rule)
    pool = pools["fused"]
    one = lambda xi, r: -jnp.sum(jax.nn.log_softmax(pool.apply(pool.params, xi[None])[:, 0])[jnp.arange(3), r])
    per = jax.jit(jax.vmap(jax.grad(one)))(jnp.asarray(x), ref.T)
    full = jax.jit(jax.grad(_loss(pool, ref)))(jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(per), np.asarray(full), atol=1e-5)


def test_fused_joint_pgd_matches_xla_pool():
    pools = _pools(*CASES[0])
    x = _x(CASES[0][3], b=6, seed=3)
    ref = jnp.argmax(pools["xla"].logits(x), -1).T.astype(jnp.int32)  # [B, M]
    out = {}
    for impl, pool in pools.items():
        atk = make_joint_pgd(pool.apply, eps=0.1, steps=4, step=JointPGDStep(restarts=1))
        out[impl] = atk(pool.params, x, ref, key=jax.random.key(0), mask=jnp.ones((6, 3)))
    a, b = out["xla"], out["fused"]
    # identical up to float32 near-ties in a pooling window (a sign flip moves a pixel by 2*alpha)
    assert np.mean(np.asarray(a.x_adv) == np.asarray(b.x_adv)) > 0.99
    assert np.mean(np.asarray(a.success) == np.asarray(b.success)) > 0.9
    np.testing.assert_allclose(np.asarray(b.objective), np.asarray(a.objective), atol=0.05, rtol=0.05)
    assert np.abs(np.asarray(b.x_adv) - x).max() <= 0.1 + 1e-6


def test_fused_phase_taps_match_convolution():
    x = jnp.asarray(_x((9, 11, 2)))
    w = jax.random.normal(jax.random.key(0), (3, 3, 2, 5))
    taps = fused.phase_taps(x, 3)  # [4, B, 4, 5, 18]
    z = jax.lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NHWC", "HWIO", "NHWC"))
    for p, (a, b) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        np.testing.assert_allclose(np.asarray(taps[p] @ w.reshape(18, 5)), np.asarray(z[:, a:8:2, b:10:2]), atol=1e-5)


def test_fused_rejects_other_families():
    with pytest.raises(ValueError, match="cnn"):
        fused.cnn_pool_apply(zoo.mlp((8,)), {}, jnp.zeros((1, 28, 28, 1)))


def test_pool_with_conv_impl_rewraps_conv_stacks_only():
    st = _params(*CASES[0], 3)
    mlp = zoo.mlp((6,), input_shape=CASES[0][3])
    pool = Pool([st, Stack(mlp, jax.vmap(mlp.init)(jax.random.split(jax.random.key(2), 2)), ("m0", "m1"))])
    fast = pool.with_conv_impl("fused")
    assert [s.arch.conv_impl for s in fast.stacks] == ["fused", "im2col"]
    assert fast.names == pool.names and fast.stacks[0].params is pool.stacks[0].params
    x = _x(CASES[0][3])
    np.testing.assert_allclose(np.asarray(fast.logits(x)), np.asarray(pool.logits(x)), atol=2e-5)
    with pytest.raises(ValueError, match="conv_impl"):
        pool.with_conv_impl("winograd")
