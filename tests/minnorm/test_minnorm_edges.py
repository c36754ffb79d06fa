"""Inputs at the edges of the minimum-norm attacks' entry, and one wording with the fixed-budget
family (issue 35: "Minimum-norm uses core/validate.py").

Before: a model with NaN logits was reported fooled on every sample and member (FMN, with its
audit); an empty batch raised numpy's "zero-size array to reduction operation"; and the same bad
input got another message from ``fmn`` than from ``pgd`` (the minimum-norm attacks kept their own
validator).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sarjax.attacks import ddn, fmn, make_pgd

KEY = jax.random.PRNGKey(0)
M, B, D, C = 2, 3, 8, 4


def pool_apply(params, x):
    return jnp.einsum("bd,mdc->mbc", x.reshape(x.shape[0], -1), params["W"]) + params["b"][:, None]


def nan_member1(params, x):
    """The affine pool, member 1 returning NaN logits everywhere."""
    z = pool_apply(params, x)
    return jnp.where((jnp.arange(z.shape[0]) == 1)[:, None, None], jnp.nan, z)


def _problem():
    rng = np.random.default_rng(0)
    params = {
        "W": jnp.asarray(rng.normal(size=(M, D, C)) * 3, jnp.float32),
        "b": jnp.asarray(rng.normal(size=(M, C)), jnp.float32),
    }
    x = rng.uniform(0.3, 0.7, (B, D)).astype(np.float32)
    y = np.asarray(jnp.argmax(pool_apply(params, x), -1))[0].astype(np.int32)  # member 0's predictions
    return params, x, y


@pytest.mark.parametrize("make", [fmn.make_fmn, ddn.make_ddn])
def test_non_finite_logits_raise_naming_the_members(make):
    params, x, y = _problem()
    fn = make(nan_member1, norm=2, max_queries=40)
    with pytest.raises(ValueError, match=r"non-finite logits.*members \[1\] on samples \[0, 1, 2\]"):
        fn(params, x, y, key=KEY)
    res = fn(params, x, y, key=KEY, mask=np.array([1, 0]))  # a masked member claims nothing: no check
    assert not np.asarray(res.success)[:, 1].any()


def test_non_finite_logits_with_nothing_found():
    params, x, y = _problem()
    all_nan = lambda p, a: pool_apply(p, a) * jnp.nan  # noqa: E731
    with pytest.raises(ValueError, match=r"non-finite logits.*members \[0, 1\] on samples \[0, 1, 2\]"):
        fmn.make_fmn(all_nan, norm=2, max_queries=40)(params, x, y, key=KEY)


def test_empty_batch_is_one_value_error():
    params, x, y = _problem()
    with pytest.raises(ValueError, match=r"^fmn: empty batch: x0 has 0 samples$"):
        fmn.make_fmn(pool_apply, norm=2, max_queries=40)(params, x[:0], y[:0], key=KEY)


def _message(fn, params, x, y, **kw):
    with pytest.raises((ValueError, TypeError)) as e:
        fn(params, x, y, key=KEY, **kw)
    return e.type, str(e.value).split(": ", 1)[1]


def _bad_inputs(x, y):
    xi_nan = x.copy()
    xi_nan[1, 2] = np.nan
    x_nan = x.copy()
    x_nan[2, 0] = np.inf
    return {
        "mask values": dict(mask=np.array([2.0, 1.0])),
        "mask shape": dict(mask=np.ones(3)),
        "float cap": dict(max_queries=7.9),
        "bool cap": dict(max_queries=True),
        "cap shape": dict(max_queries=np.array([20, 20], np.int32)),
        "x_init NaN": dict(x_init=xi_nan),
        "x_init shape": dict(x_init=x[:, :4]),
        "sample_ids shape": dict(sample_ids=np.arange(2)),
        "sample_ids range": dict(sample_ids=np.array([0, -1, 2])),
        "sample_ids dtype": dict(sample_ids=np.arange(3.0)),
        "ref shape": dict(y=y[:2]),
        "ref dtype": dict(y=y.astype(np.float32)),
        "ref range": dict(y=np.array([0, 9, 1], np.int32)),
        "x0 non-finite": dict(x=x_nan),
        "x0 box": dict(x=x + 1.0),
        "x0 ints": dict(x=np.ones((B, D), np.int32)),
        "empty batch": dict(x=x[:0], y=y[:0]),
    }


@pytest.mark.parametrize("case", list(_bad_inputs(np.zeros((B, D), np.float32), np.zeros(B, np.int32))))
def test_both_families_word_a_bad_input_the_same(case):
    params, x, y = _problem()
    kw = _bad_inputs(x, y)[case]
    xx, yy = kw.pop("x", x), kw.pop("y", y)
    got_mn = _message(fmn.make_fmn(pool_apply, norm=2, max_queries=40), params, xx, yy, **kw)
    got_fb = _message(make_pgd(pool_apply, eps=0.1, steps=2, norm="l2"), params, xx, yy, **kw)
    assert got_mn == got_fb


def test_minimum_norm_specific_checks_remain():
    params, x, y = _problem()
    fn = fmn.make_fmn(pool_apply, norm=2, max_queries=40)
    with pytest.raises(ValueError, match=r"fmn: x_init must lie in the box \(0\.0, 1\.0\)"):
        fn(params, x, y, key=KEY, x_init=x + 1.0)  # the fixed-budget attacks project it instead
    with pytest.raises(ValueError, match=r"fmn: max_queries above the factory's maximum T=40"):
        fn(params, x, y, key=KEY, max_queries=41)
    with pytest.raises(ValueError, match=r"fmn: max_queries below 2 .* for samples \[1\] \(\[1\]\)"):
        fn(params, x, y, key=KEY, max_queries=np.array([40, 1, 40]))
    for cap in (np.int64(30), np.array([30, 20, 10]), jnp.asarray([30, 20, 10], jnp.int32)):
        fn(params, x, y, key=KEY, max_queries=cap)


@pytest.mark.parametrize("cap", [7.9, np.float32(8), True, jnp.asarray([20.0, 20.0, 20.0])])
def test_jit_entry_refuses_a_non_integer_cap(cap):
    params, x, y = _problem()
    fn = fmn.make_fmn(pool_apply, norm=2, max_queries=40)
    with pytest.raises(TypeError, match=r"fmn: max_queries must be None, an int or \[B\] ints"):
        fn.jit(params, x, y, key=KEY, max_queries=cap)  # was truncated (7.9 -> 7)
    with pytest.raises(TypeError, match=r"fmn: max_queries must be None, an int or \[B\] ints"):
        jax.jit(lambda c: fn.jit(params, x, y, key=KEY, max_queries=c).norm)(jnp.asarray(cap))
    r = jax.jit(lambda c: fn.jit(params, x, y, key=KEY, max_queries=c).queries)(jnp.int32(20))
    assert (np.asarray(r) <= 20).all()
