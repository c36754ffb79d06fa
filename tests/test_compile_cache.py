"""``--compile-cache DIR`` (sarjax.runtime.compile_cache): XLA's persistent compilation cache for the commands.

The end-to-end test runs ``sarjax sar`` in subprocesses (JAX's cache settings are process-global):
the first run writes compiled programs, a second run into another output directory writes none
(every program is read back) and gives the same results as a run without the cache.
"""

import json
import os
import subprocess
import sys

import pytest

from sarjax.runtime.compile_cache import enable_compile_cache, memory_maps, release_compiled_near_map_limit

TINY = ["--samples", "3", "--steps", "2", "--restarts", "1", "--eps", "0.3", "--delta", "0"]


def test_bad_paths_and_thresholds_raise_before_touching_jax(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match="exists and is not a directory"):
        enable_compile_cache(f)
    with pytest.raises(ValueError, match="min_compile_seconds must be >= 0"):
        enable_compile_cache(tmp_path / "c", -1.0)
    assert not (tmp_path / "c").exists()


def _sar(pool, out, *extra):
    env = {**os.environ, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-m", "sarjax.cli", "sar", "--pool", str(pool), "--out", str(out), *TINY, *extra]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads((out / "results.json").read_text())


def _entries(cache):
    return sorted(p.name for p in cache.rglob("*") if p.is_file())


def test_sar_reruns_read_the_compiled_programs_back(tmp_path):
    from test_cli_reliability import _pool

    from sarjax.models.checkpoint import save_pool

    pool = save_pool(_pool(), tmp_path / "P", {"preset": "test"})
    cache = tmp_path / "xla"
    first = _sar(pool, tmp_path / "o1", "--compile-cache", str(cache))
    written = _entries(cache)
    assert written, "the first run wrote no compiled program"
    second = _sar(pool, tmp_path / "o2", "--compile-cache", str(cache))
    assert _entries(cache) == written  # every program was read back, none compiled anew
    plain = _sar(pool, tmp_path / "o3")
    keys = ("sar", "sar_se", "asr", "member_asr", "k_hat_histogram", "mean_queries_per_sample", "accuracy")
    for r in (first, second):
        assert {k: r[k] for k in keys} == {k: plain[k] for k in keys}


# -- the memory-map guard (release_compiled_near_map_limit) ---------------------------------------

needs_proc = pytest.mark.skipif(memory_maps() is None, reason="no /proc/self/maps (not Linux)")


@needs_proc
def test_memory_maps_counts_this_process():
    used, limit = memory_maps()
    with open("/proc/sys/vm/max_map_count") as f:
        assert limit == int(f.read())
    with open("/proc/self/maps") as f:
        lines = sum(1 for _ in f)
    assert used > 0 and abs(used - lines) <= 16  # the same count, up to mappings made in between


_GUARD_CHECK = """
import jax, jax.numpy as jnp
from sarjax.runtime.compile_cache import memory_maps, release_compiled_near_map_limit

def make(k):
    return jax.jit(lambda x: jnp.sum(jnp.tanh(x @ x.T + k)))

base = memory_maps()[0]
fns = [make(float(k)) for k in range(40)]  # kept alive, as sarjax keeps its kernels
want = [float(f(jnp.ones((4, 4)))) for f in fns]
used, limit = memory_maps()
assert used - base >= 40, (base, used)  # every live executable holds mappings of its own (about 6 measured)
lines = []
assert not release_compiled_near_map_limit(min(1.0, 2 * used / limit), log=lines.append)
assert lines == [] and all(f._cache_size() == 1 for f in fns)
assert release_compiled_near_map_limit(used / 2 / limit, log=lines.append)
assert len(lines) == 1 and f"memory mappings of vm.max_map_count {limit:,} in use" in lines[0], lines
assert all(f._cache_size() == 0 for f in fns)
after = memory_maps()[0]
assert after <= base + (used - base) // 2, (base, used, after)  # their mappings are gone
assert [float(f(jnp.ones((4, 4)))) for f in fns] == want  # and they recompile to the same answers
print("ok", base, used, after)
"""


@needs_proc
def test_release_compiled_drops_the_programs_only_beyond_the_fraction():
    # in a fresh process: jax.clear_caches() in a test worker would make its later tests recompile
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    r = subprocess.run([sys.executable, "-c", _GUARD_CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stderr[-3000:]
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="fraction must be in"):
            release_compiled_near_map_limit(bad)
