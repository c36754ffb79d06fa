"""Helpers shared by every test folder.

``run_on_fake_devices``: run a snippet in a fresh Python process with N fake CPU devices
(``jax_num_cpu_devices`` must be set before JAX starts its backend, so it cannot run in the test
process). The snippet sees ``jax``, ``np``, ``zoo``, ``Pool``, ``Stack`` and ``stack(arch, seed,
n)`` (a stack of random params from the init's shapes: no init compile) and must print ``OK``.
"""

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

# The commands keep XLA's compiled programs in $XDG_CACHE_HOME/sarjax/jax by default (issue 37):
# the test session points XDG_CACHE_HOME at a temporary folder, set before any test runs so that
# xdist workers and the fresh processes the tests start inherit it (the commands they run share it:
# a program one command compiled, the next loads), so the suite leaves the user's cache alone and
# starts cold, as on a fresh machine.
_TEST_CACHE = tempfile.mkdtemp(prefix="sarjax-test-xdg-")
os.environ["XDG_CACHE_HOME"] = _TEST_CACHE
atexit.register(shutil.rmtree, _TEST_CACHE, True)

# Most of the suite's time is XLA compiling small kernels that then run for milliseconds.
# SARJAX_TEST_FAST_COMPILE=1 compiles at XLA's lowest backend optimisation level without LLVM's
# expensive passes (the same HLO passes, unoptimised machine code), measured in CPU seconds per test
# (jax 0.10): a fused-CNN gradient check 24 -> 8, a PGD known-answer case 3.8 -> 2.5, training a
# 3-member preset pool 32 -> 26; the whole suite 756 s -> 516 s of wall time (2026-12-04, 2-core
# EPYC). NOT the default, since users run XLA's default level; .ci/run runs tests/attacks,
# tests/minnorm and tests/models at this level after the default run (the "rounding sweep": the
# same programs round differently, and bounds, audits and gradients must hold either way). It
# found jnp.max's max-pool gradient dividing by a count of 0 when the operand was recomputed with
# other rounding (NaN; now zoo.window_max, tests/models/test_window_max.py) and an l2 random start
# 1 ulp outside its sphere. Set here, before any test starts JAX's backend, so xdist workers and
# the fresh processes the tests start inherit it; flags a user puts in XLA_FLAGS come after.
# (--xla_cpu_use_fusion_emitters=false halves compiles again, 2.5 -> 1.3, but doubles the training
# test's run time, 26 -> 58.)
FAST_COMPILE_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
if os.environ.get("SARJAX_TEST_FAST_COMPILE") == "1" and FAST_COMPILE_XLA_FLAGS not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{FAST_COMPILE_XLA_FLAGS} {os.environ.get('XLA_FLAGS', '')}".strip()

_PREAMBLE = """
import jax
jax.config.update("jax_num_cpu_devices", {n})
import numpy as np
from sarjax.models import zoo
from sarjax.models.pool import Pool, Stack
assert jax.device_count() == {n}
def stack(arch, seed, n):   # random params from the init's shapes: no init compile (~10 s)
    shapes = jax.eval_shape(jax.vmap(arch.init), jax.random.split(jax.random.key(seed), n))
    rng = np.random.default_rng(seed)
    params = jax.tree.map(lambda s: (rng.standard_normal(s.shape) / np.sqrt(np.prod(s.shape[1:-1]) or 1.0))
                          .astype(np.float32), shapes)
    return Stack(arch, params, tuple(f"{{arch.name}}/{{i}}" for i in range(n)))
"""


def run_on_fake_devices_(body: str, n: int = 8, timeout: float = 300) -> str:
    """Run ``body`` (dedented) after the preamble with ``n`` fake CPU devices; returns its stdout."""
    code = _PREAMBLE.format(n=n) + textwrap.dedent(body)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}  # fake CPU devices, also on a machine with a GPU
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0 and "OK" in r.stdout, (r.stdout[-2000:], r.stderr[-3000:])
    return r.stdout


@pytest.fixture(scope="session")
def run_on_fake_devices():
    """``run(body, n=8, timeout=300) -> stdout``: ``body`` in a fresh process with n fake CPU devices."""
    return run_on_fake_devices_


# Linux caps a process at vm.max_map_count memory mappings (65,530 by default), and XLA:CPU keeps
# every compiled program's machine code in mappings of its own while JAX's caches hold it (about 6
# for a tiny program, hundreds for a big one; docs/autoattack.md, "Many runs in one process"). An
# xdist worker runs ~450 tests in one process and compiles thousands of programs: at the cap LLVM
# cannot map the next one and the worker dies (SIGSEGV) in whatever test compiles next. CI crashed
# that way twice in docs/attacks.md: each of the two workers grew by 54,000 and 63,600 mappings in
# one run (measured with SARJAX_TEST_MAPS_LOG=FILE, a line per test: pid, mappings, dropped, test;
# 2026-12-05), the largest step of one test 2,900. After each test, drop JAX's compiled programs
# once the worker holds more than MAP_FRACTION of the limit (the library's remedy; results do not
# change, later tests recompile what they need). A drop costs those recompilations, so it comes
# late: at 0.85 (55,700 of 65,530; about 10,000 mappings of room for the next test), at most once
# per worker in today's suite. SARJAX_TEST_MAP_FRACTION overrides it.
MAP_FRACTION = float(os.environ.get("SARJAX_TEST_MAP_FRACTION", "0.85"))
_MAPS_LOG = os.environ.get("SARJAX_TEST_MAPS_LOG")


@pytest.fixture(autouse=True)
def _release_compiled_programs_near_map_limit(request):
    yield
    from sarjax.runtime import compile_cache  # the library's check (deferred: tests importing no jax stay light)

    m = compile_cache.memory_maps() if _MAPS_LOG else None  # the release reads /proc/self/maps itself
    dropped = compile_cache.release_compiled_near_map_limit(MAP_FRACTION, log=lambda s: None)
    if m is not None:
        with open(_MAPS_LOG, "a") as f:
            f.write(f"{os.getpid()} {m[0]} {int(dropped)} {request.node.nodeid}\n")
