"""Expectation over Transformation (EOT) in the gradient attacks: known answers on stochastic
affine models, exact query accounting, conservative success, and EOT rounds that stay in the
ball of the ORIGINAL input."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _attacks_affine import binary_problem, pool_apply

from sarjax.attacks import JointPGDStep, PGDStep, Threat, audit, make_fgsm, make_joint_pgd, make_pgd, make_rounds

M = 3


def _pool(params):
    """M copies of one binary affine model, as a pool: W [M, D, C], b [M, C]."""
    return {"W": jnp.stack([params["W"]] * M), "b": jnp.stack([params["b"]] * M)}


def test_eot_with_a_key_ignoring_apply_equals_the_deterministic_attack_and_charges_every_draw():
    params, x0, opt = binary_problem("linf", 4, seed=1)
    pp = _pool(params)
    ref = jnp.zeros((4, M), jnp.int32)
    steps, restarts, eot = 5, 2, 3
    det = make_pgd(pool_apply, norm="linf", steps=steps, step=PGDStep(restarts=restarts))
    sto = make_pgd(lambda p, x, k: pool_apply(p, x), norm="linf", steps=steps, step=PGDStep(restarts=restarts), eot=eot)
    eps = 0.9 * opt
    a = det(pp, x0, ref, key=jax.random.PRNGKey(0), eps=eps)
    b = sto(pp, x0, ref, key=jax.random.PRNGKey(0), eps=eps)
    # sign steps: the mean of identical gradients has the same sign, so the iterates agree exactly
    np.testing.assert_array_equal(np.asarray(a.x_adv), np.asarray(b.x_adv))
    np.testing.assert_array_equal(np.asarray(a.success), np.asarray(b.success))
    np.testing.assert_allclose(np.asarray(a.objective), np.asarray(b.objective), rtol=1e-6)
    want = eot * (M + restarts * (steps * 2 * M + M))
    np.testing.assert_array_equal(np.asarray(b.queries).sum(-1), want)  # queries [B, M]: the row is the total
    np.testing.assert_array_equal(np.asarray(b.queries), want // M)  # every member selected: M equal shares
    np.testing.assert_array_equal(np.asarray(a.queries).sum(-1) * eot, want)


def _masked_apply(keep):
    """Stochastic affine pool: every input element is kept (x) w.p. ``keep`` and negated (-x)
    otherwise, independently per sample and element, before the affine members."""

    def apply(p, x, key):
        s = jnp.where(jax.random.bernoulli(key, keep, x.shape), 1.0, -1.0)
        return pool_apply(p, s * x)

    return apply


def test_eot_fgsm_follows_the_expected_gradient_where_one_draw_does_not():
    """Class 0 vs 1 with W[:, 1] - W[:, 0] = -w.  For label 0 the input gradient of member m on a draw
    s is s * p1(s) * (-w) with p1 in (0, 1): its sign is -sign(w) where s = +1 and flipped where
    s = -1.  With keep = 0.9 the expected gradient has sign -sign(w) on every element, so FGSM with
    many draws steps exactly to x0 - eps * sign(w); one draw flips about 10% of the elements."""
    B = 8
    params, x0, opt = binary_problem("linf", B, seed=3)
    w = np.asarray(params["W"][:, 0] - params["W"][:, 1]) * 2.0  # the hyperplane normal
    pp = _pool(params)
    ref = jnp.zeros((B, M), jnp.int32)
    eps = 0.05
    want = np.clip(np.asarray(x0) - eps * np.sign(w), 0.0, 1.0)
    many = make_fgsm(_masked_apply(0.9), eps=eps, eot=64)(pp, x0, ref, key=jax.random.PRNGKey(7))
    np.testing.assert_allclose(np.asarray(many.x_adv), want, atol=1e-6)
    # one draw (a fixed key, so a deterministic apply) does not follow the expected gradient
    one_draw = make_fgsm(lambda p, x: _masked_apply(0.9)(p, x, jax.random.PRNGKey(11)), eps=eps)(
        pp, x0, ref, key=jax.random.PRNGKey(7)
    )
    flipped = np.mean(np.abs(np.asarray(one_draw.x_adv) - want) > 1e-6)
    assert 0.02 < flipped < 0.3, flipped
    assert audit(x0, many.x_adv, Threat("linf", eps)).ok


def test_eot_success_needs_every_draw():
    """A member whose prediction is decided by a coin flip per draw is fooled on some draws only:
    with 16 draws it is not counted as fooled, while a member fooled on every draw is."""
    B = 4
    params, x0, _ = binary_problem("linf", B, seed=5)
    pp = _pool(params)
    ref = jnp.zeros((B, M), jnp.int32)

    def coin(p, x, key):
        z = pool_apply(p, x)  # every member predicts 0 on x0
        flip = jax.random.bernoulli(key, 0.5)  # one coin per draw
        bonus = jnp.where(flip, 1e3, -1e3)
        # member 0: class 1 wins on heads only; member 1: class 1 always wins; member 2: never
        add = jnp.stack([jnp.array([0.0, 1.0, 0, 0]) * bonus, jnp.array([0.0, 1e3, 0, 0]), jnp.zeros(4)])
        return z + add[:, None, :]

    res = make_pgd(coin, norm="linf", steps=1, eot=16)(pp, x0, ref, key=jax.random.PRNGKey(0), eps=0.0)
    np.testing.assert_array_equal(np.asarray(res.x_adv), np.asarray(x0))
    np.testing.assert_array_equal(np.asarray(res.success), np.tile([False, True, False], (B, 1)))
    # the loss of the coin member is the mean over draws: between the heads and tails values
    loss0 = np.asarray(res.member_loss)[:, 0]
    assert np.all(loss0 > 10.0) and np.all(loss0 < 1e3 - 10.0), loss0


def test_eot_rounds_stay_in_the_ball_of_the_original_input():
    """the Note's adaptive attack: rounds of EOT PGD.  Every round starts from the best point
    so far but is projected around x0, so the realized linf norm never exceeds eps."""
    B = 4
    params, x0, opt = binary_problem("linf", B, seed=6)
    pp = _pool(params)
    ref = jnp.zeros((B, M), jnp.int32)
    eps = 0.5 * opt
    inner = make_joint_pgd(_masked_apply(0.9), steps=4, step=JointPGDStep(restarts=1), eot=4)
    res = make_rounds(inner, 5, norm="linf")(pp, x0, ref, key=jax.random.PRNGKey(2), eps=eps)
    rep = audit(x0, res.x_adv, Threat("linf", np.asarray(eps)))
    assert rep.ok and np.all(rep.norm <= np.asarray(eps) * (1 + 1e-6)), rep.norm
    assert not bool(jnp.any(res.success))  # 0.5x the optimum cannot succeed


def test_eot_argument_is_validated():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="eot must be an int >= 1"):
            make_pgd(pool_apply, eot=bad)
    params, x0, _ = binary_problem("linf", 2, seed=0)
    attack = make_pgd(lambda p, x, k: pool_apply(p, x), steps=1, eot=4)
    with pytest.raises(ValueError, match="eot \\* M = 4 \\* 3"):
        attack(
            _pool(params), x0, jnp.zeros((2, M), jnp.int32), key=jax.random.PRNGKey(0), eps=0.1, max_queries=4 * M - 1
        )


@pytest.mark.skipif(
    os.environ.get("SARJAX_ATTACKS_FULL") != "1",
    reason="SARJAX_ATTACKS_FULL=1: ~33 s; the PGD twin test_eot_with_a_key_ignoring_apply_equals_the_deterministic_attack_and_charges_every_draw stays",
)
def test_eot_apgd_with_a_key_ignoring_apply_equals_the_deterministic_attack():
    """APGD and APGD-T with eot draws of a model that ignores its key: same iterates, success and
    objective as the deterministic attack, queries eot times as many plus the re-evaluation of each
    run's best point."""
    from sarjax.attacks import make_apgd, make_apgd_t

    B, n_iter, eot = 3, 6, 2
    params, x0, opt = binary_problem("linf", B, seed=8)
    pp = _pool(params)
    ref = jnp.zeros((B, M), jnp.int32)
    eps = 1.01 * opt
    for runs, factory in (
        (1, lambda a, **k: make_apgd(a, n_iter=n_iter, **k)),
        (2, lambda a, **k: make_apgd_t(a, n_iter=n_iter, n_targets=2, **k)),
    ):
        det = factory(pool_apply)(pp, x0, ref, key=jax.random.PRNGKey(1), eps=eps)
        sto = factory(lambda p, x, k: pool_apply(p, x), eot=eot)(pp, x0, ref, key=jax.random.PRNGKey(1), eps=eps)
        np.testing.assert_allclose(np.asarray(sto.x_adv), np.asarray(det.x_adv), atol=1e-6)
        np.testing.assert_array_equal(np.asarray(sto.success), np.asarray(det.success))
        np.testing.assert_allclose(np.asarray(sto.objective), np.asarray(det.objective), rtol=1e-5, atol=1e-6)
        # eot x the deterministic queries, plus each run's re-evaluation of its best point (eot * M)
        np.testing.assert_array_equal(np.asarray(sto.queries), eot * (np.asarray(det.queries) + runs * M))
        assert bool(jnp.all(det.success))  # 1.01x the analytic optimum


def test_eot_apgd_on_a_stochastic_pool_stays_in_the_ball_and_charges_every_draw():
    """APGD-CE with 8 EOT draws on the random-negation pool (elements kept w.p. 0.95): the output
    is inside the eps-ball of x0 and the box, and every draw of every evaluation is charged."""
    from sarjax.attacks import make_apgd

    B = 4
    params, x0, opt = binary_problem("linf", B, seed=9)
    pp = _pool(params)
    ref = jnp.zeros((B, M), jnp.int32)
    eps = np.asarray(1.5 * opt, np.float32)
    res = make_apgd(_masked_apply(0.95), n_iter=20, eot=8)(pp, x0, ref, key=jax.random.PRNGKey(3), eps=eps)
    assert audit(x0, res.x_adv, Threat("linf", eps)).ok
    assert res.success.shape == (B, M)
    # clean evaluation M, the starting gradient and 20 iterations of M forwards + M backwards, and
    # the re-evaluation of the best point, per draw
    np.testing.assert_array_equal(np.asarray(res.queries).sum(-1), 8 * (M + 21 * 2 * M + M))


def test_with_input_noise_known_answers():
    """sigma = 0 is the deterministic model; for an affine binary pool the input gradient of CE is
    p1 * (-w) on every draw whatever the noise, so EOT FGSM on the noisy pool lands exactly on
    x0 - eps * sign(w); bad sigma raises."""
    from sarjax.attacks import with_input_noise

    B = 5
    params, x0, _ = binary_problem("linf", B, seed=12)
    w = np.asarray(params["W"][:, 0] - params["W"][:, 1]) * 2.0
    pp = _pool(params)
    np.testing.assert_array_equal(
        np.asarray(with_input_noise(pool_apply, 0.0)(pp, x0, jax.random.PRNGKey(0))), np.asarray(pool_apply(pp, x0))
    )
    noisy = with_input_noise(pool_apply, 0.05, clip=False)
    z1, z2 = noisy(pp, x0, jax.random.PRNGKey(1)), noisy(pp, x0, jax.random.PRNGKey(2))
    assert not np.allclose(np.asarray(z1), np.asarray(z2))  # it is stochastic
    eps = 0.04
    res = make_fgsm(noisy, eps=eps, eot=8)(pp, x0, jnp.zeros((B, M), jnp.int32), key=jax.random.PRNGKey(3))
    np.testing.assert_allclose(np.asarray(res.x_adv), np.clip(np.asarray(x0) - eps * np.sign(w), 0, 1), atol=1e-6)
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="sigma must be finite"):
            with_input_noise(pool_apply, bad)


def test_eot_in_single_model_mode_over_members():
    """make_member_attack with a stochastic member apply and eot: every member is attacked in
    expectation with its own draws; on noisy affine members EOT FGSM lands on x0 - eps*sign(w_m)."""
    from _attacks_affine import affine_apply

    from sarjax.attacks import make_member_attack, with_input_noise

    B = 4
    params, x0, _ = binary_problem("linf", B, seed=13)
    params2, _, _ = binary_problem("linf", B, seed=14)
    stacked = jax.tree.map(lambda a, b: jnp.stack([a, b]), params, params2)
    eps = 0.03
    fn = make_member_attack(make_fgsm(with_input_noise(affine_apply, 0.05, clip=False), norm="linf", eot=4))
    res = fn(stacked, x0, jnp.zeros((B,), jnp.int32), key=jax.random.PRNGKey(0), eps=eps)
    assert res.x_adv.shape == (B, 2) + x0.shape[1:]
    for k, p in enumerate((params, params2)):
        w = np.asarray(p["W"][:, 0] - p["W"][:, 1])
        np.testing.assert_allclose(
            np.asarray(res.x_adv[:, k]), np.clip(np.asarray(x0) - eps * np.sign(w), 0, 1), atol=1e-6
        )
    np.testing.assert_array_equal(np.asarray(res.queries), 4 * (1 + 2 + 1))  # clean, step (fwd+bwd), final


def test_eot_query_caps_are_never_exceeded():
    """With EOT every draw is charged and each run's final (re-)evaluation is reserved: no cap is
    ever passed, and a cap that fits exactly k steps spends exactly it."""
    from sarjax.attacks import make_apgd

    B, eot = 3, 3
    params, x0, opt = binary_problem("linf", B, seed=15)
    pp = _pool(params)
    ref = jnp.zeros((B, M), jnp.int32)
    noisy = _masked_apply(0.9)
    pgd = make_pgd(noisy, steps=6, step=PGDStep(restarts=2), eot=eot)
    apgd = make_apgd(noisy, n_iter=6, eot=eot)
    for cap in (eot * M, eot * M + 5, eot * (M + 2 * M + M), eot * (M + 4 * 2 * M + M) + 1, 10_000):
        for attack in (pgd, apgd):
            res = attack(pp, x0, ref, key=jax.random.PRNGKey(4), eps=0.5 * opt, max_queries=cap)
            assert np.all(np.asarray(res.queries).sum(-1) <= cap), (cap, np.asarray(res.queries))
    # PGD: clean + 2 steps + final fit exactly
    exact = eot * (M + 2 * 2 * M + M)
    res = pgd(pp, x0, ref, key=jax.random.PRNGKey(4), eps=0.5 * opt, max_queries=exact)
    np.testing.assert_array_equal(np.asarray(res.queries).sum(-1), exact)
