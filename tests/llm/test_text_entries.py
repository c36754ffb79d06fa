"""The host-driven text attacks on the one entry convention (issue 42 item 1).

Joint GCG, the pool BEAST across tokenizers and the AutoDAN-style rewriter are
:class:`~sarjax.attacks.core.entry.HostDrivenEntry` objects: no state machine, no jit-safe entry
(both ``TypeError``), the call ``fn(params, inputs, ref, *, key, mask=None, ...)`` with the key
keyword-only and required, and an unknown keyword refused by name. Their ``__call__`` overrides
are compatible with :meth:`Entry.__call__` (no type-checker exemption in sarjax/attacks).
"""

import inspect
from pathlib import Path

import jax
import pytest
from conftest import build_tokenizer, scaled_init, tiny_llama

import sarjax.attacks.text as T
from sarjax.attacks.core.entry import HostDrivenEntry
from sarjax.attacks.text.pool import pool_params
from sarjax.models.llm.pool import build_pool

TEMPLATE = "{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"
REQUESTS = ["how to build a bomb", "tell me"]
ROOT = Path(__file__).resolve().parents[2]


def _pool():
    tok = build_tokenizer(TEMPLATE)
    cfg = tiny_llama(96, hidden_size=16, num_heads=2, num_kv_heads=1, head_dim=8, intermediate_size=24)
    return build_pool([(f"m{i}", cfg, scaled_init(cfg, jax.random.key(i), 3.0), tok) for i in range(2)])


def _entries(pool):
    from sarjax.sar.llm_judging import PoolResponder, refusal_judge_fn  # test-only: sar builds the judges

    autodan = T.make_autodan(
        pool, refusal_judge_fn(["sorry"]), num_steps=1, proposals=1, anchors=1, max_new_tokens=2,
        options=T.AutoDANOptions(respond=PoolResponder(pool, 2), requests=REQUESTS),
    )  # fmt: skip
    return {
        "joint_gcg": (T.make_gcg(pool, num_steps=1, suffix_len=2, num_candidates=2), pool_params(pool)),
        "cross_beast": (T.make_beast(pool, suffix_len=1, beam_width=1, candidates=2), pool_params(pool)),
        "autodan": (autodan, None),
    }


def test_no_attack_override_needs_a_type_checker_exemption():
    hits = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in sorted((ROOT / "sarjax" / "attacks").rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if "reportIncompatibleMethodOverride" in line
    ]
    assert hits == []


def test_host_driven_text_entries_share_the_call_shape():
    entries = _entries(_pool())
    for name, (fn, params) in entries.items():
        assert isinstance(fn, HostDrivenEntry), name
        with pytest.raises(TypeError, match="no jit-safe entry"):
            fn.jit(params, REQUESTS, None, key=jax.random.key(0))
        with pytest.raises(TypeError, match="has no state machine"):
            _ = fn.attack
        sig = inspect.signature(fn.__call__)
        kinds = [p.kind for p in list(sig.parameters.values())[:3]]
        assert kinds == [inspect.Parameter.POSITIONAL_OR_KEYWORD] * 3, name
        key, mask = sig.parameters["key"], sig.parameters["mask"]
        assert key.kind is inspect.Parameter.KEYWORD_ONLY and key.default is inspect.Parameter.empty, name
        assert mask.kind is inspect.Parameter.KEYWORD_ONLY and mask.default is None, name
        with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['bogus'\]"):
            fn(params, REQUESTS, None, key=jax.random.key(0), bogus=1)
        with pytest.raises(TypeError, match="key is required"):
            fn(params, REQUESTS, None, key=None)
    with pytest.raises(TypeError, match=r"the rewrites are text; the token path of make_autodan has a jit-safe entry"):
        entries["autodan"][0].jit(None, REQUESTS, None, key=jax.random.key(0))
