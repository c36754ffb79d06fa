"""``sarjax plan``: the printed memory is XLA's, the largest batch follows the linear model, the
cost of a scanned program counts every iteration, and bad inputs raise."""

import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from sarjax.cli import main
from sarjax.experiments import plan as PL
from sarjax.runtime.devices import DEVICES, device_spec


def test_scan_cost_counts_every_iteration():
    """XLA counts a loop body once; the unrolled program's FLOPs are the 32 matmuls' (known answer)."""

    def f(w, x):
        return jax.lax.scan(lambda c, wi: (jnp.tanh(c @ wi), None), x, w)[0]

    w = jax.ShapeDtypeStruct((32, 64, 64), jnp.float32)
    x = jax.ShapeDtypeStruct((16, 64), jnp.float32)
    exact = 2 * 32 * 16 * 64 * 64
    rolled = jax.jit(f).lower(w, x).compile().cost_analysis()["flops"]
    assert rolled < exact / 8  # XLA's own count: the body once
    cost = jax.jit(PL.unroll_scans(f, w, x)).lower(w, x).compile().cost_analysis()["flops"]
    assert cost == exact
    assert PL.count_loops(jax.make_jaxpr(f)(w, x)) == {"scan": 1, "while": 0}


def test_unrolled_values_equal():
    def f(x):
        c, ys = jax.lax.scan(lambda c, y: (c * 0.5 + y, c - y), x[0], x, reverse=True)
        return c, ys

    x = jnp.arange(12.0).reshape(4, 3)
    a, b = f(x), PL.unroll_scans(f, x)(x)
    assert all(bool(jnp.allclose(u, v)) for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_roofline_known_answer():
    h100 = device_spec("h100-80gb")
    r = PL.roofline(989.5e12, 1.0e9, h100, "bf16")
    assert r["seconds"] == pytest.approx(1.0) and r["bound"] == "compute" and r["label"] == "projection"
    r = PL.roofline(1.0, 3.35e12, h100, "fp32")
    assert r["seconds"] == pytest.approx(1.0) and r["bound"] == "memory"
    peak, note = device_spec("tpu-v5e").peak("fp32")  # no fp32 figure on the TPU page: the bf16 peak, said so
    assert peak == 197e12 and "no fp32" in note
    assert all(d.source for d in DEVICES.values())


def test_bad_inputs_raise(tmp_path, capsys):
    with pytest.raises(ValueError, match="unknown device"):
        device_spec("h100-40gb")
    assert main(["plan", "--zoo", "low:2", "--device", "v100"]) == 2
    assert "unknown device" in capsys.readouterr().err
    with pytest.raises(ValueError, match="not divisible"):
        PL.parse_mesh("pool=3", 8, ("pool", "data"))
    with pytest.raises(ValueError, match="has 6 devices"):
        PL.parse_mesh("pool=3,data=2", 8, ("pool", "data"))
    assert PL.parse_mesh("pool=2", 8, ("pool", "data")) == {"pool": 2, "data": 4}
    with pytest.raises(ValueError, match="batch must be >= 1"):
        PL.PlanSettings(batch=0).check()
    with pytest.raises(SystemExit):
        main(["plan", "--zoo", "low:2", "--batch", "0"])
    with pytest.raises(FileNotFoundError, match="config.json"):
        PL.llm_configs([str(tmp_path)])
    with pytest.raises(ValueError, match="NAME:M"):
        PL.zoo_pool("low")
    with pytest.raises(ValueError, match="6n"):
        PL.zoo_pool("wrn-27-10:1")


def test_plan_command_on_8_fake_devices(tmp_path, run_on_fake_devices):
    """The command's printed memory equals memory_analysis() of the same program compiled apart; the
    largest batch is the largest multiple of data under the limit in the linear model, and the model
    predicts a third compile (batch 3b) within 5%."""
    out = tmp_path / "plan.json"
    argv = [sys.executable, "-m", "sarjax.cli", "plan", "--zoo", "low:3", "--devices", "8", "--mesh", "pool=2,data=4",
            "--batch", "8", "--steps", "2", "--restarts", "1", "--samples", "40", "--rounds", "2", "--out", str(out)]  # fmt: skip
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0, r.stderr[-3000:]
    printed = int(re.search(r"total ([\d,]+) B", r.stdout).group(1).replace(",", ""))
    assert "projection" in r.stdout
    res = json.loads(out.read_text())
    assert res["programs"][0]["memory"]["total"] == printed == res["memory_per_device"]
    assert res["programs"][0]["steps_per_run"] == 2 * 1 * 5 * 2  # steps x restarts x chunks x rounds
    assert res["run_seconds"]["label"] == "projection" and res["largest_batch"]["label"] == "projection"
    lb = res["largest_batch"]
    mem = lambda b: lb["intercept"] + lb["slope"] * b  # noqa: E731
    assert lb["batch"] % 4 == 0 and mem(lb["batch"]) <= res["memory_limit"] < mem(lb["batch"] + 4)
    body = f"""
    from sarjax.experiments import plan as PL
    from sarjax.models.sharding import make_mesh
    mesh = make_mesh(2, 4)
    s = dict(steps=2, restarts=1, eps=8 / 255)
    def total(b):
        p, = PL.vision_program(PL.zoo_pool("low:3"), "joint-pgd", b, mesh, s)
        m = jax.jit(p.fn, donate_argnums=1).lower(p.params, p.state).compile().memory_analysis()
        return (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
                + m.generated_code_size_in_bytes - m.alias_size_in_bytes)
    assert total(8) == {printed}, (total(8), {printed})
    b3 = total(24)
    assert abs(b3 - ({lb["intercept"]} + {lb["slope"]} * 24)) <= 0.05 * b3, b3
    print("OK")
    """
    run_on_fake_devices(body, n=8, timeout=600)


def test_layer_rule_equals_the_full_unroll_on_a_small_decoder():
    """The LLM step's cost from 2 and 3 layers, extended linearly (``--llm-cost layers``), equals
    the cost of the step with all 4 layers unrolled: FLOPs to 1e-6 (measured: a few FLOPs of 3.7e7
    at 5 layers), bytes accessed to 5% (XLA fuses the unrolled layers a little differently: 2.5%
    measured at 5 layers), and a scanned step's rolled count is far below either."""
    import dataclasses

    from sarjax.models.llm.config import config_from_hf

    cfg = config_from_hf({"model_type": "llama", "vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 4,
                          "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 32,
                          "max_position_embeddings": 32, "tie_word_embeddings": False})  # fmt: skip
    s = {"steps": 1, "topk": 4, "candidates": 4, "suffix_len": 3, "prompt_len": 3, "after_len": 1, "target_len": 2}

    def at(n):
        cfgs = [dataclasses.replace(cfg, num_layers=n)] * 2
        return PL.llm_program(cfgs, 1, {"pool": 1, "data": 1, "model": 1}, s, "float32")[0]

    full = PL.unrolled_cost(at(4))
    a = PL.analyse(at(4), (4, at))  # the rule
    assert "linear in the layer count" in a["cost_from"] and a["loops"]["scan"] >= 1
    assert a["flops"] == pytest.approx(full[0], rel=1e-6)
    assert a["bytes_accessed"] == pytest.approx(full[1], rel=0.05)
    rolled = jax.jit(at(4).fn).lower(at(4).params, at(4).state).compile().cost_analysis()["flops"]
    assert rolled < 0.8 * full[0]  # XLA's own count: each layer scan's body once
    with pytest.raises(ValueError, match="llm_cost"):
        PL.PlanSettings(llm_cost="guess").check()


def test_autoattack_programs_compile():
    """AutoAttack standard's three step programs build and compile on one device (FAB-T passes the
    labels a targeted minimum-norm attack requires), with APGD run 1 + targets times and FAB-T
    targets times per call."""
    from sarjax.models.sharding import make_mesh

    s = {"n_iter": 3, "targets": 2, "square_queries": 5, "eps": 8 / 255}
    progs = PL.vision_program(PL.zoo_pool("low:1"), "autoattack", 2, make_mesh(1, 1), s)
    assert [p.name.split()[0] for p in progs] == ["apgd", "fab-t", "square"]
    assert progs[0].steps_per_call % 3 == 0 and progs[1].steps_per_call % 2 == 0
    for p in progs:
        assert PL.analyse_memory(p) > 0
    with pytest.raises(ValueError, match="one model"):
        PL.vision_program(PL.zoo_pool("low:2"), "autoattack", 2, make_mesh(1, 1), s)
