"""Per-program records of sarjax.runtime.compile_stats: known answer, one function at two shapes and
another at one are three records under their jitted names, summed per name by by_name."""

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.runtime.compile_stats import ProgramRecord, by_name, count_compiles


def test_records_name_each_program_and_by_name_sums_them():
    c = float(np.random.default_rng().uniform(1, 2))  # new programs: no cache holds them

    def twice_shaped(x):
        return jnp.sin(x) * c

    def once_shaped(x):
        return x @ x.T + c

    a, b, m = (jax.block_until_ready(jnp.ones(s)) for s in ((3,), (5,), (2, 2)))
    f, g = jax.jit(twice_shaped), jax.jit(once_shaped)
    with count_compiles() as cc:
        jax.block_until_ready((f(a), f(b), g(m), f(a)))
    names = [r.name for r in cc.programs()]
    assert names == ["jit(twice_shaped)", "jit(twice_shaped)", "jit(once_shaped)"], names
    assert all(not r.cached and r.seconds > 0 for r in cc.programs())
    rows = {r["name"]: r for r in by_name(cc.programs())}
    assert rows["jit(twice_shaped)"]["compiled"] == 2 and rows["jit(once_shaped)"]["compiled"] == 1
    jax.jit(lambda x: x - c)(a).block_until_ready()  # after the counter stopped: not its record
    assert len(cc.programs()) == 3


def test_by_name_orders_by_seconds_and_counts_cache_hits_apart():
    recs = [ProgramRecord("a", 1.0, False), ProgramRecord("b", 3.0, False), ProgramRecord("a", 2.5, False)]
    recs.append(ProgramRecord("b", 0.1, True))
    assert by_name(recs) == [
        {"name": "a", "compiled": 2, "seconds": 3.5, "cache_hits": 0},
        {"name": "b", "compiled": 1, "seconds": 3.0, "cache_hits": 1},
    ]
