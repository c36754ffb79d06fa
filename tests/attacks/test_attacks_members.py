"""Single-model mode vmapped over members: the per-member success matrix is analytic on
affine members (member k is fooled iff its own hyperplane distance is below eps)."""

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.attacks.fgsm import make_fgsm
from sarjax.attacks.members import make_member_attack

from _attacks_affine import affine_apply


def test_member_mode_matches_analytic_distances():
    rng = np.random.default_rng(0)
    K, B, D = 4, 6, 8
    W = np.zeros((K, D, 4))
    b = np.zeros((K, 4))
    x0 = rng.uniform(0.4, 0.6, (B, D)).astype(np.float32)
    dist = np.zeros((K, B))
    for k in range(K):
        w = rng.uniform(0.5, 1.5, D) * rng.choice([-1.0, 1.0], D)
        c = rng.uniform(0.2, 1.0) - (x0 @ w).min()
        W[k, :, 0], W[k, :, 1] = w / 2, -w / 2
        b[k] = [c / 2, -c / 2, -100.0, -101.0]
        dist[k] = (x0 @ w + c) / np.abs(w).sum()  # linf distance to member k's hyperplane
    eps = np.median(dist, axis=0)
    eps = np.where(np.min(np.abs(dist / eps - 1), axis=0) < 0.02, eps * 1.05, eps)  # keep 2% clear
    params = {"W": jnp.asarray(W, jnp.float32), "b": jnp.asarray(b, jnp.float32)}
    attack = make_member_attack(affine_apply, make_fgsm, norm="linf")
    res = attack(params, jnp.asarray(x0), jnp.zeros((B,), jnp.int32), jax.random.PRNGKey(0), eps=eps)
    assert res.success.shape == (K, B) and res.x_adv.shape == (K, B, D)
    np.testing.assert_array_equal(np.asarray(res.success), dist < eps[None])
    assert 0 < np.asarray(res.success).mean() < 1  # the test separates members
