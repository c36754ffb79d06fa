"""Inputs at the edges of the fixed-budget attacks' entries (issue 35, item 2).

Each of these returned a plausible wrong result (or a raw numpy / Python error) before: a mask of
-1 flipped the objective, a NaN mask or a NaN-logit model reported success, ``.jit`` without eps
ran an unbounded attack, ``max_queries=7.9`` was truncated to 7, a NaN warm start was clipped into
the box or blamed on the output, and an empty batch raised ``ZeroDivisionError``. Each now raises
a one-line ``ValueError`` / ``TypeError`` at the entry, naming what came.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _attacks_affine import affine_apply, pool_apply

from sarjax.attacks import JointPGDStep, attack_members, make_joint_pgd, make_pgd, make_square
from sarjax.attacks.autoattack import AutoAttackSettings, autoattack, autoattack_config
from sarjax.models.pool import Pool, Stack
from sarjax.models.zoo import mlp

KEY = jax.random.PRNGKey(0)
M, B = 2, 3


def _params(m=M, d=8, c=4):
    rng = np.random.default_rng(0)
    return {
        "W": jnp.asarray(rng.normal(size=(m, d, c)), jnp.float32),
        "b": jnp.asarray(rng.normal(size=(m, c)) * 0.1, jnp.float32),
    }


def _x(b=B):
    """[B, 2, 2, 2] images (Square needs [B, H, W, C]); feature 0 is 0.2, 0.9, 0.3, ..."""
    x = np.random.default_rng(1).uniform(0.2, 0.4, (b, 8)).astype(np.float32)
    x[:, 0] = [0.2, 0.9, 0.3][:b] if b <= 3 else x[:, 0]
    return x.reshape(b, 2, 2, 2)


def _y(b=B):
    return np.ones(b, np.int32)


def _attacks():
    return {
        "pgd": make_pgd(pool_apply, eps=0.05, steps=3),
        "pgd-l2": make_pgd(pool_apply, eps=0.05, steps=3, norm="l2"),
        "joint": make_joint_pgd(pool_apply, eps=0.05, steps=3, step=JointPGDStep(restarts=1)),
        "square": make_square(pool_apply, eps=0.05, n_queries=8),
    }


# ---- masks --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["pgd", "joint", "square"])
@pytest.mark.parametrize(
    "mask, shown",
    [
        ([-1.0, 1.0], r"\[-1\.0\]"),  # flipped the objective: the member was made MORE correct
        ([np.nan, 1.0], r"\[nan\]"),
        ([2.0, 1.0], r"\[2\.0\]"),
        ([0.5, 1.0], r"\[0\.5\]"),
        ([[1, 1], [1, 3], [0, 1]], r"\[3\]"),
    ],
)
def test_masks_must_be_bool_or_0_1(name, mask, shown):
    fn = _attacks()[name]
    with pytest.raises(ValueError, match=rf"{fn.name}: mask must be bool or \{{0, 1\}}.*got values {shown}"):
        fn(_params(), _x(), _y(), key=KEY, mask=np.asarray(mask))


def test_valid_masks_agree_whatever_their_dtype():
    fn = make_pgd(pool_apply, eps=0.05, steps=3)
    params, x, y = _params(), _x(), _y()
    ref = fn(params, x, y, key=KEY, mask=np.array([True, False]))
    for mask in (np.array([1, 0]), np.array([1.0, 0.0], np.float32), jnp.asarray([[1.0, 0.0]] * B)):
        res = fn(params, x, y, key=KEY, mask=mask)
        for a, b in zip(ref, res):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ---- non-finite logits --------------------------------------------------------------------------


def nan_member1_sample1(params, x):
    """The affine pool, except member 1 returns NaN where feature 0 > 0.5 (sample 1's whole ball)."""
    z = pool_apply(params, x)
    bad = (jnp.arange(z.shape[0]) == 1)[:, None, None] & (x.reshape(x.shape[0], -1)[:, 0] > 0.5)[None, :, None]
    return jnp.where(bad, jnp.nan, z)


def inf_everywhere(params, x):
    return pool_apply(params, x) + jnp.inf


@pytest.mark.parametrize(
    "make",
    [
        lambda a: make_pgd(a, eps=0.05, steps=3),
        lambda a: make_pgd(a, eps=0.05, steps=3, audit=False),  # the check is not the bound audit
        lambda a: make_square(a, eps=0.05, n_queries=8),
        lambda a: make_joint_pgd(a, eps=0.05, steps=3, step=JointPGDStep(restarts=1)),
    ],
)
def test_non_finite_logits_raise_naming_members_and_samples(make):
    # before: every (sample, member) with NaN logits was reported fooled
    with pytest.raises(ValueError, match=r"non-finite logits.*members \[1\] on samples \[1\]"):
        make(nan_member1_sample1)(_params(), _x(), _y(), key=KEY)
    with pytest.raises(ValueError, match=r"non-finite logits.*members \[0, 1\] on samples \[0, 1, 2\]"):
        make(inf_everywhere)(_params(), _x(), _y(), key=KEY)


def test_finite_logits_are_not_flagged_and_jit_does_not_check():
    fn = make_pgd(nan_member1_sample1, eps=0.05, steps=3)
    params, x, y = _params(), _x(), _y()
    fn(params, x[[0, 2]], y[[0, 2]], key=KEY)  # member 1 is finite on samples 0 and 2
    res = fn.jit(params, x, y, key=KEY)  # the jit-safe entry never checks on the host
    assert np.isnan(np.asarray(res.member_loss)[1, 1])


# ---- eps in the jit entry -----------------------------------------------------------------------


def test_jit_entry_refuses_a_missing_eps():
    fn = make_pgd(pool_apply, steps=5)
    params, x, y = _params(), _x(), _y()
    with pytest.raises((TypeError, ValueError), match="eps is required"):
        fn(params, x, y, key=KEY)
    # before: .jit ran an unbounded attack (linf distance 0.9998) without eps
    with pytest.raises((TypeError, ValueError), match="eps is required"):
        fn.jit(params, x, y, key=KEY)
    with pytest.raises((TypeError, ValueError), match="eps is required"):
        jax.jit(lambda p, a, b, k: fn.jit(p, a, b, key=k).x_adv)(params, x, y, KEY)
    unbounded = fn.jit(params, x, y, key=KEY, eps=jnp.inf)  # the explicit opt-in stays
    assert float(jnp.max(jnp.abs(unbounded.x_adv - x))) > 0.5
    bounded = fn.jit(params, x, y, key=KEY, eps=0.05)
    assert float(jnp.max(jnp.abs(bounded.x_adv - x))) <= 0.05 + 1e-6


# ---- max_queries --------------------------------------------------------------------------------


@pytest.mark.parametrize("cap", [7.9, 8.0, np.float32(8), np.array([8.0, 8.0, 8.0]), True, np.array([True] * B)])
def test_max_queries_must_be_an_integer(cap):
    fn = make_pgd(pool_apply, eps=0.05, steps=3)
    with pytest.raises(TypeError, match="max_queries must be None, an int or \\[B\\] ints"):
        fn(_params(), _x(), _y(), key=KEY, max_queries=cap)
    with pytest.raises(TypeError, match="max_queries must be None, an int or \\[B\\] ints"):
        fn.jit(_params(), _x(), _y(), key=KEY, max_queries=cap)


def test_integer_max_queries_are_accepted():
    fn = make_pgd(pool_apply, eps=0.05, steps=3)
    params, x, y = _params(), _x(), _y()
    ref = fn(params, x, y, key=KEY, max_queries=8)
    for cap in (np.int64(8), np.int32(8), np.array([8, 8, 8]), jnp.asarray([8, 8, 8], jnp.int32), [8, 8, 8]):
        res = fn(params, x, y, key=KEY, max_queries=cap)
        np.testing.assert_array_equal(np.asarray(res.x_adv), np.asarray(ref.x_adv))
        np.testing.assert_array_equal(np.asarray(res.queries), np.asarray(ref.queries))


# ---- x_init -------------------------------------------------------------------------------------


@pytest.mark.parametrize("norm", ["linf", "l2", "l1"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_x_init_is_refused_up_front(norm, bad):
    fn = make_pgd(pool_apply, eps=0.05, steps=3, norm=norm)
    xi = _x().copy()
    xi[2, 0, 1, 0] = bad
    # before: linf clipped it into the box silently, l1 / l2 blamed the output after the run
    with pytest.raises(ValueError, match=r"pgd: x_init must be finite: samples \[2\] hold NaN or inf"):
        fn(_params(), _x(), _y(), key=KEY, x_init=xi)
    with pytest.raises(ValueError, match=r"x_init must have the shape of x0 \(3, 2, 2, 2\), got \(3, 8\)"):
        fn(_params(), _x(), _y(), key=KEY, x_init=_x().reshape(B, 8))


# ---- empty batch --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["pgd", "joint", "square"])
def test_empty_batch_is_one_value_error(name):
    # before: ZeroDivisionError (integer modulo by zero)
    with pytest.raises(ValueError, match=r"empty batch: x0 has 0 samples"):
        _attacks()[name](_params(), _x()[:0], _y()[:0], key=KEY)


def test_empty_batch_in_member_mode_and_autoattack():
    arch = mlp((4,), input_shape=(2, 2, 2), num_classes=4)
    shapes = jax.eval_shape(arch.init, jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    stacked = jax.tree.map(lambda s: rng.standard_normal((2,) + s.shape).astype(np.float32), shapes)
    pool = Pool([Stack(arch, stacked, ("m0", "m1"))])
    with pytest.raises(ValueError, match=r"empty batch: x0 has 0 samples"):
        attack_members(pool, make_pgd, _x()[:0], _y()[:0], key=KEY, eps=0.05, steps=2)
    with pytest.raises(ValueError, match=r"empty batch: x has 0 samples"):
        autoattack(affine_apply, {"W": jnp.zeros((8, 4)), "b": jnp.zeros(4)}, _x()[:0], _y()[:0],
                   attack=autoattack_config("linf", 0.05), key=KEY, settings=AutoAttackSettings(log=False))  # fmt: skip
