"""Known answers: on affine classifiers the minimal perturbation is exact (see _minnorm_ref)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _minnorm_ref import affine_min_norm, brute_force_l0, make_affine

from sarjax.attacks import alma, apgd_min, ddn, fab, fmn, pdgd, pdpgd, sigma_zero
from sarjax.attacks import minnorm as mn

# (batch, input shape) combinations, rotated over the cases so that every attack family
# meets several and every combination is met by most norms.
COMBOS = [(1, (8,)), (3, (4, 6)), (8, (5, 7, 7, 1))]

# name, spec, norm, query cap, tolerance on norm / optimum
CASES = [
    ("fmn", fmn.spec(), 2, 400, 1.05),
    ("fmn", fmn.spec(), math.inf, 400, 1.05),
    ("fmn", fmn.spec(), 1, 400, 1.05),
    ("fmn", fmn.spec(), 0, 400, 1.5),
    ("ddn", ddn.spec(), 2, 400, 1.05),
    ("apgd_min-ce", apgd_min.spec(), 2, 400, 1.05),
    ("apgd_min-ce", apgd_min.spec(), math.inf, 400, 1.05),
    # l1: the sign step's element count rounds to nearest (k = 1 reachable), see apgd_min's
    # module doc; with AutoAttack's round-up these two measured up to 1.13x (1.34x over 120 draws)
    ("apgd_min-ce", apgd_min.spec(), 1, 400, 1.05),
    ("apgd_min-dlr", apgd_min.spec(loss="dlr"), 1, 400, 1.05),
    ("alma", alma.spec(), 2, 1000, 1.05),
    # ALMA l1 at the paper's setting (first step 0.5 in l1).  Its step sizes are absolute, tuned
    # for MNIST-scale l1 norms (5-15); on these instances (optima 0.01-0.5) the RMSProp
    # subgradient steps leave residual mass on every element.  Measured 2.36-2.51x worst here
    # (adv-lib's default setting: 2.9-3.6x; adv-lib gives the same norms, see docs/minnorm.md);
    # test_alma_l1_paper_setting_mnist_scale checks the 1.05x regime
    ("alma-paper", alma.spec(init_lr_distance="paper"), 1, 2000, 3.0),
    ("pdgd", pdgd.spec(), 2, 1000, 1.05),
    ("pdpgd", pdpgd.spec(), 2, 1000, 1.05),
    ("pdpgd", pdpgd.spec(), math.inf, 1000, 1.05),
    ("pdpgd", pdpgd.spec(), 1, 1000, 1.05),
    ("pdpgd", pdpgd.spec(), 0, 1000, 1.5),
    ("sigma_zero", sigma_zero.spec(), 0, 1000, 1.5),
    ("fab", fab.spec(), 2, 300, 1.05),
    ("fab-t", fab.spec(targeted=True), math.inf, 300, 1.05),
    ("fab", fab.spec(), 1, 300, 1.05),
]


def _affine_params(W, b, temperature=30.0):
    # Scaling the logits leaves every decision boundary (hence the optimum) unchanged; a
    # sharper softmax makes the CE gradient point at the nearest boundary, as on real nets.
    return jnp.asarray(W) * temperature, jnp.asarray(b) * temperature


def _apply(params, x):
    return x.reshape(x.shape[0], -1) @ params[0] + params[1]  # [B, C]: one member


def _mixed(spec, params, x0, y, targets, key, p, T):
    """Samples with ``targets < 0`` untargeted, the others targeted at their target with any
    misclassification counting (the Frontiers pool's mode): two calls, each sample keeping
    its own random stream (``sample_ids``).  Returns [B] norms, success, queries and the
    [B, T // 10] trajectories of member 0."""
    B = len(y)
    norm, succ = np.full(B, np.nan), np.zeros(B, bool)
    q, traj, xa = np.zeros(B, np.int64), np.zeros((B, T // 10)), np.zeros_like(x0)
    for tg, idx in ((False, np.flatnonzero(targets < 0)), (True, np.flatnonzero(targets >= 0))):
        if idx.size == 0:
            continue
        fn = mn.make(spec, _apply, norm=p, max_queries=T, targeted=tg, success="untargeted")
        ref = targets[idx] if tg else y[idx]
        r = fn(params, x0[idx], ref, key=key, sample_ids=idx, labels=y[idx] if tg else None)
        norm[idx], succ[idx] = np.asarray(r.norm)[:, 0], np.asarray(r.success)[:, 0]
        q[idx], traj[idx], xa[idx] = (
            np.asarray(r.queries)[:, 0],
            np.asarray(r.trajectory)[:, 0],
            np.asarray(r.x_adv)[:, 0],
        )
    return norm, succ, q, traj, xa


@pytest.mark.parametrize("k", range(len(CASES)), ids=[f"{c[0]}-l{c[2]}" for c in CASES])
def test_affine_known_answer(k):
    name, spec, p, T, tol = CASES[k]
    B, shape = COMBOS[k % 3]
    W, b, x0, y = make_affine(100 + k, shape, C=5, B=B, nearest_is_runner_up=p)
    ref = [affine_min_norm(W, b, x0[i], y[i], p) for i in range(B)]
    opt = np.array([r[0] for r in ref])
    assert np.isfinite(opt).all()
    # every other sample runs targeted at the class whose boundary is nearest (any
    # misclassification still counts, as in the Frontiers pool)
    targets = np.where(np.arange(B) % 2 == 1, [r[1] for r in ref], -1).astype(np.int32)
    got, succ, queries, traj, xa = _mixed(spec, _affine_params(W, b), x0, y, targets, jax.random.key(k), p, T)
    assert succ.all(), f"{name} l{p}: failed on {np.flatnonzero(~succ)}"
    ratio = got / opt
    assert (ratio <= tol).all(), f"{name} l{p}: norm/optimum {ratio}"
    # nothing can beat the exact optimum (catches a wrong norm or a non-adversarial point)
    assert (ratio >= 1 - 1e-4).all(), f"{name} l{p}: below the optimum {ratio}"
    assert xa.shape == x0.shape
    assert traj.shape == (B, T // 10)
    assert (queries <= T).all()


def test_l0_reference_matches_brute_force():
    for seed in range(6):
        W, b, x0, y = make_affine(seed, (6,), C=4, B=2, scale=0.6)
        for i in range(2):
            assert affine_min_norm(W, b, x0[i], y[i], 0)[0] == brute_force_l0(W, b, x0[i], y[i])


def test_reference_l2_closed_form_inside_box():
    # two classes, tiny margin: the l2 optimum is the hyperplane distance |s| / ||a||
    rng = np.random.default_rng(0)
    W = rng.normal(size=(10, 2)).astype(np.float32)
    x0 = np.full(10, 0.5, np.float32)
    b = np.array([0.0, -(x0 @ (W[:, 1] - W[:, 0])) - 0.05], np.float32)
    y = int(np.argmax(x0 @ W + b))
    a = W[:, 1 - y] - W[:, y]
    s = x0 @ W + b
    expect = (s[y] - s[1 - y]) / np.linalg.norm(a)
    assert affine_min_norm(W, b, x0, y, 2)[0] == pytest.approx(expect, rel=1e-6)
    assert affine_min_norm(W, b, x0, y, math.inf)[0] == pytest.approx((s[y] - s[1 - y]) / np.abs(a).sum(), rel=1e-6)


def _mnist_scale_affine(seed, B, lo=5.0, hi=15.0, draws=16):
    # 28x28x1 inputs, 10 classes, weights scaled so that the l1 optima fall in MNIST's range
    # (the benchmark's ALMA l1 medians: 8.1 standard, 12 PGD-AT); of `draws` inputs, the
    # first B whose optimum lies in [lo, hi]
    W, b, x0, y = make_affine(seed, (28, 28, 1), C=10, B=draws, scale=0.1, nearest_is_runner_up=1)
    ref = [affine_min_norm(W, b, x0[i], y[i], 1) for i in range(draws)]
    opt, tgt = np.array([r[0] for r in ref]), np.array([r[1] for r in ref])
    keep = np.flatnonzero((opt >= lo) & (opt <= hi))[:B]
    return W, b, x0[keep], y[keep], tgt[keep], opt[keep]


def test_alma_l1_paper_setting_mnist_scale():
    # At MNIST-scale optima, ALMA l1 with the paper's first-step distance reaches the optimum;
    # adv-lib's default setting (lr 0.1) stops 1.17-1.29x above it on this draw.
    # Over 8 draws (16 samples) measured median 1.009x, worst 1.12x; this draw holds the worst.
    W, b, x0, y, tgt, opt = _mnist_scale_affine(4, 3)
    t = np.where(np.arange(len(y)) % 2 == 1, tgt, -1).astype(np.int32)
    norm, succ, _, _, _ = _mixed(
        alma.spec(init_lr_distance="paper"), _affine_params(W, b), x0, y, t, jax.random.key(4), 1, 2000
    )
    assert succ.all()
    r = norm / opt
    assert r.size == 3 and (r >= 1 - 1e-4).all(), r
    # two of three within 1.02x, none above 1.2x (measured 1.006, 1.012, 1.12)
    assert np.sort(r)[1] <= 1.02 and (r <= 1.2).all(), f"norm/optimum {r}"


def test_alma_init_lr_finder_known_answer():
    # x0 = 0.5, g = 1: the step clip(x0 - lr g) has l1 size d * lr and l2 size sqrt(d) * lr
    # (while lr < 0.5), so the first step moves exactly `target` at lr = target / d (l1) or
    # target / sqrt(d) (l2); the doubling phase must also pass lr = 1 (target above d * 0.5
    # is out of reach: the largest lr is kept, no NaN)
    d = 24
    x0, g = jnp.full((4, 6), 0.5), jnp.ones((4, 6))
    # 20 bisection steps from the bracket [0, 1]: lr to within 2^-20
    assert float(alma._init_lr(x0, g, 1.0, 0.5)) == pytest.approx(0.5 / d, abs=2.0**-20)
    assert float(alma._init_lr(x0, g, 2.0, 0.1)) == pytest.approx(0.1 / np.sqrt(d), abs=2.0**-20)
    assert np.isfinite(float(alma._init_lr(x0, g, 1.0, 100.0)))


def test_alma_init_lr_distance_validation_and_zero_gradient():
    for bad in (0.0, -1.0, float("nan"), "l1", True):
        with pytest.raises(ValueError, match="init_lr_distance"):
            alma.spec(init_lr_distance=bad)
    assert dict(alma.spec(init_lr_distance=1).hp)["init_lr_distance"] == 1.0
    # zero gradient: the first step takes a random direction, the rest stays finite and unsuccessful
    bias = jnp.asarray([3.0, 1.0, 0.0, -1.0], jnp.float32)
    apply = lambda prm, x: prm + 0.0 * jnp.sum(x, axis=(1,))[:, None]
    x0 = np.random.default_rng(0).uniform(0, 1, (2, 3)).astype(np.float32)
    fn = alma.make_alma(apply, norm=1, max_queries=41, init_lr_distance="paper")
    r = fn(bias, x0, np.zeros(2, np.int32), key=jax.random.key(0))
    assert not np.asarray(r.success).any() and np.isinf(np.asarray(r.trajectory)).all()
    assert (np.asarray(r.queries) <= 41).all()
    np.testing.assert_array_equal(np.asarray(r.x_adv)[:, 0], x0)
