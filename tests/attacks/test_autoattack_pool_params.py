"""``make_autoattack(pool, ...)(pool.params, x, y, key=k)``: the call its own error message recommends.

``Pool.params`` built a new tuple on every access and the entry compared params by identity, so
passing ``pool.params`` always raised "pass the pool's own params (pool.params) or None". Known
answer: the call with ``pool.params`` equals the call with ``params=None`` array for array;
params that are not the pool's own (other arrays, even of equal values; another structure) still
raise.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sarjax.attacks import make_autoattack
from sarjax.attacks.autoattack import AutoAttackSettings
from sarjax.models.pool import Pool, Stack
from sarjax.models.zoo import mlp

KW = dict(attacks=["apgd-ce"], n_iter=3, settings=AutoAttackSettings(log=False, checks=False))


@pytest.fixture(scope="module")
def problem():
    arch = mlp((8,), input_shape=(4, 4, 1), num_classes=4)
    shapes = jax.eval_shape(jax.vmap(arch.init), jax.random.split(jax.random.key(0), 2))
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: (rng.standard_normal(s.shape) / 2).astype(np.float32), shapes)
    pool = Pool([Stack(arch, params, ("a", "b"))])
    x = rng.uniform(size=(4, 4, 4, 1)).astype(np.float32)
    y = np.asarray(pool.logits(x))[0].argmax(-1).astype(np.int32)
    return pool, jnp.asarray(x), jnp.asarray(y)


def test_pool_params_is_the_same_object_while_the_stacks_are(problem):
    pool, _, _ = problem
    assert pool.params is pool.params
    assert all(a is s.params for a, s in zip(pool.params, pool.stacks))


def test_the_pools_own_params_run_and_equal_params_none(problem):
    pool, x, y = problem
    fn = make_autoattack(pool, norm="linf", eps=0.1, **KW)
    key = jax.random.key(3)
    got = fn(pool.params, x, y, key=key)
    ref = fn(None, x, y, key=key)
    for f in ("x_adv", "robust", "success", "queries"):
        np.testing.assert_array_equal(np.asarray(getattr(got, f)), np.asarray(getattr(ref, f)), err_msg=f)
    assert got.x_adv.shape == (4, 2, 4, 4, 1)
    # a tuple rebuilt from the stacks' own params (the same leaves) is the pool's own params too
    again = fn(tuple(s.params for s in pool.stacks), x, y, key=key)
    np.testing.assert_array_equal(np.asarray(again.x_adv), np.asarray(ref.x_adv))


def test_other_params_are_refused(problem):
    pool, x, y = problem
    fn = make_autoattack(pool, norm="linf", eps=0.1, **KW)
    key = jax.random.key(3)
    copied = jax.tree.map(lambda a: np.array(a, copy=True), pool.params)  # equal values, other arrays
    zeros = jax.tree.map(np.zeros_like, pool.params)
    for bad in (copied, zeros, pool.params[0], {"w": 1}):
        with pytest.raises(
            ValueError, match=r"autoattack on a Pool: pass the pool's own params \(pool.params\) or None"
        ):
            fn(bad, x, y, key=key)
