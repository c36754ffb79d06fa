"""PDPGD's sort-free linf proximal operator equals the sort-based one it replaced (issue 17, item 5)."""

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.attacks import pdpgd
from sarjax.attacks.pdpgd import project_l1_ball_newton
from sarjax.attacks.pdpgd import prox_linf as prox_linf_newton


def _cases():
    rng = np.random.default_rng(0)
    xs, lams = [], []
    for scale in (1e-3, 0.05, 0.3, 1.0):
        for lam in (1e-5, 1e-3, 0.05, 1.0, 50.0):  # small lam: ||x / lam||_1 >> 1; large: inside the ball
            xs.append(rng.normal(0, scale, 196) * (rng.uniform(0, 1, 196) < 0.7))  # zeros (PDPGD's z at x0)
            lams.append(lam)
    ties = np.repeat([0.3, -0.3, 0.1, 0.0], 49)  # repeated magnitudes
    xs += [ties, np.zeros(196), np.full(196, 1e-3)]
    lams += [0.01, 0.01, 1e-3]
    return jnp.asarray(np.stack(xs), jnp.float32), jnp.asarray(lams, jnp.float32)


def test_prox_linf_newton_equals_the_sort_prox():
    x, lam = _cases()
    ref = jax.vmap(pdpgd.prox_linf_sort)(x, lam)
    got = jax.jit(jax.vmap(prox_linf_newton))(x, lam)
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=0, atol=1e-6)
    # a known answer: prox of lam ||.||_inf on (3, 1, -2) with lam = 2 clips at t = 1.5
    np.testing.assert_allclose(prox_linf_newton(jnp.array([3.0, 1.0, -2.0]), 2.0), [1.5, 1.0, -1.5], atol=1e-6)


def test_l1_ball_newton_projection_is_exact_and_few_steps():
    """Against float64 numpy (Duchi's sort formula): the projection has l1 norm 1, and the
    Newton loop ends in a handful of steps on MNIST-sized inputs."""
    rng = np.random.default_rng(1)
    v = rng.normal(0, 1, (16, 784)) * rng.uniform(0.001, 1, (16, 1))
    w, steps = jax.vmap(project_l1_ball_newton)(jnp.asarray(v, jnp.float32))
    u = -np.sort(-np.abs(v), axis=1)
    css = np.cumsum(u, axis=1)
    k = np.arange(1, 785)
    for i in range(16):
        if np.abs(v[i]).sum() <= 1:
            np.testing.assert_allclose(np.asarray(w[i]), v[i], atol=1e-6)
            continue
        rho = np.max(np.flatnonzero(u[i] - (css[i] - 1) / k > 0)) + 1
        theta = (css[i, rho - 1] - 1) / rho
        np.testing.assert_allclose(np.asarray(w[i]), np.sign(v[i]) * np.maximum(np.abs(v[i]) - theta, 0), atol=1e-6)
    assert int(jnp.max(steps)) <= 12
