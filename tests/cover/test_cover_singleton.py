"""Singleton-completed SAR (the SAR paper, Figures 7 and 8) and SAR standard errors (issue 21)."""

import json

import numpy as np
import pytest

from sarjax.cover import GreedySettings, SARResult, SetSystemOracle, concat_results, coverage_target, greedy_sar
from sarjax.cover.result import mean_and_se


def reference_singleton(sets, visible, tau, clean, stop_unreachable):
    """Algorithm 1 for one sample with Python sets, then the singleton completion.

    Oracle rules mirror SetSystemOracle (joint: largest marginal visible set,
    lowest index on ties; fallback member: uncovered member broken by most
    visible sets, lowest index; single attack: the largest set holding it).
    Returns ``(k_hat or -1, k_singleton, added, added_unbreakable)``.
    """
    n, m = sets.shape
    members = [set(np.flatnonzero(s)) for s in sets]
    covered = set(np.flatnonzero(clean))
    uncovered = set(range(m)) - covered
    unbreakable = set()
    k = 0
    while len(covered) < tau and uncovered:
        if stop_unreachable and len(covered) + len(uncovered) < tau:
            break
        gains = [len(members[i] & uncovered) if visible[i] else 0 for i in range(n)]
        if max(gains) > 0:
            gain = members[int(np.argmax(gains))] & uncovered
        else:
            score = {j: sum(1 for i in range(n) if visible[i] and j in members[i]) for j in uncovered}
            target = min(uncovered, key=lambda j: (-score[j], j))
            holders = [i for i in range(n) if target in members[i]]
            if not holders:
                unbreakable.add(target)
                uncovered.discard(target)
                continue
            gain = members[min(holders, key=lambda i: (-len(members[i]), i))] & uncovered
        k += 1
        covered |= gain
        uncovered -= gain
    added = max(0, tau - len(covered))
    # The completion uses the untried members of I first, then unbreakable ones.
    return (k if added == 0 else -1), k + added, added, max(0, added - len(uncovered))


def _systems(seed, b, n, m, p, hide):
    rng = np.random.default_rng(seed)
    return rng.random((b, n, m)) < p, rng.random((b, n)) >= hide


def _run(sets, visible, clean, deltas, stop):
    o = SetSystemOracle(sets, joint_visible=visible)
    return greedy_sar(o.joint, o.single, clean, deltas, settings=GreedySettings(stop_when_unreachable=stop))


def test_known_answer_with_unbreakable_members():
    """Inputs {0,1,2} and {3}; members 4 and 5 unbreakable (the optimum by construction)."""
    m = 6
    sets = np.zeros((1, 2, m), bool)
    sets[0, 0, [0, 1, 2]] = True
    sets[0, 1, [3]] = True
    deltas = [0.0, 1 / 6, 0.5]  # tau = 6, 5, 3
    for stop, unb in ((True, [1, 1, 0]), (False, [2, 1, 0])):
        res = _run(sets, None, np.zeros((1, m), bool), deltas, stop)
        # tau = 3 is reached with one input: the completion adds nothing.
        assert res.k_hat[0].tolist() == [-1, -1, 1]
        # tau = 6: 2 inputs cover 4 members, 2 missing -> 4; tau = 5: 2 + 1.
        assert res.k_singleton[0].tolist() == [4, 3, 1]
        assert res.singleton_added[0].tolist() == [2, 1, 0]
        np.testing.assert_allclose(res.sar_singleton[0], [4 / 6, 3 / 6, 1 / 6])
        # With the early stop the tau = 6 run ends after one failed fallback,
        # so one completion input falls on the still untried member 5.
        assert res.singleton_unbreakable[0].tolist() == unb
        assert res.sar[0].tolist() == [1.0, 1.0, 1 / 6]


def test_early_stop_counts_untried_members_one_each():
    """Members 0, 1 unbreakable, {4} visible, {2, 3} hidden from the joint attack.

    The early stop ends after the first failed fallback: members 2 and 3 were
    never tried and cost one input each (5 / 5); the literal loop goes on, the
    fallback finds {2, 3} with one input, and the completion is 2 + 2 = 4.
    """
    m = 5
    sets = np.zeros((1, 2, m), bool)
    sets[0, 0, [4]] = True
    sets[0, 1, [2, 3]] = True
    visible = np.array([[True, False]])
    early = _run(sets, visible, np.zeros((1, m), bool), [0.0], True)
    literal = _run(sets, visible, np.zeros((1, m), bool), [0.0], False)
    assert early.sar[0, 0] == literal.sar[0, 0] == 1.0
    assert early.k_singleton[0, 0] == 5 and early.singleton_unbreakable[0, 0] == 1
    assert literal.k_singleton[0, 0] == 4 and literal.singleton_unbreakable[0, 0] == 2


def test_disjoint_weaknesses_with_unbreakable_tail_planted():
    """eye(M - 2) plus two unbreakable members: k* is known at every tau."""
    m = 8
    sets = np.zeros((2, m - 2, m), bool)
    sets[:, np.arange(m - 2), np.arange(m - 2)] = True
    deltas = [0.0, 0.125, 0.25, 0.5]  # tau = 8, 7, 6, 4
    res = _run(sets, None, np.zeros((2, m), bool), deltas, True)
    for j, d in enumerate(deltas):
        tau = coverage_target(d, m)
        # Reached (tau <= 6): k_hat = tau; otherwise 6 inputs + (tau - 6) singletons = tau.
        assert (res.k_singleton[:, j] == tau).all()
        assert (res.reached[:, j] == (tau <= m - 2)).all()
    # tau = 8 stops after one failed fallback (6 + 1 < 8): one completion input
    # goes to the untried member, one to the unbreakable one; tau = 7 tries both.
    assert res.singleton_unbreakable[0].tolist() == [1, 1, 0, 0]
    literal = _run(sets, None, np.zeros((2, m), bool), deltas, False)
    assert literal.singleton_unbreakable[0].tolist() == [2, 1, 0, 0]
    np.testing.assert_array_equal(literal.k_singleton, res.k_singleton)


@pytest.mark.parametrize("stop", [True, False])
def test_random_systems_match_reference_and_bounds(stop):
    sets, visible = _systems(5, 10, 6, 9, p=0.25, hide=0.5)
    clean = np.random.default_rng(1).random((10, 9)) < 0.1
    deltas = [0.3, 0.0, 1 / 9]  # unsorted on purpose
    res = _run(sets, visible, clean, deltas, stop)
    assert (~res.reached).sum() >= 5 and res.reached.sum() >= 5  # both branches exercised
    m = 9
    for b in range(10):
        for j, d in enumerate(deltas):
            tau = coverage_target(d, m)
            k_hat, k_sc, added, unb = reference_singleton(sets[b], visible[b], tau, clean[b], stop)
            assert res.k_hat[b, j] == k_hat
            assert (res.k_singleton[b, j], res.singleton_added[b, j], res.singleton_unbreakable[b, j]) == (
                k_sc,
                added,
                unb,
            ), (b, j)
    # Reached: the completion changes nothing. Never above tau / M <= 1 = SAR.
    np.testing.assert_array_equal(res.k_singleton[res.reached], res.k_hat[res.reached])
    taus = np.asarray(res.taus)[None, :]
    assert (res.k_singleton <= taus).all()
    assert (res.sar_singleton <= res.sar).all()
    unb_share = res.unbreakable.sum(axis=1, keepdims=True) / m
    assert (res.sar_singleton <= 1 + unb_share).all()
    # The completion beyond the untried members never exceeds the members marked unbreakable.
    assert (res.singleton_unbreakable <= res.unbreakable.sum(axis=1, keepdims=True)).all()


def test_batched_and_multi_delta_equal_separate_runs():
    sets, visible = _systems(9, 8, 6, 8, p=0.25, hide=0.5)
    clean = np.random.default_rng(3).random((8, 8)) < 0.1
    deltas = [0.0, 0.25, 0.5]
    for stop in (True, False):
        batched = _run(sets, visible, clean, deltas, stop)
        for b in range(8):
            for j, d in enumerate(deltas):
                one = _run(sets[b : b + 1], visible[b : b + 1], clean[b : b + 1], [d], stop)
                for name in ("k_singleton", "singleton_added", "singleton_unbreakable"):
                    assert getattr(one, name)[0, 0] == getattr(batched, name)[b, j], (name, b, d)
                assert one.sar_singleton[0, 0] == batched.sar_singleton[b, j]


def test_count_clean_input_and_padding():
    m = 4
    sets = np.zeros((3, 1, m), bool)
    sets[:, 0, [1]] = True  # members 2, 3 unbreakable
    clean = np.zeros((3, m), bool)
    clean[:, 0] = True
    valid = np.array([True, True, False])
    o = SetSystemOracle(sets)
    res = greedy_sar(o.joint, o.single, clean, [0.0], valid=valid, settings=GreedySettings(count_clean_input=True))
    # Clean input (1) + {1} (1) cover 2 of 4; two singletons: 4.
    assert res.k_singleton[:2, 0].tolist() == [4, 4]
    assert res.k_singleton[2, 0] == -1 and np.isnan(res.sar_singleton[2, 0])
    stats = res.sar_stats()[0]
    assert stats["n"] == 2 and stats["mean_sar_singleton"] == 1.0 and stats["se_sar_singleton"] == 0.0


def test_mean_and_se_known_values():
    mean, se, n = mean_and_se([0.25, 0.5, 0.75, 1.0])
    assert (mean, n) == (0.625, 4)
    assert se == pytest.approx(np.sqrt(((0.375**2 + 0.125**2) * 2) / 3) / 2)
    mean, se, n = mean_and_se([0.4, np.nan])  # padding nan is ignored; one sample: no se
    assert (mean, se, n) == (0.4, None, 1)
    assert mean_and_se([]) == (None, None, 0)


def test_stats_summary_json_and_roundtrip(tmp_path):
    sets, visible = _systems(21, 6, 5, 7, p=0.3, hide=0.5)
    res = _run(sets, visible, np.zeros((6, 7), bool), [0.0, 0.5], True)
    stats = res.sar_stats()
    for j, st in enumerate(stats):
        assert st["mean_sar"] == pytest.approx(res.sar[:, j].mean())
        assert st["se_sar"] == pytest.approx(res.sar[:, j].std(ddof=1) / np.sqrt(6))
        assert st["mean_sar_singleton"] == pytest.approx(res.sar_singleton[:, j].mean())
        assert st["se_sar_singleton"] == pytest.approx(res.sar_singleton[:, j].std(ddof=1) / np.sqrt(6))
        assert st["mean_singleton_unbreakable_share"] == pytest.approx(res.singleton_unbreakable[:, j].mean() / 7)
    per_delta = res.summary()["per_delta"]
    assert per_delta[0]["se_sar"] == stats[0]["se_sar"] and "mean_k_hat_reached" in per_delta[0]
    res.save(tmp_path / "r")
    doc = json.loads((tmp_path / "r" / "result.json").read_text())
    assert doc["samples"][2]["k_singleton"] == res.k_singleton[2].tolist()
    assert doc["summary"]["per_delta"][1]["mean_sar_singleton"] == pytest.approx(stats[1]["mean_sar_singleton"])
    back = SARResult.load(tmp_path / "r")
    np.testing.assert_array_equal(back.k_singleton, res.k_singleton)
    # A result saved before these fields existed derives them from its round logs.
    with np.load(tmp_path / "r" / "arrays.npz") as z:
        old = {
            k: z[k]
            for k in z.files
            if k not in ("sar_singleton", "k_singleton", "singleton_added", "singleton_unbreakable")
        }
    np.savez_compressed(tmp_path / "r" / "arrays.npz", **old)
    older = SARResult.load(tmp_path / "r")
    np.testing.assert_array_equal(older.k_singleton, res.k_singleton)
    np.testing.assert_array_equal(older.singleton_unbreakable, res.singleton_unbreakable)
    # select / concat keep them aligned.
    parts = [res.select(np.arange(0, 2)), res.select(np.arange(2, 6))]
    np.testing.assert_array_equal(concat_results(parts).k_singleton, res.k_singleton)


def test_demo_record_table_and_plots(tmp_path, capsys):
    from types import SimpleNamespace

    from sarjax.cover.plots import plot_sar
    from sarjax.experiments.demo import plot_demo, print_table
    from sarjax.experiments.sar import pool_record

    m = 4
    sets = np.zeros((3, 2, m), bool)
    sets[:, 0, [0, 1]] = True
    sets[1:, 1, [2]] = True  # member 3 unbreakable everywhere, member 2 on sample 0
    o = SetSystemOracle(sets)
    deltas = [0.5, 0.25, 0.15, 0.0]  # the demo's coverages 0.5, 0.75, 0.85, 1.0
    res = greedy_sar(o.joint, o.single, np.zeros((3, m), bool), deltas)
    # k_singleton per sample at 1.0: 1 + 2, 2 + 1, 2 + 1 -> SAR_sc 3/4, 3/4, 3/4; at 0.75: 2/4, 2/4, 2/4.
    assert res.k_singleton[:, 3].tolist() == [3, 3, 3]
    assert res.sar[:, 1].tolist() == [1.0, 0.5, 0.5]
    pool = SimpleNamespace(num_members=m, names=("a", "b", "c", "d"))
    rec = pool_record(pool, np.full(m, 0.9), np.full(m, 0.3), res)
    assert rec["sar"]["0.75"] == pytest.approx(2 / 3)  # kept as before
    assert rec["sar_se"]["0.75"] == pytest.approx(np.std([1.0, 0.5, 0.5], ddof=1) / np.sqrt(3))
    assert rec["sar_singleton"]["1"] == pytest.approx(0.75)
    assert rec["sar_singleton_se"]["1"] == 0.0
    assert rec["singleton_unbreakable_share"]["1"] == pytest.approx(np.mean([1, 1, 1]) / m)
    json.dumps(rec)  # JSON-ready
    print_table({"low": rec}, 0.05)
    out = capsys.readouterr().out
    assert "0.667±0.167" in out and "SAR_sc 0.75" in out and "0.750±0.000" in out
    assert plot_demo({"low": rec}, tmp_path).stat().st_size > 1000
    assert plot_sar(res, tmp_path / "sar.png").stat().st_size > 1000
