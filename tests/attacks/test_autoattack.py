"""AutoAttack (sarjax.attacks.autoattack): the cascade, exact queries, a known answer, the checks.

One cascade on an affine 5-class model is shared by most tests (module fixture, short budgets:
APGD 10 iterations, FAB 10, Square 20 queries); the single-stage runs reuse its compiled kernels.
The l2 known answer and the non-stacked pool path run with ``SARJAX_AUTOATTACK_FULL=1``.
"""

import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sarjax.attacks.autoattack import AutoAttackSettings, autoattack, autoattack_config
from sarjax.attacks.autoattack_checks import AutoAttackWarning, sanity_checks

FULL = os.environ.get("SARJAX_AUTOATTACK_FULL") == "1"
C = 5
N_IT, FAB_IT, SQ = 10, 10, 20
BUDGET = dict(n_iter=N_IT, fab_iter=FAB_IT, square_queries=SQ)
QUIET = AutoAttackSettings(log=False)
QUIET_NC = AutoAttackSettings(log=False, checks=False)


def linear(p, x):
    return x.reshape(x.shape[0], -1) @ p["W"] + p["b"]


def affine_problem(norm, batch=16, seed=0):
    """A 5-class linear model on 4x4x1 inputs in [0.3, 0.7]; the minimal lp distance of each point
    to a wrong class is ``min_j (z_y - z_j) / ||w_y - w_j||_q`` (q the dual norm) while the optimal
    step stays inside the box (eps <= 0.2 here): the robust accuracy at eps is known exactly."""
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(16, C)) / 4
    b = np.zeros(C)
    x = rng.uniform(0.3, 0.7, size=(batch, 16))
    z = x @ W + b
    y = np.argmax(z, 1)
    q = {"linf": 1, "l2": 2}[norm]
    d = np.full(batch, np.inf)
    for j in range(C):
        with np.errstate(invalid="ignore", divide="ignore"):
            dj = (z[np.arange(batch), y] - z[:, j]) / np.linalg.norm(W[:, y].T - W[:, j], ord=q, axis=1)
        d = np.where(y == j, d, np.minimum(d, dj))
    params = {"W": jnp.asarray(W, jnp.float32), "b": jnp.asarray(b, jnp.float32)}
    return params, x.reshape(batch, 4, 4, 1).astype(np.float32), y.astype(np.int32), d


def gap_eps(d):
    """An eps in the widest relative gap of the sorted distances around their median (a quarter of
    the points at least on each side; no point within 10% of eps: the known answer is unambiguous)."""
    s = np.sort(d)
    n = len(s)
    idx = np.arange(n - 1)
    i = int(np.argmax(np.where((idx >= n // 4) & (idx < 3 * n // 4), s[1:] / s[:-1], 0)))
    eps = float(np.sqrt(s[i] * s[i + 1]))
    assert np.all(np.abs(d - eps) > 0.1 * eps), (s, eps)
    return eps


@pytest.fixture(scope="module")
def cascade():
    params, x, y, d = affine_problem("linf", seed=1)
    y = y.copy()
    y[0] = (y[0] + 1) % C  # one clean error: never attacked
    eps = gap_eps(d[1:])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AutoAttackWarning)
        res = autoattack(
            linear,
            params,
            x,
            y,
            attack=autoattack_config("linf", eps, **BUDGET),
            key=jax.random.PRNGKey(0),
            settings=QUIET,
        )
    return params, x, y, d, res, eps


def test_known_answer_affine_linf(cascade):
    _, x, y, d, res, EPS = cascade
    want = d > EPS
    want[0] = False  # misclassified clean
    assert res.robust[:, 0].tolist() == want.tolist()
    assert 0 < want.sum() < len(want) - 1  # both outcomes occur
    # the adversarial points are real: realized linf <= eps and misclassified
    broken = ~res.robust[:, 0] & res.clean[:, 0]
    xa = res.x_adv[broken, 0]
    assert np.abs(xa - x[broken]).max() <= EPS * (1 + 1e-6)
    z = np.asarray(linear(cascade[0], jnp.asarray(xa)))
    assert np.all(np.argmax(z, 1) != y[broken])


def test_cascade_attacks_only_still_robust_points(cascade):
    *_, res, _ = cascade
    sq, sr = res.stage_queries[..., 0], res.stage_robust[..., 0]
    assert sr.shape[0] == sq.shape[0] == 1 + len(res.log)
    for s in range(1, sq.shape[0]):
        gone = ~sr[s - 1]
        assert np.all(sq[s][gone] == 0), f"stage {s} charged points already broken"
        assert np.all(sq[s][sr[s - 1]] > 0), f"stage {s} skipped a still-robust point"
        assert np.all(sr[s] <= sr[s - 1])  # robust flags only fall
    assert sq[1:, 0].sum() == 0  # the clean error: only the clean evaluation
    assert res.queries[:, 0].tolist() == sq.sum(0).tolist()


def test_queries_exact_hand_count(cascade):
    """A point robust to the end paid, per stage (one query = one forward or backward of one
    member on one sample): clean 1; APGD-CE 1 (its clean eval) + 2 (N + 1) (gradient steps) + 1
    (verification); APGD-T: 1 (target ranking) + 4 targets x (1 + 2 (N + 1) + 1); FAB-T: 1 + 4 x
    (1 + 3 F + 1); Square: 1 (clean) + 1 (init) + (SQ - 1) proposals + 1 (verification)."""
    *_, res, _ = cascade
    t = C - 1
    per_stage = [1, 2 * N_IT + 4, 1 + t * (2 * N_IT + 4), 1 + t * (3 * FAB_IT + 2), SQ + 2]
    end = res.robust[:, 0]
    assert end.any()
    assert [s.name for s in res.log] == ["apgd-ce", "apgd-t", "fab-t", "square"]
    for s, want in enumerate(per_stage):
        assert np.all(res.stage_queries[s, end, 0] == want), (s, res.stage_queries[s, end, 0], want)
    assert np.all(res.queries[end, 0] == sum(per_stage))
    assert sum(s.queries for s in res.log) + int(res.stage_queries[0].sum()) == int(res.queries.sum())


def test_cascade_never_above_any_single_stage(cascade):
    params, x, y, _, res, EPS = cascade
    final = res.robust_accuracy[0]
    for name in ("apgd-ce", "apgd-t", "fab-t", "square"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", AutoAttackWarning)
            one = autoattack(
                linear,
                params,
                x,
                y,
                attack=autoattack_config("linf", EPS, attacks=[name], **BUDGET),
                key=jax.random.PRNGKey(0),
                settings=QUIET,
            )
        assert final <= one.robust_accuracy[0] + 1e-12, name
        if name == "apgd-ce":  # the same first stage (same key, same mask): per sample too
            assert np.all(res.robust[:, 0] <= one.robust[:, 0])
    # each logged stage's accuracy never rises
    accs = [s.robust_accuracy[0] for s in res.log]
    assert accs == sorted(accs, reverse=True)


def test_pool_members_match_single_models(cascade):
    params, x, y, _, _, EPS = cascade
    p2 = {"W": params["W"] * jnp.asarray(1.0 + 0.5 * np.arange(16)[:, None] / 16, jnp.float32), "b": params["b"]}
    stacked = jax.tree.map(lambda a, b: jnp.stack([a, b]), params, p2)
    kw = dict(attack=autoattack_config("linf", EPS, attacks=["apgd-ce"], **BUDGET), key=jax.random.PRNGKey(0))
    pool = autoattack(linear, stacked, x, y, stacked=True, settings=QUIET_NC, **kw)
    assert pool.robust.shape == (16, 2) and pool.x_adv.shape == (16, 2, 4, 4, 1)
    for m, pm in enumerate((params, p2)):
        single = autoattack(linear, pm, x, y, settings=QUIET_NC, **kw)
        assert pool.robust[:, m].tolist() == single.robust[:, 0].tolist()
        assert pool.queries[:, m].tolist() == single.queries[:, 0].tolist()


def test_batch_size_padding_gives_the_same_result(cascade):
    params, x, y, _, _, EPS = cascade
    kw = dict(attack=autoattack_config("linf", EPS, attacks=["apgd-ce"], **BUDGET), key=jax.random.PRNGKey(0))
    whole = autoattack(linear, params, x, y, settings=QUIET_NC, **kw)
    # 20 samples in chunks of 16 (the last one padded with 12 masked rows): the fixture's kernels;
    # samples 16..19 repeat samples 0..3 with their sample ids, so they draw the same streams
    x20, y20, sid = np.concatenate([x, x[:4]]), np.concatenate([y, y[:4]]), np.r_[np.arange(16), np.arange(4)]
    parts = autoattack(
        linear,
        params,
        x20,
        y20,
        settings=AutoAttackSettings(batch_size=16, log=False, checks=False),
        sample_ids=sid,
        **kw,
    )
    assert parts.robust[:, 0].tolist() == np.r_[whole.robust[:, 0], whole.robust[:4, 0]].tolist()
    assert parts.queries[:, 0].tolist() == np.r_[whole.queries[:, 0], whole.queries[:4, 0]].tolist()
    assert parts.stage_queries.shape == (2, 20, 1)  # the padding rows are dropped


def test_every_run_attacks_only_rows_still_robust(cascade, monkeypatch):
    """APGD-T alone: rows broken by target t are not in the chunks of target t + 1 (only padding
    rows, repeats of the chunk's first row, carry an all-zero mask); results as the fixture's kernels."""
    import sarjax.attacks.autoattack as aa

    params, x, y, _, _, EPS = cascade
    seen = []
    real = aa._apgd_run

    def spy(ctx, chunk, mask, key, loss, targets=None):
        seen.append((np.asarray(chunk[2]), np.asarray(mask)))
        return real(ctx, chunk, mask, key, loss, targets=targets)

    monkeypatch.setattr(aa, "_apgd_run", spy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AutoAttackWarning)
        res = autoattack(
            linear,
            params,
            x,
            y,
            attack=autoattack_config("linf", EPS, attacks=["apgd-t"], **BUDGET),
            key=jax.random.PRNGKey(0),
            settings=QUIET,
        )
    assert len(seen) == C - 1  # one call per target (16 rows: one chunk)
    live = [set(sid[mk.any(axis=1)].tolist()) for sid, mk in seen]
    for sid, mk in seen:
        idle = ~mk.any(axis=1)
        assert np.all(sid[idle] == sid[0]), "a broken row rode along in a later target's chunk"
    assert live[0] > live[-1]  # some rows were broken by the early targets ...
    for a, b in zip(live, live[1:]):  # ... and every row attacked at target t + 1 was robust after target t
        assert b <= a
    assert live[-1] >= set(np.flatnonzero(res.robust[:, 0]).tolist())


def test_pool_per_member_equals_vmapped(cascade):
    from sarjax.attacks.autoattack import autoattack_pool
    from sarjax.models.pool import Pool

    params, x, y, _, _, EPS = cascade
    p2 = {"W": params["W"] * jnp.asarray(1.0 + 0.5 * np.arange(16)[:, None] / 16, jnp.float32), "b": params["b"]}
    pool = Pool.from_functions([(linear, params), (linear, p2)], ["a", "b"], input_shape=(4, 4, 1))
    kw = dict(attack=autoattack_config("linf", EPS, attacks=["apgd-ce"], **BUDGET), key=jax.random.PRNGKey(0))
    vm = autoattack_pool(pool, x, y, settings=QUIET_NC, **kw)
    pm = autoattack_pool(pool, x, y, settings=AutoAttackSettings(log=False, checks=False, per_member=True), **kw)
    assert pm.names == vm.names == ("a", "b")
    assert pm.robust.tolist() == vm.robust.tolist() and 0 < vm.robust.sum() < vm.robust.size
    assert pm.queries.tolist() == vm.queries.tolist()
    np.testing.assert_array_equal(pm.x_adv, vm.x_adv)
    with pytest.raises(TypeError, match="per_member"):
        AutoAttackSettings(per_member=1)  # pyright: ignore[reportArgumentType]


def test_chunk_buckets():
    from sarjax.attacks.autoattack import _buckets

    assert _buckets(250) == [32, 63, 125, 250]
    assert _buckets(100) == [32, 50, 100]
    assert _buckets(16) == [16]
    assert _buckets(40) == [32, 40]


def test_tail_plan_is_the_cheapest_cover():
    """The rows left after the full chunks run in bucket-sized chunks whose padded rows plus a
    fixed cost per chunk are minimal: checked against brute force over every multiset."""
    import itertools

    from sarjax.attacks.autoattack import CHUNK_CALL_ROWS, _buckets, _tail_plan

    assert _tail_plan(74, _buckets(250)) == [63, 32]  # not one chunk of 125
    assert _tail_plan(100, _buckets(250)) == [125]
    for bs in (250, 100, 40):
        sizes = _buckets(bs)
        covers = [c for k in range(1, 7) for c in itertools.combinations_with_replacement(sizes, k)]
        for n in range(1, bs + 1):
            plan = _tail_plan(n, sizes)
            assert sum(plan) >= n and all(s in sizes for s in plan)
            cost = sum(plan) + CHUNK_CALL_ROWS * len(plan)
            best = min(sum(c) + CHUNK_CALL_ROWS * len(c) for c in covers if sum(c) >= n)
            assert cost == best, (bs, n, plan)


def test_square_tail_is_one_granular_chunk(cascade, monkeypatch):
    """Square's last chunk holds its rows rounded up to a multiple of 8 (74 -> 80, not 63 + 32),
    and the padding leaves every row's result as in an unpadded run."""
    import sarjax.attacks.autoattack as aa

    assert aa._square_tail(74, 250) == [80]
    assert aa._square_tail(1, 250) == [8] and aa._square_tail(249, 250) == [250]
    assert aa._square_tail(5, 6) == [6]  # never above the batch size
    params, x, y, _, _, EPS = cascade
    kw = dict(attack=autoattack_config("linf", EPS, attacks=["square"], **BUDGET), key=jax.random.PRNGKey(0))
    whole = autoattack(linear, params, x, y, settings=QUIET_NC, **kw)
    seen = []
    real = aa._square_run

    def spy(ctx, chunk, mask, key):
        seen.append(mask.shape[0])
        return real(ctx, chunk, mask, key)

    monkeypatch.setattr(aa, "_square_run", spy)
    # 20 samples in chunks of 12: one full chunk, then the 8 left in one chunk of 8 (buckets: 12)
    x20, y20, sid = np.concatenate([x, x[:4]]), np.concatenate([y, y[:4]]), np.r_[np.arange(16), np.arange(4)]
    parts = autoattack(
        linear,
        params,
        x20,
        y20,
        settings=AutoAttackSettings(batch_size=12, log=False, checks=False),
        sample_ids=sid,
        **kw,
    )
    assert seen == [12, 8]
    assert parts.robust[:, 0].tolist() == np.r_[whole.robust[:, 0], whole.robust[:4, 0]].tolist()
    assert parts.queries[:, 0].tolist() == np.r_[whole.queries[:, 0], whole.queries[:4, 0]].tolist()


@pytest.mark.skipif(not FULL, reason="set SARJAX_AUTOATTACK_FULL=1")
def test_known_answer_affine_l2():
    params, x, y, d = affine_problem("l2", seed=1)
    eps = gap_eps(d)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AutoAttackWarning)
        res = autoattack(
            linear,
            params,
            x,
            y,
            attack=autoattack_config("l2", eps, **BUDGET),
            key=jax.random.PRNGKey(1),
            settings=QUIET,
        )
    assert res.robust[:, 0].tolist() == (d > eps).tolist()


@pytest.mark.skipif(not FULL, reason="set SARJAX_AUTOATTACK_FULL=1")
def test_pool_apply_not_stacked_matches_stacked(cascade):
    params, x, y, _, _, EPS = cascade
    p2 = {"W": -params["W"], "b": params["b"]}
    stacked = jax.tree.map(lambda a, b: jnp.stack([a, b]), params, p2)

    def pool_apply(p, xx):
        return jax.vmap(linear, in_axes=(0, None))(p, xx)

    kw = dict(attack=autoattack_config("linf", EPS, attacks=["apgd-ce"], **BUDGET), key=jax.random.PRNGKey(0))
    a = autoattack(pool_apply, stacked, x, y, settings=QUIET_NC, **kw)
    b = autoattack(linear, stacked, x, y, stacked=True, settings=QUIET_NC, **kw)
    assert a.robust.tolist() == b.robust.tolist()


# -- sanity checks ----------------------------------------------------------------------------------


def _fired(fn):
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        msgs = fn()
    got = [str(w.message) for w in rec if issubclass(w.category, AutoAttackWarning)]
    assert got == msgs
    return msgs


@pytest.fixture(scope="module")
def small():
    params, x, y, _ = affine_problem("linf", batch=8)
    return params, jnp.asarray(x), y


def test_checks_quiet_on_a_plain_model(small):
    params, x, y = small
    # 5 classes: the 9-target note is the only message; a 10-class plain model is fully quiet
    msgs = _fired(lambda: sanity_checks(linear, params, x, y, key=jax.random.PRNGKey(0)))
    assert len(msgs) == 1 and "target classes" in msgs[0]
    W10 = jnp.asarray(np.random.default_rng(3).normal(size=(16, 10)), jnp.float32)
    p10 = {"W": W10, "b": jnp.zeros(10)}
    y10 = np.asarray(jnp.argmax(linear(p10, x), 1))
    assert _fired(lambda: sanity_checks(linear, p10, x, y10, key=jax.random.PRNGKey(0))) == []


def test_checks_fire_on_softmax_outputs(small):
    params, x, y = small
    msgs = _fired(
        lambda: sanity_checks(lambda p, xx: jax.nn.softmax(linear(p, xx)), params, x, y, key=jax.random.PRNGKey(0))
    )
    assert any("probability distribution" in m and "logits" in m for m in msgs)


def test_checks_fire_on_a_stochastic_model(small):
    params, x, y = small
    host = np.random.default_rng(0)

    def host_noise(p, xx):  # randomness the key does not control (eager calls differ)
        return linear(p, xx + jnp.asarray(host.normal(size=xx.shape).astype(np.float32)))

    msgs = _fired(lambda: sanity_checks(host_noise, params, x, y, key=jax.random.PRNGKey(0)))
    assert any("randomized defense" in m and "version='rand'" in m for m in msgs)

    def own_key(p, xx):  # draws from a key it makes itself
        return linear(p, xx + 0.1 * jax.random.normal(jax.random.PRNGKey(7), xx.shape))

    msgs = _fired(lambda: sanity_checks(own_key, params, x, y, key=jax.random.PRNGKey(0)))
    assert any("random numbers inside apply" in m and "version='rand'" in m for m in msgs)

    # the rand version: a key-driven model is fine, a key-ignoring one is "deterministic"
    def noisy(p, xx, k):
        return linear(p, xx + 0.1 * jax.random.normal(k, xx.shape))

    msgs = _fired(lambda: sanity_checks(noisy, params, x, y, key=jax.random.PRNGKey(0), version="rand"))
    assert not any("deterministic" in m or "SAME key" in m for m in msgs)
    msgs = _fired(
        lambda: sanity_checks(lambda p, xx, k: linear(p, xx), params, x, y, key=jax.random.PRNGKey(0), version="rand")
    )
    assert any("looks deterministic" in m and "version='standard'" in m for m in msgs)
    msgs = _fired(
        lambda: sanity_checks(
            lambda p, xx, k: host_noise(p, xx), params, x, y, key=jax.random.PRNGKey(0), version="rand"
        )
    )
    assert any("SAME key" in m for m in msgs)


def test_checks_fire_on_zero_gradients(small):
    params, x, y = small
    msgs = _fired(
        lambda: sanity_checks(lambda p, xx: linear(p, jnp.round(xx * 4) / 4), params, x, y, key=jax.random.PRNGKey(0))
    )
    assert any("all-zero" in m for m in msgs)


def test_autoattack_validates_inputs(small):
    params, x, y = small
    k = jax.random.PRNGKey(0)
    with pytest.raises(TypeError, match="key is required"):
        autoattack(linear, params, x, y, attack=autoattack_config("linf", 0.1), key=None)
    with pytest.raises(ValueError, match="version"):
        autoattack_config("linf", 0.1, "fast")
    with pytest.raises(ValueError, match="norm"):
        autoattack_config("l0", 0.1)
    with pytest.raises(ValueError, match="eps"):
        autoattack_config("linf", -1.0)
    with pytest.raises(ValueError, match="labels"):
        autoattack(linear, params, x, y + 10, attack=autoattack_config("linf", 0.1), key=k)
    with pytest.raises(ValueError, match="box"):
        autoattack(linear, params, x + 2.0, y, attack=autoattack_config("linf", 0.1), key=k)
    with pytest.raises(ValueError, match="attacks"):
        autoattack_config("linf", 0.1, attacks=["pgd"])
    with pytest.raises(ValueError, match="fab_iter"):
        autoattack_config("linf", 0.1, fab_iter=2)
    with pytest.raises(TypeError, match="AutoAttackConfig"):
        autoattack(linear, params, x, y, attack="linf", key=k)  # pyright: ignore[reportArgumentType]


# -- the Note: chained rounds vs the bounded combinator -------------------------------------------


def test_chained_rounds_grow_past_eps_bounded_never(small):
    from sarjax.attacks import PGDStep, make_pgd, make_rounds
    from sarjax.attacks.rounds import chained_rounds

    params, x, y = small
    # a binary affine model: the loss's gradient sign is constant, so every chained round walks
    # eps further from the previous output (the Note's n * eps)
    w = np.random.default_rng(5).normal(size=16)
    pb = {"W": jnp.asarray(np.stack([w, -w], 1) / 8, jnp.float32), "b": jnp.zeros(2)}
    yb = np.asarray(jnp.argmax(linear(pb, x), 1)).astype(np.int32)
    eps = 0.02
    pgd = make_pgd(linear, norm="linf", steps=5, step=PGDStep(rel_step=0.5), audit=False)
    xs = chained_rounds(pgd, params=pb, x0=x, y=yb, key=jax.random.PRNGKey(0), eps=eps, rounds=3)
    dist = [float(np.abs(np.asarray(xr) - np.asarray(x)).max()) for xr in xs]
    assert dist[0] <= eps * (1 + 1e-6)
    assert dist[1] > 1.5 * eps and dist[2] > 2.5 * eps, dist
    bounded = make_rounds(make_pgd(linear, norm="linf", steps=5, step=PGDStep(rel_step=0.5)), 3, norm="linf")
    res = bounded(pb, x, yb, key=jax.random.PRNGKey(0), eps=eps)
    for xr in (res.x_adv, res.best_x):
        assert float(np.abs(np.asarray(xr) - np.asarray(x)).max()) <= eps * (1 + 1e-6)
