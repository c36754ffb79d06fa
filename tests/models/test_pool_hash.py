"""Pool.content_hash: equal for equal pools, different for any change that changes outputs."""

import dataclasses

import jax
import numpy as np

from sarjax.models.pool import Pool, Stack
from sarjax.models.zoo import Arch


def _pool(act="relu", seed=0, names=("a", "b")):
    arch = Arch("mlp", (8,), act=act, input_shape=(4, 4, 1), num_classes=3, name="mlp8")
    return Pool([Stack.from_keys(arch, jax.random.split(jax.random.key(seed), 2), names)])


def test_content_hash_tracks_params_arch_and_names():
    p = _pool()
    assert p.content_hash() == _pool().content_hash()
    assert p.content_hash() != _pool(seed=1).content_hash()
    assert p.content_hash() != _pool(act="tanh").content_hash()
    assert p.content_hash() != _pool(names=("a", "c")).content_hash()
    s = p.stacks[0]
    bumped = jax.tree.map(lambda a: a, s.params)
    leaf = jax.tree.leaves(bumped)[0]
    changed = jax.tree.map(lambda a: np.asarray(a).copy(), bumped)
    first = jax.tree.leaves(changed)[0]
    first.reshape(-1)[0] = np.nextafter(first.reshape(-1)[0], np.float32(np.inf))
    assert first.shape == leaf.shape
    assert Pool([Stack(s.arch, changed, s.names)]).content_hash() != p.content_hash()


def test_content_hash_ignores_conv_impl():
    arch = Arch("cnn", (4,), input_shape=(8, 8, 1), num_classes=3, name="c")
    p = Pool([Stack.from_keys(arch, jax.random.split(jax.random.key(0), 2))])
    q = Pool([Stack(dataclasses.replace(arch, conv_impl="xla"), p.stacks[0].params, p.stacks[0].names)])
    assert p.content_hash() == q.content_hash()
