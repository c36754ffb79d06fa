"""pool_llm_sar's report (``llm_sar.json``, the ``sarjax llm-sar`` command's JSON) carries the run's
compilations under ``"compile"``. Known answer: an attack that compiles one jitted function holding
a fresh random constant (the pool adapter's table, as tests/llm/test_pool_adapters.py) compiles
exactly one program more than the same run (already done once in the process) without it.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
from conftest import build_tokenizer, scaled_init, tiny_llama

from sarjax.models.llm.pool import build_pool
from sarjax.sar import POOL_ADAPTERS, LLMAttackSpec, PoolAttack, PoolLLMSARSettings, pool_llm_sar


class _Result:
    def __init__(self, mask):
        b, m = mask.shape
        self.sent = np.full((b, 2), 5, np.int32)
        self.sent_mask = np.ones((b, 2), np.int32)
        self.success = mask.copy()
        self.member_loss = np.zeros((b, m))
        self.queries = mask.astype(np.int64)


class _Batch:
    def __init__(self, n, m):
        self.n, self.m = n, m

    def judge_clean(self, judge, behaviors):
        return np.zeros((self.n, self.m), bool), [["no"] * self.n for _ in range(self.m)]


def test_llm_sar_report_records_its_compilations(monkeypatch, tmp_path):
    tok = build_tokenizer()
    cfg = tiny_llama(96, hidden_size=16, num_heads=2, num_kv_heads=1, head_dim=8, intermediate_size=24)
    pool = build_pool([(f"m{i}", cfg, scaled_init(cfg, jax.random.key(i), 3.0), tok) for i in range(2)])
    c = float(np.random.default_rng().uniform(1, 2))
    x = jax.block_until_ready(jnp.ones(3))
    key = jax.random.key(0)

    compiling = []

    def attack(params, batch, ref, *, key, mask, **kw):
        if compiling:
            jax.jit(lambda v: jnp.cos(v) + c)(x).block_until_ready()  # one new program per call
        return _Result(np.asarray(mask, bool))

    def adapter(req):
        return PoolAttack(attack, None, _Batch(len(req.behaviors), req.pool.size), {}, 1, {}, None, self_judged=True)

    monkeypatch.setitem(POOL_ADAPTERS, "mine", adapter)
    spec = LLMAttackSpec("mine")
    pool_llm_sar(pool, ["a"], (0.0,), key=key, attack=spec, settings=PoolLLMSARSettings(with_asr=False))
    compiling.append(True)  # the same run again: only the attack's program is new
    st = PoolLLMSARSettings(with_asr=False, out=tmp_path)
    _, rep = pool_llm_sar(pool, ["a"], (0.0,), key=key, attack=spec, settings=st)
    got = rep["compile"]
    assert got["programs"] == 1 and got["cache_hits"] == 0 and got["seconds"] > 0, got
    written = json.loads((tmp_path / "llm_sar.json").read_text())
    assert written["compile"] == got
    assert written["provenance"]["date"] and written["provenance"]["machine"]["backend"] == "cpu"
