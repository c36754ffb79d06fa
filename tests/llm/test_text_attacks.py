"""Joint GCG and joint BEAST on a tiny stacked Llama pool (sarjax.attacks.text).

Every attack config is built once per module (three compiles in all) and every call uses the
same batch shapes, so the kernels are shared between tests.
"""

import itertools

import jax
import numpy as np
import pytest
from conftest import build_tokenizer, scaled_init, tiny_gpt2, tiny_llama

from sarjax.attacks.text import (
    BEASTOptions,
    audit_text,
    exchange_suffix,
    joint_loss,
    llm_text_model,
    make_beast,
    make_gcg,
    refusal_loss,
    seed_suffixes,
    target_loss,
    text_batch,
)
from sarjax.attacks.text import entry as TE
from sarjax.attacks.text import model as TM
from sarjax.attacks.text import requests as TR
from sarjax.models.llm import decoder, scoring
from sarjax.models.llm.pool import unstack_params

V = 24
LS = 3
MASK = np.array([1.0, 0.0, 1.0])  # member 1 is covered already
BEFORE = [[1, 2, 3], [4, 5]]
AFTER = [[6], [7, 8]]
TARGET = [[9, 10], [11]]


@pytest.fixture(scope="module")
def pool():
    cfg = tiny_llama(V, hidden_size=16, num_heads=2, num_kv_heads=1, head_dim=8, intermediate_size=24)
    keys = jax.random.split(jax.random.key(0), 3)
    params = jax.vmap(lambda k: scaled_init(cfg, k, 3.0))(keys)
    return cfg, params, llm_text_model(cfg), text_batch(BEFORE, AFTER, TARGET)


@pytest.fixture(scope="module")
def gcg(pool):
    return make_gcg(pool[2], vocab_size=V, num_steps=4, suffix_len=LS, topk=4, num_candidates=64)


@pytest.fixture(scope="module")
def beast(pool):
    return make_beast(pool[2], vocab_size=V, suffix_len=LS, beam_width=2, candidates=3)


_nll_one = jax.jit(scoring.target_nll, static_argnums=1)
_logits_one = jax.jit(decoder.logits, static_argnums=1)
_member_losses = jax.jit(TM.member_losses, static_argnums=(0, 1))
_member_losses_cached = jax.jit(TM.member_losses_cached, static_argnums=(0, 1))


def _member_nll(cfg, params, m, prompt, target):
    """Per-token target NLL of member m on a hole-free prompt (computed alone, unbatched)."""
    p = unstack_params(params, m)
    ids = np.asarray(prompt, np.int32)
    return np.asarray(_nll_one(p, cfg, ids, np.ones_like(ids), np.asarray(target, np.int32)))


def _joint_by_hand(cfg, params, b, suffix, mask=MASK, members=(0, 1, 2)):
    losses = [
        _member_nll(cfg, params, m, BEFORE[b] + list(suffix) + AFTER[b], TARGET[b]).mean() if m in members else 0.0
        for m in range(3)
    ]
    return float(np.sum(mask * np.asarray(losses)) / mask.sum()), losses


def test_joint_loss_equals_mean_of_members_one_by_one(pool):
    cfg, params, model, batch = pool
    r = TR.row(TR.TextBatch(*(np.asarray(a) for a in batch)), 1)  # row 1: before is left-padded (a hole)
    sufs = np.array([[3, 4, 5], [0, 7, 7]], np.int32)
    sm = np.array([[1, 1, 1], [0, 1, 1]], np.int32)  # the second suffix has one hole
    ml = np.asarray(_member_losses(model, target_loss, params, r, sufs, sm))  # [M, N]
    jl = np.asarray(joint_loss(ml, MASK))
    for n, s in enumerate([[3, 4, 5], [7, 7]]):
        want, each = _joint_by_hand(cfg, params, 1, s)
        np.testing.assert_allclose(ml[:, n], each, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(jl[n], want, rtol=1e-5, atol=1e-5)
        assert abs(jl[n] - np.mean(each)) > 1e-4  # the mask matters here
    # GCG's candidate scoring reads the (left-padded) before block from a per-member KV cache
    np.testing.assert_allclose(
        np.asarray(_member_losses_cached(model, target_loss, params, r, sufs, sm)), ml, atol=1e-5
    )


def test_pool_of_two_stacks_scores_members_in_stack_order(pool):
    cfg, params, _, batch = pool
    gcfg = tiny_gpt2(V)
    gp = jax.vmap(lambda k: scaled_init(gcfg, k, 3.0))(jax.random.split(jax.random.key(1), 1))
    two = (jax.tree.map(lambda x: x[:2], params), gp)
    r = TR.row(TR.TextBatch(*(np.asarray(a) for a in batch)), 0)
    ml = np.asarray(_member_losses(llm_text_model((cfg, gcfg)), target_loss, two, r, np.array([[3, 4, 5]]), np.ones(3)))
    prompt = BEFORE[0] + [3, 4, 5] + AFTER[0]
    want = [_member_nll(cfg, params, m, prompt, TARGET[0]).mean() for m in range(2)]
    want.append(_member_nll(gcfg, gp, 0, prompt, TARGET[0]).mean())
    np.testing.assert_allclose(ml[:, 0], want, rtol=1e-5, atol=1e-5)
    model2 = llm_text_model((cfg, gcfg))
    cached = _member_losses_cached(model2, target_loss, two, r, np.array([[3, 4, 5]]), np.ones(3))
    np.testing.assert_allclose(np.asarray(cached)[:, 0], want, rtol=1e-5, atol=1e-5)  # one cache per stack
    with pytest.raises(ValueError, match="share one vocabulary"):
        llm_text_model((cfg, tiny_gpt2(V + 1)))


def test_gcg_finds_the_brute_force_optimum_over_a_tiny_vocabulary(pool, gcg):
    cfg, params, _, batch = pool
    allowed = np.zeros(V, bool)
    allowed[[12, 15, 17, 20]] = True
    r = gcg(params, batch, None, key=jax.random.key(3), mask=MASK, allowed=allowed, suffix_init=[12, 12, 12])
    every = list(itertools.product([12, 15, 17, 20], repeat=LS))
    nb = TR.TextBatch(*(np.asarray(a) for a in batch))
    for b in range(2):
        # default loss: MAXIMISE the mean refusal NLL (the SAR paper), i.e. minimise its negative;
        # the batched scorer is checked against one-by-one scoring in the test above
        ml = _member_losses(
            pool[2], refusal_loss, params, TR.row(nb, b), np.asarray(every, np.int32), np.ones(LS, np.int32)
        )
        brute = dict(zip(every, np.asarray(joint_loss(ml, MASK)).tolist(), strict=True))
        best = min(brute, key=lambda s: brute[s])
        np.testing.assert_allclose(brute[best], -_joint_by_hand(cfg, params, b, best)[0], rtol=1e-5)
        swaps = lambda s: [s[:i] + (t,) + s[i + 1 :] for i in range(LS) for t in (12, 15, 17, 20)]  # noqa: E731
        local = [s for s in every if all(brute[s] <= brute[n] for n in swaps(s))]
        got = tuple(np.asarray(r.suffix[b]).tolist())
        # coordinate search ends in a one-swap local minimum; here row 0 has one (the global
        # optimum) and row 1 has four, so this pins the search on both rows
        assert got in local, (got, local)
        assert (b != 0) or (len(local) == 1 and got == best)
        np.testing.assert_allclose(float(r.loss[b]), brute[got], rtol=1e-5, atol=1e-5)
        assert brute[got] < brute[(12, 12, 12)] - 1e-3  # the start was not already optimal
    # the returned loss is the joint loss of the returned members' losses
    np.testing.assert_allclose(np.asarray(r.loss), np.asarray(r.member_loss) @ MASK / 2, rtol=1e-5)


def test_gcg_queries_cap_key_mask_and_allowed(pool, gcg):
    cfg, params, _, batch = pool
    allowed = np.arange(V) % 2 == 1
    call = dict(allowed=allowed, suffix_init=[1, 1, 1])
    r1 = gcg(params, batch, None, key=jax.random.key(5), mask=MASK, **call)
    r2 = gcg(params, batch, None, key=jax.random.key(5), mask=MASK, **call)
    np.testing.assert_array_equal(np.asarray(r1.suffix), np.asarray(r2.suffix))
    np.testing.assert_array_equal(np.asarray(r1.loss), np.asarray(r2.loss))
    assert np.all(np.asarray(r1.suffix) % 2 == 1)  # masked-out ids never appear
    # start: 1 forward per covered member; step: (1 gradient + 64 candidates) per covered member
    nm = 2
    assert np.asarray(r1.queries).sum(1).tolist() == [nm + 4 * 65 * nm] * 2
    assert np.asarray(r1.queries).tolist() == [[1 + 4 * 65, 0, 1 + 4 * 65]] * 2  # per covered member
    # a traced per-request cap: row 0 can afford 2 steps, row 1 none
    rc = gcg(params, batch, None, key=jax.random.key(5), mask=MASK, max_queries=[nm + 2 * 65 * nm + 5, nm + 3], **call)
    assert np.asarray(rc.queries).sum(1).tolist() == [nm + 2 * 65 * nm, nm]
    np.testing.assert_array_equal(np.asarray(rc.suffix[1]), [1, 1, 1])
    # the uncovered member does not influence the search (its weights changed -> same suffix)
    p2 = jax.tree.map(lambda x: x.at[1].multiply(-1.0), params)
    r3 = gcg(p2, batch, None, key=jax.random.key(5), mask=MASK, **call)
    np.testing.assert_array_equal(np.asarray(r1.suffix), np.asarray(r3.suffix))
    np.testing.assert_allclose(np.asarray(r1.loss), np.asarray(r3.loss), rtol=1e-6)


def _mixture_top(cfg, params, prompt, allowed, k):
    probs = []
    for m in np.flatnonzero(MASK):
        lg = np.asarray(_logits_one(unstack_params(params, m), cfg, np.asarray(prompt, np.int32)))[-1]
        probs.append(np.exp(lg - lg.max()) / np.exp(lg - lg.max()).sum())
    mix = np.where(allowed, np.mean(probs, axis=0), -1.0)
    return list(np.argsort(-mix, kind="stable")[:k])


def test_beast_beam_width_one_greedy_equals_hand_trace(pool):
    cfg, params, model, batch = pool
    fn = make_beast(
        model, vocab_size=V, suffix_len=LS, beam_width=1, candidates=3, options=BEASTOptions(sampler="greedy")
    )
    allowed = np.ones(V, bool)
    allowed[[0, 5, 9]] = False
    r = fn(params, batch, None, key=jax.random.key(0), mask=MASK, allowed=allowed)
    for b in range(2):
        suffix, best, best_s = [], np.inf, None
        for _ in range(LS):
            toks = _mixture_top(cfg, params, BEFORE[b] + suffix, allowed, 3)
            scores = [_joint_by_hand(cfg, params, b, suffix + [t], members=(0, 2))[0] for t in toks]
            i = int(np.argmin(scores))
            suffix = suffix + [int(toks[i])]
            if scores[i] < best:
                best, best_s = scores[i], list(suffix)
        n = int(np.asarray(r.suffix_mask[b]).sum())
        assert np.asarray(r.suffix[b])[LS - n :].tolist() == best_s
        np.testing.assert_allclose(float(r.loss[b]), best, rtol=1e-5, atol=1e-5)
    assert np.asarray(r.queries).sum(1).tolist() == [LS * (1 + 3) * 2] * 2
    # the jit-safe entry inside a user's jax.jit (traced mask, key, cap, allowed) gives the same result
    traced = jax.jit(lambda p, m, k, cap, al: fn.jit(p, batch, None, key=k, mask=m, max_queries=cap, allowed=al))
    rj = traced(params, MASK, jax.random.key(0), 10**6, allowed)
    for name, a, b in zip(r._fields, r, rj, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, err_msg=name)


def test_beast_queries_cap_key_allowed_and_seed(pool, beast):
    cfg, params, _, batch = pool
    allowed = np.arange(V) % 3 != 0
    r1 = beast(params, batch, None, key=jax.random.key(7), mask=MASK, allowed=allowed)
    r2 = beast(params, batch, None, key=jax.random.key(7), mask=MASK, allowed=allowed)
    np.testing.assert_array_equal(np.asarray(r1.x_adv), np.asarray(r2.x_adv))
    real = np.asarray(r1.suffix)[np.asarray(r1.suffix_mask) == 1]
    assert real.size and np.all(real % 3 != 0)
    per_step = (2 + 2 * 3) * 2
    assert np.asarray(r1.queries).sum(1).tolist() == [LS * per_step] * 2
    # the returned loss is the joint loss of the returned suffix, recomputed by hand
    for b in range(2):
        n = int(np.asarray(r1.suffix_mask[b]).sum())
        want = _joint_by_hand(cfg, params, b, np.asarray(r1.suffix[b])[LS - n :].tolist())[0]
        np.testing.assert_allclose(float(r1.loss[b]), want, rtol=1e-5, atol=1e-5)
    others = [beast(params, batch, None, key=jax.random.key(k), mask=MASK, allowed=allowed) for k in (8, 9)]
    assert any(not np.array_equal(np.asarray(o.x_adv), np.asarray(r1.x_adv)) for o in others)
    # a traced cap stops after one step for row 1
    rc = beast(
        params, batch, None, key=jax.random.key(7), mask=MASK, allowed=allowed, max_queries=[10**6, per_step + 1]
    )
    assert np.asarray(rc.queries).sum(1).tolist() == [LS * per_step, per_step]
    assert int(np.asarray(rc.suffix_mask[1]).sum()) == 1
    # one allowed id: the first layer has 1 valid candidate for k1 = 2 beams; the invalid beam's
    # children must never be kept (the audit would raise on a banned id)
    one = beast(params, batch, None, key=jax.random.key(7), mask=MASK, allowed=np.arange(V) == 13)
    assert np.all(np.asarray(one.suffix)[np.asarray(one.suffix_mask) == 1] == 13)
    # with the tiny word-level tokenizer (ids 6..23 are words: every suffix of them re-tokenizes)
    # the state machine is the same but for the tokenizer it calls back (the re-tokenization
    # filter and the scoring of the text that is sent, issue 42)
    fn_tok = make_beast(pool[2], vocab_size=V, suffix_len=LS, beam_width=2, candidates=3, tokenizer=build_tokenizer())
    assert fn_tok.attack.cfg.retok is not None and fn_tok.attack.cfg._replace(retok=None) == beast.attack.cfg
    rt = fn_tok(params, batch, None, key=jax.random.key(7), mask=MASK, allowed=allowed & (np.arange(V) >= 6))
    assert np.all(np.asarray(rt.suffix)[np.asarray(rt.suffix_mask) == 1] >= 6)
    # a seed of one token: scored once, then 2 steps append to it
    rs = beast(
        params, batch, None, key=jax.random.key(7), mask=MASK, allowed=allowed, suffix_init=[0, 0, 4], init_len=1
    )
    assert np.asarray(rs.queries).sum(1).tolist() == [2 + 2 * per_step] * 2
    for b in range(2):
        n = int(np.asarray(rs.suffix_mask[b]).sum())
        assert np.asarray(rs.suffix[b])[LS - n] == 4


class _MergingTokenizer:
    """Letters a, b, ... for ids 0, 1, ...; encoding merges "ab" into id 20 (so [0, 1] does not
    re-tokenize to itself, while [20] and [1, 0] do)."""

    def decode(self, ids, **_):
        return "".join("ab" if i == 20 else chr(97 + i) for i in ids)

    def __call__(self, text, add_special_tokens=False):
        out, i = [], 0
        while i < len(text):
            if text[i : i + 2] == "ab":
                out.append(20)
                i += 2
            else:
                out.append(ord(text[i]) - 97)
                i += 1
        return {"input_ids": out}


def test_audit_names_offending_rows(pool, gcg):
    cfg, params, _, batch = pool
    prob = gcg.problem(params, batch, None, key=jax.random.key(0), mask=MASK, suffix_init=[[1, 0, 20], [1, 0, 1]])
    ids = np.concatenate([np.asarray(batch.before), np.asarray(prob.suffix_init), np.asarray(batch.after)], axis=1)
    mask = np.concatenate([batch.before_mask, np.ones((2, LS), np.int32), batch.after_mask], axis=1)
    q = np.zeros((2, 3), np.int32)
    good = TE.TextAttackResult(
        ids, np.zeros((2, 3), bool), q, mask, np.asarray(prob.suffix_init), np.ones((2, LS), np.int32), np.zeros(2),
        np.zeros((2, 3)), ids, mask, np.zeros(2, bool),
    )  # fmt: skip
    audit_text("gcg", prob, good)  # no tokenizer: passes
    with pytest.raises(ValueError, match=r"row 1: the suffix ids do not re-tokenize") as e:
        audit_text("gcg", prob, good, _MergingTokenizer())  # row 1 = [1, 0, 1] -> "bab" -> [1, 20]
    assert "row 0" not in str(e.value)
    bad = ids.copy()
    bad[0, 0] = 13  # the request itself changed
    with pytest.raises(ValueError, match=r"row 0: the part before the suffix changed"):
        audit_text("gcg", prob, good._replace(x_adv=bad))
    prob2 = prob._replace(allowed=np.arange(V) != 20)
    with pytest.raises(ValueError, match=r"row 0: suffix ids outside the allowed vocabulary: \[20\]"):
        audit_text("gcg", prob2, good)
    # queries charged to an uncovered member (member 1 of MASK), or above the cap
    with pytest.raises(ValueError, match=r"row 1: queries \[0, 3, 0\] are negative, charged to uncovered members"):
        audit_text("gcg", prob, good._replace(queries=q + np.array([[0, 0, 0], [0, 3, 0]])))
    capped = prob._replace(cap=np.array([5, 10**6]))
    with pytest.raises(ValueError, match=r"row 0: .*above the cap 5"):
        audit_text("gcg", capped, good._replace(queries=q + np.array([[3, 0, 3], [0, 0, 0]])))


def test_input_errors(pool, gcg):
    cfg, params, model, batch = pool
    with pytest.raises(TypeError, match="key is required"):
        gcg(params, batch, None, key=None, mask=MASK)
    with pytest.raises(ValueError, match="allowed vocabulary"):
        gcg.problem(
            params, batch, None, key=jax.random.key(0), mask=MASK, allowed=np.arange(V) > 2, suffix_init=[1, 4, 4]
        )
    for bad_mask in (np.array([1.0, -1.0, 1.0]), np.array([1.0, np.nan, 1.0]), np.array([2.0, 0.0, 1.0])):
        with pytest.raises(ValueError, match=r"mask must be bool or \{0, 1\}"):  # no flipped or NaN objective
            gcg.problem(params, batch, None, key=jax.random.key(0), mask=bad_mask)
    with pytest.raises(TypeError, match="ref must be None"):
        gcg.problem(params, batch, batch.target, key=jax.random.key(0))
    with pytest.raises(TypeError, match="texts needs the factory's tokenizer"):
        gcg(params, batch, None, key=jax.random.key(0), texts=(["a", "b"], ["c", "d"]))
    with pytest.raises(TypeError, match="texts is read by the audited entry only"):
        gcg.jit(params, batch, None, key=jax.random.key(0), texts=(["a", "b"], ["c", "d"]))
    with pytest.raises(ValueError, match=r"mask must be \[M\] or \[B, M\] with B=\d+, M=3"):
        gcg.problem(params, batch, None, key=jax.random.key(0), mask=np.ones(2))
    with pytest.raises(ValueError, match="target rows \\[1\\] are empty"):
        text_batch([[1], [2]], [[], []], [[3], []])
    with pytest.raises(ValueError, match="exceeds the vocabulary"):
        make_beast(model, vocab_size=V, beam_width=5, candidates=5)
    with pytest.raises(ValueError, match="outside \\[0, 24\\)"):
        gcg.problem(params, text_batch([[1, 99]], [[2]], [[3]]), None, key=jax.random.key(0), mask=MASK)


class _LettersTokenizer(_MergingTokenizer):
    """Letters a..e only (no merges); other characters are not encodable (id 99)."""

    def decode(self, ids, **_):
        return "".join(chr(97 + i) if i < 5 else "?" for i in ids)

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) - 97 if "a" <= c <= "e" else 99 for c in text]}


def test_exchange_suffix_as_text_keeps_only_retokenizable_suffixes():
    merging, letters = _MergingTokenizer(), _LettersTokenizer()
    assert exchange_suffix([20, 2], merging, [letters, merging]) == [[0, 1, 2], [20, 2]]
    assert exchange_suffix([0, 1, 3], letters, [merging]) == [[20, 3]]
    assert exchange_suffix([5], merging, [letters]) is None  # "f" is not in the letters vocabulary


def test_seed_suffixes_right_aligns_and_clips():
    tok = _MergingTokenizer()
    s, n = seed_suffixes(lambda req: ["", "cde" + req], ["fg", "hij"], tok, suffix_len=4, seed_tokens=3)
    assert n.tolist() == [3, 3]
    assert s.tolist() == [[0, 2, 3, 4], [0, 2, 3, 4]]


def test_success_is_the_teacher_forced_greedy_check_on_the_prompt_without_holes(pool, beast):
    """``success`` by hand: member m's argmax next tokens reproduce the whole target after the
    returned prompt (its real tokens only). With no template tail and a cap that scores nothing,
    the prompt is ``before`` followed by empty suffix slots: the check must read ``before``'s last
    token, not a hole."""
    cfg, params, _, _ = pool
    batch = text_batch(BEFORE, [[], []], TARGET)
    for cap in (0, 10**6):
        r = beast(params, batch, None, key=jax.random.key(7), mask=MASK, max_queries=cap)
        for b in range(2):
            prompt = np.asarray(r.x_adv[b])[np.asarray(r.mask[b]) == 1].tolist()
            assert cap or prompt == BEFORE[b]
            for m in range(3):
                lg = np.asarray(_logits_one(unstack_params(params, m), cfg, np.asarray(prompt + TARGET[b][:-1])))
                want = np.argmax(lg[len(prompt) - 1 :], -1).tolist() == TARGET[b]
                assert bool(r.success[b, m]) == want, (cap, b, m)
    # a target the members do reproduce: member 0's own greedy continuation of request 0
    lg = np.asarray(_logits_one(unstack_params(params, 0), cfg, np.asarray(BEFORE[0])))
    t0 = [int(np.argmax(lg[-1]))]
    r = beast(params, text_batch(BEFORE, [[], []], [t0, t0]), None, key=jax.random.key(7), mask=MASK, max_queries=0)
    assert bool(r.success[0, 0])
