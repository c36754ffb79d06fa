"""Joint GCG (Zou et al. 2023, "Universal and Transferable Adversarial Attacks on Aligned
Language Models"; the joint form of the SAR paper): greedy coordinate gradient over an adversarial
suffix against the uncovered members of a pool.

One step, per request (all requests of a batch in one ``vmap``):

1. the token gradient: ``d loss / d one_hot(suffix)`` ``[Ls, V]`` of the JOINT loss (the mean
   of the covered members' losses, :func:`~sarjax.attacks.text.losses.joint_loss`), one backward
   pass per covered member;
2. the ``topk`` ids with the most negative gradient per suffix position, over the allowed
   vocabulary only;
3. ``num_candidates`` candidates, each the current suffix with ONE position (uniform) replaced by
   one of that position's top-k ids (uniform), as in GCG's ``sample_control``;
4. every candidate scored on every member in one batched call; the suffix moves to the best
   candidate (GCG moves even when it is worse than the current one); the best-so-far is kept.

The request's ``before`` block (template head + request) does not change during a call: it is run
once per member and call (:func:`~sarjax.attacks.text.model.prefix_cache`, kept in the state;
nanoGCG's prefix cache), and both the gradient pass and the candidates read it from that KV cache
(equal to running full prompts up to float rounding; models without a cache run full prompts).

The loss is a function argument: the default :func:`~sarjax.attacks.text.losses.refusal_loss`
MAXIMISES the mean NLL of a fixed refusal (the SAR paper, joint GCG); pass
:func:`~sarjax.attacks.text.losses.target_loss` for Zou et al.'s original objective (minimise the
NLL of an affirmative target).

Queries per step and request: ``(1 + num_candidates) * |covered members|`` (one gradient per
member, one forward per member and candidate); the start suffix costs ``|covered|``. A request
whose next step would pass its cap stops (its state is frozen).

This state machine is what :func:`make_gcg` returns for a
:class:`~sarjax.attacks.text.model.TextModel` (one vocabulary); given an
:class:`~sarjax.models.llm.pool.LLMPool`, :func:`make_gcg` returns the joint GCG of the SAR paper
on text (:class:`~sarjax.attacks.text.gcg_joint.JointGCG`, host-driven, any tokenizers).
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from sarjax.attacks import queries as Q
from sarjax.attacks.core.protocol import Attack
from sarjax.attacks.text import entry as TE
from sarjax.attacks.text import losses as TL
from sarjax.attacks.text import model as TM
from sarjax.attacks.text import requests as TR
from sarjax.attacks.text import retokenize as TK
from sarjax.attacks.text.gcg_joint import JointGCG, JointGCGConfig
from sarjax.attacks.text.pool import check_suffix_factory
from sarjax.models.llm.pool import LLMPool


class GCGConfig(NamedTuple):
    """Static hyperparameters (hashable).

    Attributes:
      model: the :class:`~sarjax.attacks.text.model.TextModel`.
      loss: ``loss(nll [..., Tt], target_mask [Tt]) -> [...]`` per member (minimised).
      suffix_len: ``Ls`` (20: GCG's ``"! " * 20`` start).
      topk: substitutions per position (256, Zou et al. 2023; the SAR paper Table 3).
      num_candidates: candidates per step (64, the SAR paper Table 3; GCG's reference uses 512).
      criterion: the success criterion (:attr:`~sarjax.attacks.text.entry.TextAttackResult.success`).
      retok: a :class:`~sarjax.attacks.text.retokenize.Retokenizer` (the factory's tokenizer): every
        candidate goes through GCG's re-tokenization filter (Zou et al. 2023's ``filter_cand``: its
        decoded text must encode back to its ids) and is scored on the ids of the whole prompt text
        that is sent; None: candidates are scored on the blocks ``before | suffix | after``.
    """

    model: TM.TextModel
    loss: Callable
    suffix_len: int
    topk: int
    num_candidates: int
    criterion: str = "refusal"
    retok: Any = None


def _sent_losses(cfg: GCGConfig, params, r, mk, texts, cands):
    """``[N]`` joint losses of ``N`` full-length candidate suffixes (one request) on the ids of the
    text that is sent (``cfg.retok``), ``inf`` where the re-tokenization filter drops one."""
    ls = cfg.suffix_len
    width = r.before.shape[0] + ls + r.after.shape[0]
    ids, mask, ok = cfg.retok.sent(r, texts, cands, jnp.int32(ls), width)
    jl = TL.joint_loss(TM.prompt_losses(cfg.model, cfg.loss, params, r, ids, mask), mk)
    return jnp.where(ok, jl, jnp.inf)


class GCGState(NamedTuple):
    """Per-request state (leading ``[B]``).

    Attributes:
      suffix: ``[B, Ls]`` current suffix.
      best_suffix: ``[B, Ls]`` best-so-far; best_loss: ``[B]`` its joint loss.
      queries: ``[B]`` int32.
      step: scalar int32 (the step counter; draws use ``fold_in(sample key, step)``).
      keys: ``[B]`` per-request keys.
      problem: the :class:`~sarjax.attacks.text.requests.TextProblem`.
      prefix: every member's KV cache of each request's ``before`` block (leading ``[B]``;
        :func:`~sarjax.attacks.text.model.prefix_cache`), computed once per call; None when the
        model has no cache.
    """

    suffix: Any
    best_suffix: Any
    best_loss: Any
    queries: Any
    step: Any
    keys: Any
    problem: Any
    prefix: Any = None


def _init(cfg: GCGConfig, params, problem: TR.TextProblem) -> GCGState:
    ls = cfg.suffix_len
    full = jnp.ones((ls,), jnp.int32)

    def one(r, mk, s, tx):
        if cfg.retok is not None:
            return _sent_losses(cfg, params, r, mk, tx, s[None])[0]
        return TL.joint_loss(TM.member_losses(cfg.model, cfg.loss, params, r, s[None], full), mk)[0]

    loss = jax.vmap(one)(problem.batch, problem.mask, problem.suffix_init, problem.texts)
    nm = jnp.sum(problem.mask > 0, axis=1).astype(jnp.int32)
    ok = Q.allowed(jnp.zeros_like(nm), nm, problem.cap)
    q = Q.charge(jnp.zeros_like(nm), nm, ok)
    loss = jnp.where(ok, loss, jnp.inf)
    s0 = problem.suffix_init
    prefix = jax.vmap(lambda r: TM.prefix_cache(cfg.model, params, r))(problem.batch)
    return GCGState(s0, s0, loss, q, jnp.int32(0), TR.sample_keys(problem), problem, prefix)


def _step(cfg: GCGConfig, state: GCGState, params) -> GCGState:
    p = state.problem
    ls, nc = cfg.suffix_len, cfg.num_candidates
    v = p.allowed.shape[0]
    k = min(cfg.topk, v)
    full = jnp.ones((ls,), jnp.int32)
    pb = p.batch.before.shape[1]

    model = cfg.model
    nll_oh_cached = model.nll_one_hot_cached
    cached = state.prefix is not None and nll_oh_cached is not None

    def one(r, mk, key, suffix, best_s, best_l, count, cap, cache, tx):
        nm = jnp.sum(mk > 0).astype(jnp.int32)
        cost = (1 + nc) * nm
        active = Q.allowed(count, cost, cap) & (nm > 0) & jnp.isfinite(best_l)
        if cached:  # the gradient reads the before block from its cache: suffix | after | target
            ids = jnp.concatenate([suffix, r.after]).astype(jnp.int32)
            pm = jnp.concatenate([full, r.after_mask]).astype(jnp.int32)
            start = 0
        else:
            ids, pm = TR.assemble(r, suffix, full)
            start = pb
        oh = jax.nn.one_hot(ids, v, dtype=jnp.float32)

        def f(oh_s):
            x = jax.lax.dynamic_update_slice_in_dim(oh, oh_s, start, axis=0)
            if cached and nll_oh_cached is not None:
                nll = nll_oh_cached(params, cache, x, pm, r.target, r.target_mask)
            else:
                nll = model.nll_one_hot(params, x, pm, r.target, r.target_mask)
            return TL.joint_loss(cfg.loss(nll, r.target_mask), mk)

        g = jax.grad(f)(jax.lax.dynamic_slice_in_dim(oh, start, ls, axis=0))  # [Ls, V]
        score = jnp.where(p.allowed[None], -g, -jnp.inf)
        top = jax.lax.top_k(score, k)[1]  # [Ls, k]
        kp, kt = jax.random.split(jax.random.fold_in(key, state.step))
        pos = jax.random.randint(kp, (nc,), 0, ls)
        which = jax.random.randint(kt, (nc,), 0, k)
        tok = top[pos, which]
        cands = jnp.broadcast_to(suffix, (nc, ls)).at[jnp.arange(nc), pos].set(tok)
        if cfg.retok is not None:  # the ids of the text that is sent, GCG's re-tokenization filter
            jl = _sent_losses(cfg, params, r, mk, tx, cands)
        else:
            jl = TL.joint_loss(TM.member_losses_cached(model, cfg.loss, params, r, cands, full, cache), mk)
        jl = jnp.where(p.allowed[tok], jl, jnp.inf)  # fewer than k allowed ids: never pick a banned one
        i = jnp.argmin(jl)
        move = active & jnp.isfinite(jl[i])
        new_s = jnp.where(move, cands[i], suffix)
        better = move & (jl[i] < best_l)
        return (
            new_s,
            jnp.where(better, cands[i], best_s),
            jnp.where(better, jl[i], best_l),
            Q.charge(count, cost, active),
        )

    s, bs, bl, q = jax.vmap(one)(
        p.batch, p.mask, state.keys, state.suffix, state.best_suffix, state.best_loss, state.queries, p.cap,
        state.prefix, p.texts,
    )  # fmt: skip
    return state._replace(suffix=s, best_suffix=bs, best_loss=bl, queries=q, step=state.step + 1)


def _result(cfg: GCGConfig, state: GCGState, params) -> TE.TextAttackResult:
    b = state.suffix.shape[0]
    n = jnp.full((b,), cfg.suffix_len, jnp.int32)
    return TE.finish(
        cfg.model, cfg.loss, cfg.criterion, params, state.problem, state.best_suffix, n, state.best_loss, state.queries,
        cfg.retok,
    )  # fmt: skip


class GCGOptions(NamedTuple):
    """The rare knobs of :func:`make_gcg` (each default's source beside it).

    Attributes:
      init_id: on a :class:`~sarjax.attacks.text.model.TextModel`, the start token (GCG starts
        from ``"!"`` x 20, Zou et al. 2023: pass the id of ``"!"``); None: the first allowed id. A
        call's ``suffix_init`` overrides it.
      target: on an :class:`~sarjax.models.llm.pool.LLMPool`, the default ``ref`` (the fixed
        refusal; the SAR paper does not print its refusal string, this one is ours).
      init_text: on an ``LLMPool``, the start suffix text; None (default): ``"!"`` repeated
        ``suffix_len`` times with spaces (GCG's start, Zou et al. 2023) when every stack's
        tokenizer reproduces it within its allowed vocabulary and slots, else the text of the first
        allowed token of the first stack (in id order, stripped of spaces) repeated the same way
        that every stack reproduces (e.g. a SentencePiece-style vocabulary without ``"!"``),
        chosen per call (:func:`~sarjax.attacks.text.pool.start_text`).
      slots: on an ``LLMPool``, the suffix token slots of every stack (None: ``2 * suffix_len``:
        the same text may take more tokens in another tokenizer; a candidate that does not fit is
        filtered; ours).
      ascii_only: on an ``LLMPool``, the default allowed vocabulary keeps printable-ASCII tokens
        only (GCG's reference filter, Zou et al. 2023; also nanoGCG's).
    """

    init_id: int | None = None
    target: str = "I'm sorry, but I cannot help with that."
    init_text: str | None = None
    slots: int | None = None
    ascii_only: bool = True


def make_gcg(
    model: "TM.TextModel | LLMPool",
    *,
    num_steps: int = 20,
    suffix_len: int = 20,
    topk: int = 256,
    num_candidates: int = 64,
    loss: Callable = TL.refusal_loss,
    criterion: str | None = None,
    vocab_size: int | None = None,
    tokenizer: Any = None,
    options: GCGOptions | None = None,
) -> "TE.TextAttackFn | JointGCG":
    """Joint GCG on a pool, whichever pool it is given.

    - An :class:`~sarjax.models.llm.pool.LLMPool` (every stack with a tokenizer, one tokenizer or
      several): the joint GCG of the SAR paper on text (:class:`~sarjax.attacks.text.gcg_joint.JointGCG`,
      host-driven: the suffix is exchanged as TEXT between the members' tokenizers). Called
      ``fn(params, inputs, ref, *, key, ...)`` with ``params`` the pool's weights
      (:func:`~sarjax.attacks.text.pool.pool_params`), ``inputs`` the ``B`` requests
      (:class:`~sarjax.attacks.text.requests.TextRequests`: prompts, system message, chat template
      or none; or the request strings) and ``ref`` the targets: the refusal (one string or one per
      request; None: ``options.target``).
    - A :class:`~sarjax.attacks.text.model.TextModel` (a user's own model functions over one
      vocabulary; :func:`~sarjax.attacks.text.model.llm_text_model` for stacked sarjax
      decoders): the compiled state machine on token ids (this module), ``vocab_size`` required.
      Called ``fn(params, inputs, ref, *, key, ...)`` with ``inputs`` either
      :class:`~sarjax.attacks.text.requests.TextRequests` (with ``tokenizer``: each request
      rendered by its chat template, ``ref`` the targets, one string or one per request, None:
      ``options.target``) or a :class:`~sarjax.attacks.text.requests.TextBatch` of token ids with
      ``ref`` None (the batch already lays out the targets); ``fn.jit(...)`` is the jit-safe entry.

    Args:
      model: the pool (see above).
      num_steps: steps per call (20 per round, the SAR paper Table 3).
      suffix_len: ``Ls`` (20, Zou et al. 2023); on an ``LLMPool``, the start suffix's length in words.
      topk: top-k substitutions per position (256, Zou et al. 2023 / the SAR paper Table 3); clipped
        to ``V``.
      num_candidates: candidates per step (64, the SAR paper Table 3).
      loss: per-member loss, minimised (default :func:`~sarjax.attacks.text.losses.refusal_loss`:
        maximise the refusal's mean NLL, the SAR paper).
      criterion: ``"refusal"`` (a member is broken when its greedy response is not the refusal)
        or ``"target"`` (its greedy response starts with the target); None: ``"refusal"`` for
        :func:`~sarjax.attacks.text.losses.refusal_loss`, else ``"target"``.
      vocab_size: ``V`` (the embedding rows) of a ``TextModel``; an ``LLMPool`` gives its own.
      tokenizer: optional, with a ``TextModel``: every candidate (and the start suffix) then goes
        through GCG's re-tokenization filter (its decoded text must encode back to its ids; Zou et
        al. 2023's ``filter_cand``; a start suffix that does not raises ``ValueError``) and is
        scored on the ids of the whole prompt TEXT that is sent (``before text + decode(suffix) +
        after text`` tokenized at once; the call's ``texts``, else each block's ids decoded),
        through a host callback of the tokenizer inside the compiled step (``jax.pure_callback``,
        so ``fn.jit`` calls the host too; the token gradient is still taken on the blocks); the
        audited entry checks that the returned suffix re-tokenizes and re-tokenizes the whole
        prompt as text (:attr:`~sarjax.attacks.text.entry.TextAttackResult.sent`). None:
        candidates are scored on the blocks ``before | suffix | after``. An ``LLMPool`` brings its own.
      options: the rare knobs (:class:`GCGOptions`; None: its defaults).

    Returns:
      On an ``LLMPool``, a :class:`~sarjax.attacks.text.gcg_joint.JointGCG`; on a ``TextModel``, a
      :class:`~sarjax.attacks.text.entry.TextAttackFn`: ``fn(params, inputs, ref, *, key,
      mask=None, max_queries=None, sample_ids=None, allowed=None, suffix_init=None, texts=None) ->
      TextAttackResult`` and ``fn.jit(...)``.

    Raises:
      TypeError: a model that is neither; ``vocab_size`` / ``tokenizer`` with an ``LLMPool``; a
        ``TextModel`` without ``vocab_size``; an ``LLMPool`` stack without a tokenizer; options
        not a :class:`GCGOptions`.
      ValueError: a non-positive size, an unknown criterion.
    """
    sizes = [("num_steps", num_steps), ("suffix_len", suffix_len), ("topk", topk), ("num_candidates", num_candidates)]
    opts, slots = check_suffix_factory("make_gcg", model, options, GCGOptions, sizes, vocab_size, tokenizer)
    if isinstance(model, LLMPool):
        cfg = JointGCGConfig(
            num_steps=int(num_steps), suffix_len=int(suffix_len), topk=int(topk), num_candidates=int(num_candidates),
            loss=loss, criterion=TL.check_criterion("make_gcg", criterion, loss), target=opts.target,
            init_text=opts.init_text, slots=slots, ascii_only=bool(opts.ascii_only),
        )  # fmt: skip
        return JointGCG(model, cfg)
    assert vocab_size is not None  # check_suffix_factory: a TextModel has one
    crit = TL.check_criterion("make_gcg", criterion, loss)
    retok = None if tokenizer is None else TK.Retokenizer(tokenizer)
    cfg = GCGConfig(model, loss, int(suffix_len), int(topk), int(num_candidates), crit, retok)
    attack = Attack(_init, _step, _result, int(num_steps), cfg)
    return TE.TextAttackFn(
        attack,
        name="gcg",
        model=model,
        vocab_size=int(vocab_size),
        suffix_len=int(suffix_len),
        tokenizer=tokenizer,
        init_id=opts.init_id,
        target=opts.target,
        criterion=crit,
    )


__all__ = [
    "GCGConfig",
    "GCGOptions",
    "GCGState",
    "make_gcg",
]
