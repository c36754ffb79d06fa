"""The one public surface (issue 35): every attack is exported as make_<name>, called
``fn(params, inputs, ref, *, key, mask=None, ...)`` with the key keyword-only and required, and
returns the one result base (``x_adv``, ``success [B, M]``, ``queries [B, M]``): every factory's
result against :class:`sarjax.attacks.AttackOutput` is checked in test_attack_output_protocol.py."""

import inspect
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _attacks_affine import affine_apply, pool_apply

import sarjax.attacks as A

KEY = jax.random.PRNGKey(0)
B, M, D = 3, 2, 8


def _pool_problem():
    rng = np.random.default_rng(0)
    params = {"W": jnp.asarray(rng.normal(size=(M, D, 4)), jnp.float32), "b": jnp.zeros((M, 4), jnp.float32)}
    x0 = jnp.asarray(rng.uniform(0.3, 0.7, (B, D)), jnp.float32)
    y = jnp.asarray(np.argmax(np.asarray(pool_apply(params, x0))[0], -1), jnp.int32)
    return params, x0, y


IMAGE_ENTRIES = {
    "pgd": lambda: A.make_pgd(pool_apply, eps=0.05, steps=2),
    "fgsm": lambda: A.make_fgsm(pool_apply, eps=0.05),
    "mifgsm": lambda: A.make_mifgsm(pool_apply, eps=0.05, steps=2),
    "apgd": lambda: A.make_apgd(pool_apply, eps=0.05, n_iter=2),
    "apgd_t": lambda: A.make_apgd_t(pool_apply, eps=0.05, n_iter=2, n_targets=1),
    "joint_pgd": lambda: A.make_joint_pgd(pool_apply, eps=0.05, steps=2, step=A.JointPGDStep(restarts=1)),
    "fmn": lambda: A.make_fmn(pool_apply, norm="linf", max_queries=20),
    "ddn": lambda: A.make_ddn(pool_apply, max_queries=20),
    "rounds": lambda: A.make_rounds(A.make_pgd(pool_apply, eps=0.05, steps=2), 2, norm="linf"),
}


def test_every_attack_factory_is_exported_from_sarjax_attacks():
    names = {n for n in A.__all__ if n.startswith("make_")}
    modules = ("alma", "apgd_min", "ddn", "fab", "fmn", "pdgd", "pdpgd", "sigma_zero")
    for mod in modules:
        assert f"make_{mod}" in names and getattr(A, f"make_{mod}") is getattr(getattr(A, mod), f"make_{mod}")
    for n in ("make_autoattack", "make_member_attack", "make_rounds"):
        assert n in names
    for n in ("make_joint_gcg", "make_cross_beast", "make_autodan_jit"):  # removed: one factory per attack
        assert n not in names and not hasattr(A, n) and not hasattr(A.text, n)
    for n in ("make_gcg", "make_beast", "make_autodan"):
        assert n in names


@pytest.mark.parametrize("name", sorted(IMAGE_ENTRIES))
def test_call_shape_key_keyword_only_and_required(name):
    fn = IMAGE_ENTRIES[name]()
    for entry in (fn.__call__, fn.jit):
        sig = inspect.signature(entry)
        key, mask = sig.parameters["key"], sig.parameters["mask"]
        assert key.kind is inspect.Parameter.KEYWORD_ONLY and key.default is inspect.Parameter.empty
        assert mask.kind is inspect.Parameter.KEYWORD_ONLY and mask.default is None
        assert list(sig.parameters)[:3] == ["params", "x0", "ref"]


def test_no_public_attack_signature_defaults_the_key():
    root = Path(A.__file__).parent
    hits = []
    for f in root.rglob("*.py"):
        for i, line in enumerate(f.read_text().splitlines(), 1):
            if re.search(r"def (__call__|jit|problem|make_\w+|attack_members)\(.*key=None", line):
                hits.append(f"{f.relative_to(root)}:{i}")
    assert not hits, hits


def test_member_mode_has_the_member_axis_second():
    params, x0, y = _pool_problem()
    fn = A.make_member_attack(A.make_pgd(affine_apply, eps=0.05, steps=2))
    res = fn(params, x0, y, key=KEY)
    assert res.x_adv.shape == (B, M, D) and res.success.shape == (B, M) and res.queries.shape == (B, M)
    for m in range(M):  # member m alone, with its own stream: the same point as member mode
        one = {"W": params["W"][m], "b": params["b"][m]}
        alone = A.make_pgd(affine_apply, eps=0.05, steps=2)(one, x0, y, key=jax.random.fold_in(KEY, m))
        np.testing.assert_array_equal(np.asarray(res.x_adv[:, m]), np.asarray(alone.x_adv))
        np.testing.assert_array_equal(np.asarray(res.queries[:, m]), np.asarray(alone.queries)[:, 0])


def test_rounds_take_x_init_and_have_a_jit_entry():
    params, x0, y = _pool_problem()
    fn = A.make_rounds(A.make_pgd(pool_apply, steps=2), 2, norm="linf")
    far = jnp.clip(x0 + 0.3, 0, 1)  # a warm start outside the ball: projected around x0
    res = fn(params, x0, y, key=KEY, eps=0.05, x_init=far)
    assert float(jnp.max(jnp.abs(res.x_adv - x0))) <= 0.05 * (1 + 1e-6)
    again = jax.jit(lambda p, x: fn.jit(p, x, y, key=KEY, eps=0.05, x_init=far))(params, x0)
    np.testing.assert_array_equal(np.asarray(again.x_adv), np.asarray(res.x_adv))
    np.testing.assert_array_equal(np.asarray(again.queries), np.asarray(res.queries))


def test_make_autoattack_has_the_call_shape_and_equals_the_function():
    params, x0, y = _pool_problem()
    quiet = A.autoattack.AutoAttackSettings(log=False, checks=False)
    fn = A.make_autoattack(pool_apply, norm="linf", eps=0.1, attacks=["apgd-ce"], n_iter=3, settings=quiet)
    res = fn(params, x0, y, key=KEY)
    cfg = A.autoattack.autoattack_config("linf", 0.1, attacks=["apgd-ce"], n_iter=3)
    ref = A.autoattack.autoattack(pool_apply, params, x0, y, attack=cfg, key=KEY, settings=quiet)
    np.testing.assert_array_equal(res.x_adv, ref.x_adv)
    np.testing.assert_array_equal(res.robust, ref.robust)
    assert res.x_adv.shape == (B, M, D) and res.success.shape == (B, M) and res.queries.shape == (B, M)
    np.testing.assert_array_equal(res.success, ~res.robust)
    with pytest.raises(TypeError, match="no jit-safe entry"):
        fn.jit(params, x0, y, key=KEY)
    with pytest.raises(ValueError, match="mask and max_queries must be None"):
        fn(params, x0, y, key=KEY, mask=np.ones(M, bool))
    with pytest.raises(TypeError, match="required keyword-only argument: 'key'"):
        fn(params, x0, y)
