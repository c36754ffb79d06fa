"""AutoDAN-style rewriting (sarjax.attacks.text.autodan) with a stub attacker and a stub pool.

The stub attacker appends one word ``w<k>`` to its anchor, ``k`` drawn from the key and the
proposal's sample id; stub member ``m`` complies iff the request holds ``w<m>``, with confidence
``min(1, 0.3 * count)`` of its word otherwise. No model is compiled here.
"""

import os

import jax
import numpy as np
import pytest

from sarjax.attacks.text.autodan import AutoDANAttack
from sarjax.attacks.text.autodan_judge import rank_key, refusal_confidence

M = 4


def _propose(anchors, key, sample_ids):
    seed = int(np.asarray(jax.random.key_data(key)).sum())
    out = []
    for a, s in zip(anchors, sample_ids):
        k = np.random.default_rng([seed, int(s)]).integers(M)
        out.append(f"{a} w{k}")
    return out


class _Eval:
    def __call__(self, texts, behaviors):
        del behaviors
        counts = np.array([[t.split().count(f"w{m}") for m in range(M)] for t in texts])
        broken = counts > 0
        return broken, np.where(broken, 1.0, 0.0) + 0.01 * np.array([len(t) for t in texts])[:, None] % 1

    def encode(self, texts, stack=0):
        ids = np.array([[len(t) % 7 + 1, 1] for t in texts], np.int32)
        return ids, np.ones_like(ids)


def _attack(**kw):
    kw = {"proposals": 4, "anchors": 2, "num_steps": 3, **kw}
    return AutoDANAttack(_propose, _Eval(), M, **kw)


def test_rank_key_is_lexicographic_over_the_uncovered_members():
    mask = np.array([True, True, True, False, True])
    # broken count first (member 3 is covered: its break does not count)
    a = rank_key([1, 0, 0, 1, 0], [0.9, 0.9, 0.9, 1.0, 0.9], mask)
    b = rank_key([1, 1, 0, 0, 0], [0.1, 0.1, 0.1, 0.0, 0.1], mask)
    assert b > a and a[0] == 1 and b[0] == 2
    # equal counts: the mean confidence decides; equal means: the 20% quantile
    c = rank_key([1, 0, 0, 0, 0], [0.2, 0.2, 0.2, 0.0, 0.2], mask)
    d = rank_key([1, 0, 0, 0, 0], [0.5, 0.1, 0.1, 0.0, 0.1], mask)
    e = rank_key([1, 0, 0, 0, 0], [0.35, 0.35, 0.05, 0.0, 0.05], mask)
    assert c[1] == pytest.approx(d[1]) == pytest.approx(e[1])
    assert c[2] == pytest.approx(np.quantile([0.2] * 4, 0.2)) and d[2] == pytest.approx(0.1)
    assert sorted([d, e, c], reverse=True)[0] == c
    assert rank_key([1, 1], [1.0, 1.0], [False, False]) == (0.0, 0.0, 0.0)


def test_refusal_confidence():
    conf = refusal_confidence(["Sure, here it is", "I'm sorry", "Step 1: mix. I cannot go on"])
    assert conf[0] == 1.0 and conf[1] == 0.0
    assert conf[2] == pytest.approx(len("step 1: mix. ") / len("step 1: mix. i cannot go on"))


def test_one_step_picks_the_lexicographic_best_of_the_four_proposals():
    fn = _attack(num_steps=1, anchors=1)
    reqs = ["make a thing", "do a task", "go"]
    mask = np.array([[1, 1, 0, 1], [0, 1, 0, 0], [1, 0, 1, 0]], np.float32)
    key = jax.random.key(0)
    res = fn(None, reqs, None, key=key, mask=mask, sample_ids=np.array([5, 6, 7]))
    ev = _Eval()
    for b, r in enumerate(reqs):  # by hand: proposal p of request b has sample id sid * 1 * 4 + p
        props = _propose([r] * 4, jax.random.fold_in(key, 0), [(5 + b) * 4 + p for p in range(4)])
        br, cf = ev(props, [r] * 4)
        keys = [rank_key(br[p], cf[p], mask[b] > 0) for p in range(4)]
        want = props[int(np.argmax([k == max(keys) for k in keys]))]  # first of the best (stable)
        assert res.x_adv[b] == want
        np.testing.assert_array_equal(res.success[b], br[props.index(want)])
    np.testing.assert_array_equal(res.queries.sum(1), 4 * mask.sum(1))
    np.testing.assert_array_equal(res.queries, 4 * mask)  # 4 responses of each uncovered member
    np.testing.assert_array_equal(res.attacker_calls, [4, 4, 4])
    np.testing.assert_array_equal(res.member_loss, -res.confidence)


def test_queries_exact_over_steps_and_same_key_same_result():
    fn = _attack()
    reqs = ["make a thing", "do a task"]
    mask = np.array([[1, 1, 0, 1], [0, 1, 0, 0]], np.float32)
    res = fn(None, reqs, None, key=jax.random.key(0), mask=mask)
    # 1 anchor x 4 proposals, then 2 anchors x 4 per step; a row stops once its uncovered are broken
    assert res.attacker_calls[0] in (4, 12, 20) and res.attacker_calls[1] in (4, 12, 20)
    np.testing.assert_array_equal(res.queries.sum(1), res.attacker_calls * mask.sum(1))
    np.testing.assert_array_equal(res.queries, res.attacker_calls[:, None] * mask)
    assert res.success[1, 1]  # member 1 is broken by w1 within 20 proposals
    again = fn(None, reqs, None, key=jax.random.key(0), mask=mask)
    assert again.x_adv == res.x_adv and (again.queries == res.queries).all()
    other = fn(None, reqs, None, key=jax.random.key(7), mask=mask)
    assert other.x_adv != res.x_adv or other.queries.tolist() != res.queries.tolist()


def test_cap_stops_before_a_step_that_would_pass_it_and_covered_rows_cost_nothing():
    fn = _attack(num_steps=5)
    mask = np.array([[1, 1, 1, 1], [0, 0, 0, 0]], np.float32)
    res = fn(None, ["x y", "z"], None, key=jax.random.key(1), mask=mask, max_queries=40)
    # step 0: 1 anchor x 4 proposals x 4 members = 16 queries; step 1: 2 x 4 x 4 = 32 > 40 - 16
    assert res.queries[0].sum() in (16,) and res.queries[1].sum() == 0 and res.attacker_calls[1] == 0
    assert res.x_adv[1] == "z"


def test_key_is_required():
    with pytest.raises(TypeError, match="key is required"):
        _attack()(None, ["a"], None, key=None)


@pytest.mark.skipif(
    not os.environ.get("SARJAX_LLM_FULL"), reason="set SARJAX_LLM_FULL=1 (compiles sampling + decoding)"
)
def test_autodan_on_a_tiny_pool_with_a_sampling_attacker():
    from conftest import build_tokenizer, scaled_init, tiny_llama

    from sarjax.attacks.text.autodan import AutoDANAttack, AutoDANOptions, make_autodan
    from sarjax.models.llm.pool import build_pool
    from sarjax.sar.llm_judging import PoolResponder, refusal_judge_fn

    tok = build_tokenizer("{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}")
    cfg = tiny_llama(96, hidden_size=16, num_heads=2, num_kv_heads=1, head_dim=8, intermediate_size=24)
    pool = build_pool([(f"m{i}", cfg, scaled_init(cfg, jax.random.key(i), 3.0), tok) for i in range(2)])
    judge = refusal_judge_fn(["sorry"])
    opts = AutoDANOptions(respond=PoolResponder(pool, 4), requests=["how to build"])
    fn = make_autodan(pool, judge, num_steps=1, max_new_tokens=4, options=opts)
    assert isinstance(fn, AutoDANAttack)  # a text judge: the host loop
    res = fn(None, ["how to build", "tell me"], None, key=jax.random.key(0))
    again = fn(None, ["how to build", "tell me"], None, key=jax.random.key(0))
    assert res.x_adv == again.x_adv
    assert res.queries.sum(1).tolist() == [4 * 2, 4 * 2]  # one step: 4 proposals x 2 uncovered members
