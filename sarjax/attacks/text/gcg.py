"""Joint GCG (Zou et al. 2023, "Universal and Transferable Adversarial Attacks on Aligned
Language Models"; the joint form of the SAR paper): greedy coordinate gradient over an adversarial
suffix against the uncovered members of a pool.

One step, per request (all requests of a batch in one ``vmap``):

1. the token gradient: ``d loss / d one_hot(suffix)`` ``[Ls, V]`` of the JOINT loss (the mean
   of the covered members' losses, :func:`~sarjax.attacks.text.core.joint_loss`), one backward
   pass per covered member;
2. the ``topk`` ids with the most negative gradient per suffix position, over the allowed
   vocabulary only;
3. ``num_candidates`` candidates, each the current suffix with ONE position (uniform) replaced by
   one of that position's top-k ids (uniform), as in GCG's ``sample_control``;
4. every candidate scored on every member in one batched call; the suffix moves to the best
   candidate (GCG moves even when it is worse than the current one); the best-so-far is kept.

The request's ``before`` block (template head + request) does not change during a call: it is run
once per member and call (:func:`~sarjax.attacks.text.core.prefix_cache`, kept in the state;
nanoGCG's prefix cache), and both the gradient pass and the candidates read it from that KV cache
(equal to running full prompts up to float rounding; models without a cache run full prompts).

The loss is a function argument: the default :func:`~sarjax.attacks.text.core.refusal_loss`
MAXIMISES the mean NLL of a fixed refusal (the SAR paper, joint GCG); pass
:func:`~sarjax.attacks.text.core.target_loss` for Zou et al.'s original objective (minimise the
NLL of an affirmative target).

Queries per step and request: ``(1 + num_candidates) * |covered members|`` (one gradient per
member, one forward per member and candidate); the start suffix costs ``|covered|``. A request
whose next step would pass its cap stops (its state is frozen).

This state machine (:func:`make_gcg`) needs a pool sharing one vocabulary, takes the gradient of
the joint loss, and leaves GCG's re-tokenization filter to the audit of the returned suffix.
:func:`make_joint_gcg` is the joint GCG of the SAR paper on any pool, including members with
different tokenizers: the proposer rotates within the pool, suffixes pass between members as
TEXT, and every candidate goes through the re-tokenization filter. Tokenizers run on the host, so
its step is a host loop around two compiled kernels (the proposer's gradient + candidate sampling,
and the batched scoring of one stack) instead of a ``lax.scan``.
"""

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.attacks import queries as Q
from sarjax.attacks.core.entry import Entry
from sarjax.attacks.core.protocol import Attack
from sarjax.attacks.core.validate import check_sample_ids
from sarjax.attacks.text import core as T


class GCGConfig(NamedTuple):
    """Static hyperparameters (hashable).

    Attributes:
      model: the :class:`~sarjax.attacks.text.core.TextModel`.
      loss: ``loss(nll [..., Tt], target_mask [Tt]) -> [...]`` per member (minimised).
      suffix_len: ``Ls`` (20: GCG's ``"! " * 20`` start).
      topk: substitutions per position (256, Zou et al. 2023; the SAR paper Table 3).
      num_candidates: candidates per step (64, the SAR paper Table 3; GCG's reference uses 512).
      criterion: the success criterion (:attr:`~sarjax.attacks.text.core.TextAttackResult.success`).
    """

    model: T.TextModel
    loss: Callable
    suffix_len: int
    topk: int
    num_candidates: int
    criterion: str = "refusal"


class GCGState(NamedTuple):
    """Per-request state (leading ``[B]``).

    Attributes:
      suffix: ``[B, Ls]`` current suffix.
      best_suffix: ``[B, Ls]`` best-so-far; best_loss: ``[B]`` its joint loss.
      queries: ``[B]`` int32.
      step: scalar int32 (the step counter; draws use ``fold_in(sample key, step)``).
      keys: ``[B]`` per-request keys.
      problem: the :class:`~sarjax.attacks.text.core.TextProblem`.
      prefix: every member's KV cache of each request's ``before`` block (leading ``[B]``;
        :func:`~sarjax.attacks.text.core.prefix_cache`), computed once per call; None when the
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


def _init(cfg: GCGConfig, params, problem: T.TextProblem) -> GCGState:
    ls = cfg.suffix_len
    full = jnp.ones((ls,), jnp.int32)

    def one(r, mk, s):
        return T.joint_loss(T.member_losses(cfg.model, cfg.loss, params, r, s[None], full), mk)[0]

    loss = jax.vmap(one)(problem.batch, problem.mask, problem.suffix_init)
    nm = jnp.sum(problem.mask > 0, axis=1).astype(jnp.int32)
    ok = Q.allowed(jnp.zeros_like(nm), nm, problem.cap)
    q = Q.charge(jnp.zeros_like(nm), nm, ok)
    loss = jnp.where(ok, loss, jnp.inf)
    s0 = problem.suffix_init
    prefix = jax.vmap(lambda r: T.prefix_cache(cfg.model, params, r))(problem.batch)
    return GCGState(s0, s0, loss, q, jnp.int32(0), T.sample_keys(problem), problem, prefix)


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

    def one(r, mk, key, suffix, best_s, best_l, count, cap, cache):
        nm = jnp.sum(mk > 0).astype(jnp.int32)
        cost = (1 + nc) * nm
        active = Q.allowed(count, cost, cap) & (nm > 0) & jnp.isfinite(best_l)
        if cached:  # the gradient reads the before block from its cache: suffix | after | target
            ids = jnp.concatenate([suffix, r.after]).astype(jnp.int32)
            pm = jnp.concatenate([full, r.after_mask]).astype(jnp.int32)
            start = 0
        else:
            ids, pm = T.assemble(r, suffix, full)
            start = pb
        oh = jax.nn.one_hot(ids, v, dtype=jnp.float32)

        def f(oh_s):
            x = jax.lax.dynamic_update_slice_in_dim(oh, oh_s, start, axis=0)
            if cached and nll_oh_cached is not None:
                nll = nll_oh_cached(params, cache, x, pm, r.target, r.target_mask)
            else:
                nll = model.nll_one_hot(params, x, pm, r.target, r.target_mask)
            return T.joint_loss(cfg.loss(nll, r.target_mask), mk)

        g = jax.grad(f)(jax.lax.dynamic_slice_in_dim(oh, start, ls, axis=0))  # [Ls, V]
        score = jnp.where(p.allowed[None], -g, -jnp.inf)
        top = jax.lax.top_k(score, k)[1]  # [Ls, k]
        kp, kt = jax.random.split(jax.random.fold_in(key, state.step))
        pos = jax.random.randint(kp, (nc,), 0, ls)
        which = jax.random.randint(kt, (nc,), 0, k)
        tok = top[pos, which]
        cands = jnp.broadcast_to(suffix, (nc, ls)).at[jnp.arange(nc), pos].set(tok)
        jl = T.joint_loss(T.member_losses_cached(model, cfg.loss, params, r, cands, full, cache), mk)
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
        state.prefix,
    )  # fmt: skip
    return state._replace(suffix=s, best_suffix=bs, best_loss=bl, queries=q, step=state.step + 1)


def _result(cfg: GCGConfig, state: GCGState, params) -> T.TextAttackResult:
    b = state.suffix.shape[0]
    n = jnp.full((b,), cfg.suffix_len, jnp.int32)
    return T.finish(
        cfg.model, cfg.loss, cfg.criterion, params, state.problem, state.best_suffix, n, state.best_loss, state.queries
    )


def make_gcg(
    model: T.TextModel,
    *,
    vocab_size: int,
    num_steps: int = 20,
    suffix_len: int = 20,
    topk: int = 256,
    num_candidates: int = 64,
    loss: Callable = T.refusal_loss,
    tokenizer=None,
    init_id: int | None = None,
    criterion: str | None = None,
) -> T.TextAttackFn:
    """Joint GCG on a pool.

    Args:
      model: the pool (:func:`~sarjax.attacks.text.core.llm_text_model`).
      vocab_size: ``V`` (the embedding rows).
      num_steps: steps per call (20 per round, the SAR paper Table 3).
      suffix_len: ``Ls`` (20, Zou et al. 2023).
      topk: top-k substitutions per position (256, Zou et al. 2023 / the SAR paper Table 3); clipped
        to ``V``.
      num_candidates: candidates per step (64, the SAR paper Table 3).
      loss: per-member loss, minimised (default :func:`~sarjax.attacks.text.core.refusal_loss`:
        maximise the refusal's mean NLL, the SAR paper).
      tokenizer: optional; the audited entry then checks the returned suffix re-tokenizes and
        re-tokenizes the whole prompt as text (:attr:`~sarjax.attacks.text.core.TextAttackResult.sent`).
      init_id: start token (GCG starts from ``"!"`` x 20: pass the id of ``"!"``); None: the
        first allowed id. A call's ``suffix_init`` overrides it.
      criterion: ``"refusal"`` (a member is broken when its greedy response is not the refusal)
        or ``"target"`` (its greedy response starts with the target); None: ``"refusal"`` for
        :func:`~sarjax.attacks.text.core.refusal_loss`, else ``"target"``.

    Returns:
      A :class:`~sarjax.attacks.text.core.TextAttackFn`:
      ``fn(params, batch, ref, *, key, mask=None, max_queries=None, sample_ids=None, allowed=None,
      suffix_init=None, texts=None) -> TextAttackResult`` (``ref`` None: the batch carries the
      refusal / target ids) and ``fn.jit(...)``.

    Raises:
      ValueError: a non-positive size, an unknown criterion.
    """
    for n, val in (
        ("vocab_size", vocab_size),
        ("num_steps", num_steps),
        ("suffix_len", suffix_len),
        ("topk", topk),
        ("num_candidates", num_candidates),
    ):
        if int(val) < 1:
            raise ValueError(f"make_gcg: {n} must be >= 1, got {val}")
    crit = T.check_criterion("make_gcg", criterion, loss)
    cfg = GCGConfig(model, loss, int(suffix_len), int(topk), int(num_candidates), crit)
    attack = Attack(_init, _step, _result, int(num_steps), cfg)
    return T.TextAttackFn(
        attack,
        name="gcg",
        model=model,
        vocab_size=int(vocab_size),
        suffix_len=int(suffix_len),
        tokenizer=tokenizer,
        init_id=init_id,
        criterion=crit,
    )


# ---------------------------------------------------------------------------------------------
# joint GCG across tokenizers (the SAR paper): proposer rotation, text exchange, re-tokenization filter


@functools.partial(jax.jit, static_argnames=("cfg", "loss", "topk", "nc"))
def _propose(params, m, batch: T.TextBatch, suffix, smask, allowed, keys, *, cfg, loss, topk, nc):
    """Member ``m`` of a stack proposes ``nc`` single-token substitutions per request.

    Args:
      params: the stack's stacked parameters ``[M_s, ...]``; m: traced member index.
      batch: the stack's :class:`~sarjax.attacks.text.core.TextBatch` ``[B, ...]``.
      suffix, smask: ``[B, Ls]`` current suffix ids and its right-aligned real slots.
      allowed: ``[V]`` bool; keys: ``[B]`` keys of this step.

    Returns:
      ``(cands [B, nc, Ls] int32, ok [B, nc] bool)``: ``ok`` is False for a banned id (fewer
      allowed ids than ``topk``).
    """
    from sarjax.models.llm import scoring

    p = jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, m, keepdims=False), params)
    v = allowed.shape[0]
    k = min(topk, v)
    ls = suffix.shape[1]
    pb = batch.before.shape[1]

    def one(r, s, sm, key):
        ids, pm = T.assemble(r, s, sm)
        oh = jax.nn.one_hot(ids, v, dtype=jnp.float32)

        def f(oh_s):
            x = jax.lax.dynamic_update_slice_in_dim(oh, oh_s, pb, axis=0) @ p["embed"]
            return loss(scoring.target_nll_from_embeds(p, cfg, x, pm, r.target, r.target_mask), r.target_mask)

        g = jax.grad(f)(jax.lax.dynamic_slice_in_dim(oh, pb, ls, axis=0))  # [Ls, V]
        score = jnp.where(allowed[None], -g, -jnp.inf)
        top = jax.lax.top_k(score, k)[1]  # [Ls, k]
        n = jnp.maximum(jnp.sum(sm), 1)
        kp, kt = jax.random.split(key)
        pos = ls - n + jax.random.randint(kp, (nc,), 0, n)  # a uniform real slot
        tok = top[pos, jax.random.randint(kt, (nc,), 0, k)]
        cands = jnp.broadcast_to(s, (nc, ls)).at[jnp.arange(nc), pos].set(tok)
        return cands.astype(jnp.int32), allowed[tok]

    return jax.vmap(one)(batch, suffix, smask, keys)


@functools.partial(jax.jit, static_argnames=("cfg", "loss"))
def score_texts(params, batch: T.TextBatch, cands, cmask, *, cfg, loss):
    """Every member of a stack on ``N`` candidate suffixes per request: ``[B, M_s, N]``."""
    model = T.llm_text_model(cfg)
    return jax.vmap(lambda r, c, cm: T.member_losses(model, loss, params, r, c, cm))(batch, cands, cmask)


class JointGCGResult(NamedTuple):
    """The best-so-far suffix of a :func:`make_joint_gcg` call (member axis ``[B, M]``, members in
    ``pool.names`` order).

    Attributes:
      x_adv: ``B`` suffix texts (every member reads the same text, in its own tokens).
      success: ``[B, M]`` bool, member ``m`` broken on request ``b`` by the attack's criterion
        (``criterion`` of the factory: ``"refusal"``, its greedy response under teacher forcing
        is not the refusal; ``"target"``, it starts with the target), judged on the ids that are
        SENT (:attr:`sent`).
      queries: ``[B, M]`` int64 queries spent on member ``m`` (its gradient passes as the
        proposer and its forwards on the start and every kept candidate).
      loss: ``[B]`` float64 joint loss of the best suffix (``inf``: the cap allowed no scoring).
      member_loss: ``[B, M]`` every member's loss on it (on :attr:`ids`, as searched).
      ids: one ``[B, T_s]`` int32 array per stack, the searched prompts ``before | suffix | after``
        (the three blocks tokenized apart); mask: one ``[B, T_s]`` int32 array per stack.
      sent: one ``[B, S_s]`` int32 array per stack (left-padded), the ids of the whole prompt
        text ``before + suffix + after`` tokenized by the stack's tokenizer: what a user
        sending the suffix text gets; sent_mask: idem.
      retokenized: ``[B, M]`` bool, member ``m``'s :attr:`sent` ids differ from its searched
        :attr:`ids` on request ``b``.
      proposers: ``[num_steps, B]`` int64, the member that proposed each step (-1: none).
    """

    x_adv: list
    success: Any
    queries: Any
    loss: Any
    member_loss: Any
    ids: tuple
    mask: tuple
    sent: tuple
    sent_mask: tuple
    retokenized: Any
    proposers: Any


_ALLOWED_CACHE: dict = {}


def allowed_for(tok, vocab_size: int, ascii_only: bool) -> np.ndarray:
    key = (id(tok), vocab_size, ascii_only)
    if key not in _ALLOWED_CACHE:
        _ALLOWED_CACHE[key] = (tok, T.allowed_vocab(tok, vocab_size, ascii_only))
    return _ALLOWED_CACHE[key][1]


def _round_up(n: int, k: int = 8) -> int:
    return max(k, -(-n // k) * k)


def _pad_rows(seqs, left: bool, pad_id: int, length: int):
    ids = np.full((len(seqs), length), pad_id, np.int32)
    mask = np.zeros((len(seqs), length), np.int32)
    for i, q in enumerate(seqs):
        if len(q):
            sl = slice(length - len(q), length) if left else slice(0, len(q))
            ids[i, sl] = q
            mask[i, sl] = 1
    return ids, mask


class PoolRequests(NamedTuple):
    """One stack's rendering of a pool attack's requests (host side).

    Attributes:
      batch: the :class:`~sarjax.attacks.text.core.TextBatch` (blocks padded to multiples of 8).
      before, after: ``B`` texts around each suffix slot (:func:`~sarjax.attacks.text.core.slot_texts`).
    """

    batch: T.TextBatch
    before: list
    after: list


def pool_requests(name, stack, instructions, targets, system, chat_template) -> PoolRequests:
    """Stack ``stack``'s :class:`PoolRequests` (its tokenizer and chat template).

    Raises:
      ValueError: a block that encodes to no token; some requests with a template tail, others none.
    """
    from sarjax.models.llm.prompts import encode_text

    tok = stack.tokenizer
    bt, at = T.slot_texts(tok, instructions, system=system, chat_template=chat_template)
    before = [encode_text(tok, x) for x in bt]
    after = [encode_text(tok, x) for x in at]
    target = [encode_text(tok, x) for x in targets]
    for what, seqs in (("before", before), ("target", target)):
        if any(len(q) == 0 for q in seqs):
            raise ValueError(f"{name}: stack {stack.names}: a request's {what} block encodes to no token")
    if any(len(q) == 0 for q in after) and any(len(q) for q in after):
        raise ValueError(f"{name}: stack {stack.names}: some requests have a template tail, others none")
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    b, bm = _pad_rows(before, True, pad, _round_up(max(map(len, before))))
    la = max(map(len, after))
    a, am = _pad_rows(after, True, pad, _round_up(la) if la else 0)
    t, tm = _pad_rows(target, False, pad, _round_up(max(map(len, target))))
    return PoolRequests(T.TextBatch(b, bm, a, am, t, tm), bt, at)


class PoolCall(NamedTuple):
    """The checked arguments of a pool attack's call (host side)."""

    stacks: tuple
    instructions: list
    mask: Any  # [B, M] float64 0/1
    targets: list
    sample_ids: Any  # [B] int64
    cap: Any  # [B] int64


def pool_call(name, pool, instructions, ref, default_target, key, mask, sample_ids, max_queries) -> PoolCall:
    """Checks a pool attack's call: a key, a pool with a tokenizer per stack, ``B >= 1`` request
    strings, ``ref`` (None: ``default_target``; one string or ``B``), the member mask (bool or
    0/1), sample ids and caps.

    Raises:
      TypeError: no key, a stack without a tokenizer, requests that are not strings.
      ValueError: an empty batch, bad shapes or values (naming them).
    """
    if key is None:
        raise TypeError(f"{name}: key is required (a jax.random key); sarjax never defaults it")
    stacks: tuple[Any, ...] = tuple(getattr(pool, "stacks", ()))
    if not stacks:
        raise TypeError(
            f"{name}: params must be an LLMPool (the attack renders each stack's prompts), got {type(pool).__name__}"
        )
    for st in stacks:
        if st.tokenizer is None:
            raise TypeError(f"{name}: stack {st.names} has no tokenizer; the text exchange needs one")
    if isinstance(instructions, str) or not all(isinstance(x, str) for x in instructions):
        raise TypeError(f"{name}: inputs must be a sequence of request strings")
    instructions = list(instructions)
    bsz = len(instructions)
    if bsz == 0:
        raise ValueError(f"{name}: expected at least one instruction")
    m_total = sum(st.size for st in stacks)
    mk = T.check_member_mask(name, mask, bsz, m_total).astype(np.float64)
    tgt = default_target if ref is None else ref
    targets = [tgt] * bsz if isinstance(tgt, str) else list(tgt)
    if len(targets) != bsz or not all(isinstance(x, str) for x in targets):
        raise ValueError(f"{name}: ref (the target) must be one string or {bsz}, got {len(targets)}")
    sid = np.asarray(check_sample_ids(sample_ids, bsz)).astype(np.int64)
    cap = np.asarray(Q.normalize_cap(max_queries, bsz)).astype(np.int64)
    return PoolCall(stacks, instructions, mk, targets, sid, cap)


def sent_prompts(name, stacks, reqs: Sequence[PoolRequests], texts: Sequence[str], ids, masks, params_of, criterion):
    """Every stack's prompt of each suffix text as it is SENT (the whole text tokenized), every
    member judged on it, and the rows whose ids changed (host side).

    Args:
      reqs: each stack's :class:`PoolRequests`.
      texts: ``B`` suffix texts.
      ids, masks: each stack's searched prompts ``[B, T_s]``.
      params_of: ``params_of(s)``, stack ``s``'s stacked parameters.
      criterion: the success criterion.

    Returns:
      ``(sent, sent_mask, success [B, M], retokenized [B, M])``: one ``[B, S_s]`` array per stack
      (``S_s = T_s`` unless a row needs more).
    """
    from sarjax.models.llm.pool import left_pad

    sent, smask, success, retok = [], [], [], []
    for s, st in enumerate(stacks):
        tok, r = st.tokenizer, reqs[s]
        rows = [T.sent_ids(tok, r.before[b], x, r.after[b]) for b, x in enumerate(texts)]
        t = ids[s].shape[1]
        n = max(map(len, rows))
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        si, sm = left_pad(rows, int(pad), t if n <= t else _round_up(n))
        changed = np.array([rows[b] != ids[s][b][masks[s][b] != 0].tolist() for b in range(len(texts))])
        ok = T.judge_prompts(
            params_of(s), jnp.asarray(si), jnp.asarray(sm), jnp.asarray(r.batch.target, jnp.int32),
            jnp.asarray(r.batch.target_mask, jnp.int32), model=T.llm_text_model(st.cfg), criterion=criterion,
        )  # fmt: skip
        sent.append(si)
        smask.append(sm)
        success.append(np.asarray(ok, bool))
        retok.append(np.repeat(changed[:, None], st.size, axis=1))
    return tuple(sent), tuple(smask), np.concatenate(success, axis=1), np.concatenate(retok, axis=1)


class JointGCG(Entry):
    """Joint GCG on an :class:`~sarjax.models.llm.pool.LLMPool` whose members may use different
    tokenizers (the SAR paper; Zou et al. 2023). Build with :func:`make_joint_gcg`; call
    ``fn(pool, instructions, ref, *, key, mask=None, max_queries=None, sample_ids=None,
    system=None, suffix_init=None, chat_template=True, allowed=None) -> JointGCGResult``
    (``ref``: the refusal, one string or one per request; None: the factory's). Host-driven:
    there is no ``fn.jit`` (it raises ``TypeError``).

    One step, per request ``b`` with covered members ``C_b`` (in ``pool.names`` order):

    1. the proposer is ``C_b[t mod |C_b|]`` (the rotation of the SAR paper); it encodes the current
       suffix TEXT with its own tokenizer, takes the one-hot token gradient of its own loss
       (1 query), and samples ``num_candidates`` single-token substitutions among the ``topk``
       most negative allowed ids per position (GCG's ``sample_control``);
    2. each candidate is decoded to text with the proposer's tokenizer; it is kept only when the
       proposer's tokenizer re-encodes that text to the candidate ids (GCG's re-tokenization
       filter) and every stack's tokenizer encodes it to ids that decode back to it, fit the
       suffix slots and lie in that stack's allowed vocabulary
       (:func:`~sarjax.attacks.text.core.suffix_text_violations`; ids past a tokenizer's
       vocabulary and special tokens are never allowed);
    3. every kept candidate is scored by every covered member in its own tokens (1 query per
       member and candidate); the suffix moves to the candidate of least joint loss (even when it
       is worse, as GCG) and the best-so-far is kept.

    A request stops when its next step could pass its cap (``1 + num_candidates x |C_b|``); the
    start suffix costs ``|C_b|``. Same key, same result: request ``b`` draws from
    ``fold_in(fold_in(key, sample_ids[b]), step)``.

    The search scores the blocks ``before | suffix | after`` tokenized apart; the returned
    prompts are then re-tokenized as whole texts (:attr:`JointGCGResult.sent`) and every member's
    success is judged on those ids.

    Compute: the two kernels are compiled once per stack configuration and shapes (requests are
    padded to multiples of 8 tokens); a step runs one gradient kernel per distinct proposer and
    one scoring call per stack (all of its members, covered or not; only covered members are
    counted as queries).
    """

    apply = None

    def __init__(
        self, *, num_steps, suffix_len, topk, num_candidates, loss, target, init_text, slots, ascii_only, criterion
    ):
        self.name = "joint_gcg"
        self.__name__ = self.name
        self.num_steps = num_steps
        self.suffix_len = suffix_len
        self.topk = topk
        self.num_candidates = num_candidates
        self.loss = loss
        self.target = target
        self.init_text = init_text
        self.slots = slots
        self.ascii_only = ascii_only
        self.criterion = criterion

    def __repr__(self) -> str:
        return f"JointGCG(steps={self.num_steps}, Ls={self.suffix_len}, topk={self.topk}, nc={self.num_candidates})"

    @property
    def attack(self):
        raise TypeError(f"{self.name}: a host-driven attack (tokenizers run between steps) has no state machine")

    def jit(self, *args, **kwargs):
        """No jit-safe entry: the text exchange runs the tokenizers on the host between steps."""
        raise TypeError(f"{self.name}: no jit-safe entry (the tokenizers run on the host between steps); call fn(...)")

    def _encode_suffixes(self, ids_lists, slots):
        out = np.zeros((len(ids_lists), slots), np.int32)
        m = np.zeros((len(ids_lists), slots), np.int32)
        for i, q in enumerate(ids_lists):
            if q:
                out[i, slots - len(q) :] = q
                m[i, slots - len(q) :] = 1
        return out, m

    def __call__(  # pyright: ignore[reportIncompatibleMethodOverride]
        self,
        pool,
        instructions: Sequence[str],
        ref: str | Sequence[str] | None,
        *,
        key,
        mask=None,
        max_queries=None,
        sample_ids=None,
        system: str | None = None,
        suffix_init: str | Sequence[str] | None = None,
        chat_template: bool = True,
        allowed: Sequence[Any] | None = None,
    ) -> JointGCGResult:
        """Runs the attack (see the class docstring).

        Args:
          pool: an :class:`~sarjax.models.llm.pool.LLMPool` (every stack with a tokenizer).
          instructions: ``B`` requests (e.g. HarmBench behaviors).
          ref: the fixed refusal (one string, or one per request); None: the factory's.
          key: PRNG key (keyword-only, required).
          mask: ``[M]`` or ``[B, M]`` bool or 0/1, the members the objective covers (default all).
          max_queries: None, a scalar or ``[B]`` per-request cap (summed over members).
          sample_ids: ``[B]`` non-negative ints (default ``arange(B)``).
          system: optional system message.
          suffix_init: the start suffix text (one, or one per request); default the factory's.
          chat_template: False renders ``instruction + " " + suffix`` (base models).
          allowed: optional ``[V_s]`` bool per stack (default :func:`~sarjax.attacks.text.core.allowed_vocab`).

        Returns:
          :class:`JointGCGResult`.

        Raises:
          TypeError: no key; a stack without a tokenizer.
          ValueError: bad shapes or values; a start suffix that violates the threat model (naming
            the row and why); an audit failure of the output.
        """
        c = pool_call(self.name, pool, instructions, ref, self.target, key, mask, sample_ids, max_queries)
        stacks, instructions, mk, targets, sid, cap = c
        bsz = len(instructions)
        offsets = np.cumsum([0] + [st.size for st in stacks])[:-1]
        stack_of = np.concatenate([np.full(st.size, i) for i, st in enumerate(stacks)])
        cov = mk > 0
        ncov = cov.sum(1)
        init = self.init_text if suffix_init is None else suffix_init
        init_texts = [init] * bsz if isinstance(init, str) else list(init)
        if len(init_texts) != bsz:
            raise ValueError(f"{self.name}: suffix_init must be one string or {bsz}, got {len(init_texts)}")
        toks = [st.tokenizer for st in stacks]
        if allowed is None:
            als = [allowed_for(st.tokenizer, st.cfg.vocab_size, self.ascii_only) for st in stacks]
        else:
            als = [np.asarray(a, bool) for a in allowed]
            if len(als) != len(stacks) or any(a.shape != (st.cfg.vocab_size,) for a, st in zip(als, stacks)):
                raise ValueError(f"{self.name}: allowed must be one [V_s] bool array per stack")
        slots = [self.slots] * len(stacks)
        reqs = [pool_requests(self.name, st, instructions, targets, system, chat_template) for st in stacks]
        batches = [r.batch for r in reqs]
        jb = [T.TextBatch(*(jnp.asarray(a) for a in b)) for b in batches]
        bad = []
        cur_ids = [[None] * bsz for _ in stacks]
        for i, text in enumerate(init_texts):
            ids, why = T.suffix_text_violations(text, toks, als, slots)
            if why:
                bad.append(f"row {i}: " + "; ".join(why))
            for s in range(len(stacks)):
                cur_ids[s][i] = ids[s]
        if bad:
            raise ValueError(f"{self.name}: the start suffix violates the threat model: " + " | ".join(bad))

        def score(ids_per_stack, n):
            """ids_per_stack[s][b][c] (list or None) -> member losses [B, M, n]."""
            out = []
            for s, st in enumerate(stacks):
                c = np.zeros((bsz, n, slots[s]), np.int32)
                cm = np.zeros((bsz, n, slots[s]), np.int32)
                for b in range(bsz):
                    for j in range(n):
                        q = ids_per_stack[s][b][j]
                        if q:
                            c[b, j, slots[s] - len(q) :] = q
                            cm[b, j, slots[s] - len(q) :] = 1
                kw = dict(cfg=st.cfg, loss=self.loss)
                out.append(np.asarray(score_texts(st.params, jb[s], jnp.asarray(c), jnp.asarray(cm), **kw)))
            return np.concatenate(out, axis=1).astype(np.float64)

        def joint(ml):  # [B, M, n] -> [B, n]
            return np.einsum("bm,bmn->bn", mk, ml) / np.maximum(mk.sum(1), 1.0)[:, None]

        ml0 = score([[[q] for q in cur_ids[s]] for s in range(len(stacks))], 1)
        ok0 = (ncov > 0) & (ncov <= cap)
        queries = np.where(ok0[:, None] & cov, 1, 0).astype(np.int64)  # [B, M]
        cur_text: list[Any] = list(init_texts)
        best_text = list(init_texts)
        best_loss = np.where(ok0, joint(ml0)[:, 0], np.inf)
        best_ml = ml0[:, :, 0].copy()
        base_keys = jax.vmap(lambda s: jax.random.fold_in(key, s))(jnp.asarray(sid, jnp.uint32))
        nc = self.num_candidates
        proposers = np.full((self.num_steps, bsz), -1, np.int64)
        kw_decode = dict(skip_special_tokens=False, clean_up_tokenization_spaces=False)
        from sarjax.models.llm.prompts import encode_text

        for t in range(self.num_steps):
            active = (ncov > 0) & np.isfinite(best_loss) & (queries.sum(1) + 1 + nc * ncov <= cap)
            if not active.any():
                break
            for b in np.flatnonzero(active):
                members = np.flatnonzero(cov[b])
                proposers[t, b] = members[t % len(members)]
            keys = jax.vmap(lambda k: jax.random.fold_in(k, t))(base_keys)
            cand_text: list[list[Any]] = [[None] * nc for _ in range(bsz)]
            for p in np.unique(proposers[t][proposers[t] >= 0]):
                s = int(stack_of[p])
                st = stacks[s]
                sf, sm = self._encode_suffixes(cur_ids[s], slots[s])
                cands, ok = _propose(
                    st.params, jnp.int32(p - offsets[s]), jb[s], jnp.asarray(sf), jnp.asarray(sm),
                    jnp.asarray(als[s]), keys, cfg=st.cfg, loss=self.loss, topk=self.topk, nc=nc,
                )  # fmt: skip
                cands, ok = np.asarray(cands), np.asarray(ok)
                for b in np.flatnonzero(proposers[t] == p):
                    real = sm[b] == 1
                    for j in range(nc):
                        if not ok[b, j]:
                            continue
                        ids = cands[b, j][real].tolist()
                        text = st.tokenizer.decode(ids, **kw_decode)
                        if encode_text(st.tokenizer, text) == ids:  # GCG's re-tokenization filter
                            cand_text[b][j] = text
            cand_ids = [[[None] * nc for _ in range(bsz)] for _ in stacks]
            valid = np.zeros((bsz, nc), bool)
            memo: dict = {}
            for b in range(bsz):
                for j in range(nc):
                    text = cand_text[b][j]
                    if text is None:
                        continue
                    if text not in memo:
                        memo[text] = T.suffix_text_violations(text, toks, als, slots)
                    ids, why = memo[text]
                    if why:
                        continue
                    valid[b, j] = True
                    for s in range(len(stacks)):
                        cand_ids[s][b][j] = ids[s]
            jl = np.where(valid, joint(ml := score(cand_ids, nc)), np.inf)
            pick = np.argmin(jl, axis=1)
            for b in np.flatnonzero(active):
                j = int(pick[b])
                if not np.isfinite(jl[b, j]):
                    continue
                cur_text[b] = cand_text[b][j]
                for s in range(len(stacks)):
                    cur_ids[s][b] = cand_ids[s][b][j]
                if jl[b, j] < best_loss[b]:
                    best_loss[b] = jl[b, j]
                    best_text[b] = cur_text[b]
                    best_ml[b] = ml[b, :, j]
            queries += np.where(active[:, None] & cov, valid.sum(1)[:, None], 0)
            for b in np.flatnonzero(active):
                queries[b, proposers[t, b]] += 1  # the proposer's gradient pass

        ids_out, mask_out = [], []
        for s, st in enumerate(stacks):
            enc = [T.suffix_text_violations(x, [toks[s]], [als[s]], [slots[s]])[0][0] for x in best_text]
            sf, sm = self._encode_suffixes(enc, slots[s])
            b = batches[s]
            ids_out.append(np.concatenate([b.before, sf, b.after], axis=1))
            mask_out.append(np.concatenate([b.before_mask, sm, b.after_mask], axis=1))
            problem = T.TextProblem(b, mk, als[s], cap, key, sid, sf, sm.sum(1))
            q_s = queries[:, offsets[s] : offsets[s] + st.size]
            res = T.TextAttackResult(ids_out[-1], None, q_s, mask_out[-1], sf, sm, best_loss, best_ml, None, None, None)
            T.audit_text(
                f"{self.name} (stack {s})",
                problem._replace(mask=cov[:, offsets[s] : offsets[s] + st.size]),
                res,
                st.tokenizer,
            )
        why = [
            f"row {i}: " + "; ".join(r)
            for i, x in enumerate(best_text)
            if (r := T.suffix_text_violations(x, toks, als, slots)[1])
        ]
        if why:
            raise ValueError(f"{self.name}: output violates the threat model: " + " | ".join(why))
        sent, sent_mask, success, retok = sent_prompts(
            self.name, stacks, reqs, best_text, ids_out, mask_out, lambda s: stacks[s].params, self.criterion
        )
        return JointGCGResult(
            best_text, success, queries, best_loss, best_ml, tuple(ids_out), tuple(mask_out), sent, sent_mask, retok,
            proposers,
        )  # fmt: skip


def make_joint_gcg(
    *,
    num_steps: int = 20,
    suffix_len: int = 20,
    topk: int = 256,
    num_candidates: int = 64,
    loss: Callable = T.refusal_loss,
    target: str = "I'm sorry, but I cannot help with that.",
    init_text: str | None = None,
    slots: int | None = None,
    ascii_only: bool = True,
    criterion: str | None = None,
) -> JointGCG:
    """Joint GCG for pools whose members may have different tokenizers (the SAR paper).

    Args:
      num_steps: steps per call (20 per round, the SAR paper Table 3).
      suffix_len: length of the start suffix in words (GCG's ``"! " * 20``, Zou et al. 2023).
      topk: substitutions per position (256, Zou et al. 2023 / the SAR paper Table 3).
      num_candidates: candidates per step (64, the SAR paper Table 3).
      loss: per-member loss, minimised (default
        :func:`~sarjax.attacks.text.core.refusal_loss`: maximise the fixed refusal's mean NLL,
        the SAR paper).
      target: the fixed refusal (the SAR paper does not print its refusal string; this one is ours).
      init_text: start suffix text (default ``"!"`` repeated ``suffix_len`` times with spaces,
        GCG's start).
      slots: suffix token slots of every stack (default ``2 * suffix_len``: the same text may
        take more tokens in another tokenizer; a candidate that does not fit is filtered).
      ascii_only: the default allowed vocabulary keeps printable-ASCII tokens only (GCG's
        reference filter).
      criterion: the success criterion (:attr:`JointGCGResult.success`; None: ``"refusal"`` for
        :func:`~sarjax.attacks.text.core.refusal_loss`, else ``"target"``).

    Returns:
      A :class:`JointGCG`: ``fn(pool, instructions, ref, *, key, mask=None, max_queries=None,
      sample_ids=None, system=None, suffix_init=None, chat_template=True, allowed=None) ->
      JointGCGResult`` (``ref`` None: ``target``).

    Raises:
      ValueError: a non-positive size, an unknown criterion.
    """
    for n, val in (
        ("num_steps", num_steps),
        ("suffix_len", suffix_len),
        ("topk", topk),
        ("num_candidates", num_candidates),
    ):
        if int(val) < 1:
            raise ValueError(f"make_joint_gcg: {n} must be >= 1, got {val}")
    sl = int(slots) if slots is not None else 2 * int(suffix_len)
    if sl < 1:
        raise ValueError(f"make_joint_gcg: slots must be >= 1, got {slots}")
    init = " ".join(["!"] * int(suffix_len)) if init_text is None else init_text
    return JointGCG(
        num_steps=int(num_steps), suffix_len=int(suffix_len), topk=int(topk), num_candidates=int(num_candidates),
        loss=loss, target=target, init_text=init, slots=sl, ascii_only=bool(ascii_only),
        criterion=T.check_criterion("make_joint_gcg", criterion, loss),
    )  # fmt: skip


__all__ = [
    "allowed_for",
    "GCGConfig",
    "GCGState",
    "JointGCG",
    "JointGCGResult",
    "make_gcg",
    "make_joint_gcg",
    "pool_call",
    "pool_requests",
    "PoolRequests",
    "score_texts",
    "sent_prompts",
]
