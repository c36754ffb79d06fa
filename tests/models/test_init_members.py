"""``init_members``: the demo's member initialisation, bit for bit ``jax.vmap(arch.init)``, from one program.

Issue 43 item 2 (fewer programs in a cold ``sarjax demo --quick``): eager ``vmap(arch.init)``
compiled a random-normal program per weight shape and member count (21 in the demo).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sarjax.models import zoo
from sarjax.models.presets import BASE_ARCH, HIGH_ARCHS
from sarjax.runtime.compile_stats import count_compiles

ARCHS = (
    *HIGH_ARCHS,  # cnn, mlp, gelu cnn, resnet, tanh mlp, 5x5 swish cnn: the demo's architectures
    zoo.resnet((8, 16), blocks=1, dense=32),  # a projection between stages
    zoo.mlp((700,)),  # a first layer of 548,800 > NORMAL_DRAW entries: a longer draw
)


def _bits(tree):
    return [np.asarray(a).view(np.uint32) for a in jax.tree.leaves(tree)]


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.name)
def test_init_members_equals_vmapped_init_bit_for_bit(arch):
    seeds = [7, 1003, 2**31 - 1]
    want = jax.vmap(arch.init)(jnp.stack([jax.random.key(s) for s in seeds]))
    got = zoo.init_members(arch, seeds)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(_bits(got), _bits(want)):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)  # the float32 bits, not a tolerance


def test_init_members_one_member_equals_init():
    got = zoo.init_members(BASE_ARCH, [5])
    want = BASE_ARCH.init(jax.random.key(5))
    for g, w in zip(_bits(got), _bits(jax.tree.map(lambda a: a[None], want))):
        np.testing.assert_array_equal(g, w)


def test_init_members_compiles_one_draw_program_for_every_shape_and_member_count():
    zoo.init_members(zoo.mlp((3,), input_shape=(2, 2, 1), num_classes=2), [0])  # the shared programs, compiled once
    with count_compiles() as c:
        for arch, k in ((BASE_ARCH, 3), (HIGH_ARCHS[1], 1), (HIGH_ARCHS[3], 2), (HIGH_ARCHS[5], 1)):
            zoo.init_members(arch, list(range(k)))
    names = [r.name for r in c.programs()]
    assert names == [], names  # eager vmap(arch.init) compiled a _normal program per (shape, K) here


def test_init_members_refuses_bad_seeds():
    with pytest.raises(ValueError, match="at least one seed"):
        zoo.init_members(BASE_ARCH, [])
    with pytest.raises(ValueError, match="seeds must be ints, got float 1.5"):
        zoo.init_members(BASE_ARCH, [1.5])


def test_init_members_without_partitionable_threefry_falls_back_to_the_vmapped_init():
    # the old threefry layout: a prefix of a longer draw is NOT the shorter draw, so init_members vmaps arch.init
    arch = HIGH_ARCHS[3]
    with jax.threefry_partitionable(False):
        want = jax.vmap(arch.init)(jnp.stack([jax.random.key(s) for s in (2, 4)]))
        got = zoo.init_members(arch, [2, 4])
        cut = np.asarray(zoo._layer_normals(jax.random.key(2), np.int32(0), zoo.NORMAL_DRAW))[:72]
        assert not np.array_equal(cut, np.asarray(jax.random.normal(jax.random.split(jax.random.key(2), 64)[0], (72,))))
    for g, w in zip(_bits(got), _bits(want)):
        np.testing.assert_array_equal(g, w)
