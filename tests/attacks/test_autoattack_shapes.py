"""A cold AutoAttack compiles fewer chunk shapes (issue 43, item 2): a run's last rows pad to a
size the stage's kernel already ran at unless the padding, over the stage's runs left, costs more
than a compilation (``NEW_SHAPE_ROWS``); results are bit for bit those of the former plan."""

import collections
import itertools
import os

import jax
import numpy as np
import pytest
from _aa_tiny import images, make_pool

import sarjax.attacks.autoattack as aa
from sarjax.attacks.autoattack import (
    CHUNK_CALL_ROWS,
    NEW_SHAPE_ROWS,
    AutoAttackSettings,
    _buckets,
    _tail_plan,
    autoattack_config,
    autoattack_pool,
)
from sarjax.runtime.compile_stats import count_compiles


def test_tail_plan_counts_a_new_size_once_against_the_runs_left():
    sizes = _buckets(250)  # 32, 63, 125, 250
    assert _tail_plan(164, sizes) == [125, 63]  # every size free: the fewest padded rows
    assert _tail_plan(164, sizes, compiled={250}) == [250]  # one run: padding 86 rows beats two compilations
    assert _tail_plan(30, sizes, compiled={250}, runs=1) == [250]
    assert _tail_plan(30, sizes, compiled={250}, runs=9) == [32]  # nine targets: 32 once beats 250 nine times
    assert _tail_plan(30, sizes, compiled={63, 250}, runs=9) == [32]
    assert _tail_plan(30, sizes, compiled={63, 250}, runs=2) == [63]


def test_tail_plan_with_compiled_sizes_is_the_cheapest_cover():
    """Against brute force over every multiset of chunk sizes."""
    for bs in (250, 100, 40):
        sizes = _buckets(bs)
        top = -(-bs // sizes[0]) + 1  # enough chunks of the smallest size to cover bs
        covers = [c for k in range(1, top + 1) for c in itertools.combinations_with_replacement(sizes, k)]
        for compiled in ({bs}, set(), {sizes[0]}):
            for runs in (1, 3, 9):
                for n in range(1, bs + 1, 7):
                    plan = _tail_plan(n, sizes, compiled=compiled, runs=runs)

                    def cost(c):
                        return runs * (sum(c) + CHUNK_CALL_ROWS * len(c)) + NEW_SHAPE_ROWS * len(set(c) - compiled)

                    assert sum(plan) >= n and all(s in sizes for s in plan)
                    assert cost(plan) == min(cost(c) for c in covers if sum(c) >= n), (bs, compiled, runs, n, plan)


@pytest.mark.filterwarnings("ignore")
def test_fewer_stage_programs_and_the_same_results(monkeypatch):
    pool = make_pool(stacks=1)
    x, y = images(70)  # chunks of 64 (buckets 32, 64): one full chunk and 6 rows
    # the stages of several runs (4 targets each), whose tails the plan changes
    cfg = autoattack_config("linf", 0.05, attacks=["apgd-t", "fab-t"], n_iter=4, fab_iter=3)
    settings = AutoAttackSettings(batch_size=64, checks=False, log=False)

    def cascade():
        jax.clear_caches()
        with count_compiles() as c:
            res = autoattack_pool(pool, x, y, attack=cfg, key=jax.random.PRNGKey(3), settings=settings)
        return res, collections.Counter(r.name for r in c.programs() if not r.cached)

    new, new_names = cascade()
    former = aa._tail_plan

    def every_size_free(n, sizes, *, compiled=None, runs=1):  # the plan before: compilations not counted
        return former(n, sizes)

    monkeypatch.setattr(aa, "_tail_plan", every_size_free)
    old, old_names = cascade()
    stage = ("jit(_run_apgd_like)", "jit(_run_minnorm)")
    assert [new_names[k] for k in stage] == [1, 1], new_names  # one shape each: the full chunk's
    if os.environ.get("SARJAX_TEST_FAST_COMPILE") != "1":
        # Which points a stage still attacks (so whether a run has a tail to pad) depends on the
        # rounding: at XLA's default level (the default run) the former plan compiled the tail's
        # shape too; at the rounding sweep's level the runs happen to have no such tail.
        assert old_names["jit(_run_apgd_like)"] == 2, old_names  # and the tail's (FAB-T's tail happens to fit)
        assert new_names["jit(_logits)"] < old_names["jit(_logits)"], (new_names, old_names)
    assert new.robust.tolist() == old.robust.tolist() and 0 < new.robust.sum() < new.robust.size
    assert new.queries.tolist() == old.queries.tolist()
    np.testing.assert_array_equal(new.x_adv, old.x_adv)
    np.testing.assert_array_equal(new.stage_robust, old.stage_robust)
