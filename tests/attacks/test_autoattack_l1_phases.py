"""AutoAttack's l1 phases (``use_largereps``): the phase at eps always runs.

AutoAttack splits ``n_iter`` into ``ceil(0.3 n)``, ``ceil(0.3 n)`` and the rest at ``3 eps, 2 eps,
eps``. For ``n_iter`` 2 and 4 the rest is 0: the cascade used to drop the eps phase, return the
``2 eps`` phase's point and be refused by its own audit (a crash of every l1 run at those budgets).
"""

import math
import warnings

import jax
import numpy as np
import pytest

from sarjax.attacks.autoattack import LARGEREPS, AutoAttackSettings, _largereps, autoattack, autoattack_config
from sarjax.attacks.autoattack_checks import AutoAttackWarning
from tests.attacks.test_autoattack import affine_problem, linear


def _reference_split(n):
    iters = [math.ceil(s * n) for _, s in LARGEREPS[:-1]]
    return [*iters, n - sum(iters)]


@pytest.mark.parametrize("n", range(1, 202))
def test_phases_sum_to_n_iter_and_end_at_eps(n):
    phases = _largereps(n)
    assert sum(i for _, i in phases) == n
    assert phases[-1][0] == 1.0 and phases[-1][1] >= 1  # the phase at eps runs
    assert all(i >= 1 for _, i in phases)
    ref = _reference_split(n)
    if ref[-1] >= 1:  # where AutoAttack's own split is bound-true, it is kept exactly
        assert [i for _, i in phases] == ref


def test_known_splits():
    assert _largereps(100) == [(3.0, 30), (2.0, 30), (1.0, 40)]  # AutoAttack's default budget
    assert _largereps(4) == [(3.0, 1), (2.0, 2), (1.0, 1)]  # the reference: 2, 2, 0
    assert _largereps(2) == [(2.0, 1), (1.0, 1)]
    assert _largereps(1) == [(1.0, 1)]


def test_l1_apgd_with_four_iterations_stays_in_the_ball():
    params, x, y, _ = affine_problem("linf", batch=8, seed=2)
    eps = 3.0  # above every point's l1 distance to its boundary (1.5 at most) with the box in the way
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AutoAttackWarning)
        res = autoattack(
            linear,
            params,
            x,
            y,
            attack=autoattack_config("l1", eps, attacks=("apgd-ce",), n_iter=4),
            key=jax.random.PRNGKey(0),
            settings=AutoAttackSettings(log=False, checks=False),
        )
    d = np.abs(np.asarray(res.x_adv).reshape(len(x), -1) - x.reshape(len(x), -1)).sum(1)
    assert (d <= eps * (1 + 1e-5)).all(), d
    assert not res.robust.all()  # the attack did something
