"""Trajectory, query cap, determinism, NaN safety, pool vmap, validation and audit."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _minnorm_ref import affine_min_norm, make_affine

from sarjax.attacks import alma, apgd_min, ddn, fab, fmn, pdgd, pdpgd, sigma_zero
from sarjax.attacks import minnorm as mn

# one case per attack, on the norm whose numerics divide by a gradient norm or threshold it
ALL = [
    (fmn.spec(), 2),
    (ddn.spec(), 2),
    (apgd_min.spec(loss="dlr"), 1),
    (alma.spec(), 2),
    (pdgd.spec(), 2),
    (pdpgd.spec(), 0),
    (sigma_zero.spec(), 0),
    (fab.spec(targeted=True), 1),
]


def _apply(params, x):
    return x.reshape(x.shape[0], -1) @ params[0] + params[1]  # [B, C]: one member


def _affine(seed, shape, B, temperature=10.0, C=5):
    W, b, x0, y = make_affine(seed, shape, C=C, B=B)
    return W, b, x0, y, (jnp.asarray(W) * temperature, jnp.asarray(b) * temperature)


@pytest.fixture(scope="module")
def restart_run():
    W, b, x0, y, params = _affine(1, (4, 6), 3)
    fn = fmn.make_fmn(_apply, norm=2, max_queries=300, restarts=2, init_eps=0.5)
    return fn, params, x0, y, fn(params, x0, y, key=jax.random.key(7))


def test_trajectory_cap_restarts_and_determinism(restart_run):
    fn, params, x0, y, r1 = restart_run
    r2 = fn(params, x0, y, key=jax.random.key(7))
    for a, c in zip(r1, r2):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(c))
    traj = np.asarray(r1.trajectory)
    assert traj.shape == (3, 1, 30)
    fin = np.where(np.isinf(traj), 1e30, traj)
    assert (np.diff(fin, axis=-1) <= 0).all(), "trajectory must be non-increasing"
    assert (np.asarray(r1.queries) == 300).all()  # 3 runs x 50 steps x 2 queries
    # after the last query the trajectory holds the returned (best over restarts) norm
    np.testing.assert_allclose(traj[..., -1], np.asarray(r1.norm), rtol=1e-6)
    # every sample succeeds and the result is audited (the entry raises otherwise)
    assert np.asarray(r1.success).all()


def _const_apply(bias, x):
    return bias + 0.0 * jnp.sum(x.reshape(x.shape[0], -1), axis=1)[:, None]  # zero gradient


@pytest.mark.parametrize("k", range(len(ALL)), ids=[f"{s.name}-l{p}" for s, p in ALL])
def test_zero_gradient_no_nan_and_odd_cap(k):
    spec, p = ALL[k]
    bias = jnp.asarray([3.0, 1.0, 0.0, -1.0], jnp.float32)  # constant logits: never adversarial
    x0 = np.random.default_rng(0).uniform(0, 1, (2, 3)).astype(np.float32)
    y = np.zeros(2, np.int32)
    T = 47  # odd: a 2-query step cannot land exactly on the cap, which stays hard
    r = mn.make(spec, _const_apply, norm=p, max_queries=T)(bias, x0, y, key=jax.random.key(0))
    q = np.asarray(r.queries)
    assert (q <= T).all() and (q >= T - 2).all()
    assert r.trajectory.shape == (2, 1, T // 10)
    assert not np.asarray(r.success).any()
    assert np.isinf(np.asarray(r.norm)).all() and np.isinf(np.asarray(r.trajectory)).all()
    np.testing.assert_array_equal(np.asarray(r.x_adv)[:, 0], x0)
    assert np.isfinite(np.asarray(r.x_adv)).all()


def _stack(M=3, B=4, shape=(4, 6), C=5, seed=3):
    rng = np.random.default_rng(seed)
    params = {
        "W": jnp.asarray(rng.normal(size=(M, int(np.prod(shape)), C)) * 2.0, jnp.float32),
        "b": jnp.asarray(rng.normal(size=(M, C)) * 0.1, jnp.float32),
    }
    x0 = rng.uniform(0.2, 0.8, (B,) + shape).astype(np.float32)
    return params, x0


def _member(x, p):
    return x.reshape(x.shape[0], -1) @ p["W"] + p["b"]


def _pool(params, x):
    return jax.vmap(lambda p: _member(x, p))(params)  # [M, B, C]


def _stacked(p, x):
    return _member(x, p)


def test_pool_layout_matches_single_member_and_known_optimum():
    M, B, shape = 3, 4, (4, 6)
    params, x0 = _stack(M, B, shape)
    y = np.asarray(jnp.argmax(_member(x0, jax.tree.map(lambda a: a[0], params)), -1), np.int32)
    res = fmn.make_fmn(_pool, norm=2, max_queries=200)(params, x0, y, key=jax.random.key(0))
    assert res.x_adv.shape == (B, M) + shape and res.norm.shape == (B, M)
    assert res.trajectory.shape == (B, M, 20) and res.queries.shape == (B, M)
    # the stacked path (member apply vmapped over stacked params) gives the same result
    st = fmn.make_fmn(_stacked, norm=2, max_queries=200, stacked=True)(params, x0, y, key=jax.random.key(0))
    np.testing.assert_allclose(np.asarray(st.norm), np.asarray(res.norm), rtol=1e-5)
    # each member alone gives its column; its norm is within 1.05x of that member's exact
    # optimum where y is its prediction (member 0 on every sample: y is its prediction), and
    # never below it (a norm below the optimum would be a bound or audit bug)
    attacked = 0
    for m in range(M):
        pm = jax.tree.map(lambda a: a[m], params)
        one = fmn.make_fmn(_stacked, norm=2, max_queries=200)(pm, x0, y, key=jax.random.key(0))
        np.testing.assert_allclose(np.asarray(res.norm[:, m]), np.asarray(one.norm[:, 0]), rtol=1e-4)
        pred = np.asarray(jnp.argmax(_member(x0, pm), -1))
        Wm, bm = np.asarray(pm["W"]), np.asarray(pm["b"])
        for i in range(B):
            if pred[i] == y[i]:
                opt = affine_min_norm(Wm, bm, x0[i], y[i], 2)[0]
                assert opt * (1 - 1e-5) <= float(res.norm[i, m]) <= 1.05 * opt + 1e-6, (i, m, opt)
                attacked += 1
            else:
                assert float(res.norm[i, m]) == 0.0  # already misclassified: x0 itself
    assert attacked >= B  # member 0 on every sample at least: the optimum check is not vacuous


def test_mask_and_per_member_refs():
    M, B = 3, 4
    params, x0 = _stack(M, B, seed=5)
    pred = np.asarray(jnp.argmax(_pool(params, x0), -1)).T.astype(np.int32)  # [B, M] clean predictions
    mask = np.ones((B, M), np.float32)
    mask[1, 2] = 0.0
    mask[3, 0] = 0.0
    fn = ddn.make_ddn(_pool, max_queries=100)
    r = fn(params, x0, pred, mask=mask, key=jax.random.key(1))
    ok = mask > 0
    # masked members: not attacked, no queries, norm inf, x_adv = x0, trajectory inf
    assert (np.asarray(r.queries)[~ok] == 0).all() and (np.asarray(r.queries)[ok] == 100).all()
    assert np.isinf(np.asarray(r.norm)[~ok]).all() and not np.asarray(r.success)[~ok].any()
    assert np.isinf(np.asarray(r.trajectory)[~ok]).all()
    np.testing.assert_array_equal(np.asarray(r.x_adv)[1, 2], x0[1])
    # each attacked member left its own reference (the audit checked it against that member)
    assert np.asarray(r.success)[ok].all()
    full = fn(params, x0, pred, key=jax.random.key(1))
    np.testing.assert_array_equal(np.asarray(full.norm)[ok], np.asarray(r.norm)[ok])


def test_traced_budget_and_init_eps_do_not_recompile():
    traces = []

    def counting(p, x):
        traces.append(1)
        return _pool(p, x)

    params, x0 = _stack(2, 3, seed=7)
    y = np.asarray(jnp.argmax(_pool(params, x0), -1))[0].astype(np.int32)
    fn = fmn.make_fmn(counting, norm=2, max_queries=100, restarts=1, init_eps=0.3)
    fn(params, x0, y, key=jax.random.key(0))
    n = len(traces)
    small = fn(params, x0, y, key=jax.random.key(0), max_queries=np.array([40, 60, 100]), init_eps=0.1)
    assert len(traces) == n, "a new budget or init_eps recompiled"
    q = np.asarray(small.queries)
    np.testing.assert_array_equal(q, [[40, 40], [60, 60], [100, 100]])
    assert small.trajectory.shape == (3, 2, 10)
    # a cap below T runs the same attack as a factory built for that budget
    ref = fmn.make_fmn(_pool, norm=2, max_queries=40, restarts=1, init_eps=0.1)(
        params, x0[:1], y[:1], key=jax.random.key(0)
    )
    np.testing.assert_allclose(np.asarray(small.norm)[:1], np.asarray(ref.norm), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(small.trajectory)[:1, :, :4], np.asarray(ref.trajectory), rtol=1e-6)
    # after the cap the trajectory keeps its last value
    np.testing.assert_array_equal(
        np.asarray(small.trajectory)[0, :, 4:], np.repeat(np.asarray(small.trajectory)[0, :, 3:4], 6, axis=-1)
    )
    with pytest.raises(ValueError, match="above the factory's maximum"):
        fn(params, x0, y, key=jax.random.key(0), max_queries=101)


def test_jit_entry_inside_user_jit_compiles_once():
    traces = []
    params, x0 = _stack(2, 3, seed=9)
    y = np.asarray(jnp.argmax(_pool(params, x0), -1))[0].astype(np.int32)
    fn = fmn.make_fmn(_pool, norm=2, max_queries=60)

    @jax.jit
    def user_step(params, x, y, key, cap):
        traces.append(1)
        r = fn.jit(params, x, y, key=key, max_queries=cap)
        return jnp.sum(jnp.where(r.success, r.norm, 0.0)), r

    for i, cap in enumerate((60, 40, 20)):
        _, r = user_step(params, x0, y, jax.random.key(i), jnp.int32(cap))
        assert (np.asarray(r.queries) <= cap).all()
    assert len(traces) == 1
    _, r = user_step(params, x0, y, jax.random.key(0), jnp.int32(60))
    pub = fn(params, x0, y, key=jax.random.key(0))
    np.testing.assert_allclose(np.asarray(r.norm), np.asarray(pub.norm), rtol=1e-6)
    with pytest.raises(TypeError, match="required keyword-only argument: 'key'"):
        fn.jit(params, x0, y)
    with pytest.raises(TypeError, match="needs labels="):
        fmn.make_fmn(_pool, norm=2, max_queries=60, targeted=True).jit(params, x0, y, key=jax.random.key(0))


def test_best_of_different_budgets():
    params, x0 = _stack(2, 3, seed=11)
    y = np.asarray(jnp.argmax(_pool(params, x0), -1))[0].astype(np.int32)
    a = fmn.make_fmn(_pool, norm=2, max_queries=100)(params, x0, y, key=jax.random.key(0))
    b = ddn.make_ddn(_pool, max_queries=200)(params, x0, y, key=jax.random.key(0))
    c = mn.best_of([a, b])
    assert c.trajectory.shape == (3, 2, 20) and c.norm.shape == (3, 2)
    ta, tb = np.asarray(a.trajectory), np.asarray(b.trajectory)
    padded = np.concatenate([ta, np.repeat(ta[..., -1:], 10, axis=-1)], axis=-1)
    np.testing.assert_array_equal(np.asarray(c.trajectory), np.minimum(padded, tb))
    np.testing.assert_array_equal(np.asarray(c.norm), np.minimum(np.asarray(a.norm), np.asarray(b.norm)))
    np.testing.assert_array_equal(np.asarray(c.queries), np.asarray(a.queries) + np.asarray(b.queries))
    pick_a = np.asarray(a.norm) <= np.asarray(b.norm)
    np.testing.assert_array_equal(np.asarray(c.x_adv), np.where(pick_a[..., None, None], a.x_adv, b.x_adv))
    with pytest.raises(ValueError, match="same inputs"):
        mn.best_of([a, fmn.make_fmn(_pool, norm=2, max_queries=100)(params, x0[:2], y[:2], key=jax.random.key(0))])


def test_pool_on_zoo_mlp_pool():
    from sarjax.models import zoo
    from sarjax.models.pool import Pool, Stack

    arch = zoo.mlp(widths=(16,))
    stack = Stack.from_keys(arch, jax.random.split(jax.random.key(0), 2))
    pool = Pool((stack,))
    x0 = np.random.default_rng(0).uniform(0, 1, (2, 28, 28, 1)).astype(np.float32)
    y = np.asarray(pool.predict(x0))[0]
    res = ddn.make_ddn(pool.apply, max_queries=60, audit=False)(pool.params, x0, y, key=jax.random.key(0))
    assert res.norm.shape == (2, 2) and res.x_adv.shape == (2, 2, 28, 28, 1)
    assert np.asarray(res.success)[:, 0].all()  # member 0's labels are its own predictions; DDN flips them


def test_strict_target_reaches_the_target():
    W, b, x0, y, params = _affine(5, (8,), 3, C=4)
    # target = the least likely class: strictly targeted success must predict it
    s = x0.reshape(3, -1) @ W + b
    t = np.argmin(s, axis=1).astype(np.int32)
    r = fmn.make_fmn(_apply, norm=2, max_queries=400, targeted=True)(params, x0, t, key=jax.random.key(0), labels=y)
    ok = np.asarray(r.success)[:, 0]
    assert ok.any()
    pred = np.asarray(_apply(params, jnp.asarray(r.x_adv)[:, 0])).argmax(-1)
    np.testing.assert_array_equal(pred[ok], t[ok])


def test_validation_errors():
    W, b, x0, y, params = _affine(0, (8,), 2)
    key = jax.random.key(0)
    fn = fmn.make_fmn(_apply)
    with pytest.raises(ValueError, match="supports norms"):
        ddn.make_ddn(_apply, norm=1)
    with pytest.raises(ValueError, match="box"):
        fn(params, x0 + 2.0, y, key=key)
    with pytest.raises(ValueError, match="target equals"):
        fmn.make_fmn(_apply, targeted=True)(params, x0, y, key=key, labels=y)
    with pytest.raises(ValueError, match="needs labels="):
        fmn.make_fmn(_apply, targeted=True)(params, x0, y, key=key)
    with pytest.raises(ValueError, match="only read by targeted"):
        fn(params, x0, y, key=key, labels=y)
    with pytest.raises(ValueError, match="init_eps"):
        fmn.make_fmn(_apply, restarts=1)(params, x0, y, key=key)
    with pytest.raises(ValueError, match="too small"):
        fmn.make_fmn(_apply, max_queries=5)
    with pytest.raises(ValueError, match="labels"):
        fn(params, x0, y + 7, key=key)
    with pytest.raises(TypeError, match="required keyword-only argument: 'key'"):
        fn(params, x0, y)
    with pytest.raises(ValueError, match="success"):
        fmn.make_fmn(_apply, success="targeted")
    with pytest.raises(ValueError, match="mask must be"):
        fn(params, x0, y, mask=np.ones(3), key=key)
    with pytest.raises(ValueError, match="at least 3 classes"):
        two = (jnp.ones((8, 2)), jnp.zeros(2))
        apgd_min.make_apgd_min(_apply, loss="dlr")(two, x0, np.zeros(2, np.int32), key=key)
    with pytest.raises(ValueError, match="norm must be"):
        fmn.make_fmn(_apply, norm=3)
    with pytest.raises(ValueError, match="loss"):
        apgd_min.spec(loss="hinge")


def test_audit_catches_wrong_results(restart_run):
    fn, params, x0, y, r = restart_run
    assert np.asarray(r.success).all()
    prob = fn.problem(params, x0, y, key=jax.random.key(7))
    mn._audit(fn, params, prob, r)
    under = r._replace(norm=r.norm * 0.5)  # reported norm smaller than realized
    with pytest.raises(ValueError, match="bound audit"):
        mn._audit(fn, params, prob, under)
    d = 1e-3
    clean = r._replace(x_adv=jnp.asarray(x0)[:, None] + d, norm=jnp.full((3, 1), np.sqrt(24) * d, jnp.float32))
    with pytest.raises(ValueError, match="not adversarial"):
        mn._audit(fn, params, prob, clean)


def test_trajectory_bookkeeping_known_answer():
    hist = jnp.asarray([jnp.inf, jnp.inf, 5.0, 6.0, 3.0, 3.0, 2.0], jnp.float32)
    spent = jnp.asarray([3, 5, 7, 9, 11, 23, 25], jnp.int32)
    traj = mn._trajectory(hist, spent, 30)
    np.testing.assert_array_equal(np.asarray(traj), [5.0, 3.0, 2.0])  # after 10, 20, 30 queries


def test_top_k_targets():
    logits = jnp.asarray([[0.0, 5.0, 1.0, 3.0], [9.0, 2.0, 8.0, 7.0]])
    t = mn.top_k_targets(logits, jnp.asarray([1, 0]), k=2)
    np.testing.assert_array_equal(np.asarray(t), [[3, 2], [2, 3]])
    with pytest.raises(ValueError):
        mn.top_k_targets(logits, jnp.asarray([1, 0]), k=4)


@pytest.mark.parametrize("p", [1.0, 2.0, math.inf])
def test_fab_hyperplane_box_projection_is_exact(p):
    from _minnorm_ref import halfspace_min

    from sarjax.attacks.fab import hyperplane_box_step

    rng = np.random.default_rng(int(p) if p != math.inf else 9)
    xs = rng.uniform(0.1, 0.9, (6, 12)).astype(np.float32)
    ws = rng.normal(size=(6, 12)).astype(np.float32)
    bs = (np.sum(ws * xs, 1) + rng.uniform(-1.5, 1.5, 6)).astype(np.float32)
    d = np.asarray(jax.jit(jax.vmap(lambda x, w, b: hyperplane_box_step(x, w, b, p)))(xs, ws, bs), np.float64)
    for i in range(6):
        c = float(ws[i] @ xs[i]) - float(bs[i])
        a = -np.sign(c) * ws[i].astype(np.float64) if c != 0 else ws[i].astype(np.float64)
        opt = halfspace_min(a, abs(c), xs[i], p)
        got = np.abs(d[i]).sum() if p == 1.0 else (np.sqrt(d[i] @ d[i]) if p == 2.0 else np.abs(d[i]).max())
        z = xs[i] + d[i]
        assert (z >= -1e-6).all() and (z <= 1 + 1e-6).all()
        if math.isfinite(opt):
            assert float(ws[i] @ z) == pytest.approx(float(bs[i]), abs=1e-4)
            assert got == pytest.approx(opt, rel=1e-4, abs=1e-6)


def test_pdpgd_linf_prox_is_moreau_of_l1_projection():
    from sarjax.attacks import geometry
    from sarjax.attacks.pdpgd import prox_linf

    rng = np.random.default_rng(0)
    v = jnp.asarray(rng.normal(size=(4, 30)).astype(np.float32))
    lam = 0.7
    small = v[0] / jnp.sum(jnp.abs(v[0])) * 0.5

    @jax.jit
    def both(v, small):
        got = jax.vmap(lambda x: prox_linf(x, lam))(v)
        ref = jax.vmap(lambda x: x - lam * geometry.project(x / lam, jnp.zeros_like(x), 1.0, 1, box=(-1e30, 1e30)))(v)
        return got, ref, prox_linf(small, lam)

    got, ref, zero = both(v, small)
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=1e-5)
    # the prox of lam ||.||_inf is 0 wherever ||x||_1 <= lam
    np.testing.assert_allclose(np.asarray(zero), 0.0, atol=1e-6)
