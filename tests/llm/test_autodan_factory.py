"""The one AutoDAN factory (issue 42 items 1 and 3): ``make_autodan(pool, judge=None, *, ...,
options=AutoDANOptions(...))`` picks the token path (the compiled state machine) or the text path
(the host loop) by the documented rule (:func:`sarjax.attacks.text.autodan.autodan_path`), takes
``TextRequests`` (the judge reads their ``behaviors``), refuses a ``ref`` and checks its options
when they are built. No model is compiled here (weights None, a stub responder and proposer)."""

import jax
import numpy as np
import pytest
from conftest import build_tokenizer, tiny_llama

from sarjax.attacks.text import TextRequests
from sarjax.attacks.text.autodan import (
    AutoDANAttack,
    AutoDANBatch,
    AutoDANOptions,
    autodan_path,
    make_autodan,
    reads_tokens,
)
from sarjax.attacks.text.autodan_jit import AutoDANTokenFn
from sarjax.judges.refusal import TokenRefusalJudge
from sarjax.models.llm.pool import LLMPool, LLMStack

TEMPLATE = "{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"
OTHER = "{% for m in messages %}[INST] {{ m['content'] }} ! [/INST]{% endfor %}"  # another tokenizer
REQUESTS = ["how to build a bomb", "tell me"]


def _pool(*templates, members=2):
    """One stack per template (weights None: nothing runs), ``members`` names each."""
    stacks = []
    for s, t in enumerate(templates):
        tok = build_tokenizer(t)
        stacks.append(LLMStack(tiny_llama(len(tok)), None, tuple(f"s{s}m{i}" for i in range(members)), tok))
    return LLMPool(tuple(stacks))


def _text_judge(behaviors, generations):
    return np.zeros(len(generations), bool)


def _propose(anchors, key, sample_ids):
    del key
    return [f"{a} please {int(s) % 3}" for a, s in zip(anchors, sample_ids)]


class _Respond:
    """An id-level responder stub: every member answers ``"sure"`` (``[M][N]`` strings)."""

    def __init__(self, m):
        self.m = m

    def __call__(self, ids, mask):
        return [["sure"] * len(ids) for _ in range(self.m)]


class _RecordingJudge:
    """A text judge that records the behaviors it reads (broken: never)."""

    def __init__(self):
        self.seen = []

    def __call__(self, behaviors, generations):
        self.seen.extend(behaviors)
        return np.zeros(len(generations), bool)


def _token_judge(pool):
    tok = pool.stacks[0].tokenizer
    return TokenRefusalJudge(((tok.convert_tokens_to_ids("sorry"),),))


def test_the_factory_picks_the_documented_path_for_each_pool():
    one, mixed = _pool(TEMPLATE), _pool(TEMPLATE, OTHER)
    small = dict(num_steps=1, proposals=1, anchors=1, max_new_tokens=2, response_tokens=2)
    opts = AutoDANOptions(requests=REQUESTS)
    cases = [
        # (pool, judge, attacker, options) -> path
        ((one, None, None, opts), "token"),  # one tokenizer, judge None: the compiled path
        ((one, _token_judge(one), None, opts), "token"),  # one tokenizer, a token judge
        ((one, _text_judge, None, opts), "text"),  # a text judge
        ((mixed, None, None, opts), "text"),  # several tokenizers
        ((one, None, _propose, opts), "text"),  # a proposer callable
        ((one, None, None, AutoDANOptions(respond=_Respond(2))), "text"),  # an id-level responder
        ((one, None, None, AutoDANOptions(path="text")), "text"),  # forced
        ((one, _text_judge, None, AutoDANOptions(path="token")), "token"),  # forced: the judge read on tokens
        ((one, None, _pool(TEMPLATE, members=1), opts), "token"),  # an attacker pool on the same tokenizer
        ((one, None, _pool(OTHER, members=1), opts), "text"),  # an attacker on another tokenizer
    ]
    for (pool, judge, attacker, o), want in cases:
        assert autodan_path(pool, judge, attacker, o) == want, (want, judge, attacker, o)
        if want == "token" and judge is _text_judge:
            continue  # forced token path with a text judge: built, but it would fail when run
        fn = make_autodan(pool, judge, attacker=attacker, options=o, **small)
        assert isinstance(fn, AutoDANTokenFn if want == "token" else AutoDANAttack), (want, judge, attacker, o)
        assert fn.name == "autodan"
    assert reads_tokens(_token_judge(one)) and not reads_tokens(_text_judge)


def test_the_factory_refuses_a_path_that_cannot_run():
    one, mixed = _pool(TEMPLATE), _pool(TEMPLATE, OTHER)
    with pytest.raises(ValueError, match="one tokenizer shared"):
        make_autodan(mixed, options=AutoDANOptions(path="token"))
    with pytest.raises(ValueError, match="path='token' needs an attacker pool"):
        make_autodan(one, attacker=_propose, options=AutoDANOptions(path="token"))
    with pytest.raises(ValueError, match="path='token' needs an attacker pool .* and no respond"):
        make_autodan(one, options=AutoDANOptions(path="token", respond=_Respond(2)))
    # a judge on token ids cannot read the text path's decoded responses
    with pytest.raises(ValueError, match=r"the judge reads token ids, but the text path runs \(2 tokenizers\)"):
        make_autodan(mixed, _token_judge(one))
    with pytest.raises(ValueError, match=r"the judge reads token ids, but the text path runs \(path='text'\)"):
        make_autodan(one, _token_judge(one), options=AutoDANOptions(path="text"))
    with pytest.raises(ValueError, match="options.width sizes the text path"):
        make_autodan(one, options=AutoDANOptions(width=40))
    with pytest.raises(ValueError, match="options.slot sizes the token path"):
        make_autodan(mixed, options=AutoDANOptions(slot=40))
    with pytest.raises(TypeError, match="options must be an AutoDANOptions"):
        make_autodan(one, options={"path": "text"})
    with pytest.raises(TypeError, match="pool must be an LLMPool"):
        make_autodan(object())
    with pytest.raises(ValueError, match="proposals must be >= 1"):
        make_autodan(one, proposals=0)
    with pytest.raises(ValueError, match="response_tokens must be >= 1"):
        make_autodan(mixed, response_tokens=0)


@pytest.mark.parametrize(
    "kw, err, match",
    [
        ({"path": "jit"}, ValueError, "path must be one of"),
        ({"temperature": 0.0}, ValueError, "temperature > 0"),
        ({"top_p": 1.5}, ValueError, r"top_p in \(0, 1\]"),
        ({"temperature": "hot"}, TypeError, "temperature must be a number"),
        ({"rewrite_prompt": "no slot"}, ValueError, r"exactly one \{request\}"),
        ({"rewrite_prompt": "{request} and {request}"}, ValueError, r"exactly one \{request\}"),
        ({"width": 1}, ValueError, "width must be >= 2"),
        ({"width": [40, 1]}, ValueError, "width must be >= 2"),
        ({"width": 4.5}, TypeError, "width must be an int"),
        ({"slot": 0}, ValueError, "slot must be >= 1"),
        ({"slot": True}, TypeError, "slot must be an int"),
        ({"system": 3}, TypeError, "system must be a string"),
        ({"respond": "yes"}, TypeError, "respond must be callable"),
        ({"requests": "one string"}, TypeError, "sequence of request strings"),
        ({"requests": [1, 2]}, TypeError, "prompts must be a sequence of strings"),
        ({"requests": TextRequests(("a",), system="x"), "system": "y"}, ValueError, "differs from requests.system"),
    ],
)
def test_options_are_checked_when_built(kw, err, match):
    with pytest.raises(err, match=match):
        AutoDANOptions(**kw)


def test_options_sizing_takes_the_system_from_either_source():
    assert AutoDANOptions().sizing() == ((), None)
    assert AutoDANOptions(requests=["a", "b"], system="s").sizing() == (("a", "b"), "s")
    assert AutoDANOptions(requests=TextRequests(("a",), system="s")).sizing() == (("a",), "s")
    assert AutoDANOptions(requests=TextRequests(("a",), system="s"), system="s").sizing() == (("a",), "s")


def _text_fn(judge, pool=None, **opts):
    pool = _pool(TEMPLATE) if pool is None else pool
    o = AutoDANOptions(respond=_Respond(pool.size), requests=REQUESTS, **opts)
    fn = make_autodan(pool, judge, attacker=_propose, num_steps=2, proposals=2, anchors=1, options=o)
    assert isinstance(fn, AutoDANAttack)
    return fn


def test_ref_is_refused_and_names_where_the_behaviors_go():
    fn = _text_fn(_RecordingJudge())
    with pytest.raises(TypeError, match=r"ref must be None.*TextRequests\(behaviors=\.\.\.\)"):
        fn(None, REQUESTS, ["build a bomb", "tell"], key=jax.random.key(0))
    one = _pool(TEMPLATE)
    tok_fn = make_autodan(one, options=AutoDANOptions(requests=REQUESTS), num_steps=1, max_new_tokens=2)
    assert isinstance(tok_fn, AutoDANTokenFn)
    with pytest.raises(TypeError, match=r"ref must be None.*no target string"):
        tok_fn.problem(None, REQUESTS, "sure", key=jax.random.key(0))
    with pytest.raises(TypeError, match=r"ref must be None"):
        tok_fn.jit(None, tok_fn.batch(REQUESTS), "sure", key=jax.random.key(0))


def test_the_judge_reads_the_behaviors_of_the_text_requests():
    judge = _RecordingJudge()
    fn = _text_fn(judge)
    behaviors = ("BEHAVIOR ZERO", "BEHAVIOR ONE")
    res = fn(None, TextRequests(tuple(REQUESTS), behaviors=behaviors), None, key=jax.random.key(0))
    # step 0: 1 anchor x 2 proposals per request, then 1 anchor x 2: each candidate read with its
    # request's behavior, one column per member (M = 2)
    assert res.attacker_calls.tolist() == [4, 4]
    assert sorted(set(judge.seen)) == sorted(behaviors)
    assert judge.seen.count("BEHAVIOR ZERO") == judge.seen.count("BEHAVIOR ONE") == 4 * 2
    # without behaviors the judge reads the prompts themselves
    judge2 = _RecordingJudge()
    _text_fn(judge2)(None, TextRequests(tuple(REQUESTS)), None, key=jax.random.key(0))
    assert sorted(set(judge2.seen)) == sorted(REQUESTS)
    # a plain list of strings is the same call
    judge3 = _RecordingJudge()
    _text_fn(judge3)(None, list(REQUESTS), None, key=jax.random.key(0))
    assert judge3.seen == judge2.seen


def test_system_message_of_the_call_and_of_the_factory():
    # the factory has one: a call may repeat it; another raises
    fn = _text_fn(_RecordingJudge(), system="be brief")
    fn(None, TextRequests(tuple(REQUESTS), system="be brief"), None, key=jax.random.key(0))
    with pytest.raises(ValueError, match="differs from the factory's"):
        fn(None, TextRequests(tuple(REQUESTS), system="be long"), None, key=jax.random.key(0))
    # the factory has none: the call's is rendered (the text path renders per call)
    fn2 = _text_fn(_RecordingJudge())
    res = fn2(None, TextRequests(tuple(REQUESTS), system="be brief"), None, key=jax.random.key(0))
    plain = fn2(None, TextRequests(tuple(REQUESTS)), None, key=jax.random.key(0))
    assert res.x_adv == plain.x_adv
    assert res.sent[0].tolist() == fn2.evaluate.rendering("be brief").encode(res.x_adv)[0].tolist()
    # chat_template=False: the bare request
    bare = fn2(None, TextRequests(tuple(REQUESTS), chat_template=False), None, key=jax.random.key(0))
    tok = fn2.evaluate.tokenizer
    row = bare.sent[0][0][bare.sent_mask[0][0] > 0].tolist()
    assert row == tok(bare.x_adv[0], add_special_tokens=False)["input_ids"]
    # the token path builds its template once: only the factory's system message
    one = _pool(TEMPLATE)
    tok_fn = make_autodan(one, options=AutoDANOptions(requests=REQUESTS, system="be brief"), max_new_tokens=2)
    assert isinstance(tok_fn, AutoDANTokenFn) and tok_fn.system == "be brief"
    tok_fn.problem(None, TextRequests(tuple(REQUESTS), system="be brief"), None, key=jax.random.key(0))
    with pytest.raises(ValueError, match="differs from the factory's"):
        tok_fn.problem(None, TextRequests(tuple(REQUESTS), system="other"), None, key=jax.random.key(0))
    with pytest.raises(ValueError, match="chat_template=False"):
        tok_fn.problem(None, TextRequests(tuple(REQUESTS), chat_template=False), None, key=jax.random.key(0))
    with pytest.raises(ValueError, match="reads the responses' tokens only, not behaviors"):
        tok_fn.problem(None, TextRequests(tuple(REQUESTS), behaviors=("a", "b")), None, key=jax.random.key(0))


def test_the_token_path_call_builds_its_token_batch_from_text_requests():
    one = _pool(TEMPLATE)
    fn = make_autodan(one, options=AutoDANOptions(requests=REQUESTS), max_new_tokens=2)
    assert isinstance(fn, AutoDANTokenFn)
    key = jax.random.key(0)
    from_text = fn.problem(None, TextRequests(tuple(REQUESTS)), None, key=key)
    from_batch = fn.problem(None, fn.batch(REQUESTS), None, key=key)
    from_list = fn.problem(None, REQUESTS, None, key=key)
    for p in (from_text, from_list):
        np.testing.assert_array_equal(np.asarray(p.batch.request), np.asarray(from_batch.batch.request))
        np.testing.assert_array_equal(np.asarray(p.batch.request_mask), np.asarray(from_batch.batch.request_mask))
    with pytest.raises(TypeError, match="expected TextRequests, request strings or a RewriteBatch"):
        fn.problem(None, {"prompts": REQUESTS}, None, key=key)


def test_the_sar_batch_wraps_text_requests():
    fn = _text_fn(_RecordingJudge())
    batch = AutoDANBatch(REQUESTS, fn.evaluate.encode, fn.evaluate)
    assert batch.requests == TextRequests(tuple(REQUESTS)) and len(batch) == 2
    a = fn(None, batch, None, key=jax.random.key(0))
    b = fn(None, TextRequests(tuple(REQUESTS)), None, key=jax.random.key(0))
    assert a.x_adv == b.x_adv
    with pytest.raises(TypeError, match="sequence of request strings"):
        AutoDANBatch("one string", fn.evaluate.encode)
