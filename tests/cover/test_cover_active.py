"""The SAR oracles attack only what is needed: packed active samples, gated stacks.

Known answers: a packed / gated run equals the unpacked, ungated run of the same key (every
sample's stream comes from its id), and a switched-off stack contributes no input gradient.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sarjax.attacks.joint import JointPGDStep, make_joint_pgd
from sarjax.models.pool import Pool, Stack
from sarjax.models.zoo import mlp
from sarjax.sar import SARSettings, default_sar_attack
from sarjax.sar.vision import Packing, StackGate, make_attack_oracles, pack_sizes, run_sar

SHAPE = (4, 4, 1)
ARCHS = (mlp((8,), input_shape=SHAPE, num_classes=3), mlp((6,), act="tanh", input_shape=SHAPE, num_classes=3))


def _stack(arch, m, seed, prefix):
    # numpy params in the structure of arch.init (eval_shape compiles nothing)
    shapes = jax.eval_shape(arch.init, jax.random.PRNGKey(0))
    rng = np.random.default_rng(seed)
    params = jax.tree.map(
        lambda s: (rng.standard_normal((m,) + s.shape) / np.sqrt(s.shape[0])).astype(np.float32), shapes
    )
    return Stack(arch, params, tuple(f"{prefix}{i}" for i in range(m)))


POOL = Pool([_stack(ARCHS[0], 3, 0, "a"), _stack(ARCHS[1], 2, 1, "b")])  # M = 5 in two stacks
X = np.random.default_rng(7).random((6, *SHAPE), dtype=np.float32)
KEY = jax.random.PRNGKey(11)
SAR_ARGS = dict(eps=0.3, deltas=[0.0, 0.4], key=KEY, sample_ids=np.arange(20, 26))


def test_pack_sizes_halve_the_batch():
    assert pack_sizes(8, 4) == (1, 2, 4, 8)
    assert pack_sizes(1000, 4) == (63, 125, 250, 500, 1000)
    assert pack_sizes(6, 0) == (6,)
    assert pack_sizes(6, 9) == (1, 2, 3, 6)
    assert pack_sizes(1000, 4, 100) == (125, 250, 500, 1000) and pack_sizes(12, 4, 16) == (12,)


@pytest.fixture(scope="module")
def runs():
    old = run_sar(
        POOL,
        X,
        attack=default_sar_attack(POOL, steps=4, restarts=1, gate_stacks=False),
        settings=SARSettings(pack_levels=0),
        **SAR_ARGS,
    )
    new = run_sar(  # packed (to single rows: 6 rows are under the default floor PACK_MIN_ROWS), gated
        POOL, X, attack=default_sar_attack(POOL, steps=4, restarts=1), settings=SARSettings(pack_min_rows=1), **SAR_ARGS
    )
    return old, new


def test_packed_gated_run_equals_the_full_batch_run(runs):
    old, new = runs
    # the case exercises packing: rounds where some samples are done, and fallbacks
    assert (~old.active[1:]).any() and old.active[1:].any() and old.fallback.any()
    assert new.num_rounds == old.num_rounds
    for name in ("k_hat", "sar", "reached", "covered", "covered_round", "unbreakable", *_ROUND_LOGS):
        np.testing.assert_array_equal(getattr(new, name), getattr(old, name), err_msg=name)
    np.testing.assert_array_equal(new.inputs, old.inputs)


_ROUND_LOGS = (
    "active",
    "recorded",
    "new_covered",
    "joint_covered",
    "joint_queries",
    "fallback",
    "fallback_target",
    "fallback_covered",
    "fallback_success",
    "fallback_queries",
)


def test_packed_oracle_calls_small_batches_and_fills_the_rest():
    attack = make_joint_pgd(
        POOL.apply, eps=0.3, steps=4, step=JointPGDStep(restarts=1)
    )  # run_sar's unpacked kernel (shared)
    sizes = []

    def spy(params, x0, ref, *, key, mask=None, **kw):
        sizes.append(x0.shape[0])
        return attack(params, x0, ref, key=key, mask=mask, **kw)

    ref = POOL.predict(X).T
    full, _ = make_attack_oracles(spy, POOL.params, X, ref, KEY, sample_ids=np.arange(6))
    packed, single = make_attack_oracles(spy, POOL.params, X, ref, KEY, sample_ids=np.arange(6), packing=Packing(4))
    unc = np.zeros((6, 5), bool)
    unc[[1, 4]] = [[True, False, True, True, False], [False, True, False, False, True]]
    a, b = full(unc, 2), packed(unc, 2)
    assert sizes == [6, 2]
    rows = [1, 4]
    for name in ("x_adv", "covered", "queries"):  # the point, what it covers, what it cost
        np.testing.assert_array_equal(getattr(a, name)[rows], getattr(b, name)[rows], err_msg=name)
    # the losses there: XLA's CPU kernels may round a batch of 2 and one of 6 differently (seen:
    # 6e-8 on one member on a 2-core AMD EPYC VM, exact on another machine)
    np.testing.assert_allclose(a.objective[rows], b.objective[rows], rtol=1e-6, atol=0)
    idle = [0, 2, 3, 5]
    np.testing.assert_array_equal(b.x_adv[idle], X[idle])
    assert not b.covered[idle].any() and not b.queries[idle].any()
    # the fallback packs its one target per row too; nothing active: no call at all
    single(np.array([0, 3, 0, 0, 1, 0]), np.array([0, 1, 0, 0, 1, 0], bool), 0)
    out = single(np.zeros(6, np.int64), np.zeros(6, bool), 1)
    assert sizes == [6, 2, 2] and not out.queries.any()
    with pytest.raises(ValueError, match="packing.levels"):
        make_attack_oracles(spy, POOL.params, X, ref, KEY, packing=Packing(-1))
    with pytest.raises(ValueError, match="packing.min_rows"):
        make_attack_oracles(spy, POOL.params, X, ref, KEY, packing=Packing(2, 0))
    with pytest.raises(TypeError, match="Packing"):
        make_attack_oracles(spy, POOL.params, X, ref, KEY, packing=(2, 1))


def test_stack_gate_keeps_logits_and_switches_off_a_stacks_gradient():
    gate = StackGate.of(POOL)
    assert StackGate.of(POOL) is gate  # one per pool: kernels built on gate.apply are shared
    x = jnp.asarray(X[:3])
    w = jnp.asarray([1.0, 0.0, 2.0, 0.5, 1.0])  # every member weighted

    def loss(apply, params):
        return lambda z: jnp.sum(w[:, None, None] * jax.nn.log_softmax(apply(params, z)))

    g_pool = jax.grad(loss(POOL.apply, POOL.params))(x)
    on = jnp.asarray([True, True])
    np.testing.assert_array_equal(gate.apply((POOL.params, on), x), POOL.apply(POOL.params, x))
    np.testing.assert_allclose(jax.grad(loss(gate.apply, (POOL.params, on)))(x), g_pool, rtol=1e-5, atol=1e-6)
    # stack 1 off: only stack 0's members pass a gradient
    g_off = jax.grad(loss(gate.apply, (POOL.params, jnp.asarray([True, False]))))(x)
    w0 = w.at[3:].set(0.0)
    g_stack0 = jax.grad(lambda z: jnp.sum(w0[:, None, None] * jax.nn.log_softmax(POOL.apply(POOL.params, z))))(x)
    np.testing.assert_allclose(g_off, g_stack0, rtol=1e-5, atol=1e-6)
    assert np.abs(np.asarray(g_off - g_pool)).max() > 1e-3
    np.testing.assert_array_equal(gate.switches(np.array([[0, 0, 0, 1, 0], [0, 0, 0, 0, 0]], bool)), [False, True])
