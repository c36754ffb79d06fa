"""Trajectory, query cap, determinism, NaN safety, pool vmap, validation and audit."""
import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _minnorm_ref import affine_min_norm, make_affine  # noqa: E402

from sarjax.attacks import alma, apgd_min, ddn, fab, fmn, pdgd, pdpgd, sigma_zero  # noqa: E402
from sarjax.attacks import minnorm as mn  # noqa: E402

# one case per attack, on the norm whose numerics divide by a gradient norm or threshold it
ALL = [(fmn.spec(), 2), (ddn.spec(), 2), (apgd_min.spec(loss="dlr"), 1), (alma.spec(), 2),
       (pdgd.spec(), 2), (pdpgd.spec(), 0), (sigma_zero.spec(), 0), (fab.spec(targeted=True), 1)]


def _affine(seed, shape, B, temperature=10.0, C=5):
    W, b, x0, y = make_affine(seed, shape, C=C, B=B)
    Wj, bj = jnp.asarray(W) * temperature, jnp.asarray(b) * temperature
    return W, b, x0, y, (lambda x: x.reshape(-1) @ Wj + bj)


@pytest.fixture(scope="module")
def restart_run():
    W, b, x0, y, f = _affine(1, (4, 6), 3)
    kw = dict(norm=2, max_queries=300, restarts=2, init_eps=0.5)
    return f, x0, y, kw, fmn.fmn(f, x0, y, jax.random.key(7), **kw)


def test_trajectory_cap_restarts_and_determinism(restart_run):
    f, x0, y, kw, r1 = restart_run
    r2 = fmn.fmn(f, x0, y, jax.random.key(7), **kw)
    for a, c in zip(r1, r2):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(c))
    traj = np.asarray(r1.trajectory)
    assert traj.shape == (3, 30)
    fin = np.where(np.isinf(traj), 1e30, traj)
    assert (np.diff(fin, axis=1) <= 0).all(), "trajectory must be non-increasing"
    assert (np.asarray(r1.queries) == 300).all()  # 3 runs x 50 steps x 2 queries
    # after the last query the trajectory holds the returned (best over restarts) norm
    np.testing.assert_allclose(traj[:, -1], np.asarray(r1.norm), rtol=1e-6)
    # every sample succeeds and the result is audited (run raises otherwise)
    assert np.asarray(r1.success).all()


@pytest.mark.parametrize("k", range(len(ALL)), ids=[f"{s.name}-l{p}" for s, p in ALL])
def test_zero_gradient_no_nan_and_odd_cap(k):
    spec, p = ALL[k]
    bias = jnp.asarray([3.0, 1.0, 0.0, -1.0], jnp.float32)
    f = lambda x: bias + 0.0 * jnp.sum(x)  # constant logits: zero gradient, never adversarial
    x0 = np.random.default_rng(0).uniform(0, 1, (2, 3)).astype(np.float32)
    y = np.zeros(2, np.int32)
    T = 47  # odd: a 2-query step cannot land exactly on the cap, which stays hard
    r = mn.run(spec, f, x0, y, jax.random.key(0), norm=p, max_queries=T)
    q = np.asarray(r.queries)
    assert (q <= T).all() and (q >= T - 2).all()
    assert r.trajectory.shape == (2, T // 10)
    assert not np.asarray(r.success).any()
    assert np.isinf(np.asarray(r.norm)).all() and np.isinf(np.asarray(r.trajectory)).all()
    np.testing.assert_array_equal(np.asarray(r.x_adv), x0)
    assert np.isfinite(np.asarray(r.x_adv)).all()


def test_stack_vmap_matches_single_member():
    M, B, shape, C = 3, 4, (4, 6), 5
    rng = np.random.default_rng(3)
    params = {"W": jnp.asarray(rng.normal(size=(M, 24, C)) * 2.0, jnp.float32),
              "b": jnp.asarray(rng.normal(size=(M, C)) * 0.1, jnp.float32)}
    apply = lambda p, x: x.reshape(x.shape[0], -1) @ p["W"] + p["b"]
    x0 = rng.uniform(0.2, 0.8, (B,) + shape).astype(np.float32)
    y = np.asarray(jnp.argmax(apply({"W": params["W"][0], "b": params["b"][0]}, x0), -1), np.int32)
    res = mn.run_stack(fmn.spec(), apply, params, x0, y, jax.random.key(0), norm=2, max_queries=200)
    assert res.x_adv.shape == (M, B) + shape and res.norm.shape == (M, B)
    assert res.trajectory.shape == (M, B, 20) and res.queries.shape == (M, B)
    m = 1
    pm = {"W": params["W"][m], "b": params["b"][m]}
    one = mn.run(fmn.spec(), lambda x: apply(pm, x[None])[0], x0, y, jax.random.key(0), norm=2, max_queries=200)
    np.testing.assert_allclose(np.asarray(res.norm[m]), np.asarray(one.norm), rtol=1e-4)
    # each member's norm is within 1.05x of that member's exact optimum where y is its prediction
    pred = np.asarray(jnp.argmax(apply(pm, x0), -1))
    Wm, bm = np.asarray(pm["W"]), np.asarray(pm["b"])
    for i in range(B):
        if pred[i] == y[i]:
            opt = affine_min_norm(Wm, bm, x0[i], y[i], 2)[0]
            assert np.asarray(res.norm[m, i]) <= 1.05 * opt + 1e-6
        else:
            assert np.asarray(res.norm[m, i]) == 0.0  # already misclassified: x0 itself


def test_run_pool_on_zoo_mlp_pool():
    from sarjax.models import zoo
    from sarjax.models.pool import Pool, Stack
    arch = zoo.mlp(widths=(16,))
    stack = Stack.from_keys(arch, jax.random.split(jax.random.key(0), 2))
    pool = Pool((stack,))
    x0 = np.random.default_rng(0).uniform(0, 1, (2, 28, 28, 1)).astype(np.float32)
    y = np.asarray(pool.predict(x0))[0]
    res = mn.run_pool(ddn.spec(), pool, x0, y, jax.random.key(0), norm=2, max_queries=60, check=False)
    assert res.norm.shape == (2, 2) and res.x_adv.shape == (2, 2, 28, 28, 1)
    assert np.asarray(res.success)[0].all()  # member 0 labels are its own predictions; DDN flips them


def test_strict_target_reaches_the_target():
    W, b, x0, y, f = _affine(5, (8,), 3, C=4)
    # target = the least likely class: strictly targeted success must predict it
    s = x0.reshape(3, -1) @ W + b
    t = np.argmin(s, axis=1).astype(np.int32)
    r = fmn.fmn(f, x0, y, jax.random.key(0), norm=2, max_queries=400, targets=t, strict_target=True)
    ok = np.asarray(r.success)
    assert ok.any()
    pred = np.asarray(jax.vmap(f)(r.x_adv)).argmax(-1)
    np.testing.assert_array_equal(pred[ok], t[ok])


def test_validation_errors():
    W, b, x0, y, f = _affine(0, (8,), 2)
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="supports norms"):
        ddn.ddn(f, x0, y, key, norm=1)
    with pytest.raises(ValueError, match="box"):
        fmn.fmn(f, x0 + 2.0, y, key)
    with pytest.raises(ValueError, match="target equals"):
        fmn.fmn(f, x0, y, key, targets=y)
    with pytest.raises(ValueError, match="init_eps"):
        fmn.fmn(f, x0, y, key, restarts=1)
    with pytest.raises(ValueError, match="too small"):
        fmn.fmn(f, x0, y, key, max_queries=5)
    with pytest.raises(ValueError, match="labels"):
        fmn.fmn(f, x0, y + 7, key)
    with pytest.raises(ValueError, match="at least 3 classes"):
        f2 = lambda x: jnp.stack([jnp.sum(x), -jnp.sum(x)])
        apgd_min.apgd_min(f2, x0, np.zeros(2, np.int32), key, loss="dlr")
    with pytest.raises(ValueError, match="norm must be"):
        fmn.fmn(f, x0, y, key, norm=3)
    with pytest.raises(ValueError, match="loss"):
        apgd_min.spec(loss="hinge")


def test_audit_catches_wrong_results(restart_run):
    f, x0, y, kw, r = restart_run
    assert np.asarray(r.success).all()
    mn._audit(r, jnp.asarray(x0), 2.0, "genuine", jax.vmap(f), jnp.asarray(y), jnp.full((3,), -1), False)
    under = r._replace(norm=r.norm * 0.5)  # reported norm smaller than realized
    with pytest.raises(ValueError, match="bound audit"):
        mn._audit(under, jnp.asarray(x0), 2.0, "doctored")
    d = 1e-3
    clean = r._replace(x_adv=jnp.asarray(x0) + d, norm=jnp.full((3,), np.sqrt(24) * d, jnp.float32))
    with pytest.raises(ValueError, match="not adversarial"):
        mn._audit(clean, jnp.asarray(x0), 2.0, "doctored", jax.vmap(f), jnp.asarray(y), jnp.full((3,), -1), False)


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
        ref = jax.vmap(lambda x: x - lam * geometry.project(x / lam, jnp.zeros_like(x), 1.0, 1,
                                                            box=(-1e30, 1e30)))(v)
        return got, ref, prox_linf(small, lam)

    got, ref, zero = both(v, small)
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=1e-5)
    # the prox of lam ||.||_inf is 0 wherever ||x||_1 <= lam
    np.testing.assert_allclose(np.asarray(zero), 0.0, atol=1e-6)
