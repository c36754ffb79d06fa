"""How many XLA programs an AutoAttack run compiles (issue 43 item 2).

Design: one program per attack stage, reused across its restarts, its targets (targets are data,
the ``ref`` array, not constants in the trace) and its chunks (every chunk padded to one of the
bucket shapes); one program for the verification / ranking forward (``_logits``) and one for FAB's
random restarts (``_fab_start``); the host-side preparation of every chunk is numpy, so it
compiles nothing. A second identical call compiles nothing at all.
"""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _aa_tiny import images, make_pool

from sarjax.attacks.autoattack import AutoAttackSettings, autoattack_config, autoattack_pool
from sarjax.runtime.compile_stats import count_compiles

# the plus version: 5 restarts of APGD-CE, APGD-DLR and FAB, 4 targets (C - 1) of APGD-T and FAB-T, Square
STAGE_KERNELS = {"jit(_run_apgd_like)": 4, "jit(_run_minnorm)": 2}  # apgd-ce, apgd-dlr, square, apgd-t; fab, fab-t
OTHER = {"jit(_logits)": 1, "jit(_fab_start)": 1}
# what the caller's key and the per-run fold_in compile once per process (JAX's own key programs)
KEY_OPS = ("threefry", "convert_element_type", "stage")


@pytest.mark.filterwarnings("ignore")
def test_autoattack_compiles_one_program_per_stage_and_nothing_twice():
    pool = make_pool(stacks=1)  # two linear members, vmapped
    x, y = images(20)  # batch 8: two full chunks and a padded tail, one shape
    cfg = autoattack_config("linf", 0.05, "plus", n_iter=4, fab_iter=3, square_queries=8)
    settings = AutoAttackSettings(batch_size=8, checks=False)
    jax.clear_caches()
    with count_compiles() as c:
        first = autoattack_pool(pool, x, y, attack=cfg, key=jax.random.PRNGKey(5), settings=settings)
    names = collections.Counter(r.name for r in c.programs() if not r.cached)
    assert {k: names[k] for k in STAGE_KERNELS} == STAGE_KERNELS, names
    assert {k: names[k] for k in OTHER} == OTHER, names
    rest = {k: v for k, v in names.items() if k not in STAGE_KERNELS and k not in OTHER}
    assert all(any(op in k for op in KEY_OPS) for k in rest), f"eager programs in the cascade: {rest}"
    assert sum(rest.values()) <= 4, rest
    assert first.log[0].name == "apgd-ce" and len(first.log) == 6
    with count_compiles() as again:  # the same run again: every program reused
        autoattack_pool(pool, x, y, attack=cfg, key=jax.random.PRNGKey(5), settings=settings)
    assert again.stats.programs_compiled == 0, [r.name for r in again.programs()]


@pytest.mark.filterwarnings("ignore")
def test_sanity_checks_compile_two_programs_not_one_per_eager_operation():
    """The checks' 5 repeated forward calls run one compiled program (the model traced 5 times,
    every trace the same program), the zero-gradient check one more; they ran eagerly before, one
    program per operation and shape (about 140 for a small CNN: pad, reshape, matmul, ...)."""
    from sarjax.attacks.autoattack_checks import sanity_checks
    from sarjax.models import zoo

    arch = zoo.cnn((8,), dense=32, input_shape=(8, 8, 1), num_classes=10)  # wide enough that no point has
    params = arch.init(jax.random.PRNGKey(0))  # every ReLU dead (an all-zero gradient, flagged) at either XLA level
    x = np.random.default_rng(0).uniform(size=(6, 8, 8, 1)).astype(np.float32)
    y = np.asarray(np.argmax(arch.apply(params, x), 1), np.int32)
    key = jax.random.PRNGKey(1)
    jax.clear_caches()
    with count_compiles() as c:
        assert sanity_checks(arch.apply, params, x, y, key=key) == []
    names = collections.Counter(r.name for r in c.programs() if not r.cached)
    assert sum(names.values()) == 2, names
    stacked = jax.tree.map(lambda a: jnp.stack([a, a]), params)  # member 0 taken inside the traced model
    jax.clear_caches()
    with count_compiles() as c:
        assert sanity_checks(arch.apply, stacked, x, y, key=key, stacked=True) == []
    assert c.stats.programs_compiled == 2, [r.name for r in c.programs()]
