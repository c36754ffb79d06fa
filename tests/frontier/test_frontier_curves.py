"""Curves, AUREC, eps_min, AOI and the fixed-eps curve against hand-computed values (the frontier paper Eqs. 3-6)."""

import numpy as np
import pytest

from sarjax.frontier import (
    LinearCurve,
    StepCurve,
    aoi,
    aoi_from_distances,
    attack_frontier,
    aurec,
    eps_grid,
    eps_min,
    fixed_eps_curve,
    global_aoi,
    interpolated_curve,
    per_model_aoi,
)

INF = np.inf


def test_step_curve_hand_computed():
    # 5 samples: one misclassified (0), two broken at 0.5, one at 1.0, one never broken.
    c = StepCurve.from_distances([1.0, 0.5, INF, 0.5, 7.0], correct=[True, True, True, True, False])
    assert c.distances.tolist() == [0.0, 0.5, 0.5, 1.0, INF]
    assert c.clean == pytest.approx(0.8) and c.floor == pytest.approx(0.2)
    # right-continuous: at eps = 0.5 the two samples at 0.5 are broken (Eq. 3: I[d > eps])
    got = c([0.0, 0.49, 0.5, 0.99, 1.0, 10.0])
    np.testing.assert_allclose(got, [0.8, 0.8, 0.4, 0.4, 0.2, 0.2])
    np.testing.assert_allclose(c.breakpoints, [0.5, 1.0])
    np.testing.assert_allclose(c.values, [0.4, 0.2])
    assert c.eps_zero == 1.0 and eps_min(c) == 1.0
    # int_0^1 rho = 0.8 * 0.5 + 0.4 * 0.5 = 0.6 ; int_0^0.75 = 0.4 + 0.4 * 0.25 = 0.5
    assert aurec(c, 1.0) == pytest.approx(0.6)
    assert c.area(0.75) == pytest.approx(0.5)
    assert c.area(0.0) == 0.0
    # beyond eps_zero only the never-broken sample adds area: 0.6 + 0.2 * 2
    assert c.area(3.0) == pytest.approx(1.0)


def test_step_curve_area_matches_fine_riemann_sum():
    rng = np.random.default_rng(3)
    d = np.concatenate([rng.gamma(2.0, 0.3, 40), [0.0, 0.0, INF]])
    c = StepCurve.from_distances(d)
    u = 1.3
    grid = np.linspace(0, u, 200_001)
    mid = 0.5 * (grid[1:] + grid[:-1])
    assert c.area(u) == pytest.approx(np.sum(c(mid)) * (u / 200_000), abs=1e-5)


def test_step_curve_rejects_bad_input():
    with pytest.raises(ValueError, match="NaN"):
        StepCurve.from_distances([0.1, np.nan])
    with pytest.raises(ValueError, match=">= 0"):
        StepCurve.from_distances([0.1, -0.2])
    with pytest.raises(ValueError, match="1-D"):
        StepCurve.from_distances([[0.1]])
    with pytest.raises(ValueError, match="shape"):
        StepCurve.from_distances([0.1, 0.2], correct=[True])
    with pytest.raises(ValueError, match="finite"):
        StepCurve.from_distances([0.1]).area(INF)


def test_eps_min_with_unbroken_samples():
    # frontier never breaks one sample: eps_min is the last finite drop (the floor is 1/3)
    c = StepCurve.from_distances([INF, 0.3, 0.9])
    assert c.eps_zero == 0.9
    assert StepCurve.from_distances([INF, 0.0]).eps_zero == 0.0


def test_aoi_hand_computed_and_frontier_is_one():
    front = np.array([0.0, 1.0, 2.0, 4.0])
    weaker = np.array([0.0, 2.0, 2.0, 4.0])
    failing = np.array([0.0, INF, 2.0, 4.0])
    # eps_min = 4, rho(0) = 3/4, AUREC* = 7/4 -> den = 5/4; AUREC_weaker = 2 -> 1 / (5/4) = 0.8;
    # AUREC_failing = (4 + 2 + 4) / 4 = 2.5 -> 0.5 / (5/4) = 0.4
    fc = StepCurve.from_distances(front)
    assert aoi(fc, fc) == 1.0
    assert aoi(StepCurve.from_distances(weaker), fc) == pytest.approx(0.8)
    assert aoi(StepCurve.from_distances(failing), fc) == pytest.approx(0.4)
    d = np.stack([front, weaker, failing])[:, None]  # [A=3, M=1, B=4]
    np.testing.assert_array_equal(attack_frontier(d)[0], front)
    np.testing.assert_allclose(per_model_aoi(d)[:, 0], [1.0, 0.8, 0.4])
    np.testing.assert_allclose(aoi_from_distances(weaker, front), 0.8)
    # global AOI (Eq. 6): mean over models; a second model where the failing attack is best
    d2 = np.concatenate([d, np.stack([weaker, weaker, front])[:, None]], axis=1)
    g = global_aoi(d2)
    np.testing.assert_allclose(g, [(1.0 + 0.8) / 2, (0.8 + 0.8) / 2, (0.4 + 1.0) / 2])


def test_aoi_degenerate_frontier_is_one():
    # every sample misclassified: no area to gain; every attack ties with the frontier
    z = np.zeros(4)
    assert aoi_from_distances(z, z) == 1.0
    assert aoi(StepCurve.from_distances(z), StepCurve.from_distances(z)) == 1.0


def test_linear_curve_area_and_values():
    c = LinearCurve([0.0, 1.0, 2.0], [1.0, 0.5, 0.0])
    np.testing.assert_allclose(c([0.5, 1.5, 9.0]), [0.75, 0.25, 0.0])
    assert c.area(2.0) == pytest.approx(1.0)
    assert c.area(1.5) == pytest.approx(0.75 + 0.5 * (0.5 + 0.25) / 2)
    assert c.area(3.0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="non-increasing"):
        LinearCurve([0.0, 1.0], [0.5, 0.6])
    with pytest.raises(ValueError, match="start at 0"):
        LinearCurve([0.1, 1.0], [0.5, 0.4])


def test_fixed_eps_curve_hand_computed():
    # frontier: 4 samples, one misclassified; distances 1, 2, 3 -> eps_min 3, rho0 3/4,
    # AUREC* = 6/4, den = 9/4 - 6/4 = 3/4
    front = np.array([0.0, 1.0, 2.0, 3.0])
    # AA measured at eps 1, 2, 3 with robust accuracies 0.5, 0.25, 0 (as the frontier's right
    # limits); interpolated curve: (0, .75) (1, .5) (2, .25) (3, 0) -> area = .625 + .375 + .125
    fc = fixed_eps_curve([1.0, 2.0, 3.0], [0.5, 0.25, 0.0], front, queries=[[10, 20, 30, 40]] * 3, eps_ref=2.0)
    assert fc.curve.area(3.0) == pytest.approx(1.125)
    assert fc.aoi == pytest.approx((2.25 - 1.125) / 0.75)
    assert fc.cost_ref == pytest.approx(25.0) and fc.cost_total == pytest.approx(75.0)
    # a noisy non-monotone measurement is lowered to the running minimum
    c = interpolated_curve([1.0, 2.0], [0.4, 0.6], 0.8)
    np.testing.assert_allclose(c.values, [0.8, 0.4, 0.4])


def test_eps_grid_percentiles_plus_reference():
    d = np.concatenate([[0.0, INF], np.arange(1, 101, dtype=float)])
    g = eps_grid(d, eps_ref=0.5, percentiles=(10, 50, 90))
    np.testing.assert_allclose(
        g, [0.5, np.percentile(np.arange(1, 101), 10), 50.5, np.percentile(np.arange(1, 101), 90)]
    )
    with pytest.raises(ValueError, match="eps_ref"):
        eps_grid(d, eps_ref=-1.0)
