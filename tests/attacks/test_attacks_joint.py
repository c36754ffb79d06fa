"""Joint PGD on pools, mask handling without recompilation, query accounting and caps."""

import jax
import jax.numpy as jnp
import numpy as np
from _attacks_affine import D, pool_apply

from sarjax.attacks.joint import JointPGDStep, make_joint_pgd
from sarjax.attacks.pgd import PGDStep, make_pgd

M = 5
_TRACES = []


def counting_apply(p, x):
    """pool_apply that records every trace (Python runs only when JAX traces)."""
    _TRACES.append(1)
    return pool_apply(p, x)


def common_direction_pool(batch, seed=0):
    """M binary affine members sharing one adversarial direction v (plus small noise);
    every member needs about the same linf budget along sign(v).  Returns params, x0,
    the linf budget that breaks the member needing the most (1.15x margin)."""
    rng = np.random.default_rng(seed)
    v = rng.uniform(0.5, 1.5, D) * rng.choice([-1.0, 1.0], D)
    W = np.zeros((M, D, 4))
    b = np.zeros((M, 4))
    x0 = rng.uniform(0.4, 0.6, (batch, D)).astype(np.float32)
    need = np.zeros((batch, M))
    for m in range(M):
        w = v + rng.normal(0, 0.05, D)
        margin = rng.uniform(0.5, 1.0)  # f_m(x0) must be positive: choose c per member
        c = margin - (x0 @ w).min()
        W[m, :, 0], W[m, :, 1] = w / 2, -w / 2
        b[m] = [c / 2, -c / 2, -100.0, -101.0]
        need[:, m] = (x0 @ w + c) / np.abs(w).sum()  # linf distance of member m
    params = {"W": jnp.asarray(W, jnp.float32), "b": jnp.asarray(b, jnp.float32)}
    return params, jnp.asarray(x0), need


def test_joint_pgd_breaks_every_member_with_one_input():
    B = 4
    params, x0, need = common_direction_pool(B)
    eps = 1.15 * need.max(axis=1)
    assert eps.max() < 0.35  # the box does not interfere
    ref = jnp.zeros((B, M), jnp.int32)  # every member predicts class 0 on x0
    assert bool(jnp.all(jnp.argmax(pool_apply(params, x0), -1) == 0))
    attack = make_joint_pgd(pool_apply)
    res = attack(params, x0, ref, key=jax.random.PRNGKey(0), mask=jnp.ones((B, M)), eps=eps)
    assert res.success.shape == (B, M) and res.member_loss.shape == (B, M)
    assert bool(jnp.all(res.success)), np.asarray(res.success)
    # one input per sample: re-evaluating x_adv on the pool shows every member fooled
    z = pool_apply(params, res.x_adv)
    assert bool(jnp.all(jnp.argmax(z, -1) != 0))
    # with 0.9x the smallest member's distance no member can be fooled
    res_lo = attack(params, x0, ref, key=jax.random.PRNGKey(0), mask=jnp.ones((B, M)), eps=0.9 * need.min(axis=1))
    assert not bool(jnp.any(res_lo.success))


def test_mask_changes_do_not_recompile_and_select_members():
    B = 3
    params, x0, need = common_direction_pool(B, seed=1)
    traces = _TRACES
    attack = make_pgd(counting_apply, norm="linf", steps=6, step=PGDStep(restarts=2))  # shares the kernel below
    ref = jnp.zeros((B, M), jnp.int32)
    eps = 0.5 * need.min(axis=1)
    masks = [np.ones((B, M)), np.eye(B, M), np.zeros((B, M)), (np.arange(M) % 2 == 0)[None].repeat(B, 0)]
    results = [attack(params, x0, ref, key=jax.random.PRNGKey(2), mask=jnp.asarray(masks[0], jnp.float32), eps=eps)]
    n_after_first = len(traces)
    for mask in masks[1:]:
        results.append(attack(params, x0, ref, key=jax.random.PRNGKey(2), mask=jnp.asarray(mask, jnp.float32), eps=eps))
    assert len(traces) == n_after_first > 0, "a new mask re-traced the kernel"
    # the objective is the mean loss of the selected members only
    for mask, res in zip(masks, results):
        m = np.asarray(mask, np.float32)
        want = (m * np.asarray(res.member_loss)).sum(1) / np.maximum(m.sum(1), 1)
        np.testing.assert_allclose(np.asarray(res.objective), want, rtol=1e-5, atol=1e-6)
    # an all-zero mask (a covered sample) takes no step and only pays the clean evaluation
    np.testing.assert_array_equal(np.asarray(results[2].x_adv), np.asarray(x0))
    np.testing.assert_array_equal(np.asarray(results[2].queries), np.ones((B, M)))  # one forward per member


def test_query_count_is_exact_and_cap_freezes_samples():
    B, steps, restarts = 3, 6, 2
    params, x0, need = common_direction_pool(B, seed=2)
    ref = jnp.zeros((B, M), jnp.int32)
    mask = jnp.asarray([[1, 1, 1, 1, 1], [1, 0, 1, 0, 0], [0, 0, 0, 0, 1]], jnp.float32)
    n_sel = np.asarray(mask).sum(1).astype(int)
    eps = 0.8 * need.min(axis=1)
    attack = make_pgd(counting_apply, norm="linf", steps=steps, step=PGDStep(restarts=restarts))
    res = attack(params, x0, ref, key=jax.random.PRNGKey(3), mask=mask, eps=eps)
    # clean evaluation M + per restart: steps x (M forwards + n_sel backwards) + final M forwards
    want = M + restarts * (steps * (M + n_sel) + M)
    np.testing.assert_array_equal(np.asarray(res.queries).sum(-1), want)
    # per member: its forwards (clean, every step, every final) and a backward per step where selected
    per_member = 1 + restarts * (steps * (1 + np.asarray(mask)) + 1)
    np.testing.assert_array_equal(np.asarray(res.queries), per_member)

    # a cap that allows exactly 2 steps of the first restart (and no second restart)
    # reproduces the 2-step, 1-restart attack
    short = make_pgd(pool_apply, norm="linf", steps=2, step=PGDStep(restarts=1))
    cap = M + 2 * (M + n_sel) + M
    capped = attack(params, x0, ref, key=jax.random.PRNGKey(3), mask=mask, eps=eps, max_queries=cap)
    ref_run = short(params, x0, ref, key=jax.random.PRNGKey(3), mask=mask, eps=eps)
    assert np.all(np.asarray(capped.queries).sum(-1) <= cap)
    np.testing.assert_array_equal(np.asarray(capped.queries), np.asarray(ref_run.queries))
    np.testing.assert_array_equal(np.asarray(capped.x_adv), np.asarray(ref_run.x_adv))


def test_cap_below_the_clean_evaluation_is_refused():
    import pytest

    B = 3
    params, x0, need = common_direction_pool(B, seed=2)
    ref = jnp.zeros((B, M), jnp.int32)
    attack = make_pgd(pool_apply, norm="linf", steps=2)
    with pytest.raises(ValueError, match=f"max_queries must be >= M = {M}"):
        attack(params, x0, ref, key=jax.random.PRNGKey(0), eps=0.1, max_queries=M - 1)
    ok = attack(params, x0, ref, key=jax.random.PRNGKey(0), eps=0.1, max_queries=M)
    np.testing.assert_array_equal(np.asarray(ok.queries), 1)  # only the clean evaluation (one per member) fits
    np.testing.assert_array_equal(np.asarray(ok.x_adv), np.asarray(x0))


def test_joint_pgd_on_a_heterogeneous_pool_reports_consistent_success():
    from sarjax.models import zoo
    from sarjax.models.pool import Pool, Stack

    small = dict(input_shape=(6, 6, 1))

    rng = np.random.default_rng(0)

    def dense(n, fan_in, fan_out):  # numpy init: no compile (Arch.init would compile per stack)
        return {
            "w": jnp.asarray(rng.normal(0, fan_in**-0.5, (n, fan_in, fan_out)), jnp.float32),
            "b": jnp.asarray(rng.normal(0, 0.1, (n, fan_out)), jnp.float32),
        }

    mlp, cnn = zoo.mlp(widths=(16,), **small), zoo.cnn(channels=(4,), dense=8, **small)
    conv = {"w": jnp.asarray(rng.normal(0, 1 / 3, (3, 3, 3, 1, 4)), jnp.float32), "b": jnp.zeros((3, 4), jnp.float32)}
    pool = Pool(
        (
            Stack(mlp, {"dense0": dense(2, 36, 16), "out": dense(2, 16, 10)}, ("m0", "m1")),
            Stack(cnn, {"conv0": conv, "dense": dense(3, 36, 8), "out": dense(3, 8, 10)}, ("c0", "c1", "c2")),
        )
    )
    x0 = jax.random.uniform(jax.random.PRNGKey(2), (3, 6, 6, 1))
    ref = jnp.argmax(pool.logits(x0), -1).T.astype(jnp.int32)  # [B, M] own predictions
    mask = jnp.asarray([[1, 1, 1, 1, 1], [0, 1, 0, 1, 0], [1, 0, 0, 0, 0]], jnp.float32)
    res = make_joint_pgd(pool.apply, steps=4, step=JointPGDStep(restarts=2))(
        pool.params, x0, ref, key=jax.random.PRNGKey(3), mask=mask, eps=0.3
    )
    for x, succ in ((res.x_adv, res.success), (res.best_x, res.best_success)):
        pred = np.asarray(jnp.argmax(pool.logits(x), -1)).T  # [B, M]
        np.testing.assert_array_equal(np.asarray(succ), pred != np.asarray(ref))
    assert np.abs(np.asarray(res.x_adv) - np.asarray(x0)).max() <= 0.3 + 1e-7


def test_labels_b_are_shared_by_every_member_of_a_pool_apply():
    """ref [B] with no mask on a pool apply means the same label for every member: the result equals
    the explicit [B, M] call, queries count all M members, and a single-model apply keeps M = 1."""
    from _attacks_affine import affine_apply

    from sarjax.attacks.apgd import make_apgd
    from sarjax.attacks.square import make_square

    B, steps = 3, 4
    params, x0, need = common_direction_pool(B, seed=4)
    x0 = x0.reshape(B, 2, 4, 1)  # image-shaped for Square; the affine members flatten it
    y = jnp.zeros((B,), jnp.int32)
    y_bm = jnp.zeros((B, M), jnp.int32)
    eps = 0.8 * need.min(axis=1)
    for attack in (
        make_pgd(pool_apply, norm="linf", steps=steps),
        make_apgd(pool_apply, norm="linf", n_iter=steps),
        make_square(pool_apply, n_queries=steps),
    ):
        shared = attack(params, x0, y, key=jax.random.PRNGKey(5), eps=eps)
        explicit = attack(params, x0, y_bm, key=jax.random.PRNGKey(5), eps=eps)
        assert shared.success.shape == (B, M)
        np.testing.assert_array_equal(np.asarray(shared.x_adv), np.asarray(explicit.x_adv))
        np.testing.assert_array_equal(np.asarray(shared.queries), np.asarray(explicit.queries))
    pgd = make_pgd(pool_apply, norm="linf", steps=steps, step=PGDStep(restarts=1))
    res = pgd(params, x0, y, key=jax.random.PRNGKey(5), eps=eps)
    np.testing.assert_array_equal(np.asarray(res.queries).sum(-1), M + steps * 2 * M + M)
    np.testing.assert_array_equal(np.asarray(res.queries), 1 + steps * 2 + 1)  # each member alike
    one = {"W": params["W"][0], "b": params["b"][0]}
    single = make_pgd(affine_apply, norm="linf", steps=steps, step=PGDStep(restarts=1))(
        one, x0, y, key=jax.random.PRNGKey(5), eps=eps
    )
    assert single.success.shape == (B, 1)
    np.testing.assert_array_equal(np.asarray(single.queries), 1 + steps * 2 + 1)
