"""Labels, references and targets outside the model's classes are rejected at every public entry.

Before: ``make_pgd(apply)(params, x, np.full(4, 12), eps=1e-9)`` returned every member "fooled"
at ``x_adv = x0`` with a NaN objective (cross-entropy of a class that does not exist).  Each entry
below raises ``ValueError`` naming the samples and the valid range, before anything compiles
(the class count comes from ``jax.eval_shape`` of ``apply``).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _attacks_affine import C, affine_apply, pool_apply

from sarjax.attacks import (
    attack_members,
    check_labels,
    fmn,
    make_apgd,
    make_apgd_t,
    make_fgsm,
    make_joint_pgd,
    make_member_attack,
    make_mifgsm,
    make_pgd,
    make_rounds,
    make_square,
)
from sarjax.models.pool import Pool, Stack
from sarjax.models.sharding import ShardedPool, make_mesh
from sarjax.models.zoo import mlp

B = 4
BAD = np.array([4, 99, 1, -3], np.int32)  # C = 4 classes: samples 0, 1, 3 are bad
KEY = jax.random.PRNGKey(0)
MSG = r"labels out of range \[0, C=4\): samples \[0, 1, 3\] have \[4, 99, -3\]"


def _affine_pool_params(m=2, d=8):
    rng = np.random.default_rng(0)
    return {"W": jnp.asarray(rng.standard_normal((m, d, C)), jnp.float32), "b": jnp.zeros((m, C), jnp.float32)}


def _x(shape=(B, 8)):
    return jnp.asarray(np.random.default_rng(1).uniform(0.2, 0.8, shape), jnp.float32)


def test_check_labels_names_samples_values_and_range():
    check_labels(np.array([0, 3, 2]), 4)  # in range: no error
    with pytest.raises(ValueError, match=MSG):
        check_labels(BAD, 4)
    # [B, M]: the first offending value of each bad sample
    with pytest.raises(ValueError, match=r"samples \[1, 2\] have \[7, -1\]"):
        check_labels(np.array([[0, 1], [2, 7], [-1, 9]]), 4)
    with pytest.raises(ValueError, match=r"samples \[10, 11, .*, 19\] have \[7, .*\] \(and 2 more samples\)"):
        check_labels(np.repeat([0, 7], [10, 12]), 4)
    with pytest.raises(ValueError, match=r"targets out of range \[0, C=4\) or -1: samples \[1\] have \[-3\]"):
        check_labels(np.array([-1, -3, 2]), 4, name="targets", untargeted=-1)
    with pytest.raises(TypeError, match="integer"):
        check_labels(np.array([0.0, 1.0]), 4)


@pytest.mark.parametrize(
    "make, kw",
    [
        (make_pgd, dict(steps=2)),
        (make_pgd, dict(steps=2, norm="l1")),
        (make_fgsm, dict()),
        (make_mifgsm, dict(steps=2)),
        (make_apgd, dict(n_iter=2)),
        (make_apgd_t, dict(n_iter=2)),
        (make_joint_pgd, dict(steps=2)),
    ],
)
def test_gradient_attacks_reject_out_of_range_labels(make, kw):
    atk = make(pool_apply, eps=1e-9, **kw)
    params, x = _affine_pool_params(), _x()
    with pytest.raises(ValueError, match=MSG):
        atk(params, x, BAD, key=KEY)
    with pytest.raises(ValueError, match=MSG):
        atk(params, x, jnp.asarray(BAD)[:, None] * jnp.ones((1, 2), jnp.int32), key=KEY)  # [B, M] refs
    with pytest.raises(ValueError, match=r"labels out of range \[0, C=4\): samples \[2\] have \[12\]"):
        atk(params, x, np.array([0, 1, 12, 3]), key=KEY, mask=np.array([True, False]))  # masked members too


def test_targeted_attacks_name_targets():
    params, x = _affine_pool_params(), _x()
    for atk in (
        make_pgd(pool_apply, eps=0.1, steps=2, targeted=True),
        make_apgd(pool_apply, eps=0.1, n_iter=2, targeted=True),
        make_square(pool_apply, eps=0.1, n_queries=2, targeted=True),
    ):
        with pytest.raises(ValueError, match=r"targets out of range \[0, C=4\): samples \[0, 1, 3\]"):
            atk(params, x.reshape(B, 2, 2, 2), BAD, key=KEY)


def test_square_rejects_out_of_range_labels():
    with pytest.raises(ValueError, match=MSG):
        make_square(pool_apply, eps=0.1, n_queries=2)(_affine_pool_params(), _x().reshape(B, 2, 2, 2), BAD, key=KEY)


def test_single_model_and_eot_attacks_reject_out_of_range_labels():
    params = {"W": _affine_pool_params()["W"][0], "b": jnp.zeros((C,), jnp.float32)}
    with pytest.raises(ValueError, match=MSG):
        make_pgd(affine_apply, eps=1e-9, steps=2)(params, _x(), BAD, key=KEY)
    noisy = lambda p, x, k: affine_apply(p, x + 0.0 * jax.random.normal(k, x.shape))  # noqa: E731
    with pytest.raises(ValueError, match=MSG):
        make_pgd(noisy, eps=0.1, steps=2, eot=2)(params, _x(), BAD, key=KEY)


def test_rounds_and_member_modes_reject_out_of_range_labels():
    params, x = _affine_pool_params(), _x()
    with pytest.raises(ValueError, match=MSG):
        make_rounds(make_pgd(pool_apply, steps=2), 2, norm="linf")(params, x, BAD, key=KEY, eps=0.1)
    member = make_member_attack(make_pgd(affine_apply, steps=2))
    with pytest.raises(ValueError, match=MSG):
        member(params, x, BAD, key=KEY, eps=0.1)
    per_member = np.array([[0, 1, 2, 3], [0, 5, 2, 3]]).T  # [B, K]: member 1 has 5 for sample 1
    with pytest.raises(ValueError, match=r"samples \[1\] have \[5\]"):
        member(params, x, per_member, key=KEY, eps=0.1)
    with pytest.raises(ValueError, match=r"targets out of range \[0, C=4\): samples \[0, 1, 3\]"):
        make_member_attack(make_pgd(affine_apply, steps=2, targeted=True))(params, x, BAD, key=KEY, eps=0.1)


def _mlp_pool(m=2, classes=4):
    arch = mlp((8,), input_shape=(2, 2, 2), num_classes=classes)
    shapes = jax.eval_shape(arch.init, jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: rng.standard_normal((m,) + s.shape).astype(np.float32), shapes)
    return Pool([Stack(arch, params, tuple(f"m{i}" for i in range(m)))])


def test_pool_entries_reject_out_of_range_labels():
    pool = _mlp_pool()
    x = np.asarray(_x()).reshape(B, 2, 2, 2)
    with pytest.raises(ValueError, match=MSG):
        attack_members(pool, make_pgd, x, BAD, key=KEY, eps=0.1, steps=2)
    sp = ShardedPool(pool, make_mesh(1, 1))
    with pytest.raises(ValueError, match=MSG):
        sp.attack(make_joint_pgd(sp.apply, eps=0.1, steps=2), x, BAD, key=KEY)
    with pytest.raises(ValueError, match=r"ref must be \[B\] or \[B, M\] with B=4"):
        sp.attack(make_joint_pgd(sp.apply, eps=0.1, steps=2), x, BAD[:3], key=KEY)


def test_minimum_norm_attacks_share_the_validator():
    pool = _mlp_pool()
    x = np.asarray(_x()).reshape(B, 2, 2, 2)
    with pytest.raises(ValueError, match=MSG):
        fmn.make_fmn(pool.apply, norm="l2", max_queries=20)(pool.params, x, BAD, key=jax.random.PRNGKey(0))
    targets = np.array([1, 2, -3, 9])
    with pytest.raises(ValueError, match=r"targets out of range \[0, C=4\): samples \[2, 3\] have \[-3, 9\]"):
        fmn.make_fmn(pool.apply, norm="l2", max_queries=20, targeted=True)(
            pool.params, x, targets, key=jax.random.PRNGKey(0), labels=np.zeros(B, np.int32)
        )


def test_sample_ids_are_validated():
    atk = make_pgd(pool_apply, eps=0.1, steps=2)
    params, x, y = _affine_pool_params(), _x(), np.zeros(B, np.int32)
    with pytest.raises(ValueError, match=r"sample_ids must have shape \[4\]"):
        atk(params, x, y, key=KEY, sample_ids=np.arange(3))
    with pytest.raises(ValueError, match=r"sample_ids must lie in \[0, 2\*\*31\): samples \[1\] have \[-2\]"):
        atk(params, x, y, key=KEY, sample_ids=np.array([0, -2, 1, 2]))
    with pytest.raises(TypeError, match="sample_ids must be int"):
        atk(params, x, y, key=KEY, sample_ids=np.arange(4.0))
