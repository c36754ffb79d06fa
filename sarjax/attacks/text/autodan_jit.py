"""AutoDAN as a state machine on TOKEN IDS (:class:`AutoDANTokenFn`): the token path of
:func:`~sarjax.attacks.text.autodan.make_autodan` (built by :func:`build_token_autodan`).

The search of :mod:`sarjax.attacks.text.autodan` (the host loop on text) written as ``init`` /
``step`` / ``result`` over :class:`AutoDANState` (``run`` = ``lax.scan`` over ``step``), with a
jit-safe entry and an audited entry, for a pool and an attacker that share ONE tokenizer and a
judge on token ids (:class:`~sarjax.judges.refusal.TokenRefusalJudge`, or any pure
``judge(tokens, length)``). The proposals, their sample-id streams, the ranking and the query
accounting are the host loop's (see that module's docstring).
"""

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.attacks import queries as Q
from sarjax.attacks.core.entry import Entry, host
from sarjax.attacks.core.protocol import Attack
from sarjax.attacks.core.validate import check_sample_ids
from sarjax.attacks.text.autodan_options import AutoDANOptions, check_search
from sarjax.attacks.text.requests import TextRequests, check_member_mask, text_requests
from sarjax.judges.refusal import token_refusal_judge
from sarjax.models.llm.generate import SamplingConfig, greedy_one, sample_one
from sarjax.models.llm.pool import left_pad, stack_decoding, tokenizer_fingerprint
from sarjax.models.llm.prompts import PLACEHOLDER, encode_text, retokenizes


class RewriteBatch(NamedTuple):
    """B requests as token ids (build with :meth:`AutoDANTokenFn.batch`).

    Attributes:
      request: ``[B, W]`` int32 request tokens (no chat template), right-aligned in the ``W``
        rewrite slots (holes 0).
      request_mask: ``[B, W]`` 0/1.
    """

    request: Any
    request_mask: Any


class RewriteProblem(NamedTuple):
    """One call of the token-level AutoDAN, normalised (every field traced, shapes static).

    Attributes:
      batch: the :class:`RewriteBatch`.
      mask: ``[B, M]`` float32, the uncovered members (the ranking and the queries count them).
      cap: ``[B]`` int32 query cap (``queries.NO_CAP``: none).
      key: PRNG key of the call (required).
      sample_ids: ``[B]`` int32, each request's index in the data set.
    """

    batch: RewriteBatch
    mask: Any
    cap: Any
    key: Any
    sample_ids: Any


class AutoDANParams(NamedTuple):
    """The weights the token-level AutoDAN reads.

    Attributes:
      attacker: ONE member's parameter tree (not stacked): the attacker LM.
      targets: one stacked parameter tree ``[M_s, ...]`` per target stack, members in pool order.
    """

    attacker: Any
    targets: tuple


class AutoDANConfig(NamedTuple):
    """Static hyperparameters of the token-level AutoDAN (hashable: it keys the jit cache).

    Attributes:
      attacker_cfg: the attacker's :class:`~sarjax.models.llm.config.DecoderConfig`.
      target_cfgs: one config per target stack.
      judge: ``judge(tokens [R] int32, length) -> (broken bool, confidence float32)``: a hashable
        pure function of one response (its first ``length`` tokens real, special tokens and
        everything from the first end token on removed), e.g.
        :class:`~sarjax.judges.refusal.TokenRefusalJudge`.
      num_members: ``M``.
      proposals, anchors: per step (4: the SAR paper Table 4; 2: sarjax's choice).
      rewrite_len: the attacker's new tokens per rewrite (``max_new_tokens``).
      response_len: each target's greedy tokens per response.
      slot: ``W``, the rewrite slots (>= ``rewrite_len`` and the longest request).
      temperature, top_p: the attacker's sampling (0.8, 0.95: the SAR paper Table 4; top-k off).
      attacker_head, attacker_tail: ids of the attacker's chat template and rewrite instruction
        before and after the anchor.
      target_head, target_tail: ids of the targets' chat template before and after the request.
      target_head_text, target_tail_text: their text (the audited entry re-tokenizes
        ``head text + rewrite + tail text`` as a whole).
      specials: ids removed from rewrites and responses (the tokenizer's special tokens: the host
        loop decodes with ``skip_special_tokens=True``).
      num_tokens: ``len(tokenizer)``; ids from it on (padded embedding rows) are removed too.
      vocab_size: the largest embedding size of the attacker and the targets.
      attacker_eos, attacker_pad: the attacker's end tokens and pad id.
      target_eos, target_pad: per target stack.
      prompt_pad: the id of left-padding slots (never attended).
    """

    attacker_cfg: Any
    target_cfgs: tuple
    judge: Callable
    num_members: int
    proposals: int
    anchors: int
    rewrite_len: int
    response_len: int
    slot: int
    temperature: float
    top_p: float
    attacker_head: tuple
    attacker_tail: tuple
    target_head: tuple
    target_tail: tuple
    target_head_text: str
    target_tail_text: str
    specials: tuple
    num_tokens: int
    vocab_size: int
    attacker_eos: tuple
    attacker_pad: int
    target_eos: tuple
    target_pad: tuple
    prompt_pad: int


class AutoDANState(NamedTuple):
    """Per-request state (leading ``[B]``).

    Attributes:
      anchors: ``[B, A, W]`` int32 right-aligned anchors; anchor_mask: ``[B, A, W]``;
        anchor_ok: ``[B, A]`` bool (the first step has one anchor: the request).
      best: ``[B, W]`` the best rewrite so far (the request until a step ran); best_mask.
      best_key: ``[B, 3]`` float32 its ranking key (``-1``: nothing scored yet).
      best_broken: ``[B, M]`` bool; best_conf: ``[B, M]`` float32 (every member).
      queries: ``[B]`` int32 member responses charged; calls: ``[B]`` int32 rewrites sampled.
      step: scalar int32.
      problem: the :class:`RewriteProblem`.
    """

    anchors: Any
    anchor_mask: Any
    anchor_ok: Any
    best: Any
    best_mask: Any
    best_key: Any
    best_broken: Any
    best_conf: Any
    queries: Any
    calls: Any
    step: Any
    problem: Any


class AutoDANTokenResult(NamedTuple):
    """Best-so-far rewrite per request, on token ids (member axis ``[B, M]``).

    Attributes:
      x_adv: ``[B, W]`` int32 the best rewritten request (right-aligned, holes 0).
      success: ``[B, M]`` bool, each member's judgement of the best rewrite (the judge's verdict:
        broken; every member), on the prompt it reads (:attr:`sent`; judged again where the
        audited entry's re-tokenization changed the ids).
      queries: ``[B, M]`` int32 responses of member ``m`` charged for request ``b`` (uncovered
        members only).
      rewrite_mask: ``[B, W]`` the real slots of :attr:`x_adv`.
      ids: ``[B, T]`` int32 the searched prompt ``target_head | rewrite | target_tail`` (the
        template's ids and the rewrite's ids side by side), left-padded; mask: ``[B, T]``.
      confidence: ``[B, M]`` float32; member_loss: ``-confidence``.
      sent: ``[B, S]`` int32, left-padded: the prompt as it is sent. The audited entry
        re-tokenizes the rendered text (``head text + decode(rewrite) + tail text``); the jit
        entry returns :attr:`ids` (``S = T``). sent_mask: idem.
      retokenized: ``[B, M]`` bool, member ``m``'s :attr:`sent` ids differ from its searched
        :attr:`ids` on request ``b`` (one tokenizer: a row is all True or all False; those
        members were judged again on :attr:`sent`); all False from the jit entry.
      attacker_calls: ``[B]`` int32 rewrites sampled.
    """

    x_adv: Any
    success: Any
    queries: Any
    rewrite_mask: Any
    ids: Any
    mask: Any
    confidence: Any
    member_loss: Any
    sent: Any
    sent_mask: Any
    retokenized: Any
    attacker_calls: Any


def _ids(t) -> Any:
    return jnp.asarray(tuple(t), jnp.int32).reshape(-1)


def _compact_right(ids, mask, pad):
    """Real tokens moved to the right end in order (left padding ``pad``): ``(ids, mask)``."""
    m = mask.astype(jnp.int32)
    order = jnp.argsort(m, stable=True)
    return jnp.where(m[order] > 0, ids[order], pad).astype(jnp.int32), m[order]


def _compact_left(ids, keep):
    """Kept tokens moved to the left end in order: ``(ids [R] (0 after), length)``."""
    k = keep.astype(jnp.int32)
    order = jnp.argsort(1 - k, stable=True)
    return jnp.where(k[order] > 0, ids[order], 0).astype(jnp.int32), jnp.sum(k)


def _kept(cfg: AutoDANConfig, toks, eos):
    """``[R]`` bool: tokens before the first end token that are neither special nor past the
    tokenizer (what ``decode(row[:cut], skip_special_tokens=True)`` keeps)."""
    e = _ids(eos if eos else (-1,))
    is_eos = (toks[:, None] == e[None, :]).any(axis=-1)
    before = jnp.cumsum(is_eos.astype(jnp.int32)) == 0
    dropped = jnp.zeros((cfg.vocab_size,), bool).at[cfg.num_tokens :].set(True)
    if cfg.specials:
        dropped = dropped.at[_ids(cfg.specials)].set(True)
    return before & ~dropped[jnp.clip(toks, 0, cfg.vocab_size - 1)]


def _wrap(head, body, body_mask, tail, pad):
    """``head | body | tail`` compacted to the right (left-padded)."""
    ids = jnp.concatenate([_ids(head), body.astype(jnp.int32), _ids(tail)])
    m = jnp.concatenate(
        [jnp.ones((len(head),), jnp.int32), body_mask.astype(jnp.int32), jnp.ones((len(tail),), jnp.int32)]
    )
    return _compact_right(ids, m, pad)


def _propose_one(cfg: AutoDANConfig, aparams, anchor, amask, key):
    """One rewrite of one anchor: ``(ids [W], mask [W])`` right-aligned; the anchor itself when
    the rewrite keeps no token (the host loop's ``text.strip() or anchor``)."""
    ids, m = _wrap(cfg.attacker_head, anchor, amask, cfg.attacker_tail, cfg.prompt_pad)
    eos = _ids(cfg.attacker_eos) if cfg.attacker_eos else None  # None: no end token ([-1], as before)
    sampling = SamplingConfig(
        jnp.float32(cfg.temperature), jnp.int32(0), jnp.float32(cfg.top_p), eos, jnp.int32(cfg.attacker_pad)
    )
    toks = sample_one(aparams, cfg.attacker_cfg, ids, m, cfg.rewrite_len, key, sampling)
    keep = _kept(cfg, toks, cfg.attacker_eos)
    r, rm = _compact_right(toks, keep, 0)
    fill = cfg.slot - cfg.rewrite_len
    cand = jnp.concatenate([jnp.zeros((fill,), jnp.int32), r])
    cmask = jnp.concatenate([jnp.zeros((fill,), jnp.int32), rm])
    empty = jnp.sum(keep) == 0
    return jnp.where(empty, anchor, cand), jnp.where(empty, amask.astype(jnp.int32), cmask)


def _evaluate_one(cfg: AutoDANConfig, targets, cand, cmask):
    """Every member's greedy response to one rewrite, judged: ``(broken [M], confidence [M])``."""

    ids, m = _wrap(cfg.target_head, cand, cmask, cfg.target_tail, cfg.prompt_pad)
    return _respond_judge(cfg, targets, ids, m)


def _respond_judge(cfg: AutoDANConfig, targets, ids, m):
    """Every member's greedy response to one whole prompt ``ids [T]`` (left-padded), judged:
    ``(broken [M], confidence [M])``."""
    resp, lens = [], []
    for p, c, eos, pad in zip(targets, cfg.target_cfgs, cfg.target_eos, cfg.target_pad, strict=True):

        def member(pp, c=c, eos=eos, pad=pad):
            toks = greedy_one(pp, c, ids, m, cfg.response_len, _ids(eos or (-1,)), jnp.int32(pad))
            return _compact_left(toks, _kept(cfg, toks, eos))

        r, n = jax.vmap(member)(p)
        resp.append(r)
        lens.append(n)
    broken, conf = jax.vmap(lambda t, n: cfg.judge(t, n))(jnp.concatenate(resp, axis=0), jnp.concatenate(lens, axis=0))
    return broken.astype(bool), conf.astype(jnp.float32)


def _rank(broken, conf, mk):
    """``(count, mean, 20% quantile)`` float32 over the masked members (numpy's linear quantile;
    zeros when the mask is empty): :func:`rank_key` on device."""
    w = mk > 0
    n = jnp.sum(w).astype(jnp.int32)
    cnt = jnp.sum(broken & w).astype(jnp.float32)
    mean = jnp.sum(jnp.where(w, conf, 0.0)) / jnp.maximum(n, 1).astype(jnp.float32)
    c = jnp.sort(jnp.where(w, conf, jnp.inf))
    pos = jnp.float32(0.2) * (n - 1).astype(jnp.float32)
    lo = jnp.clip(jnp.floor(pos).astype(jnp.int32), 0, c.shape[0] - 1)
    hi = jnp.clip(jnp.minimum(lo + 1, n - 1), 0, c.shape[0] - 1)
    t = pos - lo.astype(jnp.float32)
    a, b = c[lo], c[hi]
    d = jnp.where(hi > lo, b - a, 0.0)
    q = jnp.where(t >= 0.5, b - d * (1.0 - t), a + d * t)
    ok = n > 0
    return jnp.where(ok, cnt, 0.0), jnp.where(ok, mean, 0.0), jnp.where(ok, q, 0.0)


def _greater(a, b):
    """Lexicographic ``a > b`` of two ``[3]`` keys."""
    return (a[0] > b[0]) | ((a[0] == b[0]) & ((a[1] > b[1]) | ((a[1] == b[1]) & (a[2] > b[2]))))


def _init(cfg: AutoDANConfig, params: AutoDANParams, problem: RewriteProblem) -> AutoDANState:
    req = problem.batch.request.astype(jnp.int32)
    rm = problem.batch.request_mask.astype(jnp.int32)
    b, w = req.shape
    a = cfg.anchors
    anchors = jnp.zeros((b, a, w), jnp.int32).at[:, 0].set(req)
    amask = jnp.zeros((b, a, w), jnp.int32).at[:, 0].set(rm)
    aok = jnp.zeros((b, a), bool).at[:, 0].set(True)
    # the request's own judgement: reported for a row no step ran on (bookkeeping, not charged)
    br0, cf0 = jax.vmap(lambda c, cm: _evaluate_one(cfg, params.targets, c, cm))(req, rm)
    z = jnp.zeros((b,), jnp.int32)
    key0 = jnp.full((b, 3), -1.0, jnp.float32)
    return AutoDANState(anchors, amask, aok, req, rm, key0, br0, cf0, z, z, jnp.int32(0), problem)


def _step(cfg: AutoDANConfig, state: AutoDANState, params: AutoDANParams) -> AutoDANState:
    p = state.problem
    na, npr = cfg.anchors, cfg.proposals
    n = na * npr
    a_idx = jnp.repeat(jnp.arange(na), npr)
    offs = jnp.arange(n, dtype=jnp.uint32)  # a * proposals + p
    kstep = jax.random.fold_in(p.key, state.step)

    def one(sid, mk, cap, anchors, amask, aok, best, bmask, bkey, bbr, bcf, q, calls):
        nm = jnp.sum(mk > 0).astype(jnp.int32)
        n_anchor = jnp.sum(aok).astype(jnp.int32)
        cost = n_anchor * npr * nm
        active = (nm > 0) & (bkey[0] < nm.astype(jnp.float32)) & Q.allowed(q, cost, cap)
        sids = sid.astype(jnp.uint32) * jnp.uint32(n) + offs
        keys = jax.vmap(lambda s: jax.random.fold_in(jax.random.fold_in(kstep, s), 0))(sids)
        cands, cmask = jax.vmap(lambda an, am, k: _propose_one(cfg, params.attacker, an, am, k))(
            anchors[a_idx], amask[a_idx], keys
        )
        broken, conf = jax.vmap(lambda c, cm: _evaluate_one(cfg, params.targets, c, cm))(cands, cmask)
        valid = aok[a_idx]
        cnt, mean, q20 = jax.vmap(lambda bb, cc: _rank(bb, cc, mk))(broken, conf)
        cnt = jnp.where(valid, cnt, -1.0)
        # descending keys, ties in proposal order (the host loop's stable sort); 0 - x keeps +0.0
        order = jnp.lexsort((jnp.arange(n), 0.0 - q20, 0.0 - mean, 0.0 - cnt))
        i = order[0]
        ki = jnp.stack([cnt[i], mean[i], q20[i]])
        better = active & _greater(ki, bkey)
        keep = order[:na]
        return (
            jnp.where(active, cands[keep], anchors),
            jnp.where(active, cmask[keep], amask),
            jnp.where(active, valid[keep], aok),
            jnp.where(better, cands[i], best),
            jnp.where(better, cmask[i], bmask),
            jnp.where(better, ki, bkey),
            jnp.where(better, broken[i], bbr),
            jnp.where(better, conf[i], bcf),
            Q.charge(q, cost, active),
            calls + jnp.where(active, n_anchor * npr, 0),
        )

    out = jax.vmap(one)(
        p.sample_ids, p.mask, p.cap, state.anchors, state.anchor_mask, state.anchor_ok, state.best, state.best_mask,
        state.best_key, state.best_broken, state.best_conf, state.queries, state.calls,
    )  # fmt: skip
    return AutoDANState(*out, state.step + 1, p)


def _result(cfg: AutoDANConfig, state: AutoDANState, params: AutoDANParams) -> AutoDANTokenResult:
    del params
    ids, mask = jax.vmap(lambda c, cm: _wrap(cfg.target_head, c, cm, cfg.target_tail, cfg.prompt_pad))(
        state.best, state.best_mask
    )

    conf = state.best_conf
    q = jnp.where(state.problem.mask > 0, state.calls[:, None], 0).astype(jnp.int32)  # calls x uncovered
    return AutoDANTokenResult(
        state.best, state.best_broken, q, state.best_mask, ids, mask, conf, -conf, ids, mask,
        jnp.zeros(q.shape, bool), state.calls,
    )  # fmt: skip


@functools.partial(jax.jit, static_argnums=0)
def _judge_sent(cfg: AutoDANConfig, targets, ids, mask):
    """``(broken [B, M], confidence [B, M])`` of whole prompts ``[B, S]`` (host helper of the
    audited entry's re-tokenization; compiled per config and shape)."""
    return jax.vmap(lambda i, m: _respond_judge(cfg, targets, i, m))(ids, mask)


def _template_texts(tokenizer, pre: str, post: str, system: str | None) -> tuple[str, str]:
    """The text of the chat template (and instruction text) before and after a request slot
    rendered as ``pre + slot + post`` in the user turn with the generation prompt; without a chat
    template ``pre`` and ``post`` alone."""
    if getattr(tokenizer, "chat_template", None) is None:
        return pre, post
    msgs = [] if system is None else [{"role": "system", "content": system}]
    msgs.append({"role": "user", "content": pre + PLACEHOLDER + post})
    text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    if text.count(PLACEHOLDER) != 1:
        raise ValueError("the chat template must render the user message once, verbatim")
    head, tail = text.split(PLACEHOLDER)
    return head, tail


def _template_ids(tokenizer, pre: str, post: str, system: str | None):
    """Ids of :func:`_template_texts`, each piece tokenized alone (no special tokens added)."""
    head, tail = _template_texts(tokenizer, pre, post, system)
    return tuple(encode_text(tokenizer, head)), tuple(encode_text(tokenizer, tail))


def audit_rewrite(name: str, cfg: AutoDANConfig, problem: RewriteProblem, result: AutoDANTokenResult, tokenizer=None):
    """The threat-model audit of the token-level AutoDAN's output (host side).

    Checks, per row: the prompt is the ORIGINAL chat template around the rewrite (only the
    request changed); the rewrite holds 1 to ``W`` tokens, none special or past the tokenizer;
    the queries' sum ``<= cap`` and each uncovered member charged ``attacker_calls``; confidences are
    finite and in ``[0, 1]``; with a ``tokenizer``, a rewrite that differs from the request
    re-tokenizes to itself (``encode(decode(ids)) == ids``: the ids a user typing the text would
    send).

    Raises:
      ValueError: naming every offending row and why.
    """
    req, reqm = host(problem.batch.request), host(problem.batch.request_mask)
    mk, cap = host(problem.mask) > 0, host(problem.cap)
    rw, rwm = host(result.x_adv), host(result.rewrite_mask)
    ids, mask = host(result.ids), host(result.mask)
    q, calls, conf = host(result.queries), host(result.attacker_calls), host(result.confidence)
    head, tail = list(cfg.target_head), list(cfg.target_tail)
    special = set(cfg.specials)
    problems = []
    for i in range(rw.shape[0]):
        why = []
        real = rw[i][rwm[i] > 0].tolist()
        if ids[i][mask[i] > 0].tolist() != head + real + tail:
            why.append("the prompt is not the original chat template around the rewrite")
        if not 1 <= len(real) <= rw.shape[1]:
            why.append(f"the rewrite has {len(real)} tokens")
        bad = sorted({t for t in real if t < 0 or t >= cfg.num_tokens or t in special})
        if bad:
            why.append(f"special or out-of-tokenizer ids in the rewrite: {bad}")
        if int(q[i].sum()) > cap[i]:
            why.append(f"{int(q[i].sum())} queries exceed the cap {int(cap[i])}")
        if not np.array_equal(q[i], np.where(mk[i], calls[i], 0)):
            why.append(f"queries {q[i].tolist()} != {int(calls[i])} rewrites for each uncovered member")
        if not np.all(np.isfinite(conf[i])) or np.any((conf[i] < 0) | (conf[i] > 1)):
            why.append("confidence not finite or outside [0, 1]")
        original = req[i][reqm[i] > 0].tolist()
        if tokenizer is not None and not why and real != original and not retokenizes(tokenizer, real):
            why.append("the rewrite's ids do not re-tokenize to themselves")
        if why:
            problems.append(f"row {i}: " + "; ".join(why))
    if problems:
        raise ValueError(f"{name}: output violates the threat model: " + " | ".join(problems))


class AutoDANTokenFn(Entry):
    """The entries of the token-level AutoDAN (the token path of
    :func:`~sarjax.attacks.text.autodan.make_autodan`).

    - ``fn(params, requests, ref, *, key, mask=None, max_queries=None, sample_ids=None) ->
      AutoDANTokenResult``: the audited entry: validate on the host, run the compiled state
      machine (:func:`~sarjax.attacks.core.protocol.run_jit`), audit (:func:`audit_rewrite`),
      then re-tokenize every returned prompt as TEXT (``head text + decode(rewrite) + tail
      text``) and judge every member again where the ids changed
      (:attr:`AutoDANTokenResult.sent`, :attr:`AutoDANTokenResult.retokenized`). ``params``
      None: the pool's (:attr:`params`); ``requests`` a
      :class:`~sarjax.attacks.text.requests.TextRequests` (or ``B`` request strings), tokenized
      into a :class:`RewriteBatch` by :meth:`batch` (a ready :class:`RewriteBatch` is accepted
      too). Its ``system`` must be None or the factory's (the template's ids are built once),
      ``chat_template`` True when the tokenizer has a template, ``behaviors`` None (the judge
      reads the responses' tokens only). ``ref`` None (AutoDAN has no target string).
    - ``fn.jit(...)``, same arguments but ``requests`` a :class:`RewriteBatch` (token ids
      ``[B, W]``, from :meth:`batch`): the same state machine with the problem built by ``jnp``
      operations only (no host call, no validation, no audit, no re-tokenization); put it inside
      a ``jax.jit``.
    - ``fn.attack``: the state machine (``init`` / ``step`` / ``result``); ``fn.texts(result)``
      decodes the rewrites.

    Attributes:
      params: the :class:`AutoDANParams` of the pool and attacker the factory was given.
      tokenizer: the shared tokenizer.
      system: the factory's system message (baked into the template's ids; None: the template's own).
      cfg: the :class:`AutoDANConfig`.
    """

    apply = None

    def __init__(self, attack, *, name: str, params: AutoDANParams, tokenizer, system: str | None = None):
        self._attack = attack
        self.name = name
        self.__name__ = name
        self.params = params
        self.tokenizer = tokenizer
        self.system = system
        self.cfg: AutoDANConfig = attack.cfg

    @property
    def attack(self):
        """The state machine."""
        return self._attack

    @property
    def num_members(self) -> int:
        return self.cfg.num_members

    def batch(self, requests: Sequence[str]) -> RewriteBatch:
        """The :class:`RewriteBatch` of request strings (host side; no special tokens added).

        Raises:
          TypeError: not a non-empty list of strings. ValueError: a request that encodes to no
            token or to more than ``W`` tokens.
        """
        if isinstance(requests, str) or not requests or not all(isinstance(r, str) for r in requests):
            raise TypeError(f"{self.name}: requests must be a non-empty sequence of strings")
        w = self.cfg.slot
        ids = np.zeros((len(requests), w), np.int32)
        mask = np.zeros((len(requests), w), np.int32)
        for i, r in enumerate(requests):
            e = encode_text(self.tokenizer, r)
            if not 1 <= len(e) <= w:
                raise ValueError(f"{self.name}: request {i} encodes to {len(e)} tokens; expected 1 to W={w}")
            ids[i, w - len(e) :] = e
            mask[i, w - len(e) :] = 1
        return RewriteBatch(ids, mask)

    def _check_ref(self, ref) -> None:
        if ref is not None:
            raise TypeError(
                f"{self.name}: ref must be None: ref holds the targets of the text attacks and AutoDAN has no "
                f"target string (the token judge reads the responses' tokens; a text judge's behaviors go in "
                f"TextRequests(behaviors=...)), got {type(ref).__name__}"
            )

    def _requests_batch(self, requests) -> RewriteBatch:
        """The :class:`RewriteBatch` of a call's :class:`~sarjax.attacks.text.requests.TextRequests`
        (or request strings), after checking what the compiled config fixed (host side).

        Raises:
          ValueError: a system message other than the factory's, ``chat_template=False`` with a
            templated tokenizer, behaviors (the token judge reads no behavior).
        """
        req = text_requests(self.name, requests)
        if req.system is not None and req.system != self.system:
            raise ValueError(
                f"{self.name}: the call's system message {req.system!r} differs from the factory's {self.system!r}; "
                "the token path builds its template ids once: pass it as make_autodan(..., "
                "options=AutoDANOptions(system=...))"
            )
        if not req.chat_template and getattr(self.tokenizer, "chat_template", None) is not None:
            raise ValueError(
                f"{self.name}: chat_template=False, but the token path renders the tokenizer's chat template "
                "(built once); use AutoDANOptions(path='text') for requests without a template"
            )
        if req.behaviors is not None:
            raise ValueError(
                f"{self.name}: the token path's judge reads the responses' tokens only, not behaviors; pass "
                "behaviors=None, or a text judge (the host loop reads TextRequests.behaviors)"
            )
        return self.batch(list(req.prompts))

    def _host_problem(self, params, batch, ref, mask, key, *, max_queries=None, sample_ids=None) -> RewriteProblem:
        """The validated :class:`RewriteProblem` of a call (host side).

        Raises:
          TypeError: no key, a batch of another type, non-integer ids, a ``ref``.
          ValueError: shapes, ids outside ``[0, V)``, an empty request row, a member mask that is
            not bool or 0/1 or of another shape, caps or sample ids (each naming what was expected
            and what came).
        """
        del params
        if key is None:
            raise TypeError(f"{self.name}: key is required (a jax.random key); sarjax never defaults it")
        self._check_ref(ref)
        if not isinstance(batch, RewriteBatch):
            if not isinstance(batch, (TextRequests, list, tuple)):
                raise TypeError(
                    f"{self.name}: expected TextRequests, request strings or a RewriteBatch, got {type(batch).__name__}"
                )
            batch = self._requests_batch(batch)
        req, rm = np.asarray(batch.request), np.asarray(batch.request_mask)
        w, v, m = self.cfg.slot, self.cfg.vocab_size, self.cfg.num_members
        if req.ndim != 2 or req.shape[1] != w or rm.shape != req.shape:
            raise ValueError(
                f"{self.name}: batch.request and request_mask must be [B, W={w}], got {req.shape}, {rm.shape}"
            )
        if not np.issubdtype(req.dtype, np.integer):
            raise TypeError(f"{self.name}: batch.request must hold integers, got {req.dtype}")
        b = req.shape[0]
        bad = np.argwhere((rm != 0) & ((req < 0) | (req >= v)))
        if bad.size:
            raise ValueError(f"{self.name}: request ids outside [0, {v}) at (row, pos) {bad[:5].tolist()}")
        if np.any((rm != 0) & (rm != 1)):
            raise ValueError(f"{self.name}: request_mask must be 0/1")
        empty = np.flatnonzero(rm.sum(axis=1) == 0)
        if empty.size:
            raise ValueError(f"{self.name}: request rows {empty.tolist()} hold no token")
        mk = check_member_mask(self.name, mask, b, m)
        sid = check_sample_ids(sample_ids, b)
        cap = Q.normalize_cap(max_queries, b)
        rb = RewriteBatch(jnp.asarray(np.where(rm > 0, req, 0), jnp.int32), jnp.asarray(rm, jnp.int32))
        return RewriteProblem(rb, jnp.asarray(mk), cap, key, sid)

    def _traced_problem(self, params, batch, ref, mask, key, *, max_queries=None, sample_ids=None) -> RewriteProblem:
        """The :class:`RewriteProblem` with ``jnp`` operations only (jit-safe; no validation)."""
        del params
        self._check_ref(ref)
        req = jnp.asarray(batch.request).astype(jnp.int32)
        rm = jnp.asarray(batch.request_mask).astype(jnp.int32)
        b, m = req.shape[0], self.cfg.num_members
        mk = (
            jnp.ones((b, m), jnp.float32)
            if mask is None
            else jnp.broadcast_to((jnp.asarray(mask) > 0).astype(jnp.float32), (b, m))
        )
        sid = jnp.arange(b, dtype=jnp.int32) if sample_ids is None else jnp.asarray(sample_ids).astype(jnp.int32)
        return RewriteProblem(RewriteBatch(req * rm, rm), mk, Q.cap_array(max_queries, b), key, sid)

    def _audit_result(self, params, problem, result) -> None:
        audit_rewrite(self.name, self.cfg, problem, result, self.tokenizer)

    def problem(self, params, batch, ref, *, key, mask=None, **call) -> RewriteProblem:
        """The validated :class:`RewriteProblem` of a call (host side; see :meth:`_host_problem`)."""
        return super().problem(self.params if params is None else params, batch, ref, key=key, mask=mask, **call)

    def __call__(self, params, batch, ref, *, key, mask=None, **call) -> AutoDANTokenResult:
        """Validate -> the compiled state machine -> audit (:meth:`Entry.__call__`), then the
        re-tokenization of the returned prompts (see the class docstring)."""
        params = self.params if params is None else params
        result = super().__call__(params, batch, ref, key=key, mask=mask, **call)
        return self._resend(params, result)

    def jit(self, params, batch, ref, *, key, mask=None, **call) -> AutoDANTokenResult:
        """The jit-safe entry (no host call, no validation, no audit, no re-tokenization)."""
        return super().jit(self.params if params is None else params, batch, ref, key=key, mask=mask, **call)

    def _resend(self, params, result: AutoDANTokenResult) -> AutoDANTokenResult:
        """The result with every prompt re-tokenized as text and, where the ids changed, every
        member judged again on the new ids (host side)."""
        c, tok = self.cfg, self.tokenizer
        rw, rwm = host(result.x_adv), host(result.rewrite_mask)
        ids, mask = host(result.ids), host(result.mask)
        rows, changed = [], []
        for i in range(rw.shape[0]):
            text = tok.decode(rw[i][rwm[i] > 0].tolist(), skip_special_tokens=False, clean_up_tokenization_spaces=False)
            sent = encode_text(tok, c.target_head_text + text + c.target_tail_text)
            rows.append(sent)
            changed.append(sent != ids[i][mask[i] > 0].tolist())
        t, n = ids.shape[1], max(map(len, rows))
        si, sm = left_pad(rows, c.prompt_pad, t if n <= t else -(-n // 8) * 8)
        retok = np.asarray(changed, bool)
        broken, conf = host(result.success), host(result.confidence)
        if retok.any():
            b2, c2 = _judge_sent(c, params.targets, jnp.asarray(si), jnp.asarray(sm))
            broken = np.where(retok[:, None], host(b2), broken)
            conf = np.where(retok[:, None], host(c2), conf)
        return result._replace(
            success=jnp.asarray(broken), confidence=jnp.asarray(conf), member_loss=jnp.asarray(-conf),
            sent=jnp.asarray(si), sent_mask=jnp.asarray(sm),
            retokenized=jnp.asarray(np.broadcast_to(retok[:, None], broken.shape)),
        )  # fmt: skip

    def texts(self, result: AutoDANTokenResult) -> list[str]:
        """The rewrites as text (decoded without special tokens, host side)."""
        rw, rm = np.asarray(result.x_adv), np.asarray(result.rewrite_mask)
        return [self.tokenizer.decode(r[m > 0].tolist(), skip_special_tokens=True) for r, m in zip(rw, rm)]

    def __repr__(self) -> str:
        c = self.cfg
        return (
            f"AutoDANTokenFn(proposals={c.proposals}, anchors={c.anchors}, steps={self._attack.num_steps}, W={c.slot})"
        )


def build_token_autodan(
    pool,
    judge,
    attacker,
    proposals: int,
    anchors: int,
    num_steps: int,
    max_new_tokens: int,
    response_tokens: int,
    options: AutoDANOptions,
) -> "AutoDANTokenFn":
    """The token path of :func:`~sarjax.attacks.text.autodan.make_autodan` (its arguments, checked
    there; ``options.path`` is not read here): AutoDAN-style rewriting as a jit-safe state machine
    on token ids (one shared tokenizer).

    The search, the sample-id streams, the ranking and the query accounting are those of the
    host loop (:class:`~sarjax.attacks.text.autodan.AutoDANAttack`); what changes is that the
    rewrite never becomes text: the attacker's sampled ids (special tokens and everything from its
    first end token removed) are put between the targets' chat-template ids, every member decodes
    greedily, and a judge on token ids reads the responses. On a tokenizer whose text round trip is
    exact (decode then encode gives the same ids, e.g. word-level vocabularies) the two agree; with
    BPE the host loop re-tokenizes the decoded rewrite and may see other ids (the audited entry
    raises when a returned rewrite does not re-tokenize to itself).

    Args:
      pool: the target :class:`~sarjax.models.llm.pool.LLMPool`; every stack shares one
        tokenizer (and so one chat template).
      judge: ``judge(tokens [R], length) -> (broken, confidence)``, hashable and pure (see
        :class:`AutoDANConfig`); None: :func:`~sarjax.judges.refusal.token_refusal_judge` of
        GCG's phrases on the pool's tokenizer.
      attacker: the attacker pool (its first member rewrites; None: ``pool``); same tokenizer.
      proposals, anchors, num_steps, max_new_tokens, response_tokens: see ``make_autodan``.
      options: :class:`~sarjax.attacks.text.autodan_options.AutoDANOptions` (``temperature``,
        ``top_p``, ``rewrite_prompt``, ``requests`` / ``system`` sizing the slots, ``slot``).

    Returns:
      :class:`AutoDANTokenFn`.

    Raises:
      ValueError: non-positive sizes, stacks or an attacker with another tokenizer, ``slot``
        smaller than ``max_new_tokens`` or the longest request, prompts longer than a model's
        positions.
    """
    name = "make_autodan"
    temperature, top_p = options.temperature, options.top_p
    check_search(name, proposals, anchors, num_steps, max_new_tokens, temperature, top_p)
    if int(response_tokens) < 1:
        raise ValueError(f"{name}: response_tokens must be >= 1, got {response_tokens}")
    att = pool if attacker is None else attacker
    stacks = tuple(pool.stacks)
    tok = stacks[0].tokenizer
    fps = {tokenizer_fingerprint(s.tokenizer) for s in stacks + (att.stacks[0],)}
    if tok is None or len(fps) != 1:
        raise ValueError(
            f"{name}: the token path needs one tokenizer shared by every stack and the attacker, got "
            f"{len(fps)} distinct ones; use AutoDANOptions(path='text') for pools with several tokenizers"
        )
    requests, system = options.sizing()
    pre, post = options.rewrite_prompt.split("{request}")
    longest = max((len(encode_text(tok, r)) for r in requests), default=1)
    w = max(longest, int(max_new_tokens)) if options.slot is None else int(options.slot)
    if w < int(max_new_tokens) or w < longest:
        raise ValueError(
            f"{name}: slot={w} must hold max_new_tokens={max_new_tokens} and the longest request ({longest})"
        )
    unesc = lambda s: s.replace("{{", "{").replace("}}", "}")  # noqa: E731 (format-string escapes)
    a_head, a_tail = _template_ids(tok, unesc(pre), unesc(post), None)
    t_head_text, t_tail_text = _template_texts(tok, "", "", system)
    t_head, t_tail = tuple(encode_text(tok, t_head_text)), tuple(encode_text(tok, t_tail_text))
    a_stack = att.stacks[0]
    for label, cfg_, need in [("the attacker", a_stack.cfg, len(a_head) + w + len(a_tail) + int(max_new_tokens))] + [
        (f"stack {s.names}", s.cfg, len(t_head) + w + len(t_tail) + int(response_tokens)) for s in stacks
    ]:
        if need > cfg_.max_position_embeddings:
            raise ValueError(f"{name}: {label} needs {need} positions, has {cfg_.max_position_embeddings}")
    a_eos, a_pad = stack_decoding(a_stack)
    t_dec = [stack_decoding(s) for s in stacks]
    judge = token_refusal_judge(tok) if judge is None else judge
    cfg = AutoDANConfig(
        attacker_cfg=a_stack.cfg,
        target_cfgs=tuple(s.cfg for s in stacks),
        judge=judge,
        num_members=sum(s.size for s in stacks),
        proposals=int(proposals),
        anchors=int(anchors),
        rewrite_len=int(max_new_tokens),
        response_len=int(response_tokens),
        slot=w,
        temperature=float(temperature),
        top_p=float(top_p),
        attacker_head=a_head,
        attacker_tail=a_tail,
        target_head=t_head,
        target_tail=t_tail,
        target_head_text=t_head_text,
        target_tail_text=t_tail_text,
        specials=tuple(sorted({int(i) for i in getattr(tok, "all_special_ids", [])})),
        num_tokens=len(tok),
        vocab_size=max([a_stack.cfg.vocab_size] + [s.cfg.vocab_size for s in stacks]),
        attacker_eos=tuple(a_eos or ()),
        attacker_pad=int(a_pad),
        target_eos=tuple(tuple(e or ()) for e, _ in t_dec),
        target_pad=tuple(int(p) for _, p in t_dec),
        prompt_pad=int(tok.pad_token_id if tok.pad_token_id is not None else 0),
    )
    params = AutoDANParams(jax.tree.map(lambda a: a[0], a_stack.params), tuple(s.params for s in stacks))
    attack = Attack(_init, _step, _result, int(num_steps), cfg)
    return AutoDANTokenFn(attack, name="autodan", params=params, tokenizer=tok, system=system)


__all__ = [
    "AutoDANConfig",
    "AutoDANParams",
    "AutoDANState",
    "AutoDANTokenFn",
    "AutoDANTokenResult",
    "RewriteBatch",
    "RewriteProblem",
    "audit_rewrite",
    "build_token_autodan",
]
