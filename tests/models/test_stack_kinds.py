"""Stacks of every JAX kind (plain function, flax linen, flax nnx) against a per-member loop in the
source framework, the zoo twins across frameworks, the protocol's errors, hashes and masks."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _flax_nets import (
    CLASSES,
    SHAPE,
    LinenCNN,
    LinenZooCNN,
    fill,
    linen_twin_variables,
    linen_variables,
    nnx_member,
    nnx_twin,
    plain_apply,
    plain_params,
    zoo_params,
)

from sarjax.models import zoo
from sarjax.models.flax_stacks import LinenStack, NnxStack
from sarjax.models.pool import Pool, Stack
from sarjax.models.stack import BaseStack, FunctionStack, stack_kind, tree_from_paths


def _x(b=5, seed=0):
    return np.random.default_rng(seed).random((b, *SHAPE), dtype=np.float32)


@pytest.fixture(scope="module")
def linen_pool():
    module = LinenCNN()
    variables = [linen_variables(module, s) for s in range(3)]
    return module, variables, Pool.from_flax(module, variables, input_shape=SHAPE)


@pytest.fixture(scope="module")
def nnx_pool():
    modules = [nnx_member(s) for s in range(3)]
    return modules, Pool.from_nnx(modules, input_shape=SHAPE)


def test_linen_pool_equals_module_apply_loop_in_eval_mode(linen_pool):
    module, variables, pool = linen_pool
    (stack,) = pool.stacks
    assert isinstance(stack, LinenStack) and stack.apply_kwargs == {"train": False}
    x = _x()
    got = np.asarray(pool.logits(x))
    want = np.stack([np.asarray(module.apply(v, x, train=False)) for v in variables])
    assert got.shape == (3, 5, CLASSES)
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=0)
    assert np.abs(got[0] - got[1]).max() > 1e-2  # members differ
    # eval mode is really used: the batch statistics change the logits (train mode would not read them)
    moved = jax.tree.map(lambda a: a, variables[0])
    moved["batch_stats"]["BatchNorm_0"]["mean"] = moved["batch_stats"]["BatchNorm_0"]["mean"] + 1.0
    other = Pool.from_flax(module, [moved], input_shape=SHAPE)
    assert np.abs(np.asarray(other.logits(x))[0] - got[0]).max() > 1e-3


def test_nnx_pool_equals_module_loop_and_leaves_the_modules_alone(nnx_pool):
    modules, pool = nnx_pool
    (stack,) = pool.stacks
    assert isinstance(stack, NnxStack) and stack.size == 3
    assert all(not m.drop.deterministic for m in modules)  # the pool put copies in eval mode, not these
    x = _x()
    got = np.asarray(pool.logits(x))
    want = []
    for m in modules:
        m.eval()
        want.append(np.asarray(m(x)))
        m.train()
    np.testing.assert_allclose(got, np.stack(want), atol=2e-6, rtol=0)
    assert np.abs(got[0] - got[1]).max() > 1e-2


def test_nnx_members_of_two_graphs_make_two_stacks():
    mods = [nnx_member(0), nnx_member(1, hidden=4), nnx_member(2)]
    pool = Pool.from_nnx(mods, ["a", "b", "c"], input_shape=SHAPE)
    assert [s.size for s in pool.stacks] == [2, 1] and pool.names == ("a", "c", "b")


def test_function_pool_groups_by_apply_and_equals_loop():
    other = lambda p, x: plain_apply(p, x) * 2.0  # noqa: E731
    members = [(plain_apply, plain_params(0)), (other, plain_params(1)), (plain_apply, plain_params(2))]
    pool = Pool.from_functions(members, ["f0", "g1", "f2"], input_shape=SHAPE)
    assert [type(s) for s in pool.stacks] == [FunctionStack, FunctionStack] and pool.names == ("f0", "f2", "g1")
    x = _x()
    got = np.asarray(pool.logits(x))
    order = {"f0": 0, "g1": 1, "f2": 2}
    want = np.stack([np.asarray(members[order[n]][0](members[order[n]][1], x)) for n in pool.names])
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=0)


def test_zoo_twins_in_linen_and_nnx_compute_the_zoo_members():
    """Known answer across frameworks: a linen CNN and an nnx MLP holding zoo members' weights."""
    cnn = zoo.cnn((3,), dense=8, input_shape=SHAPE, num_classes=CLASSES)
    mlp = zoo.mlp((6,), input_shape=SHAPE, num_classes=CLASSES)
    zc = Stack(cnn, zoo_params(cnn, 2, 0), ("c0", "c1"))
    zm = Stack(mlp, zoo_params(mlp, 2, 1), ("m0", "m1"))
    twins = Pool.concat(
        Pool.from_flax(LinenZooCNN(3, 8), [linen_twin_variables(zc.member(i)) for i in range(2)], input_shape=SHAPE),
        Pool.from_nnx([nnx_twin(zm.member(i), 6) for i in range(2)], input_shape=SHAPE),
    )
    x = _x()
    np.testing.assert_allclose(np.asarray(twins.logits(x)), np.asarray(Pool([zc, zm]).logits(x)), atol=2e-6, rtol=0)


def test_stack_errors_name_the_problem():
    with pytest.raises(TypeError, match=r"logits must be float32 .* got bfloat16"):
        FunctionStack(
            lambda p, x: plain_apply(p, x).astype(jnp.bfloat16), jax.tree.map(lambda a: a[None], plain_params(0)),
            ["m"], input_shape=SHAPE,
        )  # fmt: skip
    with pytest.raises(TypeError, match=r"apply fails on inputs \[B, 4, 4, 1\]"):
        Pool.from_functions([(plain_apply, plain_params(0))], input_shape=(4, 4, 1))
    with pytest.raises(ValueError, match=r"num_classes=7 but the apply returns 3"):
        Pool.from_functions([(plain_apply, plain_params(0))], input_shape=SHAPE, num_classes=7)
    with pytest.raises(ValueError, match=r"member 'b': its variables differ"):
        m = LinenCNN()
        Pool.from_flax(m, [linen_variables(m, 0), linen_variables(LinenCNN(channels=2), 1)], ["a", "b"],
                       input_shape=SHAPE)  # fmt: skip

    class TrainOnlyBN(nn.Module):  # batch norm in training mode and no mode argument to turn it off
        @nn.compact
        def __call__(self, x):
            return nn.Dense(3)(nn.BatchNorm(use_running_average=False)(x.reshape(x.shape[0], -1)))

    v = TrainOnlyBN().init(jax.random.key(0), jnp.zeros((2, *SHAPE)))
    with pytest.raises(TypeError, match=r"TrainOnlyBN: the member apply fails"):
        Pool.from_flax(TrainOnlyBN(), [v], input_shape=SHAPE)
    with pytest.raises(TypeError, match="expected a flax.nnx.Module"):
        Pool.from_nnx([object()], input_shape=SHAPE)
    with pytest.raises(ValueError, match="class-count mismatch"):
        Pool.concat(
            Pool.from_functions([(plain_apply, plain_params(0))], input_shape=SHAPE),
            Pool([Stack(a4 := zoo.mlp((4,), input_shape=SHAPE, num_classes=4), zoo_params(a4, 1, 0), ("z",))]),
        )  # fmt: skip
    with pytest.raises(ValueError, match="unknown stack kind 'keras'"):
        stack_kind("keras")
    with pytest.raises(TypeError, match="Pool takes stacks"):
        Pool([object()])  # type: ignore[list-item]


def test_content_hash_covers_every_kind(linen_pool, nnx_pool):
    _, variables, lp = linen_pool
    _, np_ = nnx_pool
    fp = Pool.from_functions([(plain_apply, plain_params(0))], input_shape=SHAPE)
    hashes = {p.content_hash() for p in (lp, np_, fp)}
    assert len(hashes) == 3
    assert lp.content_hash() == Pool.from_flax(LinenCNN(), variables, input_shape=SHAPE).content_hash()
    # one ulp of one batch statistic, of one nnx param, of one function param: another hash
    for pool in (lp, np_, fp):
        leaves, treedef = jax.tree.flatten(pool.stacks[0].params)
        bumped = [np.asarray(a).copy() for a in leaves]
        bumped[0].reshape(-1)[0] = np.nextafter(bumped[0].reshape(-1)[0], np.float32(np.inf))
        changed = Pool([pool.stacks[0].with_params(jax.tree.unflatten(treedef, bumped))])
        assert changed.content_hash() != pool.content_hash()
    # the architecture is in the hash: the same params under another function
    doubled = lambda p, x: plain_apply(p, x) * 2.0  # noqa: E731
    assert Pool.from_functions([(doubled, plain_params(0))], input_shape=SHAPE).content_hash() != fp.content_hash()
    relabelled = Pool([lp.stacks[0].with_params(lp.stacks[0].params, ["a", "b", "c"])])
    assert relabelled.content_hash() != lp.content_hash()


def test_heterogeneous_select_and_masks_never_recompile(linen_pool, nnx_pool):
    _, _, lp = linen_pool
    _, np_ = nnx_pool
    arch = zoo.cnn((2,), dense=4, input_shape=SHAPE, num_classes=CLASSES)
    zp = Pool([Stack(arch, zoo_params(arch, 2, 5), ("z0", "z1"))])
    pool = Pool.concat(zp, lp, np_)
    assert pool.num_members == 8 and isinstance(pool.stacks[1], BaseStack)
    x = _x(2)
    full = np.asarray(pool.logits(x))
    sub = pool.select([6, 0, 3])
    assert sub.names == (pool.names[6], pool.names[0], pool.names[3])
    np.testing.assert_allclose(np.asarray(sub.logits(x)), full[[6, 0, 3]], atol=1e-6)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def masked(params, x, mask):
        return (pool.apply(params, x).mean(axis=(1, 2)) * mask).sum()

    vals = set()
    for m in (np.ones(8), np.eye(8)[0], np.eye(8)[3], np.eye(8)[7]):
        vals.add(float(masked(pool.params, x, jnp.asarray(m, jnp.float32))))
    assert len(vals) == 4


def test_tree_from_paths_rebuilds_dicts_and_lists():
    tree = {"a": [np.zeros(1), {"b": np.ones(2)}], "c'd": np.ones(3)}
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    got = tree_from_paths([jax.tree_util.keystr(p) for p, _ in flat], [l for _, l in flat])
    assert jax.tree.structure(got) == jax.tree.structure(tree)
    with pytest.raises(ValueError, match="attribute node"):
        tree_from_paths([".w"], [np.zeros(1)])


def test_linen_hash_is_stable_for_modules_with_callable_fields():
    """A module field that prints with an object address (a functools.partial) does not make two
    equal pools hash differently (the hash fingerprints resumable runs across processes)."""
    import functools

    class Act(nn.Module):
        act: object

        @nn.compact
        def __call__(self, x):
            return nn.Dense(CLASSES)(self.act(x.reshape(x.shape[0], -1)))

    def pool():
        m = Act(functools.partial(nn.leaky_relu, negative_slope=0.1))
        v = fill(jax.eval_shape(lambda: m.init(jax.random.key(0), jnp.zeros((1, *SHAPE)))), 0)
        return Pool.from_flax(m, [v], input_shape=SHAPE, name="act")

    a, b = pool(), pool()
    assert " at 0x" in repr(a.stacks[0].module)  # the address is there before the spec drops it
    assert a.content_hash() == b.content_hash()
