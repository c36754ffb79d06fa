"""Affine test problems whose minimal adversarial perturbation is analytic (shared helpers)."""

import jax.numpy as jnp
import numpy as np

from sarjax.attacks.threat import canonical_norm

D = 8  # input elements
C = 4  # classes 0/1 decide; 2 and 3 are dummies far below


def affine_apply(params, x):
    """Single affine model: logits [B, C]."""
    return x.reshape(x.shape[0], -1) @ params["W"] + params["b"]


def pool_apply(params, x):
    """Stacked affine members: W [M, D, C], b [M, C] -> logits [M, B, C]."""
    return jnp.einsum("bd,mdc->mbc", x.reshape(x.shape[0], -1), params["W"]) + params["b"][:, None]


def binary_problem(norm, batch, seed=0, d=D):
    """Class 0 vs 1 separated by the hyperplane w.x + c = 0; x0 on the class-0 side at
    lp distance opt[i] = f(x0_i) / ||w||_q with opt in [0.05, 0.2] and the optimum interior.

    ``d`` input elements (default D).

    Returns params, x0 [B, d] float32, opt [B] (float64).
    """
    p = canonical_norm(norm)
    q = {1.0: np.inf, 2.0: 2.0, np.inf: 1.0}[p]
    rng = np.random.default_rng(seed)
    w = rng.uniform(0.5, 1.5, d) * rng.choice([-1.0, 1.0], d)
    w[0] = 1.6 * np.sign(w[0])  # unique largest |w| for a unique l1 optimum
    c = -w.sum() * 0.5
    u = rng.uniform(0.4, 0.6, (batch, d))
    z = u - ((u @ w + c) / (w @ w))[:, None] * w
    r = rng.uniform(0.05, 0.2, batch)
    t = r * np.linalg.norm(w, ord=q)
    x0 = (z + (t / (w @ w))[:, None] * w).astype(np.float32)
    W = np.zeros((d, C))
    W[:, 0], W[:, 1] = w / 2, -w / 2
    b = np.array([c / 2, -c / 2, -100.0, -101.0])
    f = x0.astype(np.float64) @ w + c
    opt = f / np.linalg.norm(w, ord=q)
    # the analytic optimum lies inside the box, so the box does not change it
    if p == np.inf:
        x_opt = x0 - opt[:, None] * np.sign(w)
    elif p == 2.0:
        x_opt = x0 - opt[:, None] * w / np.linalg.norm(w)
    else:
        x_opt = x0.astype(np.float64).copy()
        x_opt[:, 0] -= opt * np.sign(w[0])
    assert x0.min() > 0.01 and x0.max() < 0.99 and x_opt.min() > 0.01 and x_opt.max() < 0.99
    params = {"W": jnp.asarray(W, jnp.float32), "b": jnp.asarray(b, jnp.float32)}
    return params, jnp.asarray(x0), opt
