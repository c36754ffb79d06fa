"""Defense frontier, DOI (the frontier paper Eqs. 11-12), rank instability and the report's JSON round trip."""

import numpy as np
import pytest

from sarjax.frontier import (
    FrontierReport,
    TrajectoryPool,
    build_report,
    defense_frontier,
    doi,
    eps_def,
    expand_pool,
    rank_instability,
    ranks,
    robust_accuracy,
    tier_tau,
)

INF = np.inf


def test_doi_of_scaled_curves_is_the_scale_ratio():
    # model m's distances are s_m * base: the defense frontier is the largest scale's curve and
    # DOI_m = mean(s_m base) / mean(s_max base) = s_m / s_max (every distance <= eps_def)
    rng = np.random.default_rng(0)
    base = rng.uniform(0.1, 1.0, 50)
    base[:5] = 0.0  # misclassified by every model
    s = np.array([0.5, 2.0, 1.0, 1.5])
    d = s[:, None] * base[None]
    np.testing.assert_allclose(defense_frontier(d), 2.0 * base)
    assert eps_def(d) == pytest.approx(2.0 * base.max())
    np.testing.assert_allclose(doi(d), s / 2.0)
    np.testing.assert_array_equal(ranks(doi(d)), [4, 1, 3, 2])


def test_doi_hand_computed_with_crossing_curves():
    # A: [1, 1, 4]; B: [2, 2, 2] -> frontier [2, 2, 4], eps_def 4, AUREC* = 8/3
    # AUREC_A = 6/3 -> DOI 0.75; AUREC_B = 6/3 -> 0.75; a robust-at-small-eps model ties with
    # a robust-at-large-eps one on the area
    d = np.array([[1.0, 1.0, 4.0], [2.0, 2.0, 2.0]])
    np.testing.assert_allclose(doi(d), [0.75, 0.75])
    # a sample never broken by one model: the frontier integrates to its last finite drop
    d2 = np.array([[1.0, INF, 3.0], [2.0, 1.0, 1.0]])  # frontier [2, inf, 3], eps_def 3
    np.testing.assert_allclose(doi(d2), [(1 + 3 + 3) / 8, (2 + 1 + 1) / 8])


def test_robust_accuracy_and_rank_flip_kendall_tau():
    # three models whose order reverses between small and large eps
    d = np.array(
        [
            [0.3, 0.3, 0.3, 0.3],  # robust at small eps, broken by 0.3
            [0.2, 0.2, 0.5, 0.5],
            [0.1, 0.1, 0.1, 0.9],  # weak at small eps, one sample survives to 0.9
        ]
    )
    eps = np.array([0.05, 0.15, 0.25, 0.4, 0.6])
    acc = robust_accuracy(d, eps)
    np.testing.assert_allclose(acc[0], [1.0, 1.0, 1.0])
    np.testing.assert_allclose(acc[1], [1.0, 1.0, 0.25])
    np.testing.assert_allclose(acc[2], [1.0, 0.5, 0.25])
    np.testing.assert_allclose(acc[3], [0.0, 0.5, 0.25])
    np.testing.assert_allclose(acc[4], [0.0, 0.0, 0.25])
    ri = rank_instability(acc, eps)
    np.testing.assert_array_equal(ri.ranks[1], [1, 1, 3])
    np.testing.assert_array_equal(ri.ranks[3], [3, 1, 2])
    np.testing.assert_array_equal(ri.ranks[4], [2, 2, 1])  # model 0 and 1 tie at 0
    np.testing.assert_array_equal(ri.shift, [2, 1, 2])
    assert ri.moved(2) == 2
    # eps 0.15 -> 0.4: (0,1) tied first, (0,2) discordant, (1,2) concordant: tau-b = 0
    assert ri.tau[1, 3] == pytest.approx(0.0) and ri.tau[3, 1] == ri.tau[1, 3]
    # eps 0.25 -> 0.6: (0,1) tied second, (0,2) and (1,2) discordant: -2 / sqrt(3 * 2)
    assert ri.tau[2, 4] == pytest.approx(-2 / np.sqrt(6))
    assert np.isnan(ri.tau[0, 1])  # at eps 0.05 every model has accuracy 1: no ranking
    # a strict reversal of 3 models gives tau = -1
    np.testing.assert_allclose(
        tier_tau([[3.0, 2.0, 1.0], [1.0, 2.0, 3.0], [3.0, 2.0, 1.0]]), [[1, -1, 1], [-1, 1, -1], [1, -1, 1]]
    )


def _pool(seed=0, M=5, B=30):
    rng = np.random.default_rng(seed)
    entries = expand_pool(["a", "b"], restarts=1, targeted=2)
    scale = rng.uniform(0.5, 2.0, (M, 1, 1, 1))
    traj = scale * rng.gamma(2.0, 1.0, (M, len(entries), B, 1)) * (1 + np.exp(-np.arange(50) / 10.0))
    traj[:, :, :3] = 0.0
    traj[:, :, 3, :] = INF
    return TrajectoryPool(traj, entries, cap=500, models=tuple(f"m{i}" for i in range(M)))


def test_report_contents_and_json_round_trip(tmp_path):
    pool = _pool()
    rep = build_report(pool, norm="l2", tiers=(500, 1000, 1500), heldout=0.4, groups=["x", "x", "x", "y", "y"])
    assert len(rep.heldout) == 2 and set(rep.train) | set(rep.heldout) == set(range(5))
    assert [t.budget for t in rep.tiers] == [500, 1000, 1500]
    for lo, hi in zip(rep.tiers, rep.tiers[1:]):
        assert all(a <= b for a, b in zip(lo.q, hi.q)) and lo.train_aoi <= hi.train_aoi + 1e-12
    assert all(t.used <= t.budget for t in rep.tiers)
    np.testing.assert_allclose(rep.tiers[-1].model_aoi, pool.aoi_per_model(rep.tiers[-1].q))
    np.testing.assert_allclose(rep.tiers[0].doi, doi(pool.distances(rep.tiers[0].q)))
    np.testing.assert_allclose(np.max(rep.entry_aoi, axis=0) <= 1 + 1e-12, True)
    np.testing.assert_allclose(rep.clean_accuracy, 27 / 30)
    assert rep.rank is not None and len(rep.rank.eps) == 10
    path = tmp_path / "frontier.json"
    rep.to_json(path)
    back = FrontierReport.from_json(path)
    assert back.to_json() == rep.to_json()
    assert back.tiers[1].q == rep.tiers[1].q and back.rank.ranks == rep.rank.ranks
    assert back.tiers[2].ensemble(back.entry_names) == rep.tiers[2].ensemble(rep.entry_names)
    with pytest.raises(ValueError, match="sarjax-frontier/1"):
        FrontierReport.from_dict({"format": "other"})
