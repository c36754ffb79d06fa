"""The attack protocol (issue 14): state machines, the jit-safe and the audited entries.

The example attack below is the one in docs/attacks.md ("The protocol"), copied verbatim.
"""

# ---- the example from docs/attacks.md, "The protocol" (keep the two identical) ----
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _attacks_affine import affine_apply, binary_problem, pool_apply

from sarjax.attacks import AttackResult, PGDStep, attack_members, make_apgd_t, make_pgd, make_rounds, make_square
from sarjax.attacks import queries as Q
from sarjax.attacks.core import Attack, AttackFn, Problem
from sarjax.attacks.core import validate as V
from sarjax.attacks.core.evaluate import batch_logits
from sarjax.attacks.losses import cross_entropy, fooled


class BimConfig(NamedTuple):  # hashable: equal configs share one compiled kernel
    apply: Callable
    steps: int


class BimState(NamedTuple):
    problem: Problem
    x: jax.Array  # [B, *S] current iterate
    count: jax.Array  # [B] queries spent


def bim_losses(cfg, params, x, pr):  # summed over samples, so its x-gradient is per sample
    z = batch_logits(cfg.apply, params, x)  # [B, M, C]
    ce = jax.vmap(cross_entropy)(z, pr.ref)  # [B, M]
    w = pr.mask / jnp.maximum(pr.mask.sum(1, keepdims=True), 1.0)
    return jnp.sum(w * ce), (z, ce)


def bim_init(cfg, params, problem):
    return BimState(problem, problem.x0, jnp.zeros(problem.x0.shape[0], jnp.int32))


def bim_step(cfg, s, params):
    pr, m = s.problem, s.problem.ref.shape[1]
    ok = Q.allowed(s.count, 3 * m, pr.cap)  # this step's 2M, the final evaluation's M
    g = jax.grad(lambda x: bim_losses(cfg, params, x, pr)[0])(s.x)
    e = pr.eps.reshape((-1,) + (1,) * (s.x.ndim - 1))
    x = jnp.clip(jnp.clip(s.x + e / cfg.steps * jnp.sign(g), pr.x0 - e, pr.x0 + e), 0.0, 1.0)
    return s._replace(x=Q.freeze(ok, x, s.x), count=Q.charge(s.count, 2 * m, ok))


def bim_result(cfg, s, params):
    pr = s.problem
    _, (z, ce) = bim_losses(cfg, params, s.x, pr)
    success = jax.vmap(fooled, in_axes=(0, 0, None))(z, pr.ref, False)  # [B, M]
    obj = jnp.sum(pr.mask * ce, 1) / jnp.maximum(pr.mask.sum(1), 1.0)
    m = pr.ref.shape[1]  # each member: 2 per step + the final evaluation
    queries = jnp.broadcast_to((s.count // m + 1)[:, None], ce.shape)  # [B, M]
    return AttackResult(s.x, success, obj, ce, queries, s.x, success, obj)


def make_bim(apply, *, eps=None, steps=10):
    attack = Attack(bim_init, bim_step, bim_result, steps, BimConfig(apply, steps))
    return V.public(attack, name="bim", p=float("inf"), default_eps=eps, box=(0.0, 1.0), apply=apply)


# ---- end of the example ----


B, M = 4, 3


def _pool(seed=0):
    """Three affine members (binary problems of different seeds) and inputs [B, 8]."""
    ps = [binary_problem("linf", B, seed=seed + i)[0] for i in range(M)]
    params = {"W": jnp.stack([p["W"] for p in ps]), "b": jnp.stack([p["b"] for p in ps])}
    _, x0, _ = binary_problem("linf", B, seed=seed)
    return params, x0


ATTACKS = {
    "pgd": lambda: make_pgd(pool_apply, steps=3, step=PGDStep(restarts=2)),
    "apgd_t": lambda: make_apgd_t(pool_apply, n_iter=3, n_targets=9),  # 9 > C - 1 = 3: skipped runs
    "square": lambda: make_square(pool_apply, n_queries=4),
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_jit_entry_inside_user_jit_compiles_once_and_equals_public_entry(name):
    fn = ATTACKS[name]()
    assert isinstance(fn, AttackFn) and isinstance(fn.attack, Attack)
    params, x0 = _pool()
    if name == "square":
        x0 = x0.reshape(B, 2, 4, 1)
    ref = jnp.zeros((B,), jnp.int32)
    traces = []

    @jax.jit
    def user_step(params, x0, mask, key, eps, cap):  # e.g. a training step's inner maximisation
        traces.append(1)
        res = fn.jit(params, x0, ref, key=key, mask=mask, eps=eps, max_queries=cap)
        return res, jnp.mean(res.objective)

    rng = np.random.default_rng(0)
    for i in range(3):
        mask = jnp.asarray(rng.uniform(size=(B, M)) < 0.7, jnp.float32)
        key = jax.random.PRNGKey(10 + i)
        eps = jnp.asarray(rng.uniform(0.02, 0.2, B), jnp.float32)
        cap = jnp.asarray(rng.integers(3 * M, 60, B), jnp.int32)
        got, _ = user_step(params, x0, mask, key, eps, cap)
        want = fn(params, x0, ref, key=key, mask=mask, eps=eps, max_queries=cap)  # validated + audited entry
        for f in AttackResult._fields:
            np.testing.assert_array_equal(np.asarray(getattr(got, f)), np.asarray(getattr(want, f)), err_msg=f)
        assert np.all(np.asarray(got.queries).sum(-1) <= np.asarray(cap))  # queries [B, M]: the cap bounds the row
    assert len(traces) == 1  # new eps, masks, keys and caps never retrace


def test_public_entry_audits_a_broken_state_machine():
    # A state machine that leaves the ball (x0 + 2 eps) is caught by the public entry, not by .jit.
    def init(cfg, params, problem):
        return problem

    def step(cfg, problem, params):
        return problem

    def result(cfg, pr, params):
        x = jnp.clip(pr.x0 + 2 * pr.eps[:, None], 0, 1)
        z = jnp.zeros(pr.ref.shape)
        return AttackResult(x, z > 0, z[:, 0], z, jnp.zeros(pr.x0.shape[0], jnp.int32), x, z > 0, z[:, 0])

    apply = lambda params, x: jnp.zeros((x.shape[0], 3))  # noqa: E731
    fn = V.public(
        Attack(init, step, result, 1, None), name="bad", p=float("inf"), default_eps=0.05, box=(0.0, 1.0), apply=apply
    )
    x0, ref, key = jnp.full((2, 3), 0.5), jnp.zeros((2,), jnp.int32), jax.random.PRNGKey(0)
    with pytest.raises(ValueError, match=r"bad \(x_adv\) output failed the bound audit: 2/2 samples"):
        fn(None, x0, ref, key=key)
    res = fn.jit(None, x0, ref, key=key)  # the jit-safe entry does not audit
    np.testing.assert_allclose(np.asarray(res.x_adv), 0.6)


def test_key_is_required_everywhere():
    pool_params, x0 = _pool()
    params = pool_params
    ref = jnp.zeros((B,), jnp.int32)
    fn = make_pgd(pool_apply, eps=0.1, steps=1)
    # keyword-only and required: Python's own TypeError names it; an explicit None is refused too
    for entry in (fn, fn.jit, make_rounds(fn, 2, norm="linf")):
        with pytest.raises(TypeError, match="required keyword-only argument: 'key'"):
            entry(params, x0, ref, eps=0.1)
        with pytest.raises(TypeError, match="key is required"):
            entry(params, x0, ref, key=None, eps=0.1)
    with pytest.raises(TypeError, match="positional"):
        fn(params, x0, ref, None, jax.random.PRNGKey(0), eps=0.1)  # the former positional mask / key

    class _Stack:
        class arch:
            apply = staticmethod(lambda p, x: x @ p["W"] + p["b"])

        params = pool_params
        size = M

    class _Pool:
        stacks = (_Stack,)

    with pytest.raises(TypeError, match="key is required"):
        attack_members(_Pool, make_pgd, x0, ref, key=None, eps=0.1, steps=1)


@pytest.mark.parametrize("scale,fooled_all", [(1.02, True), (0.98, False)])
def test_docs_example_attack_known_answer(scale, fooled_all):
    # Affine binary problem: the linf optimum is x0 - opt * sign(w); BIM's sign steps walk straight to
    # x0 - eps * sign(w) (the optimum is interior), so eps just above opt fools every sample, just below none.
    params, x0, opt = binary_problem("linf", 6, seed=3)
    w = np.asarray(params["W"])[:, 0] * 2
    eps = (scale * opt).astype(np.float32)
    steps = 5
    fn = make_bim(affine_apply, steps=steps)
    key = jax.random.PRNGKey(0)
    res = fn(params, x0, jnp.zeros((6,), jnp.int32), key=key, eps=eps)
    np.testing.assert_allclose(np.asarray(res.x_adv), np.asarray(x0) - eps[:, None] * np.sign(w), atol=1e-5)
    assert np.all(np.asarray(res.success)[:, 0] == fooled_all)
    assert np.all(np.asarray(res.queries) == steps * 2 + 1)
    again = jax.jit(lambda p, x, e: fn.jit(p, x, jnp.zeros((6,), jnp.int32), key=key, eps=e))(params, x0, eps)
    np.testing.assert_array_equal(np.asarray(again.x_adv), np.asarray(res.x_adv))
    # a cap of 4 queries: the first step fits (its 2 + the final evaluation's 1), the second does not
    capped = fn(params, x0, jnp.zeros((6,), jnp.int32), key=key, eps=eps, max_queries=4)
    assert np.all(np.asarray(capped.queries) == 3)
