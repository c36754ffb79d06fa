"""l1-APGD's adaptive sparsity (Croce & Hein 2021; AutoAttack's autopgd_base.py): the checkpoint
rule against hand-computed values, and a hand-computed three-step trajectory of the kernel."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _attacks_affine import affine_apply, binary_problem

from sarjax.attacks.apgd import APGDSchedule, l1_sparsity_update, make_apgd, sparse_sign_direction


def test_l1_sparsity_update_hand_computed():
    #            sp_best sp_last eta   eta0  -> topk,            eta,       restart
    cases = [
        (8.0, 12.0, 0.30, 0.5, 8 / 16 / 1.5, 0.5, True),  # sparser by > 5%: reset step
        (12.0, 12.0, 0.50, 0.5, 12 / 16 / 1.5, 0.5 / 1.5, False),  # not sparser: step / 1.5
        (12.0, 12.5, 0.06, 0.5, 12 / 16 / 1.5, 0.05, False),  # 0.04 clipped to eta0 / 10
        (19.0, 20.0, 0.40, 0.5, 19 / 16 / 1.5, 0.4 / 1.5, False),  # exactly 0.95: not sparser
        (18.0, 20.0, 0.40, 0.5, 18 / 16 / 1.5, 0.5, True),
        (16.0, 4.0, 0.50, 0.5, 16 / 16 / 1.5, 0.5 / 1.5, False),  # denser: k grows
        (0.0, 0.0, 0.50, 0.5, 0.0, 0.5 / 1.5, False),
    ]  # nothing moved yet
    a = np.array(cases, np.float64)
    topk, eta, sp_last, restart = jax.jit(jax.vmap(l1_sparsity_update, in_axes=(0, 0, 0, 0, None)))(
        *(jnp.asarray(a[:, i], jnp.float32) for i in range(4)), 16
    )
    np.testing.assert_allclose(np.asarray(topk), a[:, 4], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(eta), a[:, 5], rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(sp_last), a[:, 0])
    np.testing.assert_array_equal(np.asarray(restart), a[:, 6].astype(bool))


def test_l1_apgd_adapts_sparsity_per_sample_along_a_hand_computed_trajectory():
    """Affine model, d = 16: the CE gradient is proportional to -w, so a sparse step moves the
    top-k coordinates of |w| by eta / k each.  Warm start: the top 8 coordinates at eps / 20 and
    the next 4 at eps / 100 (sparsity 12, l1 size 0.44 eps); step0 = 0.5; n_iter = 3, so a
    checkpoint follows every step (max(floor(0.04 * 3), 1) = 1).  In units of eps:

    * start: topk = 12 / 16 / 1.5 = 0.5, sp_last = 12.
    * step 1 (eta 0.5, k = 8): top 8 at 0.05 + 0.0625, inside the ball.  Checkpoint: sp 12, not
      sparser -> topk 0.5, eta 0.5 / 1.5.
    * step 2 (k = 8): top 8 at 0.1125 + 0.04167, next 4 at 0.01: l1 1.273 -> the projection
      subtracts 0.0292 and drops the 4 -> top 8 at 0.125.  Checkpoint: sp 8 < 0.95 * 12 ->
      topk = 8 / 16 / 1.5 = 1/3, eta reset to 0.5, restart from this (best) point.
    * step 3 (k = floor(16 / 3) = 5): top 5 at 0.125 + 0.5 / 5, 3 at 0.125: l1 1.5 -> minus
      0.0625 -> top 5 at 0.1625, 3 at 0.0625.  Highest loss: returned.

    The old fixed sparsity (k = 1), a topk that never adapts (k = 8 again: step 3 returns to the
    uniform 0.125) or a step that is not reset (eta 0.222: 0.1528 / 0.0972) all give other points.
    """
    batch = 2
    params, x0, opt = binary_problem("l1", batch, seed=4, d=16)
    w = np.asarray(params["W"][:, 0]) * 2
    order = np.argsort(-np.abs(w))
    s = -np.sign(w)
    eps = np.array([0.5, 0.8]) * opt
    warm = np.asarray(x0, np.float64).copy()
    warm[:, order[:8]] += (eps[:, None] / 20) * s[order[:8]]
    warm[:, order[8:12]] += (eps[:, None] / 100) * s[order[8:12]]
    attack = make_apgd(affine_apply, norm="l1", n_iter=3, schedule=APGDSchedule(step0=0.5))
    res = attack(
        params, x0, np.zeros(batch, np.int32), key=jax.random.PRNGKey(0), eps=eps, x_init=warm.astype(np.float32)
    )
    want = np.zeros((batch, 16))
    want[:, order[:5]] = 0.1625
    want[:, order[5:8]] = 0.0625
    want = want * s * eps[:, None]
    got = np.asarray(res.x_adv, np.float64) - np.asarray(x0, np.float64)
    np.testing.assert_allclose(got, want, atol=2e-6)
    # 2 forwards per evaluation (M = 1 forward + 1 backward), start + 3 steps, plus the clean one
    np.testing.assert_array_equal(np.asarray(res.queries), 1 + 2 * 4)


def test_sparse_sign_direction_keeps_floor_topk_coordinates():
    g = jnp.asarray([0.1, -3.0, 2.0, -0.5, 1.0, 0.0, 4.0, -2.5])
    x = jnp.full((8,), 0.5)
    fn = jax.jit(sparse_sign_direction)
    # floor(0.2 * 8) = 1, floor(0.375 * 8) = 3, floor(0.49 * 8) = 3, tiny share -> at least 1
    np.testing.assert_array_equal(np.asarray(fn(g, x, 0.2)), [0, 0, 0, 0, 0, 0, 1, 0])
    np.testing.assert_allclose(np.asarray(fn(g, x, 0.375)), np.array([0, -1, 0, 0, 0, 0, 1, -1]) / 3)
    np.testing.assert_allclose(np.asarray(fn(g, x, 0.49)), np.array([0, -1, 0, 0, 0, 0, 1, -1]) / 3)
    np.testing.assert_array_equal(np.asarray(fn(g, x, 0.01)), [0, 0, 0, 0, 0, 0, 1, 0])
    # a coordinate on the box face the gradient pushes into cannot move: the next one is used
    x_stuck = x.at[6].set(1.0)
    np.testing.assert_array_equal(np.asarray(fn(g, x_stuck, 0.2)), [0, -1, 0, 0, 0, 0, 0, 0])


def test_l1_topk_is_validated():
    with pytest.raises(ValueError, match="l1_topk"):
        make_apgd(affine_apply, norm="l1", schedule=APGDSchedule(l1_topk=0.0))
    with pytest.raises(ValueError, match="l1_topk"):
        make_apgd(affine_apply, norm="l1", schedule=APGDSchedule(l1_topk=1.5))


def test_schedule_is_checked_and_factories_take_at_most_ten_parameters():
    """``APGDSchedule`` groups the step-size constants (issue 42 item 3): a bad field is refused by
    name, a non-schedule is a TypeError, and neither factory takes more than 10 parameters."""
    import inspect

    from sarjax.attacks.apgd import make_apgd_t

    for f in (make_apgd, make_apgd_t):
        assert len(inspect.signature(f).parameters) <= 10, f.__name__
    with pytest.raises(ValueError, match=r"APGDSchedule\.restarts"):
        make_apgd(affine_apply, schedule=APGDSchedule(restarts=0))
    with pytest.raises(ValueError, match=r"APGDSchedule\.step0 must be a finite float > 0, got -1"):
        make_apgd(affine_apply, schedule=APGDSchedule(step0=-1.0))
    with pytest.raises(ValueError, match=r"APGDSchedule\.rho"):
        make_apgd(affine_apply, schedule=APGDSchedule(rho=float("nan")))
    with pytest.raises(TypeError, match="schedule must be an APGDSchedule, got dict"):
        make_apgd(affine_apply, schedule={"rho": 0.5})  # type: ignore[arg-type]
    assert APGDSchedule() == APGDSchedule(1, 0.75, 0.75, None, 0.2, "reference")  # AutoAttack's defaults
