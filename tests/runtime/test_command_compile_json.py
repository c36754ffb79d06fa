"""The JSON of ``sarjax plan`` and ``sarjax train-defenses`` carries the run's compilations
(``"compile"``: :meth:`sarjax.runtime.compile_stats.CompileStats.to_json`), as every compiling
command's does (frontier: tests/frontier/test_cli_frontier.py; llm-sar:
tests/llm/test_llm_sar_compile_json.py; demo, sar, autoattack, train-pool, llm-demo: their tests).

Known answer for train-defenses: the training is replaced by one jitted function holding a fresh
random constant, so exactly one program compiles (no cache can hold it).
"""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.cli import main

KEYS = {"programs", "seconds", "cache_hits", "cache_seconds", "trace_seconds", "lower_seconds"}


def test_train_defenses_summary_records_its_compilations(tmp_path, monkeypatch):
    from sarjax.defenses import zoo_train

    c = float(np.random.default_rng().uniform(1, 2))
    x = jax.block_until_ready(jnp.ones(4))

    def train(out, **kw):
        jax.jit(lambda v: jnp.tanh(v) * c)(x).block_until_ready()  # one new program
        return {"out": str(out), "defenses": {}}

    monkeypatch.setattr(zoo_train, "train_defenses", train)
    assert main(["train-defenses", "--out", str(tmp_path), "--no-compile-cache", "--no-progress"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["provenance"]["command"].startswith("sarjax train-defenses --out ")  # the command, not pytest's
    got = summary["compile"]
    assert got.keys() == KEYS
    assert got["programs"] == 1 and got["cache_hits"] == 0 and got["seconds"] > 0, got


def test_plan_json_records_the_programs_it_compiled(tmp_path):
    out = tmp_path / "plan.json"  # a fresh process: the plan sets the device count before JAX starts
    argv = [sys.executable, "-m", "sarjax.cli", "plan", "--zoo", "low:2", "--batch", "4", "--steps", "1",
            "--restarts", "1", "--samples", "8", "--rounds", "1", "--no-fit-batch", "--out", str(out)]  # fmt: skip
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["provenance"]["command"].startswith("sarjax plan --zoo low:2 ")
    got = res["compile"]
    assert got.keys() == KEYS
    # the plan compiles each program it measures (memory_analysis); a session cache may hold them
    assert got["programs"] + got["cache_hits"] >= len(res["programs"]) >= 1, got
