"""Property test (hypothesis) of the fixed-budget attacks on a tiny pool.

For random attack x norm x eps (scalar or per sample, including 0, 1e-6 and radii at which the
box binds) x batch size x member mask (including all-False rows) x inputs on the box faces x
labels x key, checked on the host in float64 against the ORIGINAL input:

* ``x_adv`` and ``best_x`` are finite, inside the box and inside the ball:
  ``||x - x0||_p <= eps (1 + 1e-5) + 1e-7``, with no allowance for the float32 write-back of
  ``x0 + delta`` (this file found an l1 radius of 1e-6 realized as 1.12e-6 by that rounding;
  :func:`sarjax.attacks.geometry.add_within` now writes back toward ``x0``);
* a sample with no selected member is left at ``x0`` and charged only its clean evaluation (M);
* the same call with the same key returns identical arrays.

Each (attack, norm) is built and compiled once (module cache); the batch is always padded to
``B_MAX`` rows (padding rows: all-False masks), so examples only change traced arguments.

Examples per (attack, norm): ``SARJAX_FUZZ_EXAMPLES`` (default 20: 240 examples, about 30 s on 2
cores, mostly the 11 compilations).  A long run (``-s`` prints the count per (attack, norm)):
``SARJAX_FUZZ_EXAMPLES=2000 python -m pytest -n 0 -q -s tests/attacks/test_attacks_fuzz.py``.
"""

import functools
import math
import os

import jax
import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sarjax.attacks import APGDSchedule, PGDStep, make_apgd, make_fgsm, make_joint_pgd, make_pgd, make_square  # noqa: E402
from sarjax.models.pool import Pool, Stack  # noqa: E402
from sarjax.models.zoo import mlp  # noqa: E402

EXAMPLES = int(os.environ.get("SARJAX_FUZZ_EXAMPLES", 20))
B_MAX = 5
M = 3
SHAPE = (4, 4, 1)
D = math.prod(SHAPE)
ARCH = mlp((8,), input_shape=SHAPE, num_classes=4)


def _pool():
    shapes = jax.eval_shape(ARCH.init, jax.random.PRNGKey(0))  # numpy params: no init compile
    rng = np.random.default_rng(0)
    params = jax.tree.map(
        lambda s: (2.0 * rng.standard_normal((M,) + s.shape) / np.sqrt(s.shape[0])).astype(np.float32), shapes
    )
    return Pool([Stack(ARCH, params, tuple(f"m{i}" for i in range(M)))])


POOL = _pool()

# (attack, norm) -> factory; the box binds from eps = 1 (linf), 4 (l2), 16 (l1) on [0, 1]^16
COMBOS = {
    ("fgsm", "linf"): lambda: make_fgsm(POOL.apply, norm="linf"),
    ("fgsm", "l2"): lambda: make_fgsm(POOL.apply, norm="l2"),
    ("fgsm", "l1"): lambda: make_fgsm(POOL.apply, norm="l1"),
    ("pgd", "linf"): lambda: make_pgd(POOL.apply, norm="linf", steps=3, step=PGDStep(restarts=3)),
    ("pgd", "l2"): lambda: make_pgd(POOL.apply, norm="l2", steps=3, step=PGDStep(restarts=2)),
    ("pgd", "l1"): lambda: make_pgd(POOL.apply, norm="l1", steps=3, step=PGDStep(restarts=2)),
    ("apgd", "linf"): lambda: make_apgd(POOL.apply, norm="linf", n_iter=4, schedule=APGDSchedule(restarts=2)),
    ("apgd", "l2"): lambda: make_apgd(POOL.apply, norm="l2", n_iter=4),
    ("apgd", "l1"): lambda: make_apgd(POOL.apply, norm="l1", n_iter=4),
    ("square", "linf"): lambda: make_square(POOL.apply, norm="linf", n_queries=6),
    ("square", "l2"): lambda: make_square(POOL.apply, norm="l2", n_queries=6),
    # joint PGD is make_pgd(linf, rel_step 1/16, 3 restarts): it shares ("pgd", "linf")'s kernel
    ("joint_pgd", "linf"): lambda: make_joint_pgd(POOL.apply, steps=3),
}
BOX_BINDS = {"linf": 1.0, "l2": 4.0, "l1": 16.0}
P = {"linf": np.inf, "l2": 2.0, "l1": 1.0}


@functools.cache
def _attack(name, norm):
    return COMBOS[(name, norm)]()


def _eps_values(norm):
    big = BOX_BINDS[norm]
    return st.one_of(
        st.sampled_from([0.0, 1e-6, big, 1.5 * big]),
        st.floats(min_value=1e-4, max_value=1.5 * big, allow_nan=False, allow_infinity=False),
    )


@st.composite
def _case(draw, norm):
    b = draw(st.integers(1, B_MAX))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    x = rng.random((B_MAX,) + SHAPE).astype(np.float32)
    faces = rng.random(x.shape)
    x[faces < draw(st.sampled_from([0.0, 0.3]))] = 0.0  # inputs on the box faces
    x[faces > 1.0 - draw(st.sampled_from([0.0, 0.3]))] = 1.0
    if draw(st.booleans()):
        y = rng.integers(0, 4, (B_MAX, M)).astype(np.int32)  # arbitrary labels in range
    else:
        y = np.asarray(POOL.predict(x)).T.astype(np.int32)  # each member's clean prediction
    rows = draw(st.lists(st.lists(st.booleans(), min_size=M, max_size=M), min_size=b, max_size=b))
    mask = np.zeros((B_MAX, M), bool)
    mask[:b] = np.asarray(rows, bool).reshape(b, M)
    if draw(st.booleans()):
        eps = draw(_eps_values(norm))  # scalar
    else:
        eps = np.zeros(B_MAX, np.float32)
        eps[:b] = draw(st.lists(_eps_values(norm), min_size=b, max_size=b))
    key = jax.random.PRNGKey(draw(st.integers(0, 2**31 - 1)))
    return b, x, y, mask, eps, key


def _check(norm, x0, x, eps, what):
    """float64 host check of ``x`` against the ORIGINAL ``x0`` and the box."""
    x0 = np.asarray(x0, np.float64).reshape(len(x0), -1)
    x = np.asarray(x, np.float64).reshape(len(x0), -1)
    assert np.isfinite(x).all(), f"{what}: non-finite values"
    assert (x >= 0.0).all() and (x <= 1.0).all(), f"{what}: outside the box [{x.min()}, {x.max()}]"
    d = x - x0
    realized = np.linalg.norm(d, ord=P[norm], axis=1)
    tol = np.asarray(eps, np.float64) * (1 + 1e-5) + 1e-7
    bad = np.flatnonzero(realized > tol)
    assert bad.size == 0, (
        f"{what}: samples {bad.tolist()} realize {realized[bad]} > eps {np.broadcast_to(eps, realized.shape)[bad]}"
    )


@pytest.mark.parametrize("name, norm", list(COMBOS))
def test_fuzz_attacks_stay_in_ball_and_box_and_are_deterministic(name, norm):
    atk = _attack(name, norm)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(case=_case(norm))
    def run(case):
        b, x, y, mask, eps, key = case
        COUNT[(name, norm)] += 1
        res = atk(POOL.params, x, y, key=key, mask=mask, eps=eps)
        eps_b = np.broadcast_to(np.asarray(eps, np.float64), (B_MAX,))
        for field in ("x_adv", "best_x"):
            _check(norm, x[:b], np.asarray(getattr(res, field))[:b], eps_b[:b], f"{name}-{norm} {field}")
        idle = ~mask.any(axis=1)  # no member selected (incl. padding)
        np.testing.assert_array_equal(np.asarray(res.x_adv)[idle], x[idle])
        np.testing.assert_array_equal(np.asarray(res.queries)[idle], 1)  # [B, M]: one clean forward per member
        again = atk(POOL.params, x, y, key=key, mask=mask, eps=eps)
        for field in ("x_adv", "success", "queries", "best_x", "objective"):
            np.testing.assert_array_equal(
                np.asarray(getattr(again, field)),
                np.asarray(getattr(res, field)),
                err_msg=f"{name}-{norm} {field} differs for the same key",
            )

    run()
    print(f"fuzz {name}-{norm}: {COUNT[(name, norm)]} examples")  # shown with -s


COUNT = {k: 0 for k in COMBOS}
