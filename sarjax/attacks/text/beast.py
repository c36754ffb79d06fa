"""Joint BEAST (Sadasivan et al. 2024, "Fast Adversarial Attacks on Language Models In One GPU
Minute"; the joint form of the SAR paper): gradient-free beam search that appends an adversarial
suffix to the request, one token per step, minimising the JOINT loss (by default the mean
per-token NLL of the target response averaged over the uncovered members).

One step, per request (written from the paper's description of the algorithm):

1. for each of the ``beam_width`` (``k1``) beams, the next-token distribution of the user turn
   after ``before | beam`` (the chat template is NOT closed: the suffix continues the request);
2. ``candidates`` (``k2``) tokens per beam drawn WITHOUT replacement from that distribution at
   ``temperature`` (the Gumbel top-k trick; ``sampler="greedy"`` takes the ``k2`` most likely
   tokens instead: deterministic, for tests), restricted to the allowed vocabulary;
3. the ``k1 * k2`` extended suffixes scored on every member in one batched call; the ``k1`` with
   the lowest joint loss become the new beams; the best candidate ever scored is kept.

The first step expands the single starting beam (empty, or the seed) into ``k1 * k2`` distinct
tokens (BEAST samples ``k1`` first tokens and expands each; all beams start equal here, so
drawing the whole first layer from beam 0 avoids duplicate beams).

Joint sampling distribution: the MIXTURE (arithmetic mean of the covered members'
probabilities, after temperature). Its support is the union of the members' supports, so a token
that one uncovered member finds likely is proposed even when another finds it unlikely; the
product of experts (mean of log-probabilities) would veto such tokens, and BEAST's proposals are
meant to keep the suffix readable for some member, not for all. One tokenizer for the pool.

Queries per step and request: ``(k1 + k1 * k2) * |covered members|`` (the next-token forward of
every beam, then the candidates); a seed suffix costs ``|covered|`` to score. The traced cap
stops a request before a step that would pass it; ``Ls`` steps at most (static). A candidate the
re-tokenization filter drops is still counted (the compiled step computes every candidate).

The text that is sent. With a tokenizer (``make_beast(..., tokenizer=tok)``) every candidate is
decoded to text, dropped unless that text encodes back to its ids (GCG's re-tokenization filter,
Zou et al. 2023's ``filter_cand``), and scored on the ids of the whole prompt text ``before text +
decode(suffix) + after text`` tokenized at once (what a user sending the suffix gets), through a
host callback of the tokenizer (``jax.pure_callback``); the joint loss that ranks the beams and the
best suffix is the loss of the prompt that is sent. The next-token proposals (step 1) still read
the blocks ``before | beam``. Without a tokenizer, candidates are scored on the blocks.

Not done here: multiple calls (the SAR paper: at most 4 calls of 15,000 queries: run the attack
again with another key) and the AmpleGCG seed generator itself (pass seeds through
:func:`seed_suffixes`).
"""

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.attacks import queries as Q
from sarjax.attacks.core.protocol import Attack
from sarjax.attacks.text import entry as TE
from sarjax.attacks.text import losses as TL
from sarjax.attacks.text import model as TM
from sarjax.attacks.text import requests as TR
from sarjax.attacks.text import retokenize as TK
from sarjax.attacks.text.beast_cross import CrossBEAST, CrossBEASTConfig
from sarjax.attacks.text.pool import check_suffix_factory
from sarjax.models.llm.pool import LLMPool
from sarjax.models.llm.prompts import retokenizes


class BEASTConfig(NamedTuple):
    """Static hyperparameters (hashable).

    Attributes:
      model: the :class:`~sarjax.attacks.text.model.TextModel`.
      loss: per-member loss, minimised.
      suffix_len: ``Ls`` (30, the SAR paper Table 2).
      beam_width: ``k1`` (10, the SAR paper Table 2).
      candidates: ``k2`` tokens drawn per beam (10: BEAST uses ``k1 = k2``).
      temperature: of the next-token distribution (1, the SAR paper Table 2).
      sampler: ``"multinomial"`` (BEAST) or ``"greedy"`` (deterministic top-``k2``).
      criterion: the success criterion (:attr:`~sarjax.attacks.text.entry.TextAttackResult.success`).
      retok: a :class:`~sarjax.attacks.text.retokenize.Retokenizer` (the factory's tokenizer): every
        candidate goes through the re-tokenization filter and is scored on the ids of the prompt
        text that is sent; None: scored on the blocks ``before | suffix | after``.
    """

    model: TM.TextModel
    loss: Callable
    suffix_len: int
    beam_width: int
    candidates: int
    temperature: float
    sampler: str
    criterion: str = "target"
    retok: Any = None


class BEASTState(NamedTuple):
    """Per-request state (leading ``[B]``).

    Attributes:
      beams: ``[B, k1, Ls]`` right-aligned suffixes (holes 0).
      length: ``[B]`` int32 tokens in every beam.
      beam_ok: ``[B, k1]`` bool, the beam holds only allowed tokens (False when fewer than ``k1``
        valid candidates existed; its children are never kept).
      best_suffix: ``[B, Ls]``; best_len: ``[B]``; best_loss: ``[B]`` (inf: nothing scored yet).
      queries: ``[B]`` int32.
      step: scalar int32.
      keys: ``[B]`` per-request keys.
      problem: the :class:`~sarjax.attacks.text.requests.TextProblem`.
    """

    beams: Any
    length: Any
    beam_ok: Any
    best_suffix: Any
    best_len: Any
    best_loss: Any
    queries: Any
    step: Any
    keys: Any
    problem: Any


def _candidate_losses(cfg: BEASTConfig, params, r, mk, texts, cands, n):
    """``[N]`` joint losses of ``N`` candidate suffixes of ``n`` tokens (one request): on the
    blocks, or (``cfg.retok``) on the ids of the text that is sent, ``inf`` where the
    re-tokenization filter drops a candidate."""
    ls = cfg.suffix_len
    if cfg.retok is None:
        return TL.joint_loss(TM.member_losses(cfg.model, cfg.loss, params, r, cands, TR.suffix_mask(ls, n)), mk)
    width = r.before.shape[0] + ls + r.after.shape[0]
    ids, mask, ok = cfg.retok.sent(r, texts, cands, n, width)
    jl = TL.joint_loss(TM.prompt_losses(cfg.model, cfg.loss, params, r, ids, mask), mk)
    return jnp.where(ok, jl, jnp.inf)


def _init(cfg: BEASTConfig, params, problem: TR.TextProblem) -> BEASTState:
    ls, k1 = cfg.suffix_len, cfg.beam_width

    def one(r, mk, s, n, tx):
        return _candidate_losses(cfg, params, r, mk, tx, s[None] * TR.suffix_mask(ls, n), n)[0]

    n0 = problem.init_len
    seeded = n0 > 0
    nm = jnp.sum(problem.mask > 0, axis=1).astype(jnp.int32)
    ok = seeded & Q.allowed(jnp.zeros_like(nm), nm, problem.cap)
    loss = jax.vmap(one)(problem.batch, problem.mask, problem.suffix_init, jnp.maximum(n0, 1), problem.texts)
    best_loss = jnp.where(ok, loss, jnp.inf)
    q = Q.charge(jnp.zeros_like(nm), nm, ok)
    beams = jnp.broadcast_to(problem.suffix_init[:, None], (problem.suffix_init.shape[0], k1, ls))
    best_len = jnp.where(ok & jnp.isfinite(loss), n0, 0)  # a seed the filter drops is not a result
    ok_beams = jnp.ones(beams.shape[:2], bool)
    return BEASTState(
        beams, n0, ok_beams, problem.suffix_init, best_len, best_loss, q, jnp.int32(0), TR.sample_keys(problem), problem
    )


def _step(cfg: BEASTConfig, state: BEASTState, params) -> BEASTState:
    p = state.problem
    ls, k1, k2 = cfg.suffix_len, cfg.beam_width, cfg.candidates
    pb = p.batch.before.shape[1]

    def one(r, mk, key, beams, beam_ok, n, n0, best_s, best_n, best_l, count, cap, tx):
        nm = jnp.sum(mk > 0).astype(jnp.int32)
        cost = (k1 + k1 * k2) * nm
        active = Q.allowed(count, cost, cap) & (nm > 0) & (n < ls)
        sm = TR.suffix_mask(ls, n)
        at = jnp.where(n > 0, pb + ls - 1, pb - 1)  # the last real token of the user turn
        w = mk.astype(jnp.float32) / jnp.maximum(jnp.sum(mk.astype(jnp.float32)), 1.0)

        def mixture(beam):
            ids = jnp.concatenate([r.before, beam])
            mask = jnp.concatenate([r.before_mask, sm])
            lg = jax.lax.dynamic_index_in_dim(cfg.model.logits(params, ids, mask), at, axis=1, keepdims=False)
            probs = jax.nn.softmax(lg.astype(jnp.float32) / cfg.temperature, axis=-1)  # [M, V]
            return jnp.log(jnp.einsum("m,mv->v", w, probs))

        logp = jax.vmap(mixture)(beams)  # [k1, V]
        logp = jnp.where(p.allowed[None], logp, -jnp.inf)
        if cfg.sampler == "multinomial":
            noisy = logp + jax.random.gumbel(jax.random.fold_in(key, state.step), logp.shape)
        else:
            noisy = logp
        first = jax.lax.top_k(noisy[0], k1 * k2)[1].reshape(k1, k2)
        later = jax.lax.top_k(noisy, k2)[1]
        tok = jnp.where(n == n0, first, later)  # [k1, k2]; n == n0: every beam is the start
        parent_ok = beam_ok | (n == n0)  # the first layer is drawn from the (valid) start
        ok_tok = (jnp.isfinite(jnp.take_along_axis(logp, tok, axis=1)) & parent_ok[:, None]).reshape(-1)
        grown = jnp.concatenate([beams[:, 1:], jnp.zeros((k1, 1), beams.dtype)], axis=1)  # [k1, Ls]
        cands = jnp.broadcast_to(grown[:, None], (k1, k2, ls)).at[:, :, ls - 1].set(tok).reshape(k1 * k2, ls)
        jl = jnp.where(ok_tok, _candidate_losses(cfg, params, r, mk, tx, cands, n + 1), jnp.inf)
        keep = jax.lax.top_k(-jl, k1)[1]
        i = jnp.argmin(jl)
        better = active & (jl[i] < best_l)
        return (
            jnp.where(active, cands[keep], beams),
            jnp.where(active, jnp.isfinite(jl[keep]), beam_ok),
            jnp.where(active, n + 1, n),
            jnp.where(better, cands[i], best_s),
            jnp.where(better, n + 1, best_n),
            jnp.where(better, jl[i], best_l),
            Q.charge(count, cost, active),
        )

    out = jax.vmap(one)(
        p.batch,
        p.mask,
        state.keys,
        state.beams,
        state.beam_ok,
        state.length,
        p.init_len,
        state.best_suffix,
        state.best_len,
        state.best_loss,
        state.queries,
        p.cap,
        p.texts,
    )
    beams, bok, n, bs, bn, bl, q = out
    return state._replace(
        beams=beams, beam_ok=bok, length=n, best_suffix=bs, best_len=bn, best_loss=bl, queries=q, step=state.step + 1
    )


def _result(cfg: BEASTConfig, state: BEASTState, params) -> TE.TextAttackResult:
    return TE.finish(
        cfg.model, cfg.loss, cfg.criterion, params, state.problem, state.best_suffix, state.best_len, state.best_loss,
        state.queries, cfg.retok,
    )  # fmt: skip


class BEASTOptions(NamedTuple):
    """The rare knobs of :func:`make_beast` (each default's source beside it).

    Attributes:
      sampler: ``"multinomial"`` (BEAST's sampling, Sadasivan et al. 2024; on an ``LLMPool``
        Gumbel top-k without replacement) or ``"greedy"`` (the ``k2`` most likely tokens;
        deterministic, for tests).
      target: on an :class:`~sarjax.models.llm.pool.LLMPool`, the default ``ref`` (the target
        response; the SAR paper does not print BEAST's target, this one is ours).
      slots: on an ``LLMPool``, the suffix token slots of every stack (None: ``2 * suffix_len``: the
        same text may take more tokens in another vocabulary; a candidate that does not fit is
        filtered; ours).
      ascii_only: on an ``LLMPool``, the default allowed vocabulary keeps printable-ASCII tokens
        only (GCG's reference filter, Zou et al. 2023).
    """

    sampler: str = "multinomial"
    target: str = "Sure, here is"
    slots: int | None = None
    ascii_only: bool = True


def make_beast(
    model: "TM.TextModel | LLMPool",
    *,
    suffix_len: int = 30,
    beam_width: int = 10,
    candidates: int | None = None,
    temperature: float = 1.0,
    loss: Callable = TL.target_loss,
    criterion: str | None = None,
    vocab_size: int | None = None,
    tokenizer: Any = None,
    options: BEASTOptions | None = None,
) -> "TE.TextAttackFn | CrossBEAST":
    """Joint BEAST on a pool, whichever pool it is given.

    - An :class:`~sarjax.models.llm.pool.LLMPool` (every stack with a tokenizer, one tokenizer or
      several): joint BEAST on text (:class:`~sarjax.attacks.text.beast_cross.CrossBEAST`,
      host-driven: a proposer's beam is exchanged as TEXT between the members' tokenizers). Called
      ``fn(params, inputs, ref, *, key, ...)`` with ``params`` the pool's weights
      (:func:`~sarjax.attacks.text.pool.pool_params`), ``inputs`` the ``B`` requests
      (:class:`~sarjax.attacks.text.requests.TextRequests`: prompts, system message, chat template
      or none; or the request strings) and ``ref`` the targets: the target (one string or one per
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
      suffix_len: ``Ls``, tokens appended at most (30, the SAR paper Table 2); the attack runs ``Ls``
        steps (static), fewer when the traced cap (``max_queries``, the SAR paper: 15,000 per call)
        stops it or a seed already holds tokens.
      beam_width: ``k1`` (10, the SAR paper Table 2).
      candidates: ``k2`` tokens drawn per beam (None: ``k1``, as BEAST).
      temperature: sampling temperature (1, the SAR paper Table 2).
      loss: per-member loss, minimised (default
        :func:`~sarjax.attacks.text.losses.target_loss`, the mean per-token target NLL).
      criterion: ``"target"`` (a member is broken when its greedy response starts with the
        target) or ``"refusal"``; None: ``"refusal"`` for
        :func:`~sarjax.attacks.text.losses.refusal_loss`, else ``"target"``.
      vocab_size: ``V`` of a ``TextModel``; an ``LLMPool`` gives its own.
      tokenizer: optional, with a ``TextModel``: every candidate then goes through GCG's
        re-tokenization filter (its decoded text must encode back to its ids; Zou et al. 2023's
        ``filter_cand``) and is scored on the ids of the whole prompt TEXT that is sent (``before
        text + decode(suffix) + after text`` tokenized at once; the call's ``texts``, else each
        block's ids decoded), through a host callback of the tokenizer inside the compiled step
        (``jax.pure_callback``, so ``fn.jit`` calls the host too); the audited entry checks that
        the suffix re-tokenizes and re-tokenizes the whole prompt as text
        (:attr:`~sarjax.attacks.text.entry.TextAttackResult.sent`). None: candidates are scored on
        the blocks ``before | suffix | after``. An ``LLMPool`` brings its own.
      options: the rare knobs (:class:`BEASTOptions`; None: its defaults).

    Returns:
      On an ``LLMPool``, a :class:`~sarjax.attacks.text.beast_cross.CrossBEAST`; on a
      ``TextModel``, a :class:`~sarjax.attacks.text.entry.TextAttackFn`: ``fn(params, inputs, ref, *,
      key, mask=None, max_queries=None, sample_ids=None, allowed=None, suffix_init=None,
      init_len=None, texts=None) -> TextAttackResult`` and ``fn.jit(...)``; a call's ``suffix_init
      [B, Ls]`` + ``init_len`` is a seed suffix (right-aligned) every beam starts from.

    Raises:
      TypeError: a model that is neither; ``vocab_size`` / ``tokenizer`` with an ``LLMPool``; a
        ``TextModel`` without ``vocab_size``; an ``LLMPool`` stack without a tokenizer; options
        not a :class:`BEASTOptions`.
      ValueError: non-positive sizes, ``k1 * k2 > V``, an unknown sampler, temperature <= 0, an
        unknown criterion.
    """
    k2 = beam_width if candidates is None else candidates
    sizes = [("suffix_len", suffix_len), ("beam_width", beam_width), ("candidates", k2)]
    opts, slots = check_suffix_factory("make_beast", model, options, BEASTOptions, sizes, vocab_size, tokenizer)
    sampler = opts.sampler
    if sampler not in ("multinomial", "greedy"):
        raise ValueError(f"make_beast: sampler must be 'multinomial' or 'greedy', got {sampler!r}")
    if not temperature > 0:
        raise ValueError(f"make_beast: temperature must be > 0, got {temperature}")
    if isinstance(model, LLMPool):
        cfg = CrossBEASTConfig(
            suffix_len=int(suffix_len), beam_width=int(beam_width), candidates=int(k2), temperature=float(temperature),
            sampler=sampler, loss=loss, criterion=TL.check_criterion("make_beast", criterion, loss),
            target=opts.target, slots=slots, ascii_only=bool(opts.ascii_only),
        )  # fmt: skip
        return CrossBEAST(model, cfg)
    assert vocab_size is not None  # check_suffix_factory: a TextModel has one
    if beam_width * k2 > vocab_size:
        raise ValueError(
            f"make_beast: beam_width * candidates = {beam_width * k2} exceeds the vocabulary ({vocab_size})"
        )
    crit = TL.check_criterion("make_beast", criterion, loss)
    retok = None if tokenizer is None else TK.Retokenizer(tokenizer)
    cfg = BEASTConfig(model, loss, int(suffix_len), int(beam_width), int(k2), float(temperature), sampler, crit, retok)
    attack = Attack(_init, _step, _result, int(suffix_len), cfg)
    return TE.TextAttackFn(
        attack,
        name="beast",
        model=model,
        vocab_size=int(vocab_size),
        suffix_len=int(suffix_len),
        tokenizer=tokenizer,
        grows=True,
        target=opts.target,
        criterion=crit,
    )


def seed_suffixes(
    seed_fn: Callable[[str], Sequence[str]], requests: Sequence[str], tokenizer, suffix_len: int, seed_tokens: int = 20
):
    """Seed suffixes for a BEAST call from a seed generator (host side).

    Args:
      seed_fn: ``seed_fn(request) -> list of suffix texts`` (the SAR paper uses AmpleGCG; any
        callable works). The first candidate that encodes to >= 1 token is used.
      requests: B request texts.
      tokenizer: the pool's tokenizer.
      suffix_len: the attack's ``Ls``.
      seed_tokens: tokens kept from the seed (20, the SAR paper Table 2); clipped to ``Ls``.

    Returns:
      ``(suffix_init [B, Ls] int32 right-aligned, init_len [B] int32)``; a request with no usable
      candidate gets ``init_len = 0`` (BEAST from scratch). A seed cut to ``seed_tokens`` whose ids
      do not re-tokenize to themselves (the cut split a word the tokenizer merges otherwise) is
      shortened until they do (``retokenizes``), so that it passes BEAST's re-tokenization filter.
    """
    n = min(int(seed_tokens), int(suffix_len))
    out = np.zeros((len(requests), suffix_len), np.int32)
    lens = np.zeros((len(requests),), np.int32)
    for b, req in enumerate(requests):
        for text in seed_fn(req):
            ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])[:n]
            while ids and not retokenizes(tokenizer, ids):
                ids = ids[:-1]
            if ids:
                out[b, suffix_len - len(ids) :] = ids
                lens[b] = len(ids)
                break
    return out, lens


__all__ = ["BEASTConfig", "BEASTOptions", "BEASTState", "make_beast", "seed_suffixes"]
