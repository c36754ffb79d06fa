"""One entry class: a minimum-norm attack is an ``Entry`` like the fixed-budget ``AttackFn``
(``problem()``, ``__call__`` = validate -> run_jit -> audit, ``.jit``, ``.attack``)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sarjax.attacks import core, fab, fmn, make_pgd
from sarjax.attacks import minnorm as mn
from sarjax.attacks.core.entry import Entry


def _apply(params, x):
    return x.reshape(x.shape[0], -1) @ params[0] + params[1]  # [B, C]: one member


def _params(C=4, d=6):
    rng = np.random.default_rng(0)
    return jnp.asarray(rng.normal(size=(d, C)) * 3, jnp.float32), jnp.asarray(rng.normal(size=C), jnp.float32)


def test_both_families_share_the_entry():
    f = fmn.make_fmn(_apply, norm=2, max_queries=40)
    g = make_pgd(_apply, eps=0.1, steps=2)
    assert isinstance(f, Entry) and isinstance(g, Entry) and isinstance(g, core.AttackFn)
    for fn in (f, g):
        for entry in (fn, fn.jit):  # keyword-only and required; an explicit None is refused too
            with pytest.raises(TypeError, match="required keyword-only argument: 'key'"):
                entry(_params(), np.zeros((1, 6), np.float32), np.zeros(1, np.int32))
            with pytest.raises(TypeError, match="key is required"):
                entry(_params(), np.zeros((1, 6), np.float32), np.zeros(1, np.int32), key=None)


def test_attack_property_and_class_dependence():
    f = fmn.make_fmn(_apply, norm=2, max_queries=40)
    # FMN's costs do not depend on the class count: one state machine (one kernel) for every C
    assert isinstance(f.attack, core.Attack) and f.attack == f.attack_for(3) == f.attack_for(10)
    assert f.attack.num_steps == 20
    u = fab.make_fab(_apply, norm=2, max_queries=100)
    with pytest.raises(TypeError, match="attack_for"):
        _ = u.attack
    # FAB: 1 query for x0, then C + 1 per iteration
    assert u.attack_for(4).num_steps == (100 - 1) // 5 and u.attack_for(9).num_steps == (100 - 1) // 10
    t = fab.make_fab(_apply, norm=2, max_queries=100, fab_t=True)  # FAB-T: 3 per iteration
    assert t.attack.num_steps == (100 - 1) // 3


def test_problem_then_run_equals_the_public_entry():
    params = _params()
    x0 = np.random.default_rng(1).uniform(0.2, 0.8, (3, 6)).astype(np.float32)
    y = np.asarray(jnp.argmax(_apply(params, x0), -1), np.int32)
    key = jax.random.key(4)
    fn = fmn.make_fmn(_apply, norm=2, max_queries=40)
    prob = fn.problem(params, x0, y, key=key, max_queries=np.asarray([40, 30, 20]))
    assert isinstance(prob, mn.MinNormProblem)
    np.testing.assert_array_equal(np.asarray(prob.base.cap), [40, 30, 20])
    by_hand = core.run_jit(fn.attack, params, prob)
    res = fn(params, x0, y, key=key, max_queries=np.asarray([40, 30, 20]))
    for a, b in zip(by_hand, res):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(res.queries)[:, 0], [40, 30, 20])  # each sample's traced cap
    with pytest.raises(ValueError, match="max_queries above"):
        fn.problem(params, x0, y, key=key, max_queries=41)
