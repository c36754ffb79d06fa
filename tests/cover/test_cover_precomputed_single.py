"""The fallback oracle that looks up per-member attacks (sarjax.sar.vision.precomputed_single)."""

import jax
import numpy as np

from sarjax.attacks.joint import JointPGDStep, make_joint_pgd
from sarjax.attacks.members import attack_members
from sarjax.attacks.pgd import PGDStep, make_pgd
from sarjax.models.pool import Pool, Stack
from sarjax.models.zoo import mlp
from sarjax.sar.vision import precomputed_single, run_sar

ARCH = mlp((8,), input_shape=(4, 4, 1), num_classes=3)


def _pool(m):
    shapes = jax.eval_shape(ARCH.init, jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    params = jax.tree.map(
        lambda s: (rng.standard_normal((m,) + s.shape) / np.sqrt(s.shape[0])).astype(np.float32), shapes
    )
    return Pool([Stack(ARCH, params, tuple(f"m{i}" for i in range(m)))])


def test_lookup_returns_member_attack_and_its_pool_coverage():
    pool = _pool(3)
    rng = np.random.default_rng(1)
    x_adv = rng.random((3, 4, 4, 4, 1), dtype=np.float32)  # [M, B, *S]
    queries = np.arange(12).reshape(3, 4)
    ref = pool.predict(rng.random((4, 4, 4, 1), dtype=np.float32)).T  # [B, M]
    single = precomputed_single(pool, x_adv, queries, ref)
    target = np.array([2, 0, 1, 2])
    active = np.array([True, True, False, True])
    c = single(target, active, 7)
    for b in range(4):
        np.testing.assert_array_equal(c.x_adv[b], x_adv[target[b], b])
        want = pool.predict(x_adv[target[b], b][None])[:, 0] != ref[b]
        np.testing.assert_array_equal(c.covered[b], want & active[b])
        assert c.queries[b] == (queries[target[b], b] + 3 if active[b] else 0)


def test_run_sar_with_member_attacks_marks_individually_robust_members_unbreakable():
    pool = _pool(3)
    x = np.random.default_rng(2).random((4, 4, 4, 1), dtype=np.float32)
    clean = pool.predict(x)
    eps = 0.15
    single = attack_members(
        pool, make_pgd, x, clean.T, key=jax.random.PRNGKey(0), eps=eps, steps=5, step=PGDStep(restarts=1)
    )
    att = make_joint_pgd(pool.apply, eps=eps, steps=5, step=JointPGDStep(restarts=1))
    res = run_sar(
        pool,
        x,
        eps,
        [0.0],
        attack=att,
        key=jax.random.PRNGKey(0),
        member_attacks=(np.swapaxes(np.asarray(single.x_adv), 0, 1), np.asarray(single.queries).T),  # [M, B]
    )
    succ = np.asarray(single.success).T  # [M, B]
    assert res.recorded.any() and res.unbreakable.any()  # the instance exercises both paths
    # a member is marked unbreakable only if its own single-model attack failed
    for b in range(4):
        for j in np.flatnonzero(res.unbreakable[b]):
            assert not succ[j, b]
    # every recorded input stays inside the eps-ball of the clean image
    rec = res.inputs[res.recorded]
    xs = np.broadcast_to(x[None], res.inputs.shape)[res.recorded]
    assert np.abs(rec - xs).max() <= eps * (1 + 1e-6)
