"""run_sar on a ShardedPool (pool x data mesh) gives the one-device result, array for array.

Runs on 8 fake CPU devices in a fresh process (tests/conftest.py). Known answer: the same
run_sar on the same pool on one device. Two stacks (3 + 2 members) on a 2 x 4 mesh: the first
stack is padded to 4 members, the batch of 6 (chunks of 4) to multiples of 4, so padding of both
members and samples is exercised. The per-member attacks on a sharded pool
(``ShardedPool.attack_members``, what ``sarjax sar --devices`` runs) are checked end to end by
tests/cover/test_sar_multiprocess.py.
"""

import jax
import numpy as np
import pytest

from sarjax.models.pool import Pool, Stack
from sarjax.models.zoo import mlp
from sarjax.sar.vision import run_sar


def test_run_sar_on_a_sharded_pool_equals_one_device_on_8_fake_devices(run_on_fake_devices):
    run_on_fake_devices("""
        import dataclasses
        from sarjax.sar import SARSettings, default_sar_attack
        from sarjax.sar.vision import run_sar
        from sarjax.models.sharding import ShardedPool, make_mesh
        pool = Pool([stack(zoo.mlp((8,)), 0, 3), stack(zoo.mlp((6,)), 1, 2)])
        x = np.random.default_rng(0).random((6, 28, 28, 1)).astype(np.float32)
        key = jax.random.key(5)
        kw = dict(steps=3, restarts=2)
        settings = SARSettings(chunk_size=4)
        sp = ShardedPool(pool, make_mesh(2, 4))
        assert sp.pool.num_members == 6 and sp.members.tolist() == [0, 1, 2, 4, 5]
        ref = run_sar(pool, x, 0.1, [0.0, 0.5], key=key, attack=default_sar_attack(pool, **kw), settings=settings)
        got = run_sar(sp, x, 0.1, [0.0, 0.5], key=key, attack=default_sar_attack(sp, **kw), settings=settings)
        assert ref.num_rounds >= 2 and ref.covered.any() and not ref.covered.all(), ref.covered
        assert ref.fallback.any(), "the instance must exercise the fallback"
        assert got.num_rounds == ref.num_rounds
        for f in dataclasses.fields(ref):
            a, b = getattr(ref, f.name), getattr(got, f.name)
            if isinstance(a, np.ndarray):
                np.testing.assert_array_equal(b, a, err_msg=f.name)
        print("OK")
    """)


def test_run_sar_requires_a_key():
    arch = mlp((4,), input_shape=(4, 4, 1), num_classes=3)
    shapes = jax.eval_shape(arch.init, jax.random.key(0))
    params = jax.tree.map(lambda s: np.ones((2,) + s.shape, np.float32), shapes)
    pool = Pool([Stack(arch, params, ("a", "b"))])
    with pytest.raises(TypeError, match="required keyword-only argument: 'key'"):
        run_sar(pool, np.zeros((1, 4, 4, 1), np.float32), 0.1, [0.0])  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="key is required"):
        run_sar(pool, np.zeros((1, 4, 4, 1), np.float32), 0.1, [0.0], key=None)  # type: ignore[arg-type]
