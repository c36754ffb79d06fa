"""``--compile-cache DIR`` (sarjax.runtime.compile_cache): XLA's persistent compilation cache for the commands.

The end-to-end test runs ``sarjax sar`` in subprocesses (JAX's cache settings are process-global):
the first run writes compiled programs, a second run into another output directory writes none
(every program is read back) and gives the same results as a run without the cache. The commands'
default (``$XDG_CACHE_HOME/sarjax/jax``, ``SARJAX_NO_COMPILE_CACHE=1`` off, ``--compile-cache DIR``
wins) is checked in a subprocess too, through ``sarjax.cli.main`` with the command's work stubbed.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sarjax.runtime.compile_cache import (
    default_compile_cache_dir,
    enable_compile_cache,
    memory_maps,
    release_compiled_near_map_limit,
)

TINY = ["--samples", "3", "--steps", "2", "--restarts", "1", "--eps", "0.3", "--delta", "0"]


def test_bad_paths_and_thresholds_raise_before_touching_jax(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match="exists and is not a directory"):
        enable_compile_cache(f)
    with pytest.raises(ValueError, match="min_compile_seconds must be >= 0"):
        enable_compile_cache(tmp_path / "c", -1.0)
    assert not (tmp_path / "c").exists()


def test_default_directory_follows_xdg_and_the_off_switch(tmp_path):
    home = os.path.expanduser("~")
    xdg = str(tmp_path / "xdg")
    assert default_compile_cache_dir({"XDG_CACHE_HOME": xdg}) == tmp_path / "xdg" / "sarjax" / "jax"
    fallback = Path(home) / ".cache" / "sarjax" / "jax"
    assert default_compile_cache_dir({}) == fallback
    assert default_compile_cache_dir({"XDG_CACHE_HOME": ""}) == fallback
    assert default_compile_cache_dir({"XDG_CACHE_HOME": "relative/dir"}) == fallback  # the XDG spec: ignored
    assert default_compile_cache_dir({"XDG_CACHE_HOME": xdg, "SARJAX_NO_COMPILE_CACHE": "0"}) is not None
    for off in ("1", "yes", "true"):
        assert default_compile_cache_dir({"XDG_CACHE_HOME": xdg, "SARJAX_NO_COMPILE_CACHE": off}) is None


_CLI_DEFAULT_CHECK = """
import json, os, sys
import jax
import sarjax, sarjax.cli
from sarjax.cli import sar as sar_cmd
from jax.experimental.compilation_cache.compilation_cache import reset_cache

tmp = sys.argv[1]
seen = {"after_import": jax.config.jax_compilation_cache_dir}  # importing sarjax turns nothing on
sar_cmd.cmd_sar = lambda args: seen.__setitem__(case, jax.config.jax_compilation_cache_dir) or 0  # no real work
argv = ["sar", "--pool", os.path.join(tmp, "no-pool"), "--eps", "0.1", "--delta", "0"]
for case, env, extra in [
    ("default", {}, []),
    ("off", {"SARJAX_NO_COMPILE_CACHE": "1"}, []),
    ("explicit_and_off", {"SARJAX_NO_COMPILE_CACHE": "1"}, ["--compile-cache", os.path.join(tmp, "mine")]),
    ("explicit", {}, ["--compile-cache", os.path.join(tmp, "mine2")]),
]:
    jax.config.update("jax_compilation_cache_dir", None)
    reset_cache()
    os.environ.pop("SARJAX_NO_COMPILE_CACHE", None)
    os.environ.update(env)
    assert sarjax.cli.main(argv + extra) == 0
print(json.dumps(seen))
"""


def test_commands_use_the_default_cache_unless_turned_off_or_given(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("SARJAX_NO_COMPILE_CACHE", "JAX_COMPILATION_CACHE_DIR")}
    env.update(XDG_CACHE_HOME=str(tmp_path / "xdg"), JAX_PLATFORMS="cpu")
    r = subprocess.run(
        [sys.executable, "-c", _CLI_DEFAULT_CHECK, str(tmp_path)], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    default = tmp_path / "xdg" / "sarjax" / "jax"
    assert seen == {
        "after_import": None,
        "default": str(default),
        "off": None,
        "explicit_and_off": str(tmp_path / "mine"),
        "explicit": str(tmp_path / "mine2"),
    }
    assert default.is_dir()


_SWITCH_CHECK = """
import os, sys
import jax, jax.numpy as jnp
from sarjax.runtime.compile_cache import enable_compile_cache

a, b = sys.argv[1], sys.argv[2]
files = lambda d: sorted(os.listdir(d)) if os.path.isdir(d) else []
x = jnp.ones(3)
assert str(enable_compile_cache(a, 0.0)) == a
assert str(enable_compile_cache(a, 0.0)) == a  # idempotent
jax.jit(lambda x: jnp.sin(x) * 3)(x).block_until_ready()
in_a = files(a)
assert in_a, "nothing written to the first directory"
enable_compile_cache(b, 0.0)  # another directory after a compilation: the next programs go there
jax.jit(lambda x: jnp.cos(x) + 5)(x).block_until_ready()
assert files(a) == in_a, (in_a, files(a))
assert files(b), "nothing written to the second directory"
print("ok")
"""


# every command that compiles programs takes --compile-cache (and so gets the default cache);
# train-defenses keeps its own in OUT/.jax_cache (--no-compile-cache)
_MINIMAL_ARGS = {
    "sar": ["--pool", "p", "--eps", "0.1", "--delta", "0"],
    "demo": [],
    "frontier": ["--models", "m", "--norm", "l2", "--out", "o"],
    "autoattack": ["--pool", "p", "--eps", "0.1", "--norm", "linf"],
    "llm-sar": ["--pool", "p", "--behaviors", "b.csv", "--out", "o"],
    "train-pool": ["--preset", "low", "--out", "o"],
    "llm-demo": [],
}


@pytest.mark.parametrize("command", sorted(_MINIMAL_ARGS))
def test_every_compiling_command_takes_compile_cache(command):
    from sarjax.cli import build_parser

    parser = build_parser()
    args = parser.parse_args([command, *_MINIMAL_ARGS[command]])
    assert args.compile_cache is None  # None: main() turns the default directory on
    args = parser.parse_args([command, *_MINIMAL_ARGS[command], "--compile-cache", "d"])
    assert args.compile_cache == "d"


def test_another_directory_takes_over_after_a_compilation(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}  # no cache before the first call
    env["JAX_PLATFORMS"] = "cpu"
    cmd = [sys.executable, "-c", _SWITCH_CHECK, str(tmp_path / "a"), str(tmp_path / "b")]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def _sar(pool, out, *extra):
    env = {**os.environ, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PLATFORMS": "cpu"}
    env["SARJAX_NO_COMPILE_CACHE"] = "1"  # the run without --compile-cache has no cache at all
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # nor one of the environment
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
    # results.json records the compilations: the rerun read its programs back from the cache
    assert first["compile"]["programs"] > 0 and first["compile"]["cache_hits"] == 0
    assert second["compile"]["cache_hits"] > 0 and second["compile"]["programs"] < first["compile"]["programs"]
    assert plain["compile"]["cache_hits"] == 0
    assert all(r["provenance"]["command"].startswith("sarjax sar --pool ") for r in (first, second, plain))


# -- the memory-map guard (release_compiled_near_map_limit) ---------------------------------------

needs_proc = pytest.mark.skipif(memory_maps() is None, reason="no /proc/self/maps (not Linux)")


@needs_proc
def test_memory_maps_counts_this_process():
    m = memory_maps()
    assert m is not None
    used, limit = m
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
