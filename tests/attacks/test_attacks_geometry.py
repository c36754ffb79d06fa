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
    for trial in range(6):
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
