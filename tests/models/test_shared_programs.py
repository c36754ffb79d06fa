"""Programs shared across pools and training runs of one architecture (issue 43 item 2: fewer
programs in a cold ``sarjax demo --quick``, whose low and medium pools are one architecture).

Each test pins what a second pool / stack of an architecture already compiled costs (nothing),
and that architectures that differ in any field never share a program.
"""

import dataclasses

import jax
import numpy as np
import pytest

from sarjax.attacks.members import attack_members
from sarjax.attacks.pgd import make_pgd
from sarjax.models import zoo
from sarjax.models.pool import Pool, Stack, canonical_arch
from sarjax.models.train import MemberConfig, TrainConfig, TrainMonitor, train_stack
from sarjax.runtime.compile_stats import count_compiles

SHAPE = (6, 6, 1)


def _arch(**kw):
    return zoo.cnn((2,), dense=4, input_shape=SHAPE, num_classes=3, **kw)


def _x(b=4, seed=0):
    return np.random.default_rng(seed).random((b, *SHAPE), dtype=np.float32)


def _pool(arch, seed, k=2, prefix="m"):
    return Pool([Stack.from_keys(arch, jax.random.split(jax.random.key(seed), k), [f"{prefix}{i}" for i in range(k)])])


def _names(c):
    return [r.name for r in c.programs()]


def test_two_pools_of_one_architecture_share_the_apply_program():
    a1, a2 = _arch(), _arch()  # equal, distinct objects (as two presets' pools, or with_conv_impl copies)
    assert a1 == a2 and a1 is not a2
    p1, p2 = _pool(a1, 0), _pool(a2, 1)
    x = _x()
    p1.logits(x)
    with count_compiles() as c:
        got = np.asarray(p2.logits(x))
        p2.accuracy(x, np.zeros(len(x), np.int32))
    assert _names(c) == [], _names(c)  # before: jit(apply) and jit(_argmax) again, per pool object
    np.testing.assert_array_equal(got, np.asarray(jax.jit(p2.apply)(p2.params, x)))


@pytest.mark.parametrize(
    "other",
    [
        {"act": "tanh"},
        {"conv_impl": "fused"},
        {"conv_impl": "xla"},
        {"dense": 5},
    ],
    ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()),
)
def test_pools_of_different_architectures_never_share_a_program(other):
    base = _arch()
    diff = dataclasses.replace(base, **other)
    pb, pd = _pool(base, 0), _pool(diff, 0)  # the same keys: only the architecture differs
    x = _x()
    pb.logits(x)
    with count_compiles() as c:
        got = np.asarray(pd.logits(x))
    assert len(_names(c)) == 1, _names(c)  # its own program (a wrongly shared one: none)
    np.testing.assert_array_equal(got, np.asarray(jax.jit(pd.apply)(pd.params, x)))  # and its own logits


def test_a_heterogeneous_pool_shares_with_its_equal_twin_only():
    mlp = zoo.mlp((5,), input_shape=SHAPE, num_classes=3)
    het = Pool.concat(_pool(_arch(), 0, prefix="c"), _pool(mlp, 1, prefix="m"))
    swapped = Pool.concat(_pool(mlp, 1, prefix="m"), _pool(_arch(), 0, prefix="c"))
    twin = Pool.concat(_pool(_arch(), 2, prefix="c"), _pool(zoo.mlp((5,), input_shape=SHAPE, num_classes=3), 3))
    x = _x()
    het.logits(x)
    with count_compiles() as c:
        twin.logits(x)
    assert _names(c) == [], _names(c)
    with count_compiles() as c:
        got = np.asarray(swapped.logits(x))  # other stack order: another program
    assert _names(c).count("jit(_zoo_pool_apply)") == 1, _names(c)
    np.testing.assert_array_equal(got, np.concatenate([np.asarray(het.logits(x))[2:], np.asarray(het.logits(x))[:2]]))


def test_equal_architectures_have_one_member_apply():
    a1, a2 = _arch(conv_impl="xla"), _arch(conv_impl="xla")
    s1, s2 = _pool(a1, 0).stacks[0], _pool(a2, 1).stacks[0]
    assert s1.member_apply == s2.member_apply and hash(s1.member_apply) == hash(s2.member_apply)
    assert canonical_arch(a2) is canonical_arch(a1)
    assert _pool(_arch(conv_impl="im2col"), 0).stacks[0].member_apply != s1.member_apply


def test_member_attacks_on_a_second_pool_of_one_architecture_compile_nothing():
    # the demo's low and medium pools: attack_copy builds each an equal, distinct fused arch
    base = _arch()
    p1 = Pool([s.with_conv_impl("xla") for s in _pool(base, 0).stacks])
    p2 = Pool([s.with_conv_impl("xla") for s in _pool(base, 1).stacks])
    x = _x()
    kw = dict(eps=0.1, norm="linf", steps=2, key=jax.random.key(0))
    attack_members(p1, make_pgd, x, np.zeros(len(x), np.int32), **kw)
    with count_compiles() as c:
        attack_members(p2, make_pgd, x, np.zeros(len(x), np.int32), **kw)
    assert "jit(_run_members)" not in _names(c), _names(c)  # before: compiled again (a new kernel per arch object)


def _train(arch, seeds, aug=0.0):
    rng = np.random.default_rng(0)
    x, y = rng.random((40, *SHAPE), dtype=np.float32), rng.integers(0, 3, 40)
    cfgs = [MemberConfig(seed=s, aug_strength=aug, dropout=0.1) for s in seeds]
    return train_stack(
        arch, cfgs, x, y, config=TrainConfig(epochs=2, batch_size=8), monitor=TrainMonitor(progress=False)
    )


def test_train_stack_programs_are_pinned_and_shared_by_a_second_stack_of_one_architecture():
    _train(zoo.mlp((3,), input_shape=SHAPE, num_classes=3), [9])  # the programs every stack shares
    with count_compiles() as c:
        first, _ = _train(_arch(), [0, 1], aug=0.5)
    # one program each: the epoch, the validation accuracy, the optimizer state, the epoch keys
    # (before: 47 programs, among them a random-normal one per weight shape and eager one-op ones)
    assert sorted(_names(c)) == ["jit(_epoch_keys)", "jit(_init_member_state)", "jit(acc)", "jit(epoch)"], _names(c)
    with count_compiles() as c:
        second, _ = _train(_arch(), [2, 3], aug=0.5)  # an equal architecture, other members
    assert _names(c) == [], _names(c)  # before: jit(acc) and jit(epoch) again
    assert not np.array_equal(np.asarray(first.params["out"]["w"]), np.asarray(second.params["out"]["w"]))
