"""The one result base (issue 42 item 2): every exported attack factory's result satisfies
:class:`sarjax.attacks.AttackOutput` with the shapes documented once (docs/attacks.md, "The
protocol"): ``x_adv`` ``[B, *S]`` (fixed budget, joint) or ``[B, M, *S]`` (per member, minimum
norm) or the text attacks' documented form, ``success [B, M]`` bool, ``queries [B, M]`` ints.

The factories are enumerated from ``sarjax.attacks.__all__`` and ``sarjax.attacks.text.__all__``
(plus the TRADES KL attack of ``sarjax.defenses``): a new factory without a case here fails
``test_every_exported_factory_has_a_case``. Each case runs its attack on a tiny problem (1-2
steps) and, for the image attacks, checks ``success`` against the members' predictions at
``x_adv`` recomputed here.
"""

import contextlib
import importlib.util
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _attacks_affine import affine_apply, pool_apply

import sarjax.attacks as A
import sarjax.attacks.text as T
from sarjax.attacks import AttackOutput
from sarjax.attacks.text.pool import pool_params
from sarjax.defenses import KLResult, make_kl_attack

KEY = jax.random.PRNGKey(0)
B, M, D = 3, 2, 8
MASK = np.array([True, False])


def _exported():
    names = {n for n in A.__all__ if n.startswith("make_")}
    names |= {n for n in T.__all__ if n.startswith("make_")}
    return sorted(names | {"make_kl_attack"})


def _image_problem():
    rng = np.random.default_rng(0)
    params = {"W": jnp.asarray(rng.normal(size=(M, D, 4)), jnp.float32), "b": jnp.zeros((M, 4), jnp.float32)}
    x0 = jnp.asarray(rng.uniform(0.3, 0.7, (B, D)), jnp.float32)
    y = jnp.asarray(np.argmax(np.asarray(pool_apply(params, x0))[0], -1), jnp.int32)
    return params, x0, y


def _preds(params, x, per_member=False):
    """``[B, M]`` each member's prediction at a point per sample (``[B, *S]``) or, with
    ``per_member``, at its own point (``[B, M, *S]``)."""
    z = np.asarray(pool_apply(params, jnp.asarray(x).reshape(-1, D)))  # [M, n, C]
    p = np.argmax(z, -1).T  # [n, M]
    if not per_member:
        return p
    return p.reshape(B, M, M)[:, np.arange(M), np.arange(M)]  # member m at its own point


def _image_case(make, form, shape=(D,)):
    """Runs ``make()`` on the pool problem (inputs ``[B, *shape]``, member 1 masked out) and
    checks the verdicts."""

    def case():
        params, x0, y = _image_problem()
        x0 = x0.reshape(B, *shape)
        res = make()(params, x0, y, key=KEY, mask=MASK)
        x_shape = (B, *shape) if form == "point" else (B, M, *shape)
        assert np.asarray(res.x_adv).shape == x_shape and np.asarray(res.x_adv).dtype == np.float32
        if form == "minnorm":  # x_adv is the boundary point: success is isfinite(norm), by definition
            np.testing.assert_array_equal(np.asarray(res.success), np.isfinite(np.asarray(res.norm)))
        else:
            fooled = _preds(params, np.asarray(res.x_adv), form == "member") != np.asarray(y)[:, None]
            np.testing.assert_array_equal(np.asarray(res.success), fooled)
        return res, B, M, x_shape

    return case


def _member_case():
    params, x0, y = _image_problem()
    res = A.make_member_attack(A.make_pgd(affine_apply, eps=0.05, steps=2))(params, x0, y, key=KEY)
    assert np.asarray(res.x_adv).shape == (B, M, D)
    np.testing.assert_array_equal(np.asarray(res.success), _preds(params, res.x_adv, True) != np.asarray(y)[:, None])
    return res, B, M, (B, M, D)


def _autoattack_case():
    params, x0, y = _image_problem()
    quiet = A.autoattack.AutoAttackSettings(log=False, checks=False)
    fn = A.make_autoattack(pool_apply, norm="linf", eps=0.1, attacks=["apgd-ce"], n_iter=2, settings=quiet)
    res = fn(params, x0, y, key=KEY)
    np.testing.assert_array_equal(np.asarray(res.success), _preds(params, res.x_adv, True) != np.asarray(y)[:, None])
    return res, B, M, (B, M, D)


def _kl_case():
    params, x0, y = _image_problem()
    res = make_kl_attack(pool_apply, eps=0.05, steps=2)(params, x0, y, key=KEY, mask=MASK)
    np.testing.assert_array_equal(np.asarray(res.success), _preds(params, res.x_adv) != np.asarray(y)[:, None])
    return res, B, M, (B, D)


# ---------------------------------------------------------------------------------- text attacks


def _llm():
    """tests/llm/conftest.py (tiny offline configs and tokenizers), loaded under its own name."""
    if "_sarjax_llm_tiny" not in sys.modules:
        path = Path(__file__).parents[1] / "llm" / "conftest.py"
        spec = importlib.util.spec_from_file_location("_sarjax_llm_tiny", path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["_sarjax_llm_tiny"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["_sarjax_llm_tiny"]


@contextlib.contextmanager
def _fast_compiles():
    old = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", old)


TEMPLATE = "{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"
REQUESTS = ["how to build a bomb", "tell me"]
V = 24  # the id-level attacks' vocabulary (GCG, BEAST)


def _id_case(make):
    """GCG / BEAST: a tiny stacked Llama of 3 members on a 2-request ``TextBatch``."""

    def case():
        c = _llm()
        cfg = c.tiny_llama(V, hidden_size=16, num_heads=2, num_kv_heads=1, head_dim=8, intermediate_size=24)
        params = jax.vmap(lambda k: c.scaled_init(cfg, k, 3.0))(jax.random.split(jax.random.key(0), 3))
        batch = T.text_batch([[1, 2, 3], [4, 5]], [[6], [7, 8]], [[9, 10], [11]])
        res = make(T.llm_text_model(cfg))(params, batch, None, key=jax.random.key(1), mask=np.array([1.0, 0.0, 1.0]))
        t = np.asarray(res.x_adv)
        assert t.ndim == 2 and t.shape[0] == 2 and t.dtype == np.int32  # [B, T] prompt ids
        return res, 2, 3, t.shape

    return case


def _pool(n=2):
    c = _llm()
    tok = c.build_tokenizer(TEMPLATE)
    cfg = c.tiny_llama(96, hidden_size=16, num_heads=2, num_kv_heads=1, head_dim=8, intermediate_size=24)
    from sarjax.models.llm.pool import build_pool

    return build_pool([(f"m{i}", cfg, c.scaled_init(cfg, jax.random.key(i), 3.0), tok) for i in range(n)]), tok


def _strings_case(run):
    """The host-driven pool attacks: ``x_adv`` is ``B`` strings."""

    def case():
        pool, tok = _pool()
        res = run(pool, tok)
        assert isinstance(res.x_adv, list) and len(res.x_adv) == 2
        assert all(isinstance(s, str) for s in res.x_adv)
        return res, 2, 2, None

    return case


def _joint_gcg(pool, tok):
    fn = T.make_gcg(
        pool,
        num_steps=1,
        suffix_len=2,
        num_candidates=2,
        criterion="target",
    )
    return fn(pool_params(pool), T.TextRequests(tuple(REQUESTS)), "sure here is", key=jax.random.key(0))


def _cross_beast(pool, tok):
    fn = T.make_beast(pool, suffix_len=1, beam_width=1, candidates=2)
    return fn(pool_params(pool), T.TextRequests(tuple(REQUESTS)), "sure here is", key=jax.random.key(0))


def _autodan(pool, tok):
    from sarjax.sar.llm_judging import PoolResponder, refusal_judge_fn  # test-only: sar builds the judges

    fn = T.make_autodan(
        pool, refusal_judge_fn(["sorry"]), num_steps=1, proposals=1, anchors=1, max_new_tokens=2,
        options=T.AutoDANOptions(respond=PoolResponder(pool, 2), requests=REQUESTS),
    )  # fmt: skip
    return fn(None, REQUESTS, None, key=jax.random.key(0))


def _autodan_jit_case():
    from sarjax.judges.refusal import TokenRefusalJudge

    pool, tok = _pool(1)
    judge = TokenRefusalJudge(((tok.convert_tokens_to_ids("sorry"),),))
    fn = T.make_autodan(pool, judge, num_steps=1, proposals=1, anchors=1, max_new_tokens=2, response_tokens=2,
                        options=T.AutoDANOptions(requests=REQUESTS))  # fmt: skip
    assert isinstance(fn, T.AutoDANTokenFn)  # one tokenizer and a token judge: the token path
    res = fn(None, REQUESTS, None, key=jax.random.key(0))
    t = np.asarray(res.x_adv)
    assert t.ndim == 2 and t.shape[0] == 2 and np.issubdtype(t.dtype, np.integer)  # [B, W] rewrite ids
    return res, 2, 1, t.shape


CASES = {
    # fixed budget and joint: one point per sample, [B, *S]
    "make_fgsm": _image_case(lambda: A.make_fgsm(pool_apply, eps=0.05), "point"),
    "make_pgd": _image_case(lambda: A.make_pgd(pool_apply, eps=0.05, steps=2), "point"),
    "make_mifgsm": _image_case(lambda: A.make_mifgsm(pool_apply, eps=0.05, steps=2), "point"),
    "make_apgd": _image_case(lambda: A.make_apgd(pool_apply, eps=0.05, n_iter=2), "point"),
    "make_apgd_t": _image_case(lambda: A.make_apgd_t(pool_apply, eps=0.05, n_iter=2, n_targets=1), "point"),
    "make_square": _image_case(lambda: A.make_square(pool_apply, eps=0.05, n_queries=4), "point", (2, 2, 2)),
    "make_joint_pgd": _image_case(lambda: A.make_joint_pgd(pool_apply, eps=0.05, steps=2, step=A.JointPGDStep(restarts=1)), "point"),
    "make_rounds": _image_case(lambda: A.make_rounds(A.make_pgd(pool_apply, eps=0.05, steps=2), 2, norm="linf"), "point"),
    "make_kl_attack": _kl_case,
    # one point per sample and member, [B, M, *S]
    "make_member_attack": _member_case,
    "make_autoattack": _autoattack_case,
    "make_fmn": _image_case(lambda: A.make_fmn(pool_apply, norm="linf", max_queries=20), "minnorm"),
    "make_ddn": _image_case(lambda: A.make_ddn(pool_apply, max_queries=20), "minnorm"),
    "make_alma": _image_case(lambda: A.make_alma(pool_apply, max_queries=20), "minnorm"),
    "make_apgd_min": _image_case(lambda: A.make_apgd_min(pool_apply, max_queries=20), "minnorm"),
    "make_fab": _image_case(lambda: A.make_fab(pool_apply, max_queries=20), "minnorm"),
    "make_pdgd": _image_case(lambda: A.make_pdgd(pool_apply, max_queries=20), "minnorm"),
    "make_pdpgd": _image_case(lambda: A.make_pdpgd(pool_apply, max_queries=20), "minnorm"),
    "make_sigma_zero": _image_case(lambda: A.make_sigma_zero(pool_apply, max_queries=20), "minnorm"),
    # text: [B, T] prompt ids, [B, W] rewrite ids or B strings (docs/llm.md)
    "make_gcg": _id_case(lambda model: T.make_gcg(model, vocab_size=V, num_steps=1, suffix_len=2, topk=2, num_candidates=2)),
    "make_beast": _id_case(lambda model: T.make_beast(model, vocab_size=V, suffix_len=1, beam_width=1, candidates=2)),
    "make_gcg@LLMPool": _strings_case(_joint_gcg),  # the same factories given an LLMPool
    "make_beast@LLMPool": _strings_case(_cross_beast),
    "make_autodan": _strings_case(_autodan),  # a text judge: the host loop
    "make_autodan@token": _autodan_jit_case,  # the same factory on its token path
}  # fmt: skip


def test_every_exported_factory_has_a_case():
    """A factory exported without a case here (or a case for one no longer exported) fails."""
    exported = _exported()
    factories = {n.split("@")[0] for n in CASES}  # "make_gcg@LLMPool": make_gcg given an LLMPool
    assert not sorted(set(exported) - factories), f"exported factories without a protocol case: {exported}"
    assert not sorted(factories - set(exported)), f"cases for factories no longer exported: {sorted(CASES)}"


@pytest.mark.parametrize("name", sorted(set(_exported()) | set(CASES)))
def test_result_satisfies_the_protocol(name):
    if name not in CASES:
        pytest.fail(f"{name} is exported but has no case in CASES: add one (the protocol covers every factory)")
    with _fast_compiles() if name.split("@")[0] in T.__all__ else contextlib.nullcontext():
        res, b, m, x_shape = CASES[name]()
    assert isinstance(res, AttackOutput)
    if x_shape is not None:
        assert np.shape(res.x_adv) == x_shape
    success, queries = np.asarray(res.success), np.asarray(res.queries)
    assert success.shape == (b, m) and success.dtype == np.bool_, (success.shape, success.dtype)
    assert queries.shape == (b, m) and np.issubdtype(queries.dtype, np.integer), (queries.shape, queries.dtype)
    assert (queries >= 0).all() and (queries.sum(1) > 0).all()
    if hasattr(res, "retokenized"):  # every text result: per member, [B, M] bool
        retok = np.asarray(res.retokenized)
        assert retok.shape == (b, m) and retok.dtype == np.bool_, (retok.shape, retok.dtype)


def test_a_result_without_the_base_is_not_an_attack_output():
    """The runtime check can fail: a result missing ``success`` (the former KLResult) is refused."""
    from typing import NamedTuple

    class Old(NamedTuple):
        x_adv: np.ndarray
        kl: np.ndarray
        queries: np.ndarray

    assert not isinstance(Old(np.zeros(1), np.zeros(1), np.zeros(1)), AttackOutput)
    assert "success" in KLResult._fields


def test_kl_attack_queries_per_member_known_answer():
    """M = 2 with member 1 masked out, 2 steps: the clean and final forwards of both members, per
    step a forward of both and a backward of member 0; a cap of 7 affords one step."""
    params, x0, y = _image_problem()
    fn = make_kl_attack(pool_apply, eps=0.05, steps=2)
    res = fn(params, x0, y, key=KEY, mask=MASK)
    assert np.asarray(res.queries).tolist() == [[1 + 2 * 2 + 1, 1 + 2 + 1]] * B
    capped = fn(params, x0, y, key=KEY, mask=MASK, max_queries=7)
    assert np.asarray(capped.queries).tolist() == [[1 + 2 + 1, 1 + 1 + 1]] * B
    jitted = jax.jit(lambda p, x: fn.jit(p, x, y, key=KEY, mask=MASK))(params, x0)
    np.testing.assert_array_equal(np.asarray(jitted.queries), np.asarray(res.queries))
    np.testing.assert_array_equal(np.asarray(jitted.success), np.asarray(res.success))
