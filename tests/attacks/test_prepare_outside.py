"""A pool's weight layouts prepared once, outside the attack kernel (``core.protocol.prepare_outside``).

The audited entry of an attack prepares a pool's x-independent layouts on the host, and an MLP
stack keeps the layout of its own params (``Stack.prepare``), so repeated calls on one pool do not
redo the first-layer transpose.  Known answers: the prepared layout equals the transpose written
out by hand; the audited entry returns exactly what the kernel with the in-kernel prepare returns;
a second call compiles nothing and reuses the kept layout.
"""

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.attacks.core import protocol as P
from sarjax.attacks.joint import JointPGDStep, make_joint_pgd
from sarjax.models import zoo
from sarjax.models.pool import Pool, Stack

M, B = 3, 4


def _pool(widths=(16, 8)):
    arch = zoo.mlp(widths)
    return Pool([Stack.from_keys(arch, jax.random.split(jax.random.key(0), M))])


def _x(b=B):
    return jax.random.uniform(jax.random.key(7), (b, 28, 28, 1))


def test_stack_keeps_the_layout_of_its_own_params_and_it_is_the_transpose():
    pool = _pool()
    (stack,) = pool.stacks
    w = np.asarray(stack.params["dense0"]["w"])  # [K, D, H]
    want = np.concatenate([w[k] for k in range(M)], axis=1)  # [D, K*H]: member k in columns k*H:(k+1)*H
    a = stack.prepare(stack.params)["_dense0_cat"]
    b = stack.prepare(stack.params)["_dense0_cat"]
    assert a is b  # computed once, kept by the stack
    np.testing.assert_array_equal(np.asarray(a), want)
    # other params (same values, other arrays) are laid out afresh and not kept
    other = jax.tree.map(lambda l: l + 0.0, stack.params)
    c = stack.prepare(other)["_dense0_cat"]
    assert c is not a
    np.testing.assert_array_equal(np.asarray(c), want)
    assert stack.prepare(stack.params)["_dense0_cat"] is a
    # a stack with new params has its own layout (never the old stack's)
    s2 = stack.with_params(jax.tree.map(lambda l: 2.0 * l, stack.params))
    np.testing.assert_array_equal(np.asarray(s2.prepare(s2.params)["_dense0_cat"]), 2.0 * want)


def test_traced_params_are_laid_out_inside_the_trace():
    pool = _pool()
    (stack,) = pool.stacks
    out = jax.jit(lambda p: stack.prepare(p)["_dense0_cat"])(stack.params)
    assert "_layout_cache" not in vars(stack)  # a traced layout is never kept
    np.testing.assert_array_equal(np.asarray(out), np.asarray(stack.prepare(stack.params)["_dense0_cat"]))
    assert vars(stack)["_layout_cache"][0] is stack.params["dense0"]["w"]


def test_audited_entry_equals_the_in_kernel_prepare_and_compiles_once():
    pool = _pool()
    x0 = _x()
    ref = jnp.argmax(pool.logits(x0), -1).T.astype(jnp.int32)
    mask = jnp.ones((B, M), jnp.float32).at[0, 1].set(0.0)
    atk = make_joint_pgd(pool.apply, eps=0.1, steps=4, step=JointPGDStep(restarts=2))
    key = jax.random.key(3)
    prob = atk.problem(pool.params, x0, ref, key=key, mask=mask)
    by_hand = P.run_jit(atk.attack, pool.params, prob)  # the pool prepared inside the kernel
    before = P.run_jit._cache_size()
    got = atk(pool.params, x0, ref, key=key, mask=mask)
    compiled = P.run_jit._cache_size() - before
    again = atk(pool.params, x0, ref, key=jax.random.key(4), mask=mask)
    assert P.run_jit._cache_size() - before == compiled <= 1  # a second call compiles nothing
    for f in ("x_adv", "best_x", "objective", "member_loss"):
        np.testing.assert_allclose(np.asarray(getattr(got, f)), np.asarray(getattr(by_hand, f)), atol=1e-6, rtol=1e-6)
    for f in ("success", "best_success", "queries"):
        np.testing.assert_array_equal(np.asarray(getattr(got, f)), np.asarray(getattr(by_hand, f)))
    assert not np.array_equal(np.asarray(again.x_adv), np.asarray(got.x_adv))  # the key matters
    # the kernel the entry ran takes the prepared layout and has no prepare hook left
    attack, prepared = P.prepare_outside(atk.attack, pool.params)
    assert attack.prepare is None and attack.cfg.apply == pool.apply_prepared
    assert prepared[0]["_dense0_cat"] is pool.stacks[0].prepare(pool.params[0])["_dense0_cat"]


def test_prepare_outside_leaves_unpreparable_or_unstable_applies_alone():
    pool = _pool()
    plain = make_joint_pgd(lambda p, x: pool.apply(p, x), eps=0.1, steps=2, step=JointPGDStep(restarts=1))
    pp = pool.params
    attack, params = P.prepare_outside(plain.attack, pp)
    assert attack is plain.attack and params is pp

    class Fresh:  # prepare_apply returning a new closure on every call (as a sharded pool's does)
        def __init__(self, pool):
            self.pool = pool

        def apply(self, params, x):
            return self.pool.apply(params, x)

        def prepare_apply(self, params):
            fn, prep = self.pool.prepare_apply(params)
            return (lambda q, x: fn(q, x)), prep

    fresh = make_joint_pgd(Fresh(pool).apply, eps=0.1, steps=2, step=JointPGDStep(restarts=1))
    pp = pool.params
    attack, params = P.prepare_outside(fresh.attack, pp)
    assert attack is fresh.attack and params is pp  # prepared inside the kernel instead

    # traced params (an attack inside a user's jit): nothing is prepared outside
    atk = make_joint_pgd(pool.apply, eps=0.1, steps=2, step=JointPGDStep(restarts=1))

    def probe(p):
        a, q = P.prepare_outside(atk.attack, p)
        assert a is atk.attack and q is p
        return 0.0

    jax.jit(probe)(pool.params)
