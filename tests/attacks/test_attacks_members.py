"""Single-model mode vmapped over members: the per-member success matrix is analytic on
affine members (member k is fooled iff its own hyperplane distance is below eps)."""

import jax
import jax.numpy as jnp
import numpy as np
from _attacks_affine import affine_apply

from sarjax.attacks.fgsm import make_fgsm
from sarjax.attacks.members import make_member_attack


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
    attack = make_member_attack(make_fgsm(affine_apply, norm="linf"))
    res = attack(params, jnp.asarray(x0), jnp.zeros((B,), jnp.int32), key=jax.random.PRNGKey(0), eps=eps)
    assert res.success.shape == (B, K) and res.x_adv.shape == (B, K, D) and res.queries.shape == (B, K)
    np.testing.assert_array_equal(np.asarray(res.success), (dist < eps[None]).T)
    np.testing.assert_array_equal(np.asarray(res.queries), 4)  # per member: clean, one step (fwd + bwd), final
    # the jit-safe entry gives the same result
    again = jax.jit(lambda p, x: attack.jit(p, x, jnp.zeros((B,), jnp.int32), key=jax.random.PRNGKey(0), eps=eps))(
        params, jnp.asarray(x0)
    )
    np.testing.assert_array_equal(np.asarray(again.x_adv), np.asarray(res.x_adv))
    # a member outside the mask is not attacked: x0 back, no success, no query
    masked = attack(params, jnp.asarray(x0), jnp.zeros((B,), jnp.int32), key=jax.random.PRNGKey(0), eps=eps,
                    mask=np.array([True, False, True, True]))  # fmt: skip
    np.testing.assert_array_equal(np.asarray(masked.x_adv[:, 1]), x0)
    assert not np.asarray(masked.success[:, 1]).any()
    np.testing.assert_array_equal(np.asarray(masked.success[:, [0, 2, 3]]), np.asarray(res.success[:, [0, 2, 3]]))
    assert 0 < np.asarray(res.success).mean() < 1  # the test separates members


_TRACES = []


def _counting_affine_apply(params, x):
    _TRACES.append(1)  # runs only while JAX traces (a Python side effect)
    return affine_apply(params, x)


def test_attack_members_reuses_its_compiled_kernel_across_eps():
    from types import SimpleNamespace

    from sarjax.attacks.members import attack_members
    from sarjax.attacks.pgd import make_pgd

    rng = np.random.default_rng(1)
    K, B, D = 3, 4, 8
    params = {"W": jnp.asarray(rng.normal(size=(K, D, 4)), jnp.float32), "b": jnp.zeros((K, 4), jnp.float32)}
    stack = SimpleNamespace(member_apply=_counting_affine_apply, params=params, size=K)  # the Stack protocol
    pool = SimpleNamespace(stacks=[stack])
    x0 = jnp.asarray(rng.uniform(0.3, 0.7, (B, D)), jnp.float32)
    lab = jnp.zeros((B,), jnp.int32)
    _TRACES.clear()
    r1 = attack_members(pool, make_pgd, x0, lab, key=jax.random.PRNGKey(0), eps=0.05, steps=3)
    n_first = len(_TRACES)
    assert n_first > 0
    r2 = attack_members(pool, make_pgd, x0, lab, key=jax.random.PRNGKey(0), eps=0.1, steps=3)
    assert len(_TRACES) == n_first, "a second eps re-traced the member attack"
    d1 = np.abs(np.asarray(r1.x_adv) - np.asarray(x0)[:, None]).max()  # x_adv [B, K, D]
    d2 = np.abs(np.asarray(r2.x_adv) - np.asarray(x0)[:, None]).max()
    assert d1 <= 0.05 * (1 + 1e-6) and 0.05 < d2 <= 0.1 * (1 + 1e-6)  # the new eps took effect
    attack_members(pool, make_pgd, x0, lab, key=jax.random.PRNGKey(0), eps=0.1, steps=4)
    assert len(_TRACES) > n_first  # other hyperparameters build another kernel
