import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sarjax.models import zoo
from sarjax.models.pool import Pool, Stack


def _x(b=5, seed=0):
    return np.random.default_rng(seed).random((b, 28, 28, 1)).astype(np.float32)


ARCHS = [zoo.mlp((32, 16)), zoo.cnn((4, 8), dense=16), zoo.resnet((4, 8), blocks=1, dense=16, act="elu")]


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.name)
def test_stacked_logits_equal_member_loop(arch):
    keys = jax.random.split(jax.random.key(3), 4)
    pool = Pool([Stack.from_keys(arch, keys)])
    x = _x()
    got = np.asarray(pool.logits(x))
    apply, init = jax.jit(arch.apply), jax.jit(arch.init)
    want = np.stack([np.asarray(apply(init(k), x)) for k in keys])
    assert got.shape == (4, 5, 10)
    # float32 matmuls batched over members sum in another order than one member alone: ~1e-6 apart
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=1e-6)
    # members initialised from different keys differ
    assert np.abs(got[0] - got[1]).max() > 1e-3


def test_heterogeneous_pool_from_members_groups_and_matches_loop():
    members, names = [], []
    for i in range(6):
        arch = ARCHS[i % 3]
        members.append((arch, arch.init(jax.random.key(i))))
        names.append(f"n{i}")
    pool = Pool.from_members(members, names)
    assert len(pool.stacks) == 3
    assert sorted(pool.names) == sorted(names)
    x = _x(3)
    got = np.asarray(pool.logits(x))
    for j, name in enumerate(pool.names):
        arch, params = members[names.index(name)]
        np.testing.assert_allclose(got[j], np.asarray(arch.apply(params, x)), atol=2e-6, rtol=1e-6)


def test_im2col_conv_equals_xla_conv():
    a, b = zoo.cnn((4, 8), kernel=5, dense=16), zoo.cnn((4, 8), kernel=5, dense=16, conv_impl="xla")
    p = a.init(jax.random.key(0))
    np.testing.assert_allclose(np.asarray(a.apply(p, _x())), np.asarray(b.apply(p, _x())), atol=1e-5)


def test_mask_change_does_not_recompile():
    arch = ARCHS[0]
    pool = Pool([Stack.from_keys(arch, jax.random.split(jax.random.key(0), 4))])

    @jax.jit
    @chex.assert_max_traces(n=1)
    def masked_mean_logit(params, x, mask):
        return (pool.apply(params, x).mean(axis=(1, 2)) * mask).sum()

    x = _x(2)
    vals = [
        float(masked_mean_logit(pool.params, x, jnp.asarray(m, jnp.float32)))
        for m in ([1, 1, 1, 1], [1, 0, 0, 1], [0, 0, 1, 0])
    ]
    assert len(set(vals)) == 3  # the masks really select different members


def test_validation_errors_name_the_problem():
    arch = ARCHS[0]
    with pytest.raises(ValueError, match="empty"):
        Pool([])
    with pytest.raises(ValueError, match="empty"):
        Pool.from_members([])
    p = arch.init(jax.random.key(0))
    bad = jax.tree.map(lambda a: a, p)
    bad["out"]["w"] = bad["out"]["w"].at[0, 0].set(jnp.nan)
    with pytest.raises(ValueError, match="sick"):
        Pool.from_members([(arch, p), (arch, bad)], ["fine", "sick"])
    other = zoo.mlp((32, 16), num_classes=7)
    with pytest.raises(ValueError, match="class-count mismatch"):
        Pool.from_members([(arch, p), (other, other.init(jax.random.key(1)))])
    pool = Pool.from_members([(arch, p)])
    with pytest.raises(ValueError, match=r"expected inputs of shape \[B, 28, 28, 1\]"):
        pool.logits(np.zeros((2, 28, 28), np.float32))
    with pytest.raises(ValueError, match="duplicated"):
        Pool.from_members([(arch, p), (arch, p)], ["a", "a"])


@pytest.mark.parametrize("widths", [(16,), (12, 8, 6)])
def test_prepared_apply_equals_apply_and_member_loop(widths):
    from sarjax.attacks.core import evaluate as E

    arch = zoo.mlp(widths, act="tanh")
    keys = jax.random.split(jax.random.key(1), 3)
    pool = Pool([Stack.from_keys(arch, keys), Stack.from_keys(ARCHS[1], keys[:2])])
    x = _x(4)
    fn, prepared = pool.prepare_apply(pool.params)
    assert "_dense0_cat" in prepared[0] and prepared[0]["_dense0_cat"].shape == (784, 3 * widths[0])
    got = np.asarray(fn(prepared, x))
    np.testing.assert_allclose(got, np.asarray(pool.apply(pool.params, x)), atol=1e-6)
    want = np.stack([np.asarray(arch.apply(arch.init(k), x)) for k in keys])
    np.testing.assert_allclose(got[:3], want, atol=2e-6, rtol=1e-6)
    # the attack engine prepares a pool's bound apply once, and leaves other callables alone
    fn2, prep2 = E.prepare(pool.apply, pool.params)
    assert "_dense0_cat" in prep2[0]
    plain = lambda p, z: pool.apply(p, z)  # noqa: E731
    assert E.prepare(plain, pool.params) == (plain, pool.params)
