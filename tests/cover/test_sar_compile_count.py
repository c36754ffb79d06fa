"""How many programs a small SAR run compiles (issue 43: fewer compilations on a first run).

A demo-like run (12 images, a two-architecture pool, joint PGD with the per-member fallback)
attacks every greedy round at one batch shape: a chunk under ``PACK_MIN_ROWS`` rows is not
packed, so the attack compiles once, not once per packed size (12, 6, 3, 2, 1 before). The
results equal those of the unpacked run (packing never changes a sample's result).
"""

import jax
import numpy as np

from sarjax.models.pool import Pool, Stack
from sarjax.models.zoo import mlp
from sarjax.runtime.compile_stats import count_compiles
from sarjax.sar import default_sar_attack, run_sar
from sarjax.sar.settings import PACK_MIN_ROWS, SARSettings

SHAPE = (4, 4, 1)
ARCHS = (mlp((8,), input_shape=SHAPE, num_classes=3), mlp((6,), act="tanh", input_shape=SHAPE, num_classes=3))


def _stack(arch, m, seed, prefix):
    shapes = jax.eval_shape(arch.init, jax.random.PRNGKey(0))
    rng = np.random.default_rng(seed)
    params = jax.tree.map(
        lambda s: (2 * rng.standard_normal((m,) + s.shape) / np.sqrt(s.shape[0])).astype(np.float32), shapes
    )
    return Stack(arch, params, tuple(f"{prefix}{i}" for i in range(m)))


def test_a_small_run_attacks_at_one_batch_shape_and_pins_its_programs():
    pool = Pool([_stack(ARCHS[0], 3, 0, "a"), _stack(ARCHS[1], 2, 1, "b")])
    x = np.random.default_rng(3).random((12, *SHAPE), dtype=np.float32)
    assert 12 < PACK_MIN_ROWS
    base = default_sar_attack(pool, steps=3, restarts=1)  # a new attack: its programs compile (or load) here
    args = dict(eps=0.3, deltas=[0.0, 0.4], key=jax.random.PRNGKey(5), sample_ids=np.arange(12))
    with count_compiles() as c:
        res = run_sar(pool, x, attack=base, **args)
    active = np.asarray(res.active).sum(axis=1)  # [R] rows attacked per round
    assert len(active) >= 2 and active.min() <= 6, active  # rounds that packing would shrink
    names = [r.name for r in c.programs()]  # compiled, or loaded from a session's persistent cache
    assert names.count("jit(run)") == 1, names  # the joint attack at one batch shape (before: 12, 6, 3, ...)
    full = run_sar(pool, x, attack=base, settings=SARSettings(pack_levels=0), **args)
    np.testing.assert_array_equal(res.sar, full.sar)
