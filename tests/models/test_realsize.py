"""Real-size pools through the user's paths (issue 41, item 1), with benchmarks/realsize_run.py.

Default suite, at test dimensions and through the same functions as the real-size run:

- a pool of 2 DM-style WideResNets (depth 10, width 1) from PyTorch (``Pool.from_torch``): logits
  within 1e-4 of PyTorch's; one joint PGD step and one ``run_sar`` whose ``x_adv`` stays in the
  eps-ball and the box and whose every success flag / covered member PyTorch confirms;
- a pool of 2 decoders with Llama-3.2-1B's structure (GQA 4:1, llama3 rope scaling, tied
  embeddings) at hidden 64, written as Hugging Face checkpoints and loaded with
  ``load_llm_pool``: logits within 1e-4 (relative) of transformers' in float32; in bfloat16
  within twice transformers' own bf16-vs-f32 gap (and 2e-2 at test size); one joint GCG step and
  one BEAST step whose reported member losses transformers recomputes from the returned prompts
  (float32: 1e-4 of the loss scale); and the same checkpoint without its rope scaling gives other
  logits (so the comparison sees the scaling).

``SARJAX_REALSIZE_FULL=1`` runs the script at real size (WideResNet-28-10; Llama-3.2-1B's
dimensions in float32 and bfloat16; minutes, up to ~20 GB of memory) and checks the same bounds
on what it wrote.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "realsize_run.py"
FULL = os.environ.get("SARJAX_REALSIZE_FULL") == "1"


def _runner():
    spec = importlib.util.spec_from_file_location("_realsize_run", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


R = _runner()


def check_wrn(rec: dict) -> None:
    """The WRN bounds (small and real size)."""
    assert rec["logits"]["max_abs_diff"] <= 1e-4, rec["logits"]
    assert rec["logits"]["max_abs_logit"] > 0.5  # logits that vary (the head is whitened)
    pgd = rec["joint_pgd_check"]
    assert pgd["linf_max"] <= pgd["eps"] * (1 + 1e-6) and pgd["in_box"], pgd
    assert pgd["success_flags_agree_with_torch"], pgd
    sar = rec["run_sar_check"]
    assert sar["covered_checked"] > 0 and sar["covered_confirmed_by_torch"] == sar["covered_checked"], sar
    assert sar["linf_max"] <= pgd["eps"] * (1 + 1e-6), sar
    m = rec["spec"]["members"]
    assert np.all((np.asarray(sar["sar"]) >= 1 / m) & (np.asarray(sar["sar"]) <= 1))
    for name in ("joint_pgd", "run_sar"):
        assert rec[name]["first_s"] > 0


def check_llm(rec: dict, losses: dict, dtype: str) -> None:
    """The LLM bounds (small and real size): logits, the attacks' member losses, their queries."""
    lg = rec["logits"]
    if dtype == "float32":
        assert lg["rel_diff_vs_transformers_same_dtype"] <= 1e-4, lg
    else:
        # bf16: JAX and transformers round differently; the gap stays within twice what bf16
        # rounding does to transformers itself (measured: 5.8e-3 vs 3.5e-3 at test size, 2.8e-2
        # vs 3.1e-2 at Llama-3.2-1B's size)
        own = lg["transformers_bf16_vs_f32_rel_diff"]
        assert lg["rel_diff_vs_transformers_same_dtype"] <= min(2 * own, 5e-2), lg
    tol = 1e-4 if dtype == "float32" else 1e-2  # losses ~5 (mean NLL over ~6 tokens)
    assert losses["gcg_member_loss_max_abs_diff"] <= tol * max(1.0, losses["max_abs_loss"]), losses
    assert losses["beast_member_loss_max_abs_diff"] <= tol * max(1.0, losses["max_abs_loss"]), losses
    m = rec["members"]
    assert rec["stacks"] == 1 and m == 2
    # GCG: the start (1 query per member) + the proposer's gradient + <= 4 candidates per member
    q = np.asarray(rec["joint_gcg"]["queries"])
    assert q.shape == (1, m) and q.min() >= 1 and q.sum() <= m + 1 + rec["spec"]["gcg_candidates"] * m
    assert len(rec["joint_gcg"]["x_adv"]) == 1
    # BEAST: one step of beam 2 x 2 candidates scored by each member
    assert np.asarray(rec["beast"]["queries"]).shape == (1, m)
    assert np.asarray(rec["beast"]["queries"]).min() >= 1


# ------------------------------------------------------------------------ small: the default suite


@pytest.fixture
def fast_compiles():
    """These checks are compile-bound at test shapes: most XLA optimizations off, then restored
    (the real-size run compiles at the default level)."""
    import jax

    old = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", old)


def test_small_wrn_pool_from_torch_logits_and_attack_steps(fast_compiles):
    rec = R.run_wrn(R.WRN_SMALL)
    check_wrn(rec)
    assert rec["joint_pgd_check"]["members_broken"] > 0  # eps 8/255 flips some of the 16 (sample, member)


@pytest.fixture(scope="module")
def small_llm(tmp_path_factory):
    """Small Llama-3.2-structured checkpoints (float32), the JAX run and transformers' losses."""
    import jax

    old = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)  # as fast_compiles (module scope)
    try:
        folder = tmp_path_factory.mktemp("realsize_llm_f32")
        dirs = R.build_llm_checkpoints(R.LLM_SMALL, "float32", folder)
        rec = R.run_llm_jax(R.LLM_SMALL, "float32", dirs, folder)
        losses = R.check_llm_torch("float32", dirs, folder)
    finally:
        jax.config.update("jax_disable_most_optimizations", old)
    return folder, dirs, rec, losses


def test_small_llm_pool_logits_and_text_attack_steps(small_llm):
    _, dirs, rec, losses = small_llm
    check_llm(rec, losses, "float32")
    cfg = json.loads((Path(dirs[0]) / "config.json").read_text())
    # the checkpoint carries the Llama-3.2 structure the real size has
    assert cfg["num_key_value_heads"] < cfg["num_attention_heads"] and cfg["tie_word_embeddings"]
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    assert rope["rope_type"] == "llama3" and rope["factor"] == 32.0
    # the tokenizer has fewer ids than the vocabulary (the loader allows it; the probe covers all rows)
    assert len(R.build_tokenizer()) < cfg["vocab_size"]


def test_small_llm_logits_see_the_rope_scaling(small_llm, tmp_path, fast_compiles):
    """The same weights read without the llama3 scaling give other logits: the 1e-4 comparison
    above would catch a loader that dropped it."""
    import shutil

    from sarjax.sar.llm_requests import load_llm_pool

    folder, dirs, _, _ = small_llm
    d = tmp_path / "m0"
    shutil.copytree(dirs[0], d)
    cfg = json.loads((d / "config.json").read_text())
    for k in ("rope_parameters", "rope_scaling"):
        if isinstance(cfg.get(k), dict):
            cfg[k] = {"rope_type": "default", "rope_theta": R.LLAMA32_SMALL["rope_theta"]}
    (d / "config.json").write_text(json.dumps(cfg))
    pool = load_llm_pool([d])
    got = R.pool_logits(pool.stacks[0], R.probe_ids(R.LLM_SMALL))
    want = np.load(folder / "want.npy")[:1]
    assert R.rel_diff(got, want) > 1e-3


def test_small_llm_bfloat16_logits(tmp_path, fast_compiles):
    from sarjax.sar.llm_requests import load_llm_pool

    dirs = R.build_llm_checkpoints(R.LLM_SMALL, "bfloat16", tmp_path)
    pool = load_llm_pool(dirs, "bfloat16")
    got = R.pool_logits(pool.stacks[0], R.probe_ids(R.LLM_SMALL))
    want, want_f32 = np.load(tmp_path / "want.npy"), np.load(tmp_path / "want_f32.npy")
    assert R.rel_diff(got, want) <= 2e-2
    assert R.rel_diff(got, want_f32) <= 2e-2
    assert R.rel_diff(got, want) > 0  # bfloat16 it is: not bit-equal to the float32 weights' logits


# ------------------------------------------------------------------------- real size: flagged


@pytest.mark.skipif(not FULL, reason="SARJAX_REALSIZE_FULL=1: WRN-28-10 and Llama-3.2-1B-sized pools, minutes")
def test_real_size_run(tmp_path):
    out = tmp_path / "realsize_run.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True, timeout=7200)
    assert out.exists(), r.stderr[-3000:]
    res = json.loads(out.read_text())
    wrn = res["wrn"]
    assert wrn["returncode"] == 0, r.stderr[-3000:]
    assert wrn["params_per_member"] > 36_000_000  # WRN-28-10
    check_wrn(wrn)
    for dtype in ("float32", "bfloat16"):
        attempts = res["llm"][dtype]
        done = attempts[-1]
        # a smaller size only where the machine's memory stopped the larger one
        for a in attempts[:-1]:
            assert any(str((v or {}).get("stopped") or "").startswith("MemAvailable") for v in a.values()
                       if isinstance(v, dict)), a  # fmt: skip
        assert all(done[p]["returncode"] == 0 for p in ("llm-build", "llm-jax", "llm-torch-check")), done
        check_llm(done["llm-jax"], done["llm-torch-check"]["member_losses_vs_transformers"], dtype)
        if done["layers"] is None:
            assert done["llm-build"]["params_per_member"] > 1_200_000_000  # Llama-3.2-1B: 1.24B
