"""The bound audit and the chained-rounds regression (the Note)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _attacks_affine import affine_apply

from sarjax.attacks.audit import audit, check
from sarjax.attacks.pgd import PGDStep, make_pgd
from sarjax.attacks.rounds import make_rounds
from sarjax.attacks.threat import Threat


def test_audit_reports_norms_box_and_nan():
    x0 = np.full((4, 2, 2), 0.5, np.float32)
    xa = x0.copy()
    xa[0, 0, 0] += 0.1  # within eps = 0.1
    xa[1, 0, 1] += 0.3  # linf 0.3 > eps
    xa[2, 1, 1] = 1.2  # out of the box (and out of the ball)
    xa[3, 0, 0] = np.nan
    rep = audit(x0, xa, Threat("linf", 0.1))
    np.testing.assert_allclose(rep.norm[:3], [0.1, 0.3, 0.7], rtol=1e-6)
    np.testing.assert_array_equal(rep.within, [True, False, False, False])
    assert rep.box_violation[2] == pytest.approx(0.2, rel=1e-6) and rep.nan[3] and not rep.ok
    with pytest.raises(ValueError, match=r"sample 3: non-finite.*sample 2.*0\.7.*sample 1: linf norm 0\.3"):
        check(x0, xa, Threat("linf", 0.1), what="demo")
    # per-sample eps and other norms
    rep2 = audit(x0[:2], xa[:2], Threat("l1", [0.1, 0.31]))
    assert rep2.ok
    assert not audit(x0[:2], xa[:2], Threat("l0", 0)).ok
    assert audit(x0[:2], xa[:2], Threat("l0", 1)).ok
    with pytest.raises(ValueError, match="shape"):
        audit(x0, xa[:2], Threat("linf", 0.1))


def _chained_rounds_buggy(attack, params, x0, ref, key, eps, rounds):
    """The published bug: round k restarts from round k-1's output AND projects around it."""
    x = x0
    for r in range(rounds):
        res = attack(params, x, ref, key=jax.random.fold_in(key, r), eps=eps)  # x, not x0!
        x = res.x_adv
    return x


def test_chained_rounds_bug_is_flagged_and_combinator_stays_in_ball():
    # A linear model whose gradient sign never changes: every round walks eps further.
    rng = np.random.default_rng(0)
    w = rng.choice([-1.0, 1.0], 8) * rng.uniform(0.5, 1.5, 8)
    params = {
        "W": jnp.asarray(np.stack([w, -w, 0 * w, 0 * w], 1), jnp.float32),
        "b": jnp.asarray([3.0, -3.0, -100.0, -100.0], jnp.float32),
    }  # never fooled
    x0 = jnp.full((1, 8), 0.5, jnp.float32)
    ref = jnp.zeros((1,), jnp.int32)
    eps, k = 8 / 255, 4
    attack = make_pgd(affine_apply, norm="linf", step=PGDStep(restarts=2))  # same kernel as a known-answer case
    x_bug = _chained_rounds_buggy(attack, params, x0, ref, jax.random.PRNGKey(0), eps, k)
    rep = audit(x0, x_bug, Threat("linf", eps))
    assert not rep.ok
    np.testing.assert_allclose(rep.norm, k * eps, rtol=1e-4)  # realized linf = k * eps
    with pytest.raises(ValueError, match=r"linf norm 0\.125\d* vs eps 0\.0313\d* \(x4\)"):
        check(x0, x_bug, Threat("linf", eps), what="chained rounds")

    combined = make_rounds(attack, k, norm="linf")(params, x0, ref, key=jax.random.PRNGKey(0), eps=eps)
    rep_ok = audit(x0, combined.x_adv, Threat("linf", eps))
    assert rep_ok.ok and np.all(rep_ok.norm <= eps * (1 + 1e-6))
    np.testing.assert_allclose(rep_ok.norm, eps, rtol=1e-5)  # still uses the whole budget
    assert np.all(np.asarray(combined.queries) == k * (1 + 2 * (40 * 2 + 1)))


# The public entry's audit of a broken state machine: tests/attacks/test_attacks_protocol.py.
