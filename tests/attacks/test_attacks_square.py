"""Square attack, l2 variant: the window pattern and the mass-moving update against numpy
references written from the paper's description (Andriushchenko et al. 2020, Sec. 4.2 and
Alg. 3), known answers on affine classifiers, the audit, determinism and the query cap."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _attacks_affine import affine_apply, binary_problem

from sarjax.attacks.square import (
    centred_pattern,
    l2_init_perturbation,
    l2_window_side,
    l2_window_update,
    make_square,
    p_schedule,
)

SHAPE = (4, 4, 1)  # 16 input elements: windows of side 3 at 4 positions
N_QUERIES = 300
# Square-l2 is a random search over a finite set of window moves; on these 16-element affine
# problems (w has random signs, i.e. no spatial smoothness) its accepted iterates stall at a
# cosine of 0.54-0.85 with the optimal direction (measured over 4 seeds, 5,000 iterations), so
# eps must exceed about 1 / 0.54 = 1.85 x the optimum.  Measured: 64/64 samples (8 seeds x 8)
# fooled at 2.0 x with 300 queries, 63/64 at 1.8 x; 2.5 x leaves a margin for RNG changes.
# For reference, torchattacks 3.5.1's Square-l2 (AutoAttack's port) fools 8/64 at 2.0 x and
# 24/64 at 2.5 x on the same problems at 5 x 5 (it never moves the last row/column after
# initialisation, see the module docstring of sarjax.attacks.square).
SUCCESS_FACTOR = 2.5


def _ref_rectangles(h, w):
    """Concentric rectangles around (h // 2, w // 2): value sum over the rectangles of
    half-size k = 0 .. max(h, w) // 2 containing the element, of 1 / (k + 1)^2; unit l2."""
    out = np.zeros((h, w))
    ci, cj = h // 2, w // 2
    for k in range(max(h // 2, w // 2) + 1):
        for i in range(h):
            for j in range(w):
                if abs(i - ci) <= k and abs(j - cj) <= k:
                    out[i, j] += 1.0 / (k + 1) ** 2
    return out / np.linalg.norm(out)


def _ref_eta(s, flip):
    eta = np.zeros((s, s))
    if s // 2 > 0:
        eta[: s // 2] = _ref_rectangles(s // 2, s)
    eta[s // 2 :] = -_ref_rectangles(s - s // 2, s)
    eta /= np.linalg.norm(eta)
    return eta.T if flip else eta


@pytest.mark.parametrize("flip", [False, True])
def test_centred_pattern_matches_the_paper_construction(flip):
    max_side = 9
    fn = jax.jit(lambda a, b, s: centred_pattern(a, b, s, flip, max_side))
    for s in range(1, max_side + 1):
        # evaluate on a larger grid, offset by 2: zero outside the window
        a = jnp.arange(-2, max_side + 2)[:, None]
        b = jnp.arange(-2, max_side + 2)[None, :]
        got = np.asarray(fn(a, b, s))
        want = np.zeros(got.shape)
        want[2 : 2 + s, 2 : 2 + s] = _ref_eta(s, flip)
        np.testing.assert_allclose(got, want, atol=1e-6, err_msg=f"s={s}")


def _ref_update(delta, r1, c1, r2, c2, s, flip, sign, eps):
    delta = np.asarray(delta, np.float64).copy()
    C = delta.shape[-1]
    eta = _ref_eta(s, flip)
    total = np.linalg.norm(delta)
    m1 = np.zeros(delta.shape[:2], bool)
    m1[r1 : r1 + s, c1 : c1 + s] = True
    m2 = np.zeros(delta.shape[:2], bool)
    m2[r2 : r2 + s, c2 : c2 + s] = True
    new = delta.copy()
    new[m2] = 0.0
    for ch in range(C):
        win = delta[r1 : r1 + s, c1 : c1 + s, ch]
        cand = eta * sign[ch] + win / (np.linalg.norm(win) + 1e-12)
        union = np.linalg.norm(delta[..., ch][m1 | m2])
        mass = np.sqrt(max(eps**2 - total**2, 0.0) / C + union**2)
        new[r1 : r1 + s, c1 : c1 + s, ch] = cand / np.linalg.norm(cand) * mass
    return new * eps / np.linalg.norm(new)


@pytest.mark.parametrize(
    "r1,c1,r2,c2,s,flip",
    [
        (0, 1, 3, 3, 3, False),  # disjoint windows
        (1, 1, 2, 0, 3, True),  # overlapping
        (2, 2, 2, 2, 5, False),  # W2 == W1
        (0, 0, 6, 6, 1, True),
    ],
)  # single elements
def test_l2_window_update_matches_the_paper_update(r1, c1, r2, c2, s, flip):
    rng = np.random.default_rng(s + 7 * r1)
    delta = rng.normal(0.0, 0.05, (7, 7, 3)).astype(np.float32)
    delta[r1 : r1 + 1, c1] = 0.0  # a zero element inside W1 does not matter
    sign = np.array([1.0, -1.0, 1.0], np.float32)
    eps = 0.9  # > ||delta||: unused budget is shared between channels
    fn = jax.jit(l2_window_update, static_argnums=9)
    got = np.asarray(fn(jnp.asarray(delta), r1, c1, r2, c2, s, flip, jnp.asarray(sign), eps, 6))
    want = _ref_update(delta, r1, c1, r2, c2, s, flip, sign, eps)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    assert abs(np.linalg.norm(got) - eps) < 1e-5


def test_l2_window_side_and_schedule():
    side = jax.jit(l2_window_side, static_argnums=(1, 2, 3))
    # 32 x 32 x 3 (n = 3072): round(sqrt(p * 1024)), at least 3, odd
    assert int(side(0.8, 3072, 3, 31)) == 29  # sqrt(819.2) = 28.6 -> 29
    assert int(side(0.1, 3072, 3, 31)) == 11  # sqrt(102.4) = 10.1 -> 10 -> 11
    assert int(side(0.05, 3072, 3, 31)) == 7  # sqrt(51.2) = 7.2 -> 7
    assert int(side(0.8 / 512, 3072, 3, 31)) == 3  # sqrt(1.6) -> 1 -> at least 3
    assert int(side(0.8, 16, 1, 3)) == 3  # sqrt(12.8) -> 4 -> 5 -> capped at 3
    # p halves at 10, 50, 200, ... of 10,000 iterations (rescaled to n_iters)
    ps = [float(p_schedule(0.8, it, 5000)) for it in (0, 5, 6, 25, 26, 100, 101, 4999)]
    np.testing.assert_allclose(ps, [0.8, 0.8, 0.4, 0.4, 0.2, 0.2, 0.1, 0.8 / 512], rtol=1e-6)


def test_l2_initialisation_has_norm_eps_and_tiles():
    init = jax.jit(lambda k, e: l2_init_perturbation(k, (10, 12, 3), e))
    d = np.asarray(init(jax.random.PRNGKey(3), 0.7))
    assert abs(np.linalg.norm(d) - 0.7) < 1e-5
    # side 10 // 5 = 2, tiles from row/column 0, 5 x 6 tiles cover the image; inside a tile every
    # channel is +-eta(2) (one transpose per tile), so |d| is the same pattern in every channel
    np.testing.assert_allclose(np.abs(d[..., 0]), np.abs(d[..., 1]), atol=1e-7)
    tile = np.abs(d[:2, :2, 0])
    tile = tile / np.linalg.norm(tile)
    ok = [np.allclose(tile, np.abs(_ref_eta(2, f)), atol=1e-6) for f in (False, True)]
    assert any(ok)
    assert np.abs(np.asarray(init(jax.random.PRNGKey(3), 0.0))).max() == 0


def _image_problem(batch, seed, targeted):
    params, x0, opt = binary_problem("l2", batch, seed, d=int(np.prod(SHAPE)))
    ref = np.full((batch,), 1 if targeted else 0, np.int32)
    return params, x0.reshape(batch, *SHAPE), ref, opt


def _realized_l2(x, x0):
    diff = np.asarray(x, np.float64).reshape(x.shape[0], -1) - np.asarray(x0, np.float64).reshape(x.shape[0], -1)
    return np.linalg.norm(diff, axis=1)


@pytest.mark.parametrize("targeted", [False, True])
def test_square_l2_known_answer_audit_determinism(targeted):
    batch = 8
    attack = make_square(affine_apply, norm="l2", n_queries=N_QUERIES, targeted=targeted)
    params, x0, ref, opt = _image_problem(batch, 11, targeted)
    key = jax.random.PRNGKey(5)

    hi = attack(params, x0, ref, key=key, eps=SUCCESS_FACTOR * opt)
    assert bool(np.all(hi.success)) and bool(np.all(hi.best_success))
    assert np.all(_realized_l2(hi.x_adv, x0) <= SUCCESS_FACTOR * opt * (1 + 1e-6))
    # every sample stopped early (all fooled) and paid one forward per evaluated point
    assert np.all(np.asarray(hi.queries) < N_QUERIES + 1)

    lo = attack(params, x0, ref, key=key, eps=0.99 * opt)  # the ball never reaches the hyperplane
    assert not bool(np.any(lo.success)) and not bool(np.any(lo.best_success))
    np.testing.assert_array_equal(np.asarray(lo.queries), N_QUERIES + 1)
    # without box clipping every evaluated point lies on the sphere of radius eps
    np.testing.assert_allclose(_realized_l2(lo.x_adv, x0), 0.99 * opt, rtol=1e-5)

    zero = attack(params, x0, ref, key=key, eps=0.0)
    np.testing.assert_array_equal(np.asarray(zero.x_adv), np.asarray(x0))
    np.testing.assert_array_equal(np.asarray(zero.best_x), np.asarray(x0))

    again = attack(params, x0, ref, key=key, eps=SUCCESS_FACTOR * opt)
    for a, b in zip(again, hi):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    other = attack(params, x0, ref, key=jax.random.PRNGKey(6), eps=0.99 * opt)
    assert not np.array_equal(np.asarray(other.x_adv), np.asarray(lo.x_adv))

    # huge radius: the box clips, the output stays in ball and box (the call audits too)
    big = attack(params, x0, ref, key=key, eps=np.linspace(0.5, 3.0, batch))
    assert float(np.min(big.x_adv)) >= 0.0 and float(np.max(big.x_adv)) <= 1.0
    assert np.any(np.asarray(big.x_adv) == 0.0) or np.any(np.asarray(big.x_adv) == 1.0)
    assert np.all(_realized_l2(big.x_adv, x0) <= np.linspace(0.5, 3.0, batch) * (1 + 1e-6))
    assert np.all(_realized_l2(big.best_x, x0) <= np.linspace(0.5, 3.0, batch) * (1 + 1e-6))


def test_square_l2_query_cap_is_exact_and_warm_start_is_projected():
    batch = 8
    attack = make_square(affine_apply, norm="l2", n_queries=N_QUERIES)
    params, x0, ref, opt = _image_problem(batch, 11, False)
    caps = np.array([1, 2, 3, 17, 150, 301, 302, 10_000])
    res = attack(params, x0, ref, key=jax.random.PRNGKey(5), eps=0.99 * opt, max_queries=caps)
    # M = 1: the clean forward, the initialisation, then one forward per iteration while the
    # next one fits under the cap; never fooled at 0.99 x, so only the cap or the budget stops it
    np.testing.assert_array_equal(np.asarray(res.queries)[:, 0], np.minimum(caps, N_QUERIES + 1))
    np.testing.assert_array_equal(np.asarray(res.x_adv[0]), np.asarray(x0[0]))  # no query left
    assert not np.array_equal(np.asarray(res.x_adv[1]), np.asarray(x0[1]))

    far = np.clip(np.asarray(x0) + 0.3, 0.0, 1.0)  # warm start far outside the ball
    warm = attack(params, x0, ref, key=jax.random.PRNGKey(5), eps=0.99 * opt, max_queries=2, x_init=far)
    assert np.all(_realized_l2(warm.x_adv, x0) <= 0.99 * opt * (1 + 1e-6))
    direction = (far - np.asarray(x0)).reshape(batch, -1)
    moved = (np.asarray(warm.x_adv) - np.asarray(x0)).reshape(batch, -1)
    cos = np.sum(direction * moved, 1) / np.linalg.norm(direction, axis=1) / np.linalg.norm(moved, axis=1)
    np.testing.assert_allclose(cos, 1.0, atol=1e-5)  # projection of an interior ray: rescaled


def test_square_rejects_unsupported_norms_and_parameters():
    with pytest.raises(ValueError, match="'linf', 'l2' or 'l1'"):
        make_square(affine_apply, norm="l0")
    with pytest.raises(ValueError, match="'linf', 'l2' or 'l1'"):
        make_square(affine_apply, norm=0)
    with pytest.raises(ValueError, match="p_init"):
        make_square(affine_apply, norm="l2", p_init=0.0)
    with pytest.raises(ValueError, match="n_queries"):
        make_square(affine_apply, norm="l2", n_queries=0)
    attack = make_square(affine_apply, norm="l2", n_queries=2)
    params, x0, ref, opt = _image_problem(2, 0, False)
    with pytest.raises(ValueError, match=r"images \[B, H, W, C\]"):
        attack(params, x0.reshape(2, -1), ref, key=jax.random.PRNGKey(0), eps=0.1)
