"""Square attack, l1 variant (AutoAttack's ``square.py`` branch ``L1``, Croce & Hein 2021): the
window pattern and the mass-moving update against numpy references written from the reference's
description, containment in the l1 ball ∩ box over many random draws, a known answer on an affine
classifier whose minimal l1 perturbation is analytic, exact query counts, the AutoAttack l1
version's attack list against the reference's ``set_version``, and the reference's schedule."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _attacks_affine import affine_apply, binary_problem

from sarjax.attacks import geometry as G
from sarjax.attacks.audit import audit
from sarjax.attacks.square import (
    l1_centred_pattern,
    l1_init_perturbation,
    l1_proposal,
    l1_window_update,
    make_square,
    p_schedule,
)
from sarjax.attacks.threat import Threat

SHAPE = (4, 4, 1)  # 16 input elements: windows of side 3 at 4 positions
N_QUERIES = 300
# measured (see the known-answer test's docstring): every sample fooled at this multiple of the
# analytic minimal l1 distance within N_QUERIES queries
SUCCESS_FACTOR = 2.5


def _ref_rectangles_l1(h, w):
    """Concentric rectangles around (h // 2, w // 2), half-sizes k = 0 .. max(h, w) // 2, each
    adding 1 / (k + 1)^4 to the elements it contains; scaled to unit l1 norm."""
    out = np.zeros((h, w))
    ci, cj = h // 2, w // 2
    for k in range(max(h // 2, w // 2) + 1):
        out[max(ci - k, 0) : ci + k + 1, max(cj - k, 0) : cj + k + 1] += 1.0 / (k + 1) ** 4
    return out / np.abs(out).sum()


def _ref_eta_l1(s, flip):
    eta = np.zeros((s, s))
    if s // 2 > 0:
        eta[: s // 2] = _ref_rectangles_l1(s // 2, s)
    eta[s // 2 :] = -_ref_rectangles_l1(s - s // 2, s)
    eta /= np.abs(eta).sum()
    return eta.T if flip else eta


@pytest.mark.parametrize("flip", [False, True])
def test_l1_pattern_matches_the_reference_construction(flip):
    max_side = 9
    fn = jax.jit(lambda a, b, s: l1_centred_pattern(a, b, s, flip, max_side))
    a = jnp.arange(-2, max_side + 2)[:, None]
    b = jnp.arange(-2, max_side + 2)[None, :]
    for s in range(1, max_side + 1):
        got = np.asarray(fn(a, b, s))  # a larger grid, offset by 2: zero outside the window
        want = np.zeros(got.shape)
        want[2 : 2 + s, 2 : 2 + s] = _ref_eta_l1(s, flip)
        np.testing.assert_allclose(got, want, atol=1e-6, err_msg=f"s={s}")
        assert abs(np.abs(got).sum() - 1.0) < 1e-5


def _ref_l1_update(delta, r1, c1, r2, c2, s, flip, sign, eps):
    delta = np.asarray(delta, np.float64)
    C = delta.shape[-1]
    eta = _ref_eta_l1(s, flip)
    total = np.abs(delta).sum()
    m1 = np.zeros(delta.shape[:2], bool)
    m1[r1 : r1 + s, c1 : c1 + s] = True
    m2 = np.zeros(delta.shape[:2], bool)
    m2[r2 : r2 + s, c2 : c2 + s] = True
    new = delta.copy()
    new[m2] = 0.0
    for ch in range(C):
        win = delta[r1 : r1 + s, c1 : c1 + s, ch]
        cand = eta * sign[ch] + win / (np.abs(win).sum() + 1e-12)
        union = np.abs(delta[..., ch][m1 | m2]).sum()
        mass = (max(eps - total, 0.0) / C + union) * C  # the reference's "* c"
        new[r1 : r1 + s, c1 : c1 + s, ch] = cand / np.abs(cand).sum() * mass
    return new


@pytest.mark.parametrize(
    "r1,c1,r2,c2,s,flip,eps",
    [
        (0, 1, 3, 3, 3, False, 9.0),  # disjoint windows, unused budget shared
        (1, 1, 2, 0, 3, True, 9.0),  # overlapping
        (2, 2, 2, 2, 5, False, 1.0),  # W2 == W1, budget already spent (eps < ||delta||_1)
        (0, 0, 6, 6, 1, True, 9.0),  # single elements
    ],
)
@pytest.mark.parametrize("channels", [1, 3])
def test_l1_window_update_matches_the_reference_update(r1, c1, r2, c2, s, flip, eps, channels):
    rng = np.random.default_rng(s + 7 * r1 + channels)
    delta = rng.normal(0.0, 0.05, (7, 7, channels)).astype(np.float32)
    delta[r1 : r1 + 1, c1] = 0.0  # a zero element inside W1 does not matter
    sign = np.array([1.0, -1.0, 1.0][:channels], np.float32)
    fn = jax.jit(l1_window_update, static_argnums=9)
    got = np.asarray(fn(jnp.asarray(delta), r1, c1, r2, c2, s, flip, jnp.asarray(sign), eps, 6))
    want = _ref_l1_update(delta, r1, c1, r2, c2, s, flip, sign, eps)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_l1_proposals_and_init_never_leave_the_l1_ball_and_box():
    """1,024 random (x0, current point, eps, p) draws, 8 chained proposals each, and the
    initialisation: every point passes the library's audit (l1 ball of x0 ∩ [0, 1], finite)."""
    n, shape = 1024, (6, 6, 2)
    rng = np.random.default_rng(0)
    x0 = rng.uniform(0.0, 1.0, (n, *shape)).astype(np.float32)
    x0[rng.uniform(size=x0.shape) < 0.2] = 0.0  # elements on the box's faces
    x0[rng.uniform(size=x0.shape) < 0.2] = 1.0
    eps = np.exp(rng.uniform(np.log(0.01), np.log(40.0), n)).astype(np.float32)  # up to the whole box
    p = rng.choice([0.8, 0.4, 0.1, 0.8 / 128], n).astype(np.float32)
    threat = Threat(1.0, eps.astype(np.float64))
    project = jax.jit(jax.vmap(lambda a, b, e: G.project(a, b, e, 1.0)))
    x = project(jnp.asarray(x0 + rng.normal(0.0, 0.5, x0.shape).astype(np.float32)), jnp.asarray(x0), eps)
    propose = jax.jit(jax.vmap(l1_proposal))
    keys = jax.random.split(jax.random.PRNGKey(1), n)
    norms = []
    for t in range(8):
        x = propose(jax.vmap(lambda k, t=t: jax.random.fold_in(k, t))(keys), x, jnp.asarray(x0), eps, p)
        rep = audit(x0, np.asarray(x), threat)
        assert rep.ok, (t, rep.worst())
        norms.append(rep.norm)
    # the proposals use the budget: most end on the sphere or at the box's corner set
    assert np.mean(np.isclose(norms[-1], eps, rtol=1e-4)) > 0.5
    init = jax.jit(jax.vmap(lambda k, a, e: G.project(a + l1_init_perturbation(k, shape), a, e, 1.0)))
    xi = np.asarray(init(keys, jnp.asarray(x0), eps))
    rep = audit(x0, xi, threat)
    assert rep.ok, rep.worst()


def test_l1_init_is_the_unscaled_tiles():
    d = np.asarray(jax.jit(lambda k: l1_init_perturbation(k, (10, 12, 3)))(jax.random.PRNGKey(3)))
    # side 10 // 5 = 2, tiles from row/column 0: 5 x 6 tiles, each of l1 mass 1 per channel
    np.testing.assert_allclose(np.abs(d).sum(axis=(0, 1)), [30.0, 30.0, 30.0], rtol=1e-5)
    tile = d[:2, :2, 0] / np.abs(d[:2, :2, 0]).sum()
    assert any(np.allclose(np.abs(tile), np.abs(_ref_eta_l1(2, f)), atol=1e-6) for f in (False, True))


def _image_problem(batch, seed):
    params, x0, opt = binary_problem("l1", batch, seed, d=int(np.prod(SHAPE)))
    return params, x0.reshape(batch, *SHAPE), np.zeros((batch,), np.int32), opt


def _realized_l1(x, x0):
    diff = np.asarray(x, np.float64).reshape(x.shape[0], -1) - np.asarray(x0, np.float64).reshape(x.shape[0], -1)
    return np.abs(diff).sum(axis=1)


def test_square_l1_known_answer_on_an_affine_model():
    """Class 0 vs 1 split by the hyperplane ``w.x + c = 0``; the minimal l1 distance to it is
    ``opt = f(x0) / ||w||_inf`` (one coordinate moved). Above ``opt`` (2.5 x) l1-Square crosses
    it for every sample within 300 queries, to points on the other side and inside the l1 ball ∩
    box; below it (0.99 x) it cannot, and spends the whole budget."""
    batch = 8
    attack = make_square(affine_apply, norm="l1", n_queries=N_QUERIES)
    params, x0, ref, opt = _image_problem(batch, 11)
    key = jax.random.PRNGKey(5)
    w = np.asarray(params["W"])[:, 0] * 2.0  # the hyperplane's normal (W[:, 0] = w / 2)

    hi = attack(params, x0, ref, key=key, eps=SUCCESS_FACTOR * opt)
    assert bool(np.all(hi.success)) and bool(np.all(hi.best_success))
    side = np.asarray(hi.x_adv, np.float64).reshape(batch, -1) @ w - np.sum(w) * 0.5
    assert np.all(side < 0.0)  # the other side of the hyperplane
    assert np.all(_realized_l1(hi.x_adv, x0) <= SUCCESS_FACTOR * opt * (1 + 1e-6))
    assert np.all(np.asarray(hi.queries) < N_QUERIES + 1)  # all stopped early

    lo = attack(params, x0, ref, key=key, eps=0.99 * opt)
    assert not bool(np.any(lo.success)) and not bool(np.any(lo.best_success))
    np.testing.assert_array_equal(np.asarray(lo.queries), N_QUERIES + 1)
    assert np.all(_realized_l1(lo.x_adv, x0) <= 0.99 * opt * (1 + 1e-6))

    zero = attack(params, x0, ref, key=key, eps=0.0)
    np.testing.assert_array_equal(np.asarray(zero.x_adv), np.asarray(x0))
    np.testing.assert_array_equal(np.asarray(zero.best_x), np.asarray(x0))
    again = attack(params, x0, ref, key=key, eps=SUCCESS_FACTOR * opt)
    np.testing.assert_array_equal(np.asarray(again.x_adv), np.asarray(hi.x_adv))


def test_square_l1_query_cap_is_exact_and_warm_start_is_projected():
    batch = 8
    attack = make_square(affine_apply, norm="l1", n_queries=N_QUERIES)
    params, x0, ref, opt = _image_problem(batch, 11)
    caps = np.array([1, 2, 3, 17, 150, 301, 302, 10_000])
    res = attack(params, x0, ref, key=jax.random.PRNGKey(5), eps=0.99 * opt, max_queries=caps)
    # M = 1: the clean forward, the initialisation, then one forward per iteration while the next
    # one fits under the cap; never fooled below opt, so only the cap or the budget stops it
    np.testing.assert_array_equal(np.asarray(res.queries)[:, 0], np.minimum(caps, N_QUERIES + 1))
    np.testing.assert_array_equal(np.asarray(res.x_adv[0]), np.asarray(x0[0]))  # no query left
    assert not np.array_equal(np.asarray(res.x_adv[1]), np.asarray(x0[1]))
    far = np.clip(np.asarray(x0) + 0.3, 0.0, 1.0)  # a warm start far outside the ball: projected
    warm = attack(params, x0, ref, key=jax.random.PRNGKey(5), eps=0.99 * opt, max_queries=2, x_init=far)
    want = jax.vmap(lambda a, b, e: G.project(a, b, e, 1.0))(jnp.asarray(far), x0, jnp.asarray(0.99 * opt))
    np.testing.assert_allclose(np.asarray(warm.x_adv), np.asarray(want), atol=1e-6)


def test_reference_schedule_without_rescaling():
    # AutoAttack's SquareAttack(resc_schedule=False): the thresholds on the raw iteration count
    its = (0, 10, 11, 50, 51, 200, 201, 4000, 4001, 4999)
    got = [float(p_schedule(0.8, it, 5000, rescale=False)) for it in its]
    want = [0.8, 0.8, 0.4, 0.4, 0.2, 0.2, 0.1, 0.8 / 64, 0.8 / 128, 0.8 / 128]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert float(p_schedule(0.8, 4999, 5000)) == pytest.approx(0.8 / 512)  # rescaled: to 10,000
    with pytest.raises(TypeError, match="rescale_schedule"):
        make_square(affine_apply, norm="l1", rescale_schedule=1)


# -- AutoAttack's l1 version ------------------------------------------------------------------------


def test_autoattack_l1_version_runs_the_reference_attack_list():
    """``set_version('standard')`` with ``norm='L1'`` (fra31/auto-attack, autoattack.py): apgd-ce
    (5 restarts, use_largereps), apgd-t (5 targets, use_largereps), fab-t (9 targets), square
    (5,000 queries, p_init 0.8, resc_schedule False); none skipped."""
    import sarjax.attacks.autoattack as aa

    assert aa.stages_of("standard", "l1") == ("apgd-ce", "apgd-t", "fab-t", "square")
    mem = aa._Members(None, None, None, 1, 10)
    ctx = aa._Ctx(mem, 1.0, 10.0, 1, (0.0, 1.0), 100, 100, 5000, "standard")
    runs = {name: len(list(aa._runs(name, ctx, jax.random.PRNGKey(0)))) for name in aa.stages_of("standard", "l1")}
    assert runs == {"apgd-ce": 5, "apgd-t": 5, "fab-t": 9, "square": 1}
    assert all(aa._skip_reason(name, ctx) == "" for name in runs)
    assert aa._largereps(100) == [(3.0, 30), (2.0, 30), (1.0, 40)]
    assert (aa.SQUARE_QUERIES, aa.SQUARE_P_INIT, aa.SQUARE_RESCALE) == (5000, 0.8, False)


def test_autoattack_l1_square_stage_runs_with_exact_queries(monkeypatch):
    """The Square stage of AutoAttack at l1 on a 4 x 4 affine model: it runs (not skipped) with
    the reference's settings, its outputs lie in the l1 ball, and a point robust to the end paid
    ``1 + 1 + (SQ - 1) + 1`` queries (clean, init, proposals, verification) plus the clean 1."""
    import sarjax.attacks.autoattack as aa
    from sarjax.attacks.autoattack_checks import AutoAttackWarning

    seen = []
    real = aa.make_square

    def spy(*a, **k):
        seen.append(k)
        return real(*a, **k)

    monkeypatch.setattr(aa, "make_square", spy)
    params, x0, _, opt = _image_problem(8, 3)
    y = np.zeros(8, np.int32)
    eps = float(np.median(opt))
    sq = 40
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AutoAttackWarning)
        res = aa.autoattack(
            affine_apply, params, np.asarray(x0), y, attack=aa.autoattack_config("l1", eps, attacks=["square"],
            square_queries=sq), key=jax.random.PRNGKey(0), settings=aa.AutoAttackSettings(log=False),
        )  # fmt: skip
    assert [s.skipped for s in res.log] == [""]
    assert seen and all(k["norm"] == "l1" and k["rescale_schedule"] is False and k["p_init"] == 0.8 for k in seen)
    assert np.all(_realized_l1(res.x_adv[:, 0], x0) <= eps * (1 + 1e-6))
    below = opt < eps * 0.999  # only these can be broken
    assert not np.any(~res.robust[~below, 0])
    end = res.robust[:, 0]
    assert end.any()
    np.testing.assert_array_equal(res.queries[end, 0], 1 + sq + 2)
