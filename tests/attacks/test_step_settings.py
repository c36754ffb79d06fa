"""The step-rule settings of PGD, joint PGD and MI-FGSM (issue 42 item 3): checked when built,
and the same attack as the old keyword arguments."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sarjax.attacks import JointPGDStep, MIFGSMStep, PGDStep, make_joint_pgd, make_mifgsm, make_pgd

W = np.random.default_rng(0).normal(size=(2, 12, 3)).astype(np.float32)  # 2 linear members, 3 classes


def apply(params, x):
    return jnp.einsum("bs,msc->mbc", x.reshape(x.shape[0], -1), params)


X = np.random.default_rng(1).random((4, 12)).astype(np.float32)
Y = np.zeros((4, 2), np.int32)


@pytest.mark.parametrize(
    "make, field, value",
    [
        (PGDStep, "step_size", 0.0),
        (PGDStep, "step_size", float("nan")),
        (PGDStep, "step_size", True),
        (PGDStep, "rel_step", -0.25),
        (PGDStep, "restarts", 0),
        (PGDStep, "restarts", 2.0),
        (PGDStep, "random_start", 1),
        (PGDStep, "l1_sparsity", 1.0),
        (PGDStep, "l1_sparsity", -0.1),
        (JointPGDStep, "step_size", -1.0),
        (JointPGDStep, "restarts", 0),
        (JointPGDStep, "restarts", "3"),
        (MIFGSMStep, "decay", -0.5),
        (MIFGSMStep, "decay", float("inf")),
        (MIFGSMStep, "step_size", 0),
    ],
)
def test_bad_step_values_raise_naming_field_and_value(make, field, value):
    with pytest.raises(ValueError, match=rf"{make.__name__}\.{field} must be .*got .*{value!r}"):
        make(**{field: value})


def test_steps_are_frozen_and_replace_is_checked():
    s = PGDStep()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.restarts = 3  # type: ignore[misc]
    with pytest.raises(ValueError, match=r"PGDStep\.restarts must be an int >= 1, got 0"):
        dataclasses.replace(s, restarts=0)  # a NamedTuple's _replace would skip the check


def test_factories_refuse_a_step_of_another_attack():
    with pytest.raises(TypeError, match="step must be a PGDStep, got JointPGDStep"):
        make_pgd(apply, eps=0.1, step=JointPGDStep())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="step must be a JointPGDStep, got PGDStep"):
        make_joint_pgd(apply, eps=0.1, step=PGDStep())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="step must be an MIFGSMStep, got dict"):
        make_mifgsm(apply, eps=0.1, step={"decay": 1.0})  # type: ignore[arg-type]


def test_defaults_are_the_papers():
    # the SAR paper's Table 1 (joint: 3 restarts, eps/16), Madry et al. (random start), Dong et al. (mu = 1)
    assert (JointPGDStep().step_size, JointPGDStep().restarts) == (None, 3)
    assert PGDStep() == PGDStep(step_size=None, rel_step=None, restarts=1, random_start=True, l1_sparsity=0.99)
    assert MIFGSMStep() == MIFGSMStep(decay=1.0, step_size=None)


def test_joint_pgd_is_make_pgd_with_table_1_step():
    # known answer: make_joint_pgd(step=JointPGDStep(s, r)) == make_pgd(step=PGDStep(s, 1/16, r, True))
    key = jax.random.key(0)
    for js, ps in [
        (JointPGDStep(restarts=2), PGDStep(rel_step=1 / 16, restarts=2)),
        (JointPGDStep(step_size=0.02, restarts=1), PGDStep(step_size=0.02, restarts=1)),
    ]:
        a = make_joint_pgd(apply, eps=0.2, steps=3, step=js)(W, X, Y, key=key)
        b = make_pgd(apply, eps=0.2, steps=3, step=ps)(W, X, Y, key=key)
        np.testing.assert_array_equal(np.asarray(a.x_adv), np.asarray(b.x_adv))
        np.testing.assert_array_equal(np.asarray(a.queries), np.asarray(b.queries))
