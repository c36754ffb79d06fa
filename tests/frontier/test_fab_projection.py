"""FAB's sort-free hyperplane projection against the sorting reference (issue 17, item 5).

:func:`sarjax.attacks.fab.hyperplane_box_step` (Newton on the multiplier for l2 / linf, a
bisection on the float bits of the knapsack threshold for l1) must equal
:func:`~sarjax.attacks.fab.hyperplane_box_step_sort` within float tolerance: on MNIST-like images
(most pixels at 0 or 1: ties in the box room), on random interior points, on hyperplanes
out of the box's reach (the closest corner) and on points already on the hyperplane.  With
tied ``|w|`` the l1 optimum is not unique: the sort-free step must then be another optimum
(same l1 norm, on the hyperplane, in the box).  The exactness of the sorted reference itself
is tested against a brute-force optimum in ``tests/minnorm/test_minnorm_properties.py``.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sarjax.attacks import fab

P = {"l1": 1.0, "l2": 2.0, "linf": math.inf}


@pytest.fixture(scope="module")
def cases():
    rng = np.random.default_rng(0)
    n = 24
    u = rng.uniform(size=(n, 784))  # MNIST-like: most pixels at 0 or 1 (ties in the box room)
    img = np.where(u < 0.6, 0.0, np.where(u < 0.8, 1.0, rng.uniform(size=u.shape))).astype(np.float32)
    x = np.concatenate([img, rng.uniform(0.05, 0.95, (8, 784)).astype(np.float32)])
    w = rng.normal(size=x.shape).astype(np.float32)
    w[:4, :300] = 0.0  # zero normal entries (no move there)
    shift = rng.uniform(-3.0, 3.0, len(x))
    shift[-2:] = (-1e4, 1e4)  # out of reach: the closest box corner
    shift[-3] = 0.0  # already on the hyperplane: (almost) no step
    b = (np.sum(w.astype(np.float64) * x, 1) + shift).astype(np.float32)
    return x, w, b


def _both(p):
    new = jax.jit(jax.vmap(lambda x, w, b: fab.hyperplane_box_step(x, w, b, p)))
    ref = jax.jit(jax.vmap(lambda x, w, b: fab.hyperplane_box_step_sort(x, w, b, p)))
    return new, ref


@pytest.mark.parametrize("name", list(P))
def test_sort_free_projection_equals_sorted(cases, name):
    p = P[name]
    x, w, b = cases
    new, ref = _both(p)
    d, r = np.asarray(new(x, w, b), np.float64), np.asarray(ref(x, w, b), np.float64)
    np.testing.assert_allclose(d, r, atol=2e-6, rtol=0)
    z = x + d
    assert (z >= -1e-6).all() and (z <= 1 + 1e-6).all()
    reach = np.abs(np.sum(w * z, 1) - b) <= 1e-3 * np.maximum(1.0, np.abs(b))
    assert reach[:-2].all() and not reach[-2:].any()  # on the hyperplane unless out of reach
    assert np.abs(d[-3]).max() < 1e-4  # on the hyperplane up to float32 rounding of b


def test_l1_ties_give_another_optimum():
    """Tied ``|w|``: the sorted fill breaks the tie by index, the sort-free one shares the
    remainder; both are optima: same l1 norm, on the hyperplane, in the box."""
    x = np.full((3, 40), 0.5, np.float32)
    x[1, :10] = 0.9
    w = np.ones((3, 40), np.float32)
    w[2, 20:] = 2.0
    w[:, ::7] *= -1.0
    b = (np.sum(w * x, 1) + np.array([3.3, -2.7, 11.1])).astype(np.float32)
    new, ref = _both(1.0)
    d, r = np.asarray(new(x, w, b), np.float64), np.asarray(ref(x, w, b), np.float64)
    np.testing.assert_allclose(np.abs(d).sum(1), np.abs(r).sum(1), rtol=1e-6)
    np.testing.assert_allclose(np.sum(w * (x + d), 1), b, atol=1e-4)
    assert ((x + d) >= -1e-6).all() and ((x + d) <= 1 + 1e-6).all()
    assert not np.allclose(d, r)  # the tie is really broken differently (the test bites)


def test_fab_step_uses_sort_free_projection():
    """The attack's jaxpr holds no sort (the reason for the change)."""
    x = jnp.zeros((784,))
    w = jnp.ones((784,))
    for p in P.values():
        jaxpr = str(jax.make_jaxpr(lambda x, w: fab.hyperplane_box_step(x, w, 1.0, p))(x, w))
        assert "sort" not in jaxpr
        assert "sort" in str(jax.make_jaxpr(lambda x, w: fab.hyperplane_box_step_sort(x, w, 1.0, p))(x, w))
