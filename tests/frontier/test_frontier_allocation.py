"""Algorithm 1 (the frontier paper Section 3): budgets, caps, structural constraints, tiers, brute-force optima."""

import os

import numpy as np
import pytest

from sarjax.frontier import (
    PoolEntry,
    TrajectoryPool,
    expand_pool,
    greedy_allocation,
    is_feasible,
    nested_allocations,
    optimal_allocation,
    simple_pool,
    split_models,
)

INF = np.inf
MEASURED_CHAIN_EXACT = 18  # measured: 18 of 20 pools exact with chains=True, 15 of 20 as published


def _random_pool(rng, M=3, A=4, B=30, L=30, entries=None, every=10, cap=None):
    """Trajectories that improve at random times (not concave): a hard case for a greedy."""
    base = rng.gamma(2.0, 1.0, (M, A, B, 1))
    drops = rng.uniform(0, 1.5, (M, A, B, 3))
    when = rng.integers(0, L, (M, A, B, 3))
    steps = np.arange(L)
    traj = base + np.sum(drops[..., None, :] * (steps[:, None] < when[..., None, :]), axis=-1)
    first = rng.integers(0, L // 3, (M, A, B, 1))
    traj = np.where(steps < first, INF, traj)
    traj[:, :, :2] = 0.0  # two misclassified samples per model
    return TrajectoryPool(traj, entries or simple_pool([f"a{i}" for i in range(A)]), cap=cap or L * every, every=every)


def test_distances_read_the_trajectory_at_the_allocation():
    traj = np.full((1, 2, 1, 10), INF)
    traj[0, 0, 0, 4:] = 3.0  # entry 0: distance 3 from 50 queries on
    traj[0, 1, 0, 1:] = 5.0  # entry 1: distance 5 from 20 queries on
    traj[0, 1, 0, 9] = 1.0  # and 1 at 100 queries
    pool = TrajectoryPool(traj, simple_pool("ab"), cap=100)
    assert pool.distances([40, 0])[0, 0] == INF
    assert pool.distances([50, 0])[0, 0] == 3.0
    assert pool.distances([50, 20])[0, 0] == 3.0
    assert pool.distances([0, 20])[0, 0] == 5.0
    assert pool.distances([50, 100])[0, 0] == 1.0
    assert pool.distances([0, 0])[0, 0] == INF
    # a budget between two records reads the earlier record
    assert pool.distances([59, 0])[0, 0] == 3.0
    np.testing.assert_array_equal(pool.frontier(), [[1.0]])
    with pytest.raises(ValueError, match="cap"):
        pool.distances([110, 0])


def test_trajectory_is_made_best_so_far():
    traj = np.array([[[[5.0, 2.0, 4.0, 1.0]]]])
    pool = TrajectoryPool(traj, simple_pool("a"), cap=40)
    np.testing.assert_array_equal(pool.trajectories[0, 0, 0], [5.0, 2.0, 2.0, 1.0])


def test_frontier_allocation_has_aoi_one_and_dominated_entry_less():
    rng = np.random.default_rng(0)
    pool = _random_pool(rng)
    A = pool.shape[1]
    assert pool.aoi(np.full(A, pool.cap)) == pytest.approx(1.0)
    single = [pool.aoi(np.eye(A, dtype=np.int64)[a] * pool.cap) for a in range(A)]
    assert max(single) < 1.0
    # a dominated copy: entry 1 = entry 0 + 0.5 everywhere -> its AOI is strictly smaller
    t = pool.trajectories.copy()
    t[:, 1] = t[:, 0] + 0.5
    t[:, 1, :, :][pool.trajectories[:, 0] == 0] = 0.0
    dom = TrajectoryPool(t, pool.entries, pool.cap)
    q0, q1 = np.zeros(A, np.int64), np.zeros(A, np.int64)
    q0[0], q1[1] = dom.cap, dom.cap
    assert dom.aoi(q1) < dom.aoi(q0)


def _replay(pool, alloc, start=None):
    """Every intermediate allocation of the greedy's steps."""
    q = np.zeros(pool.shape[1], np.int64) if start is None else np.array(start)
    names = list(pool.names)
    out = []
    for name, old, new, gain in alloc.steps:
        a = names.index(name)
        assert q[a] == old and new > old and gain > 0
        q[a] = new
        out.append(q.copy())
    np.testing.assert_array_equal(q, alloc.q)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_greedy_respects_budget_cap_and_constraints(seed):
    rng = np.random.default_rng(seed)
    entries = expand_pool(["x", "y"], restarts=1, targeted=3)  # 10 entries
    pool = _random_pool(rng, M=2, A=len(entries), B=25, L=20, entries=entries, cap=200)
    levels = [40, 80, 120, 160, 200]
    for budget in (0, 150, 400, 900):
        al = greedy_allocation(pool, budget, levels=levels)
        assert al.used <= budget and (al.q <= pool.cap).all()
        assert is_feasible(pool, al.q, budget, levels)
        aois = [pool.aoi(q) for q in _replay(pool, al)]
        assert all(is_feasible(pool, q, budget, levels) for q in _replay(pool, al))
        assert np.all(np.diff(aois) > 0)  # every applied update improves AOI (Line 2)
        assert al.aoi == pytest.approx(aois[-1] if aois else pool.aoi(al.q))
        # stop rule (Line 2): no feasible update with a positive gain remains
        for a in range(pool.shape[1]):
            for lv in levels:
                q = al.q.copy()
                if lv <= q[a]:
                    continue
                q[a] = lv
                if is_feasible(pool, q, budget, levels):
                    assert pool.aoi(q) <= al.aoi + 1e-12


def test_constraints_targeted_order_and_restarts_need_base():
    entries = expand_pool(["x"], restarts=1, targeted=2)  # x, x/r1, x/t1, x/t2
    pool = TrajectoryPool(np.zeros((1, 4, 1, 10)) + 1.0, entries, cap=100)
    assert is_feasible(pool, [100, 100, 100, 100])
    assert not is_feasible(pool, [0, 100, 0, 0])  # restart without its base
    assert not is_feasible(pool, [0, 0, 100, 0])  # first targeted run without its base
    assert not is_feasible(pool, [100, 0, 50, 60])  # targeted k=2 above targeted k=1
    assert is_feasible(pool, [100, 0, 60, 60])
    assert not is_feasible(pool, [100, 0, 0, 0], budget=50)
    # the greedy on a pool whose only useful entry is the second targeted run must open the
    # base and the first targeted run first; with gain 0 for those, it cannot (Algorithm 1 only
    # applies positive-gain updates): the structural constraints can block the greedy
    traj = np.full((1, 4, 2, 10), 5.0)
    traj[0, 3, 0] = 1.0
    blocked = TrajectoryPool(traj, entries, cap=100)
    al = greedy_allocation(blocked, 1000, levels=[100])
    assert al.used == 0 and al.aoi == 0.0
    assert optimal_allocation(blocked, 1000, levels=[100]).aoi == 1.0


def test_entries_are_validated():
    with pytest.raises(ValueError, match="unique"):
        TrajectoryPool(np.ones((1, 2, 1, 10)), simple_pool("aa"), cap=100)
    with pytest.raises(ValueError, match="base entry"):
        TrajectoryPool(np.ones((1, 1, 1, 10)), (PoolEntry("r", "restart", "nope"),), cap=100)
    with pytest.raises(ValueError, match="ranks 1..K"):
        TrajectoryPool(np.ones((1, 2, 1, 10)), (PoolEntry("b"), PoolEntry("t", "targeted", "b", 2)), cap=100)
    with pytest.raises(ValueError, match="stop before the cap"):
        TrajectoryPool(np.ones((1, 1, 1, 5)), simple_pool("a"), cap=100)


def test_gain_per_query_prefers_cheap_updates_known_answer():
    # X reaches half the frontier's gain at 100 queries; Y all of it, but only at 1000.
    # Eq. 10 normalises by the added queries: X first (0.5/100 > 1/1000); then Y no longer fits
    # in Q = 1000.  The optimum takes Y alone.  (The paper's greedy has no optimality guarantee.)
    # Frontier [1, 1, 3]: eps_min 3, den = 3 - 5/3 = 4/3; X alone: [1, 4, 4] -> AUREC 7/3 -> AOI 1/2.
    traj = np.full((1, 2, 3, 100), 4.0)
    traj[0, 0, 0, 9:] = 1.0  # X breaks sample 0 at distance 1 after 100 queries
    traj[0, 1, :, 99] = [1.0, 1.0, 3.0]  # Y breaks all three, only after 1000 queries
    pool = TrajectoryPool(traj, simple_pool("XY"), cap=1000)
    al = greedy_allocation(pool, 1000)
    assert al.ensemble == {"X": 100} and al.aoi == pytest.approx(0.5)
    assert al.steps == [("X", 0, 100, pytest.approx(0.5 / 100))]
    opt = optimal_allocation(pool, 1000)
    assert opt.ensemble == {"Y": 1000} and opt.aoi == 1.0


def test_greedy_stops_when_nothing_improves():
    # one entry reaches the frontier after 100 queries: the greedy spends 100 of 12,000
    traj = np.full((2, 3, 5, 100), 9.0)
    traj[:, 0, :, 9:] = np.array([1.0, 2.0, 3.0, 4.0, 0.0])[:, None]
    traj[:, :, 4] = 0.0  # sample 4: misclassified (0 in every trajectory)
    pool = TrajectoryPool(traj, simple_pool("abc"), cap=1000)
    al = greedy_allocation(pool, 12000)
    assert al.ensemble == {"a": 100} and al.aoi == 1.0
    assert pool.aoi([0, 0, 0]) == 0.0  # the empty ensemble: misclassified samples stay at 0


def test_tiers_are_nested_and_aoi_grows():
    rng = np.random.default_rng(11)
    entries = expand_pool(["x", "y", "z"], restarts=2, targeted=2)
    pool = _random_pool(rng, M=4, A=len(entries), B=40, L=100, entries=entries)
    train, held = split_models(4, 0.5)
    tiers = nested_allocations(pool, (2000, 4000, 8000), models=train)
    for lo, hi in zip(tiers, tiers[1:]):
        assert (lo.q <= hi.q).all() and lo.used <= lo.budget
        assert lo.aoi <= hi.aoi + 1e-12
        assert hi.steps[: len(lo.steps)] == lo.steps  # each tier extends the previous one
    assert tiers[-1].used <= 8000
    # the train AOI is what the greedy maximised; the held-out models are only evaluated
    assert tiers[-1].aoi == pytest.approx(pool.aoi(tiers[-1].q, train))
    with pytest.raises(ValueError, match="increasing"):
        nested_allocations(pool, (4000, 2000))


def test_unconstrained_greedy_with_full_budget_reaches_the_frontier():
    # without constraints and with Q >= A T, any sample above the frontier has a positive-gain
    # update (raise its best entry to T), so Algorithm 1 can only stop at AOI = 1
    for seed in range(5):
        pool = _random_pool(np.random.default_rng(100 + seed), M=2, A=4, B=20, L=30)
        al = greedy_allocation(pool, 4 * pool.cap)
        assert al.aoi == pytest.approx(1.0)


def _modular_pool(rng, A=4, B=24):
    """Each entry breaks its own disjoint samples, fully at its first level: AOI is additive
    over entries and every first update costs one level, so Eq. 10's greedy is the top-k by
    gain, which is optimal (the uniform-cost knapsack)."""
    traj = np.full((1, A, B, 30), 10.0)
    owner = rng.integers(0, A, B)
    d = rng.uniform(0.5, 9.0, B)
    for b in range(B):
        traj[0, owner[b], b, 9:] = d[b]
    traj[0, :, :, :9] = INF
    return TrajectoryPool(traj, simple_pool([f"a{i}" for i in range(A)]), cap=300)


@pytest.mark.parametrize("seed", range(5))
def test_greedy_equals_brute_force_on_modular_pools(seed):
    pool = _modular_pool(np.random.default_rng(seed))
    for budget in (100, 200, 300):
        g = greedy_allocation(pool, budget, levels=[100, 200, 300])
        o = optimal_allocation(pool, budget, levels=[100, 200, 300])
        assert g.aoi == pytest.approx(o.aoi, abs=1e-12)


def _gap_distribution(n, seed0):
    gaps = []
    for seed in range(seed0, seed0 + n):
        rng = np.random.default_rng(seed)
        A = int(rng.integers(3, 5))
        entries = expand_pool(["x"], targeted=A - 1) if seed % 2 else None
        pool = _random_pool(rng, M=2, A=A, B=12, L=30, entries=entries)
        levels = [100, 200, 300]
        budget = int(rng.choice([200, 300, 500, 700]))
        g = greedy_allocation(pool, budget, levels=levels)
        o = optimal_allocation(pool, budget, levels=levels)
        assert is_feasible(pool, g.q, budget, levels)
        assert g.aoi <= o.aoi + 1e-12  # the optimum is an upper bound
        gaps.append(o.aoi - g.aoi)
    return np.asarray(gaps)


def test_greedy_vs_brute_force_gap_distribution():
    gaps = _gap_distribution(40, 0)
    print(
        f"\ngreedy vs optimum over {gaps.size} random pools: exact on {np.mean(gaps < 1e-12):.0%}, "
        f"median gap {np.median(gaps):.4f}, max {gaps.max():.4f}"
    )
    # measured: 80% (seeds 0-39; 76.4% over 500 pools, FULL); raw gains (no Eq. 10 normalisation) or
    # top-level-only updates reach 70% here
    assert np.mean(gaps < 1e-12) >= 0.75
    assert np.median(gaps) < 0.02


@pytest.mark.skipif(os.environ.get("SARJAX_FRONTIER_FULL") != "1", reason="set SARJAX_FRONTIER_FULL=1")
def test_greedy_vs_brute_force_gap_distribution_full():
    gaps = _gap_distribution(500, 1000)
    q = np.quantile(gaps, [0.5, 0.9, 0.99, 1.0])
    print(f"\n500 pools: exact on {np.mean(gaps < 1e-12):.1%}, gap quantiles 50/90/99/100%: {np.round(q, 4)}")


def test_split_models_stratified_and_deterministic():
    groups = np.array(["cifar"] * 20 + ["imagenet"] * 10)
    tr, he = split_models(groups)  # 13/30 held out, seed 0
    assert he.size == 13 and tr.size == 17
    assert np.intersect1d(tr, he).size == 0 and np.union1d(tr, he).size == 30
    n_c = np.sum(he < 20)
    assert n_c in (8, 9) and he.size - n_c in (4, 5)  # proportional to 20/10
    tr2, he2 = split_models(groups)
    np.testing.assert_array_equal(he, he2)
    assert not np.array_equal(split_models(groups, seed=1)[1], he)
    assert split_models(2, 0.9)[0].size == 1  # at least one train model
    np.testing.assert_array_equal(split_models(5, 0.0)[0], np.arange(5))


# --- chains=True: the least feasible completion of updates that C forbids (ours, docs/frontier.md) ---


def _complete(pool, q, a, level, lowest):
    """The least feasible allocation above ``q`` with entry ``a`` at ``level`` (written from the
    rules of C, independently of allocation._chain): a targeted run k raises runs k-1..1 of its
    attack to at least ``level``; a restart or targeted run opens a base with no queries at
    ``lowest``."""
    q = np.array(q, np.int64)
    e, names = pool.entries[a], list(pool.names)
    q[a] = level
    if e.kind == "targeted":
        for k in range(1, e.rank):
            i = names.index(f"{e.base}/t{k}")
            q[i] = max(q[i], level)
    if e.kind != "base" and q[names.index(e.base)] == 0:
        q[names.index(e.base)] = lowest
    return q


def test_chain_updates_unblock_the_constrained_greedy():
    # the blocked pool above: only the 2nd targeted run helps (sample 0 at distance 1), and the
    # base and the 1st targeted run bring no gain of their own.  The completion of (x/t2, 100)
    # opens x and x/t1 at 100: AOI 0 -> 1 for 300 queries, Eq. 10's gain 1/300
    entries = expand_pool(["x"], restarts=1, targeted=2)
    traj = np.full((1, 4, 2, 10), 5.0)
    traj[0, 3, 0] = 1.0
    pool = TrajectoryPool(traj, entries, cap=100)
    al = greedy_allocation(pool, 1000, levels=[100], chains=True)
    assert al.ensemble == {"x": 100, "x/t1": 100, "x/t2": 100} and al.aoi == 1.0
    g = pytest.approx(1 / 300)
    assert al.steps == [("x", 0, 100, g), ("x/t1", 0, 100, g), ("x/t2", 0, 100, g)]
    assert optimal_allocation(pool, 1000, levels=[100]).aoi == al.aoi
    # the completion must fit the budget: 299 queries cannot buy it
    assert greedy_allocation(pool, 299, levels=[100], chains=True).used == 0
    assert nested_allocations(pool, (200, 300), levels=[100], chains=True)[-1].aoi == 1.0


def test_chain_updates_raise_lower_ranks_to_the_level():
    # x/t1 already at 100; x/t3 at 300 needs x/t1 and x/t2 at 300: cost 200 + 300 + 300 = 800
    entries = expand_pool(["x"], targeted=3)  # x, x/t1, x/t2, x/t3
    traj = np.full((1, 4, 2, 30), 5.0)
    traj[0, 3, 0, 29] = 1.0  # x/t3 breaks sample 0 at distance 1 after 300 queries only
    pool = TrajectoryPool(traj, entries, cap=300)
    al = greedy_allocation(pool, 2000, levels=[100, 200, 300], start=[100, 100, 0, 0], chains=True)
    assert al.ensemble == {"x": 100, "x/t1": 300, "x/t2": 300, "x/t3": 300} and al.aoi == 1.0
    assert [s[:3] for s in al.steps] == [("x/t1", 100, 300), ("x/t2", 0, 300), ("x/t3", 0, 300)]
    assert al.steps[0][3] == pytest.approx(1 / 800)
    assert greedy_allocation(pool, 2000, levels=[100, 200, 300], start=[100, 100, 0, 0]).used == 200  # as published


@pytest.mark.parametrize("seed", range(3))
def test_chain_updates_equal_the_paper_without_constraints(seed):
    # every update of an unconstrained pool is its own completion: the same allocation and steps
    pool = _random_pool(np.random.default_rng(200 + seed), M=2, A=4, B=20, L=30)
    for budget in (300, 700):
        a, b = greedy_allocation(pool, budget), greedy_allocation(pool, budget, chains=True)
        np.testing.assert_array_equal(a.q, b.q)
        assert a.steps == b.steps


@pytest.mark.parametrize("seed", range(4))
def test_chain_updates_respect_budget_cap_constraints_and_stop_rule(seed):
    rng = np.random.default_rng(seed)
    entries = expand_pool(["x", "y"], restarts=1, targeted=3)  # 10 entries
    pool = _random_pool(rng, M=2, A=len(entries), B=25, L=20, entries=entries, cap=200)
    levels = [40, 80, 120, 160, 200]
    for budget in (0, 150, 400, 900):
        al = greedy_allocation(pool, budget, levels=levels, chains=True)
        assert al.used <= budget and (al.q <= pool.cap).all()
        assert is_feasible(pool, al.q, budget, levels)
        # replay: the steps sharing one gain form one completed update, feasible, with that gain
        q = np.zeros(pool.shape[1], np.int64)
        names = list(pool.names)
        i = 0
        while i < len(al.steps):
            j = i
            while j + 1 < len(al.steps) and al.steps[j + 1][3] == al.steps[i][3]:
                j += 1
            before, q2 = pool.aoi(q), q.copy()
            for name, old, new, _ in al.steps[i : j + 1]:
                assert q2[names.index(name)] == old and new > old
                q2[names.index(name)] = new
            last = names.index(al.steps[j][0])
            np.testing.assert_array_equal(q2, _complete(pool, q, last, al.steps[j][2], levels[0]))
            assert is_feasible(pool, q2, budget, levels)
            gain = (pool.aoi(q2) - before) / (q2.sum() - q.sum())
            assert gain > 0 and gain == pytest.approx(al.steps[i][3], rel=1e-9, abs=1e-15)
            q, i = q2, j + 1
        np.testing.assert_array_equal(q, al.q)
        # stop rule: no completion that fits the budget has a positive gain
        for a in range(pool.shape[1]):
            for lv in levels:
                if lv <= al.q[a]:
                    continue
                q2 = _complete(pool, al.q, a, lv, levels[0])
                assert is_feasible(pool, q2, None, levels)
                if q2.sum() <= budget:
                    assert pool.aoi(q2) <= al.aoi + 1e-12


def test_chain_updates_vs_brute_force_on_constrained_pools():
    # pools of one attack with its targeted runs (C binds): the paper's greedy and chains=True
    # against the optimum of Problem (8); both are feasible and below it
    exact = {False: 0, True: 0}
    gaps = {False: [], True: []}
    for seed in range(20):
        rng = np.random.default_rng(300 + seed)
        A = int(rng.integers(3, 5))
        pool = _random_pool(rng, M=2, A=A, B=12, L=30, entries=expand_pool(["x"], targeted=A - 1))
        levels, budget = [100, 200, 300], int(rng.choice([300, 500, 700]))
        o = optimal_allocation(pool, budget, levels=levels)
        for chains in (False, True):
            g = greedy_allocation(pool, budget, levels=levels, chains=chains)
            assert is_feasible(pool, g.q, budget, levels) and g.aoi <= o.aoi + 1e-12
            exact[chains] += g.aoi >= o.aoi - 1e-12
            gaps[chains].append(o.aoi - g.aoi)
    print(
        f"\nconstrained pools (20): exact as published {exact[False]}, with chains {exact[True]}; "
        f"mean gap {np.mean(gaps[False]):.4f} vs {np.mean(gaps[True]):.4f}"
    )
    assert exact[True] >= MEASURED_CHAIN_EXACT
