"""The losses module: one sign convention (larger = more adversarial), ``[..., C]`` logits, the goal
form of the minimum-norm cores equal to the reference form, known values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sarjax.attacks import losses as L
from sarjax.attacks import minnorm as mn

Z = jnp.asarray([3.0, 1.0, 0.0, -1.0])  # sorted descending: z_pi1 = 3, z_pi3 = 0, z_pi4 = -1


def test_known_values():
    lse = float(jnp.log(jnp.sum(jnp.exp(Z))))
    np.testing.assert_allclose(L.cross_entropy(Z, jnp.asarray(1)), lse - 1.0, rtol=1e-6)
    assert float(L.margin(Z, jnp.asarray(0))) == -2.0  # top class: not fooled
    assert float(L.margin(Z, jnp.asarray(2))) == 3.0
    np.testing.assert_allclose(L.dlr(Z, jnp.asarray(0)), -2.0 / 3.0, rtol=1e-6)
    np.testing.assert_allclose(L.dlr(Z, jnp.asarray(1)), 2.0 / 3.0, rtol=1e-6)
    # targeted DLR from 0 to 3: -(3 - (-1)) / (3 - (0 + (-1)) / 2)
    np.testing.assert_allclose(L.dlr_targeted(Z, jnp.asarray(0), jnp.asarray(3)), -4.0 / 3.5, rtol=1e-6)
    assert float(L.goal_margin(Z, jnp.asarray(0), jnp.asarray(-1))) == -2.0
    assert float(L.goal_margin(Z, jnp.asarray(1), jnp.asarray(0))) == 2.0  # target 0 is on top by 2
    assert bool(L.goal_reached(Z, jnp.asarray(1), jnp.asarray(2), False))  # any class but y
    assert not bool(L.goal_reached(Z, jnp.asarray(1), jnp.asarray(2), True))  # only the target


@pytest.mark.parametrize("batch", [(), (5,), (3, 5)], ids=["[C]", "[B,C]", "[M,B,C]"])
def test_any_batch_shape_matches_per_example(batch):
    rng = np.random.default_rng(0)
    C = 6
    z = jnp.asarray(rng.normal(size=batch + (C,)) * 3, jnp.float32)
    y = jnp.asarray(rng.integers(0, C, batch), jnp.int32)
    t = jnp.asarray((np.asarray(y) + rng.integers(1, C, batch)) % C, jnp.int32)
    t = jnp.where(jnp.asarray(rng.random(batch) < 0.5), -1, t)  # mix untargeted (-1) and targeted
    flat = lambda a: a.reshape((-1,) + a.shape[len(batch) :])
    zf, yf, tf = flat(z), flat(y), flat(t)
    tc = jnp.maximum(t, 0)
    for fn, args, flat_args in [
        (L.cross_entropy, (y,), (yf,)),
        (L.margin, (y,), (yf,)),
        (L.dlr, (y,), (yf,)),
        (L.dlr_targeted, (y, tc), (yf, jnp.maximum(tf, 0))),
        (L.goal_margin, (y, t), (yf, tf)),
        (L.goal_cross_entropy, (y, t), (yf, tf)),
        (L.goal_dlr, (y, t), (yf, tf)),
    ]:
        got = fn(z, *args)
        assert got.shape == batch, fn.__name__
        one = jnp.stack([fn(zf[i], *(a[i] for a in flat_args)) for i in range(zf.shape[0])])
        np.testing.assert_array_equal(np.asarray(got).reshape(-1), np.asarray(one), err_msg=fn.__name__)
    assert L.fooled(z, y, False).shape == batch and L.goal_reached(z, y, t, True).shape == batch


def test_one_sign_convention_and_goal_form_equals_reference_form():
    rng = np.random.default_rng(1)
    C, n = 7, 400
    z = jnp.asarray(rng.normal(size=(n, C)) * 2, jnp.float32)
    y = jnp.asarray(rng.integers(0, C, n), jnp.int32)
    t = jnp.asarray((np.asarray(y) + rng.integers(1, C, n)) % C, jnp.int32)
    unt = jnp.full((n,), -1, jnp.int32)
    pred = np.asarray(jnp.argmax(z, -1))
    # larger = more adversarial: the margins and DLR are positive exactly where the goal is reached
    np.testing.assert_array_equal(np.asarray(L.margin(z, y) > 0), pred != np.asarray(y))
    np.testing.assert_array_equal(np.asarray(L.dlr(z, y) > 0), pred != np.asarray(y))
    np.testing.assert_array_equal(np.asarray(L.goal_margin(z, y, t) > 0), pred == np.asarray(t))
    np.testing.assert_array_equal(np.asarray(L.goal_reached(z, y, t, True)), pred == np.asarray(t))
    np.testing.assert_array_equal(np.asarray(L.goal_reached(z, y, unt, True)), np.asarray(L.fooled(z, y, False)))
    np.testing.assert_array_equal(np.asarray(L.fooled(z, t, True)), pred == np.asarray(t))
    # the goal form is the reference form, oriented the same way (bit for bit where one formula)
    np.testing.assert_array_equal(np.asarray(L.goal_margin(z, y, unt)), np.asarray(L.margin(z, y)))
    np.testing.assert_array_equal(np.asarray(L.goal_margin(z, y, t)), np.asarray(-L.margin(z, t)))
    np.testing.assert_array_equal(np.asarray(L.goal_dlr(z, y, unt)), np.asarray(L.dlr(z, y)))
    np.testing.assert_array_equal(np.asarray(L.goal_dlr(z, y, t)), np.asarray(L.dlr_targeted(z, y, t)))
    np.testing.assert_allclose(L.goal_cross_entropy(z, y, unt), L.cross_entropy(z, y), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(L.goal_cross_entropy(z, y, t), -L.cross_entropy(z, t), rtol=1e-5, atol=1e-6)
    # member_loss orients targeted losses as the negated loss of the target
    np.testing.assert_array_equal(np.asarray(L.member_loss(z, t, "margin", True)), np.asarray(-L.margin(z, t)))
    np.testing.assert_array_equal(np.asarray(L.member_loss(z, t, "ce", True)), np.asarray(-L.cross_entropy(z, t)))
    # the deprecated minnorm names keep their former (minimisation) sign
    np.testing.assert_array_equal(np.asarray(mn.margin(z, y, t)), np.asarray(-L.goal_margin(z, y, t)))
    np.testing.assert_array_equal(np.asarray(mn.dlr_objective(z, y, unt)), np.asarray(-L.dlr(z, y)))
    assert mn.is_success is L.goal_reached and mn.value_grad is L.value_grad


def test_value_grad_is_the_goal_loss_gradient():
    W = jnp.asarray(np.random.default_rng(2).normal(size=(4, 5)), jnp.float32)
    f = lambda x: x @ W  # [4] -> [5] logits
    x = jnp.asarray([0.2, 0.4, 0.6, 0.8])
    y, t = jnp.asarray(1), jnp.asarray(3)
    val, g, logits = L.value_grad(f, L.goal_margin, x, y, t)
    np.testing.assert_array_equal(np.asarray(logits), np.asarray(f(x)))
    assert float(val) == float(L.goal_margin(f(x), y, t))
    j = int(jnp.argmax(jnp.where(jnp.arange(5) == 3, -jnp.inf, f(x))))  # runner-up of the target
    np.testing.assert_allclose(g, W[:, 3] - W[:, j], rtol=1e-6)  # affine: z_t - z_j
    _, g_nan, _ = L.value_grad(lambda x: jnp.sqrt(x - 0.2) @ W, L.goal_margin, x, y, t)  # inf at x_0 = 0.2
    assert np.isfinite(np.asarray(g_nan)).all() and float(g_nan[0]) == 0.0


def test_class_count_checks():
    with pytest.raises(ValueError, match="at least 3 classes"):
        L.dlr(jnp.zeros((2, 2)), jnp.zeros(2, jnp.int32))
    with pytest.raises(ValueError, match="at least 4 classes"):
        L.dlr_targeted(jnp.zeros((2, 3)), jnp.zeros(2, jnp.int32), jnp.ones(2, jnp.int32))
    with pytest.raises(ValueError, match="loss must be one of"):
        L.member_loss(jnp.zeros((2, 3)), jnp.zeros(2, jnp.int32), "hinge", False)
    # the goal form evaluates its targeted branch with 3 classes too (the 4th largest falls back)
    assert np.isfinite(np.asarray(L.goal_dlr(jnp.asarray([2.0, 1.0, 0.0]), jnp.asarray(0), jnp.asarray(-1))))
    assert jax.numpy.isfinite(L.goal_dlr(jnp.asarray([2.0, 1.0, 0.0]), jnp.asarray(1), jnp.asarray(0)))
