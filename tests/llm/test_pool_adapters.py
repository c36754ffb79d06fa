"""pool_llm_sar builds every attack through its pool adapter (sarjax.sar.llm_adapters.POOL_ADAPTERS):
the table is all pool_llm_sar knows of attack names, so a new attack joins with one entry."""

import jax
import numpy as np
import pytest
from conftest import build_tokenizer, scaled_init, tiny_llama

from sarjax.models.llm.pool import build_pool
from sarjax.sar import POOL_ADAPTERS, LLMAttackSpec, PoolAttack, PoolLLMSARSettings, pool_llm_sar


@pytest.fixture(scope="module")
def pool():
    tok = build_tokenizer()
    cfg = tiny_llama(96, hidden_size=16, num_heads=2, num_kv_heads=1, head_dim=8, intermediate_size=24)
    return build_pool([(f"m{i}", cfg, scaled_init(cfg, jax.random.key(i), 3.0), tok) for i in range(3)])


class _Result:
    def __init__(self, mask):
        b, m = mask.shape
        self.sent = np.full((b, 2), 5, np.int32)
        self.sent_mask = np.ones((b, 2), np.int32)
        self.success = mask.copy()  # breaks every member it targets
        self.member_loss = np.zeros((b, m))
        self.queries = mask.astype(np.int64)


class _Batch:
    """Requests that judge their own clean prompts (no decoding: nothing compiles)."""

    def __init__(self, n, m):
        self.n, self.m = n, m

    def judge_clean(self, judge, behaviors):
        return np.zeros((self.n, self.m), bool), [["no"] * self.n for _ in range(self.m)]


def test_the_table_holds_the_three_attacks():
    assert set(POOL_ADAPTERS) == {"beast", "gcg", "autodan"}


def test_a_registered_adapter_runs_in_pool_llm_sar(pool, monkeypatch, tmp_path):
    seen = {}

    def attack(params, batch, ref, *, key, mask, **kw):
        return _Result(np.asarray(mask, bool))

    def adapter(req):
        seen["req"] = req
        batch = _Batch(len(req.behaviors), req.pool.size)
        return PoolAttack(attack, None, batch, {}, 1, {"mine": 1}, None, self_judged=True)

    monkeypatch.setitem(POOL_ADAPTERS, "mine", adapter)
    run, rep = pool_llm_sar(
        pool, ["a", "b"], (0.0,), key=jax.random.key(0), attack=LLMAttackSpec("mine", options={"x": 2}),
        settings=PoolLLMSARSettings(with_asr=False, out=tmp_path),
    )  # fmt: skip
    req = seen["req"]
    assert req.settings == {"x": 2} and req.behaviors == ["a", "b"] and not req.mixed
    assert rep["settings"]["attack"] == "mine" and rep["settings"]["settings"] == {"mine": 1}
    np.testing.assert_array_equal(run.result.k_hat[:, 0], [1, 1])  # one joint input breaks all three


def test_an_unknown_attack_names_the_table(pool):
    with pytest.raises(ValueError, match=r"attack must be one of 'beast', 'gcg', 'autodan', got 'nope'"):
        pool_llm_sar(pool, ["a"], (0.0,), key=jax.random.key(0), attack="nope")
