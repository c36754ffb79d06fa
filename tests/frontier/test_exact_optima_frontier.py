"""The allocated ensembles (Algorithm 1) scored against exact optima (issue 17, item 3).

``tests/frontier/fixtures/pool_runs.npz`` holds the trajectories, at the candidate levels
100, 200, ..., 1000 queries, of the whole ``sarjax frontier`` attack pool (every attack of the
norm with 5 random restarts and targeted runs at the top-9 wrong classes) on the two MILP nets
of ``exact_nets.npz`` and their 24 images, written by ``scripts/exact_optima_frontier.py``
(docs/exact_optima.md).  The allocations are rebuilt here (no attack runs) and every tier's
per-sample distance is divided by the exact optimum.  The issue's goal: the 12k-tier ensemble
within 1.02x of the exact optimum on every sample.
"""

import math
from pathlib import Path

import numpy as np
import pytest

from sarjax.frontier import exact as eof
from sarjax.frontier import is_feasible, nested_allocations

FIXTURES = Path(__file__).parent / "fixtures"

NORMS = ("linf", "l1")
# Measured (scripts/exact_optima_frontier.py, key 0): the worst ratio of each tier over the 48
# (net, sample) pairs, asserted with a small margin; the 12k bound is the goal.
WORST = {
    # linf 4k / 8k were 1.0046 before FMN's boundary overshoot (docs/exact_optima.md): the better
    # FMN base run sends Algorithm 1's greedy down another path (AOI 0.99977, was 0.99999)
    ("linf", 4000): 1.03,  # 1.0234
    ("linf", 8000): 1.03,  # 1.0234
    ("linf", 12000): 1.02,  # 1.0006
    ("l1", 4000): 1.04,  # 1.0328
    ("l1", 8000): 1.04,  # 1.0328
    ("l1", 12000): 1.04,  # 1.0328: one sample of 48 (the pool's frontier reaches 1.0053 there)
}
GOAL_MET = {"linf": True, "l1": False}  # as published (chains=False): the 12k tier within 1.02x on all 48 (measured)
CHAIN_WORST_12K = {"linf": 1.001, "l1": 1.01}  # measured with chains=True: 1.00059, 1.00529 (the l1 frontier: 1.0053)


@pytest.fixture(scope="module")
def scored():
    z = np.load(FIXTURES / "pool_runs.npz")
    opt = np.load(FIXTURES / "exact_optima.npz")
    out = {}
    for norm in NORMS:
        pool = eof.pool_from_levels(z[f"{norm}/traj"], str(z[f"{norm}/entries"]))
        optima = np.concatenate([opt[f"opt_{m}_{norm}"] for m in range(pool.shape[0])])
        out[norm] = (pool, optima, eof.score_pool(pool, optima))
    return out


@pytest.mark.parametrize("norm", NORMS)
def test_pool_never_beats_the_optimum(scored, norm):
    pool, optima, sc = scored[norm]
    t = pool.trajectories.reshape(pool.shape[0], pool.shape[1], -1)  # [M, A, B * L]
    best = np.min(pool.trajectories, axis=(1, 3)).reshape(-1)  # [M * B], net-major
    assert np.all(best >= 0.999 * optima), np.min(best / optima)
    assert np.isfinite(t).any()
    assert sc["frontier"]["below_floor"] == 0


@pytest.mark.parametrize("norm", NORMS)
def test_tiers_against_exact_optima(scored, norm):
    pool, optima, sc = scored[norm]
    tiers = sc["tiers"]
    assert [t["budget"] for t in tiers] == [4000, 8000, 12000]
    for t in tiers:
        assert t["used"] <= t["budget"] and all(v <= pool.cap for v in t["ensemble"].values())
        assert t["failures"] == 0 and t["below_floor"] == 0
        assert t["worst"] <= WORST[(norm, t["budget"])], (norm, t)
    for a, b in zip(tiers, tiers[1:]):  # nested tiers: E_4k within E_8k within E_12k, entry by entry
        assert all(b["ensemble"].get(k, 0) >= v for k, v in a["ensemble"].items())
        assert b["worst"] <= a["worst"] + 1e-12 and b["aoi"] >= a["aoi"] - 1e-12  # so per sample no worse
    # the goal of issue 17 item 3, the 12k tier within 1.02x of the exact optimum on every sample:
    # met on linf; on l1 one sample (net 0, image 18) stays at 1.033x: only the targeted runs at the
    # 3rd most likely wrong class reach it (FAB-T's after 100 queries: 1.0004x), constraint C admits
    # a 3rd targeted run only behind the 1st and 2nd of its attack, and Algorithm 1's one-entry
    # updates never add those (no AOI gain of their own); a 16k tier reaches 1.0053x)
    assert tiers[-1]["n"] == 48
    assert (tiers[-1]["within_1_02"] == 48) == GOAL_MET[norm]
    assert tiers[-1]["within_1_02"] >= 47
    assert sc["frontier"]["worst"] <= tiers[-1]["worst"] + 1e-12  # the frontier uses every entry at the cap


def test_ratio_scores_known_values():
    r = eof.ratio_scores([1.0, 2.2, math.inf, 0.5], [1.0, 2.0, 1.0, 1.0])
    assert r["median"] == pytest.approx(1.05) and r["worst"] == math.inf
    assert r["failures"] == 1 and r["within_1_02"] == 2 and r["below_floor"] == 1 and r["n"] == 4


@pytest.mark.parametrize("norm", NORMS)
def test_chain_updates_against_exact_optima(scored, norm):
    # Algorithm 1 with completed updates (greedy_allocation(chains=True), docs/frontier.md): the
    # completion of FAB-T's 3rd targeted run (with its 1st and 2nd) is a candidate of its own
    pool, optima, _ = scored[norm]
    tiers = nested_allocations(pool, (4000, 8000, 12000), chains=True)
    rows = [eof.ratio_scores(pool.distances(al.q).reshape(-1), optima) for al in tiers]
    print(
        f"\n{norm} chains: "
        + "; ".join(
            f"{al.budget}: used {al.used}, worst {r['worst']:.5f}, within 1.02x {r['within_1_02']}"
            for al, r in zip(tiers, rows)
        )
    )
    for al, r in zip(tiers, rows):
        assert al.used <= al.budget and is_feasible(pool, al.q, al.budget)
        assert r["failures"] == 0 and r["below_floor"] == 0
    for a, b in zip(tiers, tiers[1:]):
        assert (a.q <= b.q).all()
    assert rows[-1]["within_1_02"] == 48 and rows[-1]["worst"] <= CHAIN_WORST_12K[norm]
