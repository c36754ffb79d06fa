"""Exact partial cover: HiGHS integer program against brute force."""

import numpy as np
import pytest

from sarjax.cover import brute_force_partial_cover, exact_partial_cover


def _random_instance(rng, m, n, p):
    return rng.random((n, m)) < p


def test_milp_equals_brute_force_random():
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(25):
        m = int(rng.integers(3, 13))
        n = int(rng.integers(1, 9))
        sets = _random_instance(rng, m, n, rng.uniform(0.15, 0.5))
        pre = rng.random(m) < 0.15 if rng.random() < 0.3 else None
        for tau in range(1, m + 1):
            ref = brute_force_partial_cover(sets, tau, pre)
            got = exact_partial_cover(sets, tau, pre)
            assert got.k == ref.k, (sets, tau, pre)
            if got.k is not None:
                assert got.chosen.sum() == got.k
                base = np.zeros(m, bool) if pre is None else pre
                assert (sets[got.chosen].any(axis=0) | base).sum() >= tau
                assert got.optimal
                checked += 1
    assert checked > 100


def test_milp_planted_m64():
    # 8 disjoint blocks of 8 plus decoys of size <= 7: every set has <= 8 members,
    # so covering tau members needs >= ceil(tau / 8) sets, and blocks achieve it.
    rng = np.random.default_rng(1)
    m = 64
    blocks = np.zeros((8, m), bool)
    for i in range(8):
        blocks[i, 8 * i : 8 * i + 8] = True
    decoys = np.zeros((60, m), bool)
    for d in range(60):
        decoys[d, rng.choice(m, size=int(rng.integers(3, 8)), replace=False)] = True
    sets = np.concatenate([decoys[:30], blocks, decoys[30:]])
    for tau, k in [(64, 8), (57, 8), (56, 7), (9, 2), (8, 1), (1, 1)]:
        got = exact_partial_cover(sets, tau)
        assert got.k == k
        assert sets[got.chosen].any(axis=0).sum() >= tau


def test_infeasible_and_precovered():
    sets = np.array([[1, 1, 0, 0], [0, 1, 0, 0]], dtype=bool)
    assert exact_partial_cover(sets, 3).k is None
    assert brute_force_partial_cover(sets, 3).k is None
    pre = np.array([0, 0, 1, 1], dtype=bool)
    assert exact_partial_cover(sets, 2, pre).k == 0
    assert exact_partial_cover(sets, 4, pre).k == 1
    assert exact_partial_cover(np.zeros((0, 4), bool), 2, pre).k == 0


def test_validation():
    sets = np.ones((2, 3), bool)
    with pytest.raises(ValueError, match="tau"):
        exact_partial_cover(sets, 4)
    with pytest.raises(TypeError, match="bool"):
        exact_partial_cover(sets.astype(int), 2)
    with pytest.raises(ValueError, match="precovered"):
        exact_partial_cover(sets, 2, precovered=np.ones(4, bool))
