"""The self-ensemble as a pool member (issue 16 item 1): its Stack kind, checkpoints, the zoo's pool,
the stochastic apply for EOT; and the zoo entries' specs pinned (the trained zoo's fingerprints)."""

from __future__ import annotations

import functools
import hashlib
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sarjax.defenses import self_ensemble as se
from sarjax.defenses import zoo, zoo_io
from sarjax.models.checkpoint import load_pool, save_pool
from sarjax.models.pool import Pool, Stack
from sarjax.models.zoo import mlp

# the smallest self-ensemble with every piece (two resolutions, views, two heads, CrossMax k = 2):
# few ops, so few seconds of compilation; the kernels below are compiled once for the module
CFG = se.SelfEnsembleConfig(resolutions=(28, 14), channels=(3,), dense=4)
DET = jax.jit(functools.partial(se.apply, CFG))  # (params, x) -> [B, C], noise off
RAND = jax.jit(functools.partial(se.apply, CFG))  # (params, x, key) -> [B, C], stochastic views


@pytest.fixture(scope="module")
def members():
    """Two tiny self-ensembles (distinct inits) and a batch of inputs."""
    init = jax.jit(functools.partial(se.init, CFG))
    ps = [init(jax.random.key(s)) for s in (0, 1)]
    x = jnp.asarray(np.random.default_rng(0).random((3, 28, 28, 1), dtype=np.float32))
    return ps, x


@pytest.fixture(scope="module")
def stack(members):
    ps, _ = members
    return se.SelfEnsembleStack.from_members(CFG, ps, ["se-a", "se-b"])


def test_zoo_entry_specs_are_pinned():
    # the zoo in training (and every saved zoo.json) fingerprints Defense.spec(): the DEFENSES table
    # may be refactored, never changed. The hash is of the specs before the table was factored.
    got = json.dumps([d.spec() for d in zoo.DEFENSES], sort_keys=True)
    assert (
        hashlib.sha256(got.encode()).hexdigest() == "961bed5c2b6ea9ea59b8fa0ef6e74a9043206d83a86805583abb2d2f210e3bce"
    )


def test_pool_logits_equal_the_self_ensembles_own_apply(members, stack):
    ps, x = members
    pool = Pool([stack])
    got = np.asarray(pool.logits(x))  # [M, B, C]
    assert got.shape == (2, 3, 10) and pool.names == ("se-a", "se-b")
    for m, p in enumerate(ps):
        np.testing.assert_allclose(got[m], np.asarray(DET(p, x)), rtol=1e-5, atol=1e-6)
    # the member apply is one object per (config, view): attack kernels cached on it are shared
    assert stack.member_apply is stack.with_params(stack.params).member_apply
    assert stack.member_apply is not stack.with_views(3).member_apply


def test_fixed_view_is_one_draw_for_every_sample(members, stack):
    ps, x = members
    fixed = stack.with_views(7)
    f = jax.jit(fixed.apply)
    whole = np.asarray(f(fixed.params, x))
    perm = [2, 0, 1]  # the same samples in another order: a sample's view does not depend on its place
    np.testing.assert_allclose(np.asarray(f(fixed.params, x[jnp.array(perm)])), whole[:, perm], rtol=1e-5, atol=1e-6)
    # every sample sees the same shift and noise: equal inputs give equal logits
    same = np.asarray(f(fixed.params, jnp.broadcast_to(x[:1], x.shape)))
    np.testing.assert_allclose(same, np.broadcast_to(same[:, :1], same.shape), rtol=1e-6, atol=1e-6)
    assert np.abs(whole[0] - np.asarray(DET(ps[0], x))).max() > 1e-4  # not the noise-off view


def test_checkpoint_round_trip_without_a_builder(tmp_path, stack):
    other = Stack.from_keys(mlp((8,)), jax.random.split(jax.random.key(2), 1), ["mlp"])
    pool = Pool([stack.with_views(11), other])
    save_pool(pool, tmp_path / "p", config={"note": "mixed"})
    back, cfg = load_pool(tmp_path / "p")  # the config is in the spec: no builders; probe logits verified
    assert cfg == {"note": "mixed"} and back.names == pool.names
    s0 = back.stacks[0]
    assert isinstance(s0, se.SelfEnsembleStack) and s0.cfg == CFG and s0.view_seed == 11
    assert back.content_hash() == pool.content_hash()  # the params' bytes and the specs


def test_bad_params_and_views_are_refused(members):
    ps, _ = members
    stacked = jax.tree.map(lambda a: a[None], ps[0])
    with pytest.raises(TypeError, match="view_seed must be None"):
        se.SelfEnsembleStack(CFG, stacked, ["a"], view_seed=1.5)
    with pytest.raises(TypeError, match="SelfEnsembleConfig"):
        se.SelfEnsembleStack(CFG.spec(), stacked, ["a"])
    wider = se.SelfEnsembleConfig(resolutions=(28, 14), channels=(4,), dense=4)
    with pytest.raises(ValueError, match=r"\['conv0'\]\['b'\] has member shape \(3,\), the config gives \(4,\)"):
        se.SelfEnsembleStack(wider, stacked, ["a"])
    with pytest.raises(ValueError, match="1 members but 2 names"):
        se.SelfEnsembleStack(CFG, stacked, ["a", "b"])


def test_pool_stochastic_apply_mixes_randomized_and_plain_stacks(members, stack):
    ps, x = members
    plain = Stack.from_keys(mlp((8,)), jax.random.split(jax.random.key(2), 2), ["m0", "m1"])
    pool = Pool([plain, stack])
    key = jax.random.key(9)
    f = jax.jit(se.pool_stochastic_apply(pool))
    got = np.asarray(f(pool.params, x, key))
    np.testing.assert_allclose(got[:2], np.asarray(jax.jit(plain.apply)(plain.params, x)), rtol=1e-6, atol=1e-6)
    # the self-ensemble stack (stack 1) as deployed: stack.stochastic_apply with fold_in(key, 1), whose
    # member m draws its views from fold_in(fold_in(key, 1), m)
    for m, p in enumerate(ps):
        want = np.asarray(RAND(p, x, jax.random.fold_in(jax.random.fold_in(key, 1), m)))
        np.testing.assert_allclose(got[2 + m], want, rtol=1e-5, atol=1e-6)
    other = np.asarray(f(pool.params, x, jax.random.key(10)))
    np.testing.assert_array_equal(other[:2], got[:2])  # the plain stack stays deterministic
    assert np.abs(other[2:] - got[2:]).max() > 1e-3  # fresh views under another key
    with pytest.raises(ValueError, match="no stack of .* is randomized"):
        se.pool_stochastic_apply(Pool([plain]))


@pytest.mark.skipif(
    os.environ.get("SARJAX_DEFENSES_FULL") != "1",
    reason="SARJAX_DEFENSES_FULL=1: compiles an EOT attack on the self-ensemble (the suite's 15-minute budget)",
)
def test_eot_attack_on_a_self_ensemble_pool(members, stack):
    from sarjax.attacks import make_pgd

    _, x = members
    one = Pool([stack.select([0])])
    atk = make_pgd(se.pool_stochastic_apply(one), norm="linf", steps=2, eot=2)
    res = atk(one.params, x[:2], jnp.array([0, 1]), key=jax.random.key(0), eps=0.1)
    assert res.success.shape == (2, 1)
    assert float(jnp.abs(res.x_adv - x[:2]).max()) <= 0.1 + 1e-6
    assert int(res.queries[0]) >= 2 * 2  # every step's EOT draws are charged


def test_load_zoo_gives_the_self_ensemble_a_pool_and_save_zoo_pool_saves_it(tmp_path, members):
    ps, x = members
    d = zoo.get_defense("self-ensemble")
    zoo_io.save_self_ensemble(tmp_path / "zoo" / d.name, CFG, ps[0], {"defense": d.spec()})
    idx = {"format": zoo_io.ZOO_FORMAT, "defenses": {d.name: {"dir": d.name, "defense": d.spec(), "clean_acc": 0.5}}}
    (tmp_path / "zoo" / zoo_io.ZOO_INDEX).write_text(json.dumps(idx))
    m = zoo_io.load_zoo(tmp_path / "zoo")[d.name]
    np.testing.assert_allclose(np.asarray(m.pool.logits(x))[0], np.asarray(DET(ps[0], x)), rtol=1e-5, atol=1e-6)
    s0 = m.pool.stacks[0]  # apply and stochastic_apply are the stack's (tested above against se.apply)
    assert m.apply is s0.member_apply and m.stochastic_apply is s0.member_stochastic_apply and m.stochastic
    assert zoo_io.zoo_pool({d.name: m}).names == (d.name,)
    path = zoo_io.save_zoo_pool(tmp_path / "zoo", tmp_path / "pool")
    back, cfg = load_pool(path)
    assert cfg["members"][d.name]["stochastic"] is True and cfg["members"][d.name]["clean_acc"] == 0.5
    assert back.content_hash() == m.pool.content_hash()
