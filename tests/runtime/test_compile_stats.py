"""Counting XLA compilations (sarjax.runtime.compile_stats) and the commands' closing line.

Known answers: three distinct programs (one function at two shapes, another at one) are three
compilations, calling them again is none; in a fresh process with a persistent cache directory the
first process compiles the three and the second loads the three from the cache and compiles none.
Each test's functions bake a fresh random constant into their programs, so no cache (the test
session shares one, tests/conftest.py) can already hold them.
"""

import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sarjax.runtime.compile_stats import CompileStats, compile_stats, count_compiles, start_compile_stats

LINE = re.compile(
    r"^sarjax (\S+): compiled (\d+) XLA programs? in \d+\.\d s "
    r"\((?:(\d+) loaded from the compilation cache in \d+\.\d s; )?tracing and lowering \d+\.\d s\)$"
)


def _three_programs(c: float):
    """Two jitted functions whose programs hold the constant ``c``; inputs made before counting."""
    f = jax.jit(lambda x: jnp.sin(x) * c)
    g = jax.jit(lambda x: x @ x.T + c)
    xs = (jax.device_put(np.ones(3, np.float32)), jax.device_put(np.ones(5, np.float32)))
    m = jax.device_put(np.ones((2, 2), np.float32))
    jax.block_until_ready((xs, m))
    return lambda: jax.block_until_ready((f(xs[0]), f(xs[1]), g(m)))


def test_three_distinct_programs_then_none_and_nested_counters():
    start_compile_stats()
    run = _three_programs(float(np.random.default_rng().uniform(1, 2)))
    with count_compiles() as outer:
        with count_compiles() as first:
            run()
        with count_compiles() as again:
            run()
    s = first.stats
    assert s.programs_compiled + s.cache_hits == 3, s  # a session cache could only hold them as hits
    assert s.programs_compiled == 3, s  # ... but their constant is new: all three compiled
    assert s.compile_seconds > 0 and s.trace_seconds > 0 and s.lower_seconds > 0
    assert again.stats == CompileStats()  # the same shapes again: nothing compiled, nothing loaded
    assert outer.stats == s  # nested counters: the outer one saw exactly the inner ones' programs
    frozen = outer.stats
    jax.jit(lambda x: x - 7.25)(jnp.ones(2)).block_until_ready()  # after the with block
    assert outer.stats == frozen and compile_stats() - frozen != frozen


def test_stats_arithmetic_json_and_summary():
    a = CompileStats(5, 3.5, 2, 0.25, 1.0, 0.5)
    b = CompileStats(1, 0.5, 0, 0.0, 0.25, 0.25)
    assert a - b == CompileStats(4, 3.0, 2, 0.25, 0.75, 0.25)
    assert (a - b).to_json() == {
        "programs": 4,
        "seconds": 3.0,
        "cache_hits": 2,
        "cache_seconds": 0.25,
        "trace_seconds": 0.75,
        "lower_seconds": 0.25,
    }
    assert (
        a.summary()
        == "compiled 5 XLA programs in 3.5 s (2 loaded from the compilation cache in 0.2 s; tracing and lowering 1.5 s)"
    )
    assert b.summary() == "compiled 1 XLA program in 0.5 s (tracing and lowering 0.5 s)"
    assert CompileStats().summary() is None and not CompileStats().any
    assert CompileStats(cache_hits=1).any


_CACHE_CHECK = """
import json, sys
import jax, jax.numpy as jnp, numpy as np
from sarjax.runtime.compile_cache import enable_compile_cache
from sarjax.runtime.compile_stats import count_compiles

enable_compile_cache(sys.argv[1], 0.0)  # every program written, however fast it compiled
c = float(sys.argv[2])
f = jax.jit(lambda x: jnp.sin(x) * c)
g = jax.jit(lambda x: x @ x.T + c)
xs = [jax.device_put(np.ones(n, np.float32)) for n in (3, 5)] + [jax.device_put(np.ones((2, 2), np.float32))]
jax.block_until_ready(xs)
with count_compiles() as k:
    jax.block_until_ready((f(xs[0]), f(xs[1]), g(xs[2])))
print(json.dumps(k.stats.to_json()))
"""


def test_a_second_process_loads_the_three_programs_from_the_persistent_cache(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env["JAX_PLATFORMS"] = "cpu"
    c = str(float(np.random.default_rng().uniform(1, 2)))
    runs = []
    for _ in range(2):
        cmd = [sys.executable, "-c", _CACHE_CHECK, str(tmp_path / "xla"), c]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert (first["programs"], first["cache_hits"]) == (3, 0), first
    assert (second["programs"], second["cache_hits"]) == (0, 3), second
    assert second["seconds"] == 0 and second["cache_seconds"] > 0


def test_main_prints_one_compile_line_only_for_commands_that_compiled(monkeypatch, capsys, tmp_path):
    from sarjax import cli
    from sarjax.cli import sar as sar_cmd

    run = _three_programs(float(np.random.default_rng().uniform(1, 2)))
    monkeypatch.setattr(sar_cmd, "cmd_sar", lambda args: run() and 0)  # the command's work: three programs
    monkeypatch.setenv("SARJAX_NO_COMPILE_CACHE", "1")
    argv = ["sar", "--pool", str(tmp_path / "no-pool"), "--eps", "0.1", "--delta", "0"]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err.strip().splitlines()
    m = LINE.match(err[-1])
    assert m and m.group(1) == "sar", err
    assert int(m.group(2)) + int(m.group(3) or 0) == 3, err[-1]
    assert cli.main(argv) == 0  # the same programs again: none compiled, so no line
    assert capsys.readouterr().err == ""
    assert cli.main(["train-defenses", "--list"]) == 0  # compiles nothing: no line
    assert "compiled" not in capsys.readouterr().err


def test_main_prints_no_compile_line_after_an_error(monkeypatch, capsys, tmp_path):
    from sarjax import cli
    from sarjax.cli import sar as sar_cmd

    run = _three_programs(float(np.random.default_rng().uniform(1, 2)))

    def fails(args):
        run()
        raise ValueError("bad pool")

    monkeypatch.setattr(sar_cmd, "cmd_sar", fails)
    monkeypatch.setenv("SARJAX_NO_COMPILE_CACHE", "1")
    assert cli.main(["sar", "--pool", str(tmp_path / "p"), "--eps", "0.1", "--delta", "0"]) == 2
    assert capsys.readouterr().err == "sarjax sar: error: bad pool\n"  # the error stays the one line


@pytest.mark.parametrize("objective", ["standard"])
def test_train_pool_records_its_compilations_in_the_pool_config(objective, monkeypatch, capsys, tmp_path):
    import sarjax.models.train as train_mod
    from sarjax import cli
    from sarjax.models import zoo
    from sarjax.models.pool import Pool, Stack

    run = _three_programs(float(np.random.default_rng().uniform(1, 2)))

    def fake_train_pool(members, x, y, *, config, names, objective=None, **kw):
        run()  # the training's compilations: three programs
        arch = zoo.mlp((4,))
        stack = Stack.from_members(arch, [arch.init(jax.random.key(i)) for i in range(len(members))], list(names))
        return Pool((stack,)), {}

    monkeypatch.setattr(train_mod, "train_pool", fake_train_pool)
    monkeypatch.setenv("SARJAX_NO_COMPILE_CACHE", "1")
    out = tmp_path / "pool"
    argv = ["train-pool", "--preset", "low", "--members", "2", "--out", str(out), "--objective", objective]
    assert cli.main(argv) == 0
    config = json.loads((out / "pool.json").read_text())["config"]
    assert config["provenance"]["command"] == "sarjax " + " ".join(argv)
    record = config["compile"]
    assert set(record) == {"programs", "seconds", "cache_hits", "cache_seconds", "trace_seconds", "lower_seconds"}
    # the three training programs, plus the init and accuracy programs (which a cache may hold)
    assert record["programs"] >= 3 and record["seconds"] > 0
    m = LINE.match(capsys.readouterr().err.strip().splitlines()[-1])
    assert m and m.group(1) == "train-pool"
    # the line counts the whole command: at least what the config recorded (saving may compile more)
    assert int(m.group(2)) >= record["programs"]
