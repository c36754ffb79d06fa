"""Known-answer tests for norms, projections and steepest directions."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sarjax.attacks import geometry as G
from sarjax.attacks.threat import Threat, canonical_norm

_project = jax.jit(G.project, static_argnums=(3,))
_rand = jax.jit(jax.vmap(G.random_in_ball, in_axes=(0, None, None, None)), static_argnums=(3,))


def _l1_ball_proj(v, r):
    """Duchi et al. 2008 sort-based projection onto the l1 ball (float64 numpy)."""
    if np.abs(v).sum() <= r:
        return v.copy()
    u = np.sort(np.abs(v))[::-1]
    css = np.cumsum(u)
    j = np.arange(1, v.size + 1)
    rho = np.nonzero(u * j > css - r)[0][-1]
    theta = (css[rho] - r) / (rho + 1.0)
    return np.sign(v) * np.maximum(np.abs(v) - theta, 0)


def _l2_ball_proj(v, r):
    n = np.linalg.norm(v)
    return v if n <= r else v * (r / n)


def _dykstra(x, x0, eps, ball_proj, iters=20000):
    """Dykstra's alternating projections onto ball(x0, eps) ∩ [0,1]^d: converges to the
    Euclidean projection onto the intersection (an independent reference)."""
    y = x.astype(np.float64).copy()
    p = np.zeros_like(y)
    q = np.zeros_like(y)
    for it in range(iters):
        y_prev = y
        z = np.clip(y + p, 0, 1)
        p = y + p - z
        y = x0 + ball_proj(z + q - x0, eps)
        q = z + q - y
        if it > 50 and np.abs(y - y_prev).max() < 1e-13 and np.abs(y - z).max() < 1e-10:
            break
    return y


@pytest.mark.parametrize("p,ref", [(1, _l1_ball_proj), (2, _l2_ball_proj)])
def test_l1_l2_projection_matches_dykstra(p, ref):
    rng = np.random.default_rng(p)
    for _trial in range(6):
        d = 7
        x0 = rng.uniform(0, 1, d)
        x0[:2] = [0.0, 1.0]  # centre on the box faces too
        x = x0 + rng.normal(0, 0.8, d)
        eps = rng.uniform(0.05, 1.2)
        want = _dykstra(x, x0, eps, ref)
        got = np.asarray(_project(jnp.asarray(x, jnp.float32), jnp.asarray(x0, jnp.float32), eps, p))
        np.testing.assert_allclose(got, want, atol=2e-5)
        assert np.linalg.norm(got - x0, ord=p) <= eps * (1 + 1e-6) + 1e-6
        assert got.min() >= 0 and got.max() <= 1


@pytest.mark.parametrize("p", [1, 2, "linf"])
def test_projection_is_nearest_against_random_feasible_points(p):
    rng = np.random.default_rng(3)
    pn = canonical_norm(p)
    for _ in range(4):
        x0 = rng.uniform(0, 1, 10).astype(np.float32)
        x = (x0 + rng.normal(0, 0.7, 10)).astype(np.float32)
        eps = 0.4
        got = np.asarray(_project(jnp.asarray(x), jnp.asarray(x0), eps, p), np.float64)
        best = np.linalg.norm(got - x)
        keys = jax.random.split(jax.random.PRNGKey(0), 3000)
        cands = np.asarray(_rand(keys, jnp.asarray(x0), eps, p), np.float64)
        dists = np.linalg.norm(cands - x, axis=1)
        assert best <= dists.min() + 1e-5
        assert np.linalg.norm(got - x0, ord=pn) <= eps + 1e-5


def test_linf_projection_closed_form():
    x0 = jnp.array([0.0, 0.5, 0.98, 0.3])
    x = jnp.array([-0.3, 0.9, 1.5, 0.31])
    got = G.project(x, x0, 0.1, "linf")
    np.testing.assert_allclose(got, [0.0, 0.6, 1.0, 0.31], atol=1e-7)


def test_l0_projection_matches_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(10):
        d, k = 6, int(rng.integers(0, 5))
        x0 = rng.uniform(0, 1, d).astype(np.float32)
        x = (x0 + rng.normal(0, 0.8, d)).astype(np.float32)
        got = np.asarray(_project(jnp.asarray(x), jnp.asarray(x0), k, 0))
        best = np.inf
        for r in range(k + 1):
            for s in itertools.combinations(range(d), r):
                y = x0.astype(np.float64).copy()
                y[list(s)] = np.clip(x[list(s)], 0, 1)
                best = min(best, np.linalg.norm(y - x))
        assert np.linalg.norm(got - x) == pytest.approx(best, abs=1e-5)
        assert (np.abs(got - x0) > 0).sum() <= k


def test_eps_zero_projects_to_x0():
    x0 = jnp.array([0.2, 0.7, 0.0])
    x = jnp.array([0.9, 0.1, 0.4])
    for p in (0, 1, 2, "linf"):
        np.testing.assert_array_equal(G.project(x, x0, 0.0, p), x0)


def test_norms_and_dual_norms():
    v = jnp.array([[3.0, -4.0], [0.0, 0.0]])
    assert float(G.norm(v, 0)) == 2
    assert float(G.norm(v, 1)) == 7
    assert float(G.norm(v, 2)) == 5
    assert float(G.norm(v, "linf")) == 4
    assert float(G.dual_norm(v, 1)) == 4
    assert float(G.dual_norm(v, "linf")) == 7
    assert float(G.dual_norm(v, 2)) == 5


@pytest.mark.parametrize("p", [1, 2, "linf"])
def test_steepest_attains_dual_norm(p):
    # max_{||d||_p <= 1} <g, d> = ||g||_q (Holder): the steepest direction attains it.
    g = jax.random.normal(jax.random.PRNGKey(1), (4, 5))
    d = G.steepest(g, p)
    assert float(G.norm(d, p)) == pytest.approx(1.0, rel=1e-5)
    assert float(jnp.sum(g * d)) == pytest.approx(float(G.dual_norm(g, p)), rel=1e-5)


@pytest.mark.parametrize("p", [0, 1, 2, "linf"])
def test_random_in_ball_is_feasible(p):
    x0 = jax.random.uniform(jax.random.PRNGKey(2), (3, 4))
    eps = 3 if p == 0 else 0.5
    keys = jax.random.split(jax.random.PRNGKey(5), 64)
    xs = _rand(keys, x0, eps, p)
    nrm = jax.vmap(lambda x: G.norm(x - x0, p))(xs)
    assert float(nrm.max()) <= eps * (1 + 1e-6) + 1e-6
    assert float(nrm.max()) > 0
    assert float(xs.min()) >= 0 and float(xs.max()) <= 1


def test_threat_validation():
    assert Threat("l2", 1).norm == 2.0
    assert Threat("Linf", 0.1).norm == math.inf
    with pytest.raises(ValueError, match="norm"):
        Threat(3, 0.1)
    with pytest.raises(ValueError, match="eps"):
        Threat("linf", -0.1)
    with pytest.raises(ValueError, match="box"):
        Threat("linf", 0.1, box=(1.0, 0.0))
    with pytest.raises(TypeError):
        Threat(None, 0.1)


# --- The previous implementations (48-step bisection, double argsort), kept verbatim as the
# --- reference the new projections must reproduce (and for benchmarks/projection_speed.py).

_REF_BISECT_ITERS = 48


def _ref_project_l2(x, x0, eps, box):
    delta = x - x0
    lo_d, hi_d = box[0] - x0, box[1] - x0

    def size(t):
        d = jnp.clip(t * delta, lo_d, hi_d)
        return jnp.sum(d * d)

    eps2 = eps * eps

    def body(_, bracket):
        a, b = bracket
        m = 0.5 * (a + b)
        ok = size(m) <= eps2
        return jnp.where(ok, m, a), jnp.where(ok, b, m)

    inside = size(jnp.ones((), x.dtype)) <= eps2
    a, _ = jax.lax.fori_loop(0, _REF_BISECT_ITERS, body, (jnp.zeros((), x.dtype), jnp.ones((), x.dtype)))
    t = jnp.where(inside, 1.0, a)
    return x0 + jnp.clip(t * delta, lo_d, hi_d)


def _ref_project_l1(x, x0, eps, box):
    delta = x - x0
    cap = jnp.where(delta >= 0, box[1] - x0, x0 - box[0])
    mag = jnp.abs(delta)

    def size(tau):
        return jnp.sum(jnp.clip(mag - tau, 0.0, cap))

    def body(_, bracket):
        a, b = bracket
        m = 0.5 * (a + b)
        ok = size(m) <= eps
        return jnp.where(ok, a, m), jnp.where(ok, m, b)

    hi_tau = jnp.max(mag)
    inside = size(jnp.zeros((), x.dtype)) <= eps
    _, b = jax.lax.fori_loop(0, _REF_BISECT_ITERS, body, (jnp.zeros((), x.dtype), hi_tau))
    tau = jnp.where(inside, 0.0, b)
    return x0 + jnp.sign(delta) * jnp.clip(mag - tau, 0.0, cap)


def _ref_project_l0(x, x0, eps, box):
    xc = jnp.clip(x, box[0], box[1])
    gain = jnp.ravel((x - x0) ** 2 - (x - xc) ** 2)
    k = jnp.floor(eps + 1e-6).astype(jnp.int32)
    rank = jnp.argsort(jnp.argsort(-gain, stable=True), stable=True)
    keep = (rank < k) & (gain > 0)
    return jnp.where(keep.reshape(x.shape), xc, x0)


def _ref_project(x, x0, eps, p, box=(0.0, 1.0)):
    fn = {0: _ref_project_l0, 1: _ref_project_l1, 2: _ref_project_l2}[p]
    return fn(x, x0, jnp.asarray(eps, x.dtype), box)


_batched = jax.jit(jax.vmap(G.project, in_axes=(0, 0, 0, None, None)), static_argnums=(3, 4))
_SORT = {1: G._project_l1_sort, 2: G._project_l2_sort}
_batched_sort = jax.jit(
    jax.vmap(lambda x, x0, e, p, box: _SORT[p](x, x0, e, box), in_axes=(0, 0, 0, None, None)), static_argnums=(3, 4)
)
_batched_ref = jax.jit(jax.vmap(_ref_project, in_axes=(0, 0, 0, None, None)), static_argnums=(3, 4))


def _hard_cases(p, d=40, seed=0):
    """[B, d] float32 inputs with per-sample eps covering the boundary cases.

    Rows: random in/out of the ball at several scales; a point already inside
    (eps above its clipped norm); eps = 0; huge eps; v with many exact zeros;
    x0 on the box faces (0 and 1) pushed outwards and inwards; v = 0.
    """
    rng = np.random.default_rng(seed)
    B = 48
    x0 = rng.uniform(0, 1, (B, d))
    x0[:, : d // 4] = rng.integers(0, 2, (B, d // 4))  # x0 on the faces
    x = x0 + rng.normal(0, 1, (B, d)) * rng.choice([0.01, 0.1, 0.5, 2.0], (B, 1))
    x[::3, d // 4 : d // 2] = x0[::3, d // 4 : d // 2]  # v with exact zeros
    x[5] = x0[5]  # v = 0
    t = np.geomspace(1e-2, 1.5, d)  # breakpoints spread over decades:
    for i in (7, 8):  # many Newton pieces to cross
        x0[i] = 0.5
        x[i] = 0.5 + 0.5 / rng.permutation(t) * rng.choice([-1, 1], d)
    x0, x = x0.astype(np.float32), x.astype(np.float32)
    clipped = np.linalg.norm(np.clip(x, 0, 1).astype(np.float64) - x0, ord=p, axis=1)
    eps = clipped * rng.uniform(0.02, 1.2, B)  # inside and outside
    eps[0], eps[1], eps[2], eps[3] = 0.0, 1e9, np.inf, clipped[3] * 1.0001
    eps[4] = clipped[4]  # exactly on the sphere
    eps[6] = 1e-4  # tiny radius
    return jnp.asarray(x), jnp.asarray(x0), jnp.asarray(eps, jnp.float32)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("solver", ["project", "sort"])
def test_projection_matches_old_bisection(p, solver):
    # geometry.project (piecewise Newton) and the sort-based solver both reproduce the old
    # 48-step bisection to 1e-5 on every boundary case of _hard_cases.
    x, x0, eps = _hard_cases(p, 784, seed=p)
    x, x0 = x.reshape(-1, 28, 28, 1), x0.reshape(-1, 28, 28, 1)  # images: shape and dtype kept
    got = np.asarray((_batched if solver == "project" else _batched_sort)(x, x0, eps, p, (0.0, 1.0)))
    want = np.asarray(_batched_ref(x, x0, eps, p, (0.0, 1.0)))
    assert got.shape == x.shape and got.dtype == np.float32
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(got[0], np.asarray(x0[0]))  # eps = 0 -> x0
    for i in (1, 2, 3):  # eps >= clipped norm
        np.testing.assert_allclose(got[i], np.clip(np.asarray(x[i]), 0, 1), atol=1e-7, rtol=0)
    outside = (
        np.linalg.norm((np.clip(np.asarray(x), 0, 1) - np.asarray(x0)).reshape(len(x), -1), ord=p, axis=1)
        > np.asarray(eps) * 1.01
    )
    assert outside.sum() >= 10  # the cases exercise the active constraint
    np.testing.assert_array_equal(got[5], np.asarray(x0[5]))  # v = 0


@pytest.mark.parametrize("p", [1, 2])
def test_projection_never_leaves_the_ball(p):
    # x0 = 0 inside the box (-1, 1): x0 + d == d exactly, so the float64 norm of the output is the
    # norm the projection produced, with no write-back rounding: it must be <= eps * (1 + 1e-6).
    rng = np.random.default_rng(10 + p)
    d = 300
    v = (rng.normal(0, 1, (64, d)) * rng.choice([1e-3, 0.05, 0.3, 3.0], (64, 1))).astype(np.float32)
    v[::4, :100] = 0.0
    x0 = np.zeros_like(v)
    n = np.linalg.norm(np.clip(v, -1, 1).astype(np.float64), ord=p, axis=1)
    eps = (n * rng.uniform(0.001, 0.999, 64)).astype(np.float32)
    got = np.asarray(_batched(jnp.asarray(v), jnp.asarray(x0), jnp.asarray(eps), p, (-1.0, 1.0)), np.float64)
    real = np.linalg.norm(got, ord=p, axis=1)
    assert (real <= eps.astype(np.float64) * (1 + 1e-6)).all(), (real / eps).max()
    assert (real >= eps * (1 - 1e-5)).all()  # and it is on the sphere (the constraint is active)
    assert np.abs(got).max() <= 1.0


@pytest.mark.parametrize("p", [1, 2])
def test_projection_passes_the_audit(p):
    from sarjax.attacks.audit import audit

    x, x0, eps = _hard_cases(p, 784, seed=3)
    x, x0 = x.reshape(-1, 28, 28, 1), x0.reshape(-1, 28, 28, 1)
    eps = jnp.where(jnp.isfinite(eps), eps, 1e9)
    got = _batched(x, x0, eps, p, (0.0, 1.0))
    rep = audit(x0, got, Threat(p, np.asarray(eps)))
    assert rep.ok, rep.describe()


_batched_l0_sort = jax.jit(
    jax.vmap(lambda x, x0, e, box: G._project_l0_sort(x, x0, e, box), in_axes=(0, 0, 0, None)), static_argnums=3
)


@pytest.mark.parametrize("solver", ["project", "sort"])
@pytest.mark.parametrize("d", [12, 784])
def test_l0_projection_matches_double_argsort_with_ties(solver, d):
    # geometry.project (bisection on the gains' bit patterns) and the one-sort solver keep
    # exactly the coordinates of the double-argsort reference, ties to the lower index
    rng = np.random.default_rng(7 + d)
    B = 40
    x0 = rng.uniform(0, 1, (B, d)).astype(np.float32)  # reshaped to images below
    step = rng.choice([-0.5, 0.0, 0.25, 0.5, 1.5], (B, d)).astype(np.float32)  # many equal gains
    x0[:, :3] = 0.25
    x = x0 + step
    k = rng.integers(0, d + 3, B).astype(np.float32)  # k = 0 ... > d
    k[0], k[1] = 2.9999999, 3.5  # floored with the 1e-6 tolerance
    shape = (B, 3, 4, 1) if d == 12 else (B, 28, 28, 1)
    args = (jnp.asarray(x).reshape(shape), jnp.asarray(x0).reshape(shape), jnp.asarray(k), 0, (0.0, 1.0))
    want = np.asarray(_batched_ref(*args)).reshape(B, d)
    if solver == "project":
        got = np.asarray(_batched(*args)).reshape(B, d)
    else:
        got = np.asarray(_batched_l0_sort(args[0], args[1], args[2], (0.0, 1.0))).reshape(B, d)
    np.testing.assert_array_equal(got, want)
    changed = (got != x0).sum(axis=1)
    assert (changed <= np.floor(k + 1e-6)).all()
    assert changed[0] <= 3 and changed[1] <= 3


@pytest.mark.parametrize("p", ["l1", "l2", "linf"])
def test_projection_write_back_never_leaves_a_tiny_ball(p):
    """float32 ``x0 + d`` rounds up to half an ulp of x0 per element away from x0: an l1 radius of
    1e-6 on 16 elements in [0.5, 1] realized 1.12e-6 (found by test_attacks_fuzz.py).
    ``add_within`` writes back toward x0, so the float64 realized norm stays within eps."""
    rng = np.random.default_rng(0)
    x0 = rng.uniform(0.5, 1.0, (256, 16)).astype(np.float32)
    x = np.clip(x0 + rng.normal(0.0, 1e-3, x0.shape), 0, 1).astype(np.float32)
    q = {"l1": 1, "l2": 2, "linf": np.inf}[p]
    for eps in (1e-6, 3e-7):
        y = np.asarray(jax.vmap(lambda a, b: _project(a, b, eps, p))(jnp.asarray(x), jnp.asarray(x0)))
        realized = np.linalg.norm(y.astype(np.float64) - x0.astype(np.float64), ord=q, axis=1)
        assert realized.max() <= np.float32(eps) * (1 + 1e-6), (p, eps, realized.max())
        assert realized.min() > 0.5 * eps  # still uses the ball (up to float32 quantization of x0 + d)
    d = jnp.asarray(rng.normal(0.0, 1e-7, x0.shape), jnp.float32)
    y = np.asarray(G.add_within(jnp.asarray(x0), d)).astype(np.float64)
    assert np.all(np.abs(y - x0) <= np.abs(np.asarray(d, np.float64)))  # elementwise, exactly
