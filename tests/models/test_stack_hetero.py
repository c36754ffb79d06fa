"""A heterogeneous pool (zoo CNN + a plain-function twin of it + linen CNN + nnx MLP) through joint
PGD, the single-member attacks and run_sar: the twins (bit-identical logits) must fall together."""

import os

import jax
import numpy as np
import pytest
from _flax_nets import SHAPE, LinenCNN, linen_variables, nnx_member, zoo_params

from sarjax.attacks.joint import JointPGDStep, make_joint_pgd
from sarjax.attacks.members import attack_members
from sarjax.attacks.pgd import make_pgd
from sarjax.models import zoo
from sarjax.models.pool import Pool, Stack
from sarjax.models.stack import FunctionStack
from sarjax.sar.vision import run_sar

B = 4
EPS = 0.5


@pytest.fixture(scope="module")
def hetero():
    cnn = zoo.cnn((2,), dense=4, input_shape=SHAPE, num_classes=3)
    zc = Stack(cnn, zoo_params(cnn, 2, 0), ("z0", "z1"))
    twin = FunctionStack(cnn.apply, zc.params, ["t0", "t1"], input_shape=SHAPE, name="zoo-cnn-twin")
    module = LinenCNN(channels=2, dense=4)
    lin = Pool.from_flax(module, [linen_variables(module, s) for s in (1, 2)], ["l0", "l1"], input_shape=SHAPE)
    nx = Pool.from_nnx([nnx_member(s, hidden=4) for s in (3, 4)], ["n0", "n1"], input_shape=SHAPE)
    pool = Pool.concat(Pool([zc, twin]), lin, nx)
    x = np.random.default_rng(0).random((B, *SHAPE), dtype=np.float32)
    attack = make_joint_pgd(pool.apply, eps=EPS, steps=4, step=JointPGDStep(restarts=1))
    return pool, x, attack


def test_twin_stacks_have_identical_logits(hetero):
    pool, x, _ = hetero
    logits = np.asarray(pool.logits(x))
    assert pool.names == ("z0", "z1", "t0", "t1", "l0", "l1", "n0", "n1")
    np.testing.assert_array_equal(logits[0:2], logits[2:4])


def test_joint_pgd_on_a_heterogeneous_pool(hetero):
    pool, x, attack = hetero
    ref = np.asarray(pool.predict(x)).T  # [B, M] each member's clean prediction
    mask = np.ones((B, pool.num_members), np.float32)
    res = attack(pool.params, x, ref, key=jax.random.key(1), mask=mask)
    succ = np.asarray(res.success)
    assert succ.shape == (B, 8) and succ.any()
    np.testing.assert_array_equal(succ[:, 0:2], succ[:, 2:4])  # the twins fall together
    assert np.abs(np.asarray(res.x_adv) - x).max() <= EPS + 1e-6
    # each success is real: re-evaluate the returned inputs
    again = np.asarray(pool.predict(np.asarray(res.x_adv))).T
    np.testing.assert_array_equal(succ, again != ref)


@pytest.mark.skipif(os.environ.get("SARJAX_MODELS_FULL") != "1", reason="one kernel per stack: SARJAX_MODELS_FULL=1")
def test_member_attacks_on_every_kind(hetero):
    pool, x, _ = hetero
    labels = np.asarray(pool.predict(x)).T  # [B, M]
    res = attack_members(pool, make_pgd, x, labels, key=jax.random.key(2), eps=EPS, steps=3)
    succ = np.asarray(res.success)
    assert succ.shape == (B, 8)
    adv = np.asarray(res.x_adv)  # [B, M, *S]
    for m in range(8):  # success means member m mispredicts its own adversarial inputs
        pred = np.asarray(pool.predict(adv[:, m]))[m]
        np.testing.assert_array_equal(succ[:, m], pred != labels[:, m])


def test_run_sar_on_a_heterogeneous_pool(hetero):
    pool, x, attack = hetero
    res = run_sar(pool, x, EPS, [0.0, 0.5], attack=attack, key=jax.random.key(3))
    cov = np.asarray(res.covered)
    assert cov.shape == (B, 8)
    np.testing.assert_array_equal(cov[:, 0:2], cov[:, 2:4])
    np.testing.assert_array_equal(np.asarray(res.covered_round)[:, 0:2], np.asarray(res.covered_round)[:, 2:4])
    assert np.isfinite(res.sar).all() and (res.sar > 0).all() and (res.sar <= 1).all()
