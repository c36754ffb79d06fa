"""Known-answer tests on affine classifiers (the minimal perturbation is the distance to the
decision hyperplane in the dual norm): eps = 1.01 x optimum always succeeds, 0.99 x never,
eps = 0 returns x0, outputs stay in ball and box, the same key gives the same result."""

import jax
import numpy as np
import pytest

from sarjax.attacks.apgd import make_apgd, make_apgd_t
from sarjax.attacks.fgsm import make_fgsm
from sarjax.attacks.mifgsm import make_mifgsm
from sarjax.attacks.pgd import make_pgd
from sarjax.attacks.threat import canonical_norm

from _attacks_affine import affine_apply, binary_problem

FACTORIES = {
    "fgsm": lambda norm, targeted: make_fgsm(affine_apply, norm=norm, targeted=targeted),
    "pgd": lambda norm, targeted: make_pgd(affine_apply, norm=norm, targeted=targeted, restarts=2),
    "mifgsm": lambda norm, targeted: make_mifgsm(affine_apply, norm=norm, targeted=targeted),
    "apgd-ce": lambda norm, targeted: make_apgd(affine_apply, norm=norm, targeted=targeted),
    "apgd-dlr": lambda norm, targeted: make_apgd(affine_apply, norm=norm, targeted=targeted, loss="dlr"),
    # APGD-T is untargeted in its success criterion (misclassification), targets chosen inside
    "apgd-t": lambda norm, targeted: make_apgd_t(affine_apply, norm=norm),
}

CASES = []
_batches = [1, 3, 8]
for name, norms in [("fgsm", ["linf", "l2", "l1"]), ("pgd", ["linf", "l2", "l1"]), ("mifgsm", ["linf", "l2"])]:
    i = 0
    for norm in norms:
        for targeted in (False, True):
            CASES.append((name, norm, targeted, _batches[i % 3]))
            i += 1


def run_known_answer(attack, norm, targeted, batch, seed):
    params, x0, opt = binary_problem(norm, batch, seed)
    ref = np.full((batch,), 1 if targeted else 0, np.int32)
    key = jax.random.PRNGKey(seed)
    p = canonical_norm(norm)

    hi = attack(params, x0, ref, key=key, eps=1.01 * opt)
    assert hi.success.shape == (batch, 1)
    assert bool(np.all(hi.success)), f"failed at 1.01 x optimum: {np.asarray(hi.success).ravel()}"
    assert bool(np.all(hi.best_success))
    realized = np.linalg.norm(np.asarray(hi.x_adv, np.float64) - np.asarray(x0, np.float64), ord=p, axis=1)
    assert np.all(realized <= 1.01 * opt * (1 + 1e-6) + 1e-6)
    assert float(np.min(hi.x_adv)) >= 0.0 and float(np.max(hi.x_adv)) <= 1.0

    lo = attack(params, x0, ref, key=key, eps=0.99 * opt)
    assert not bool(np.any(lo.success)) and not bool(np.any(lo.best_success))

    zero = attack(params, x0, ref, key=key, eps=0.0)
    np.testing.assert_array_equal(np.asarray(zero.x_adv), np.asarray(x0))
    np.testing.assert_array_equal(np.asarray(zero.best_x), np.asarray(x0))

    again = attack(params, x0, ref, key=key, eps=1.01 * opt)
    np.testing.assert_array_equal(np.asarray(again.x_adv), np.asarray(hi.x_adv))
    np.testing.assert_array_equal(np.asarray(again.queries), np.asarray(hi.queries))


# APGD compiles are the slowest: one case per norm, modes and batch sizes spread across them.
CASES += [("apgd-ce", "linf", False, 1), ("apgd-ce", "l2", True, 3), ("apgd-ce", "l1", False, 8),
          ("apgd-dlr", "linf", True, 3), ("apgd-t", "l2", False, 8)]


@pytest.mark.parametrize("name,norm,targeted,batch", CASES)
def test_known_answer(name, norm, targeted, batch):
    run_known_answer(FACTORIES[name](norm, targeted), norm, targeted, batch, seed=batch)


class _ImageView:
    """Presents the flat affine problem as images [B, 2, 4, 1] (Square needs H, W, C)."""

    def __init__(self, attack):
        self.attack = attack

    def __call__(self, params, x0, ref, key=None, eps=None):
        res = self.attack(params, x0.reshape(-1, 2, 4, 1), ref, key=key, eps=eps)
        flat = lambda a: a.reshape(a.shape[0], -1)
        return res._replace(x_adv=flat(res.x_adv), best_x=flat(res.best_x))


@pytest.mark.parametrize("targeted,batch", [(False, 8), (True, 3)])
def test_known_answer_square_linf(targeted, batch):
    from sarjax.attacks.square import make_square
    attack = _ImageView(make_square(affine_apply, targeted=targeted, n_queries=300))
    run_known_answer(attack, "linf", targeted, batch, seed=batch)
