"""Joint BEAST across tokenizers (Sadasivan et al. 2024; the joint form of the SAR paper) for pools
whose members use different tokenizers.

:func:`~sarjax.attacks.text.beast.make_beast` is the compiled joint BEAST of a pool that shares
one vocabulary. Here the members read different vocabularies, so the suffix is exchanged as TEXT
(as the SAR paper does for joint GCG) and the tokenizers run on the host:

- **The proposer.** The beam lives in the id space of ONE tokenizer: the first stack's (every
  stack with that tokenizer forms the proposer group). The choice is the pool's order, so a user
  picks the proposer by listing its member first. Candidate tokens are drawn per beam from the
  MIXTURE of the proposer group's next-token distributions after ``before | beam`` (the
  arithmetic mean of the probabilities after temperature, as the shared-vocabulary BEAST does
  for the covered members), over the group's covered members of the request; when the request
  covers no member of the group, over all of the group's members (their distributions still
  propose readable tokens; the scoring below decides). A distribution over another vocabulary
  cannot be mixed in: its ids mean other strings.
- **The exchange.** Each candidate (a beam plus one token) is decoded to text with the proposer's
  tokenizer and kept only when the proposer's tokenizer re-encodes that text to the candidate ids
  (GCG's re-tokenization filter, in the proposer's space) and
  :func:`~sarjax.attacks.text.retokenize.suffix_text_violations` passes for every stack (its ids
  decode back to the text, lie in the stack's allowed vocabulary, fit its slots).
- **The objective.** Every kept candidate is scored by every covered member in ITS OWN tokens, on
  the ids of the whole prompt text that is sent (``encode_s(before text + text + after text) |
  target_s``, tokenized at once: what a user sending the suffix gets), and the joint loss is the mean of the
  covered members' losses (by default the mean per-token target NLL). The ``k1`` kept candidates
  of least joint loss become the beams; the best candidate ever scored is kept.

A single beam (the start, or the only candidate that survived the filter) is expanded into
``k1 x k2`` distinct tokens, as the first step of the shared-vocabulary BEAST; ``k`` beams into
``k2`` tokens each.

Queries per step and request: ``beams x |P_b|`` next-token forwards (``P_b``: the members whose
distributions are mixed) plus ``kept x |C_b|`` scoring forwards; a
seed costs ``|C_b|``. A request stops when its next step could pass its cap
(``beams x |P_b| + k1 x k2 x |C_b|``). Compute runs every member of a stack; only the members whose
outputs are used are counted. Same key, same result: request ``b`` draws from
``fold_in(fold_in(key, sample_ids[b]), step)``.
"""

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.attacks.core.entry import HostDrivenEntry
from sarjax.attacks.text import entry as TE
from sarjax.attacks.text import requests as TR
from sarjax.attacks.text import retokenize as TK
from sarjax.attacks.text.pool import (
    allowed_for,
    bind_params,
    pool_call,
    pool_requests,
    score_sent,
    sent_prompts,
)
from sarjax.models.llm import decoder
from sarjax.models.llm.pool import tokenizer_fingerprint
from sarjax.models.llm.prompts import encode_text


@functools.partial(jax.jit, static_argnames=("cfg",))
def _mixture(params, before, before_mask, beams, beam_mask, weights, temperature, *, cfg):
    """``sum_m weights[b, m] softmax(logits_m / temperature)`` of the token after ``before | beam``.

    Args:
      params: one stack's stacked parameters ``[M_s, ...]``.
      before, before_mask: ``[B, Pb]`` left-padded request heads.
      beams, beam_mask: ``[B, K, Ls]`` right-aligned beams (holes where the mask is 0).
      weights: ``[B, M_s]`` mixture weights of this stack's members.
      temperature: scalar.

    Returns:
      ``[B, K, V_s]`` float32.
    """
    pb, ls = before.shape[1], beams.shape[2]

    def one(bf, bfm, bms, bmm, w):
        def beam(ids_s, m_s):
            ids = jnp.concatenate([bf, ids_s]).astype(jnp.int32)
            mask = jnp.concatenate([bfm, m_s]).astype(jnp.int32)
            at = jnp.where(jnp.sum(m_s) > 0, pb + ls - 1, pb - 1)  # the last real token of the user turn
            lg = jax.vmap(lambda p: decoder.logits(p, cfg, ids, mask))(params)  # [M_s, T, V]
            lg = jax.lax.dynamic_index_in_dim(lg, at, axis=1, keepdims=False)
            return jnp.einsum("m,mv->v", w, jax.nn.softmax(lg.astype(jnp.float32) / temperature, axis=-1))

        return jax.vmap(beam)(bms, bmm)

    return jax.vmap(one)(before, before_mask, beams, beam_mask, weights)


class CrossBEASTResult(NamedTuple):
    """The best-so-far suffix of a :class:`CrossBEAST` call (member axis ``[B, M]``, members in
    ``pool.names`` order).

    Attributes:
      x_adv: ``B`` suffix texts (``""``: nothing scored, the clean request).
      success: ``[B, M]`` bool, member ``m`` broken on request ``b`` by the attack's criterion
        (``criterion`` of the factory: ``"target"``, its greedy response under teacher forcing
        starts with the target), judged on the ids that are SENT (:attr:`sent`).
      queries: ``[B, M]`` int64 queries spent on member ``m`` (its next-token forwards when its
        distribution is mixed, its forwards on the seed and every kept candidate).
      suffix_ids: ``B`` id lists of the suffix in the proposer's tokenizer.
      loss: ``[B]`` float64 joint loss of the best suffix (``inf``: nothing scored).
      member_loss: ``[B, M]`` every member's loss on it (bookkeeping re-score on :attr:`sent`, the
        ids the search scored; not counted).
      ids: one ``[B, T_s]`` int32 array per stack, the suffix's blocks ``before | suffix | after``
        (tokenized apart; the proposals' context); mask: idem.
      sent: one ``[B, S_s]`` int32 array per stack (left-padded), the ids of the whole prompt
        text tokenized by the stack's tokenizer; sent_mask: idem.
      retokenized: ``[B, M]`` bool, member ``m``'s :attr:`sent` ids differ from its :attr:`ids`.
    """

    x_adv: list
    success: Any
    queries: Any
    suffix_ids: list
    loss: Any
    member_loss: Any
    ids: tuple
    mask: tuple
    sent: tuple
    sent_mask: tuple
    retokenized: Any


class CrossBEASTConfig(NamedTuple):
    """The settings of a :class:`CrossBEAST` (built and checked by
    :func:`~sarjax.attacks.text.beast.make_beast` from its arguments and
    :class:`~sarjax.attacks.text.beast.BEASTOptions`).

    Attributes:
      suffix_len: ``Ls``, tokens appended at most (the proposer's tokens).
      beam_width: ``k1``.
      candidates: ``k2`` tokens drawn per beam.
      temperature: sampling temperature.
      sampler: ``"multinomial"`` or ``"greedy"``.
      loss: per-member loss, minimised.
      criterion: ``"target"`` or ``"refusal"``.
      target: the default ``ref`` (the target or refusal string).
      slots: the suffix token slots of every stack.
      ascii_only: the default allowed vocabulary keeps printable-ASCII tokens only.
    """

    suffix_len: int
    beam_width: int
    candidates: int
    temperature: float
    sampler: str
    loss: Any
    criterion: str
    target: str
    slots: int
    ascii_only: bool


class CrossBEAST(HostDrivenEntry):
    """Joint BEAST on an :class:`~sarjax.models.llm.pool.LLMPool` whose members may use different
    tokenizers (see the module docstring). Build with :func:`~sarjax.attacks.text.beast.make_beast` on an ``LLMPool``; call
    ``fn(params, inputs, ref, *, key, mask=None, max_queries=None, sample_ids=None,
    suffix_init=None, allowed=None) -> CrossBEASTResult``
    (``inputs``: :class:`~sarjax.attacks.text.requests.TextRequests` or request strings; ``ref``: the
    targets, the target response, one string or one per request; None: the factory's default target).
    Host-driven: there is no ``fn.jit`` (it raises ``TypeError``).
    """

    host_reason = "the tokenizers run on the host between steps"

    def __init__(self, pool, config: CrossBEASTConfig):
        """Builds the attack (use the factory, which checks ``config`` first).

        Args:
          pool: the :class:`~sarjax.models.llm.pool.LLMPool`.
          config: its :class:`CrossBEASTConfig` (checked by :func:`~sarjax.attacks.text.beast.make_beast`, which builds both)."""
        if not isinstance(config, CrossBEASTConfig):
            raise TypeError(f"CrossBEAST: config must be a CrossBEASTConfig, got {type(config).__name__}")
        self.pool = pool
        self.name = "cross_beast"
        self.__name__ = self.name
        self.config = config
        self.suffix_len = config.suffix_len
        self.beam_width = config.beam_width
        self.candidates = config.candidates
        self.temperature = config.temperature
        self.sampler = config.sampler
        self.loss = config.loss
        self.target = config.target
        self.slots = config.slots
        self.ascii_only = config.ascii_only
        self.criterion = config.criterion

    def __repr__(self) -> str:
        return f"CrossBEAST(Ls={self.suffix_len}, k1={self.beam_width}, k2={self.candidates}, {self.sampler})"

    def allowed(self) -> list[np.ndarray]:
        """The default allowed vocabulary of each stack of the pool
        (:func:`~sarjax.attacks.text.retokenize.allowed_vocab`)."""
        return [allowed_for(st.tokenizer, st.cfg.vocab_size, self.ascii_only) for st in self.pool.stacks]

    def seed_violations(self, text: str, allowed=None) -> list[str]:
        """Why ``text`` cannot start the beams (empty: it can): the proposer's ids must decode back to
        it, fit ``suffix_len`` and pass :func:`~sarjax.attacks.text.retokenize.suffix_text_violations`."""
        toks = [st.tokenizer for st in self.pool.stacks]
        als = self.allowed() if allowed is None else allowed
        ids, why = TK.suffix_text_violations(text, toks, als, [max(self.slots, self.suffix_len)] * len(toks))
        if not why and len(ids[0]) > self.suffix_len:
            why = [f"stack 0: {len(ids[0])} tokens exceed suffix_len={self.suffix_len}"]
        return why

    def __call__(
        self,
        params,
        inputs: TR.TextRequests | Sequence[str],
        ref: str | Sequence[str] | None,
        *,
        key,
        mask=None,
        max_queries=None,
        sample_ids=None,
        suffix_init: Sequence[str] | None = None,
        allowed: Sequence[Any] | None = None,
        **call,
    ) -> CrossBEASTResult:
        """Runs the attack.

        Args:
          params: one stacked parameter tree per stack of the factory's pool
            (:func:`~sarjax.attacks.text.pool.pool_params`; e.g. its placed or updated weights).
          inputs: the ``B`` requests, a :class:`~sarjax.attacks.text.requests.TextRequests` (prompts,
            system message, chat template or none: ``chat_template=False`` renders ``prompt + " " +
            suffix`` for base models); a plain sequence of request strings is shorthand for
            ``TextRequests(prompts)`` (:func:`~sarjax.attacks.text.requests.text_requests`).
          ref: the targets: the target response this search scores (one string, or one per
            request); None: the factory's default target (``BEASTOptions.target``).
          key: PRNG key (keyword-only, required).
          mask: ``[M]`` or ``[B, M]`` bool or 0/1, the members the objective covers (default all).
          max_queries: None, a scalar or ``[B]`` per-request cap summed over members (the SAR paper:
            15,000 per call).
          sample_ids: ``[B]`` non-negative ints (default ``arange(B)``).
          suffix_init: ``B`` seed texts (``""``: no seed), e.g. from a seed generator; each must
            pass :meth:`seed_violations`.
          allowed: optional ``[V_s]`` bool per stack (default :meth:`allowed`).
          **call: none (an unknown keyword raises ``TypeError``; the base's ``**call`` is kept so
            that the signature stays compatible with :meth:`~sarjax.attacks.core.entry.Entry.__call__`).

        Returns:
          :class:`CrossBEASTResult`.

        Raises:
          TypeError: no key; ``params`` not one tree per stack.
          ValueError: bad shapes or values (``params`` unlike the pool's included); a seed that violates the threat model (naming the row
            and why); an audit failure of the output.
        """
        if key is None:
            raise TypeError(f"{self.name}: key is required (a jax.random key); sarjax never defaults it")
        self._reject_keywords(call)
        pool = bind_params(self.name, self.pool, params)
        c = pool_call(self.name, pool, inputs, ref, self.target, key, mask, sample_ids, max_queries)
        stacks, requests, mk, targets, sid, cap = c
        bsz, m_total = len(requests.prompts), sum(st.size for st in stacks)
        cov = mk > 0
        ncov = cov.sum(1)
        seeds = [""] * bsz if suffix_init is None else list(suffix_init)
        if len(seeds) != bsz:
            raise ValueError(f"{self.name}: suffix_init needs one entry per request ({bsz}), got {len(seeds)}")
        toks = [st.tokenizer for st in stacks]
        als = self.allowed() if allowed is None else [np.asarray(a, bool) for a in allowed]
        if len(als) != len(stacks) or any(a.shape != (st.cfg.vocab_size,) for a, st in zip(als, stacks)):
            raise ValueError(f"{self.name}: allowed must be one [V_s] bool array per stack")
        ls, k1, k2 = self.suffix_len, self.beam_width, self.candidates
        slots = [max(self.slots, ls)] * len(stacks)
        # the proposer group: every stack with the first stack's tokenizer
        fp0 = tokenizer_fingerprint(toks[0])
        group = [s for s, t in enumerate(toks) if tokenizer_fingerprint(t) == fp0]
        tok0, v0, al0 = toks[0], stacks[0].cfg.vocab_size, als[0]
        offsets = np.cumsum([0] + [st.size for st in stacks])
        in_group = np.zeros(m_total, bool)
        for s in group:
            in_group[offsets[s] : offsets[s + 1]] = True
        prop = np.where((cov & in_group).any(1, keepdims=True), cov & in_group, in_group[None])  # [B, M]
        nprop = prop.sum(1)
        w = prop / nprop[:, None]
        # joint GCG's rendering of each stack's requests (chat template split at the suffix, padded
        # to multiples of 8)
        reqs = [pool_requests(self.name, st, requests, targets) for st in stacks]
        batches = [r.batch for r in reqs]
        jb = [TR.TextBatch(*(jnp.asarray(a) for a in b)) for b in batches]
        kw_dec = dict(skip_special_tokens=False, clean_up_tokenization_spaces=False)

        bad = [
            f"row {i}: " + "; ".join(why) for i, x in enumerate(seeds) if x and (why := self.seed_violations(x, als))
        ]
        if bad:
            raise ValueError(f"{self.name}: a seed violates the threat model: " + " | ".join(bad))

        def score(texts: list[list[str | None]], n: int) -> np.ndarray:
            """texts[b][j] (None or "": no suffix) -> member losses [B, M, n] (every member, float64),
            each member on the ids of the whole prompt text that is sent in its own tokenizer."""
            out = [score_sent(st, reqs[s], texts, n, self.loss, slots[s]) for s, st in enumerate(stacks)]
            return np.concatenate(out, axis=1)

        def joint(ml: np.ndarray) -> np.ndarray:  # [B, M, n] -> [B, n]
            return np.einsum("bm,bmn->bn", mk, ml) / np.maximum(mk.sum(1), 1.0)[:, None]

        # start: one beam per request, the seed (proposer ids) or empty
        beams = [[encode_text(tok0, x) if x else []] for x in seeds]
        best_text, best_loss = [""] * bsz, np.full(bsz, np.inf)
        queries = np.zeros((bsz, m_total), np.int64)  # [B, M]
        seeded = np.array([bool(x) for x in seeds]) & (ncov > 0) & (ncov <= cap)
        if seeded.any():
            jl = joint(score([[x] for x in seeds], 1))[:, 0]
            best_loss = np.where(seeded, jl, np.inf)
            best_text = [x if seeded[b] else "" for b, x in enumerate(seeds)]
            queries += np.where(seeded[:, None] & cov, 1, 0)
        base_keys = jax.vmap(lambda s: jax.random.fold_in(key, s))(jnp.asarray(sid, jnp.uint32))
        for t in range(ls):
            length = np.array([len(bm[0]) for bm in beams])
            nb = np.array([len(bm) for bm in beams])
            active = (ncov > 0) & (length < ls) & (queries.sum(1) + nb * nprop + k1 * k2 * ncov <= cap)
            if not active.any():
                break
            bi = np.zeros((bsz, k1, ls), np.int32)
            bmk = np.zeros((bsz, k1, ls), np.int32)
            for b in range(bsz):
                for j, q in enumerate(beams[b]):
                    if q:
                        bi[b, j, ls - len(q) :] = q
                        bmk[b, j, ls - len(q) :] = 1
            mix = np.zeros((bsz, k1, v0), np.float64)
            for s in group:
                ws = jnp.asarray(w[:, offsets[s] : offsets[s + 1]], jnp.float32)
                p = np.asarray(
                    _mixture(
                        stacks[s].params,
                        jb[s].before,
                        jb[s].before_mask,
                        jnp.asarray(bi),
                        jnp.asarray(bmk),
                        ws,
                        jnp.float32(self.temperature),
                        cfg=stacks[s].cfg,
                    )  # fmt: skip
                )
                n = min(v0, p.shape[-1])
                mix[..., :n] += p[..., :n]
            with np.errstate(divide="ignore"):
                logp = np.log(mix)
            logp[:, :, ~al0] = -np.inf
            logp[np.arange(k1)[None, :] >= nb[:, None]] = -np.inf  # no beam there
            if self.sampler == "multinomial":
                noise = jax.vmap(lambda k, t=t: jax.random.gumbel(jax.random.fold_in(k, t), (k1, v0)))(base_keys)
                noisy = logp + np.asarray(noise, np.float64)
            else:
                noisy = logp
            cand_texts: list[list[str | None]] = [[None] * (k1 * k2) for _ in range(bsz)]
            cand_ids: list[list[list[int] | None]] = [[None] * (k1 * k2) for _ in range(bsz)]
            memo: dict = {}
            for b in np.flatnonzero(active):
                if nb[b] == 1:  # the single start beam: all k1 x k2 first tokens from it (as make_beast)
                    pairs = [(0, int(i)) for i in np.argsort(-noisy[b, 0], kind="stable")[: k1 * k2]]
                else:
                    top = np.argsort(-noisy[b], axis=1, kind="stable")[:, :k2]
                    pairs = [(j, int(top[j, c])) for j in range(k1) for c in range(k2)]
                for c, (j, tok_id) in enumerate(pairs):
                    if not np.isfinite(logp[b, j, tok_id]):
                        continue
                    ids = beams[b][j] + [tok_id]
                    text = tok0.decode(ids, **kw_dec)
                    if text not in memo:
                        ok = encode_text(tok0, text) == ids  # the re-tokenization filter, proposer space
                        memo[text] = ok and not TK.suffix_text_violations(text, toks, als, slots)[1]
                    if memo[text]:
                        cand_texts[b][c], cand_ids[b][c] = text, ids
            valid = np.array([[x is not None for x in row] for row in cand_texts])
            jl = np.where(valid, joint(score(cand_texts, k1 * k2)), np.inf)
            queries += np.where(active[:, None], nb[:, None] * prop + valid.sum(1)[:, None] * cov, 0)
            for b in np.flatnonzero(active & valid.any(1)):
                order = [int(j) for j in np.argsort(jl[b], kind="stable")[:k1] if valid[b, j]]
                beams[b] = [q for j in order if (q := cand_ids[b][j]) is not None]
                if jl[b, order[0]] < best_loss[b]:
                    best_loss[b], best_text[b] = jl[b, order[0]], cand_texts[b][order[0]] or ""

        member_loss = score([[x or None] for x in best_text], 1)[:, :, 0]  # bookkeeping, not counted
        ids_out, mask_out = [], []
        for s, st in enumerate(stacks):
            sf = np.zeros((bsz, slots[s]), np.int32)
            sm = np.zeros((bsz, slots[s]), np.int32)
            for b, x in enumerate(best_text):
                q = encode_text(toks[s], x) if x else []
                if q:
                    sf[b, slots[s] - len(q) :], sm[b, slots[s] - len(q) :] = q, 1
            bt = batches[s]
            ids_out.append(np.concatenate([bt.before, sf, bt.after], axis=1))
            mask_out.append(np.concatenate([bt.before_mask, sm, bt.after_mask], axis=1))
            ms = slice(offsets[s], offsets[s + 1])
            problem = TR.TextProblem(bt, cov[:, ms], als[s], cap, key, sid, sf, sm.sum(1))
            q_s = np.where(cov[:, ms], queries[:, ms], 0)  # the audit's check: covered members' forwards
            res = TE.TextAttackResult(
                ids_out[-1], None, q_s, mask_out[-1], sf, sm, best_loss, member_loss, None, None, None
            )
            TE.audit_text(f"{self.name} (stack {s})", problem, res, st.tokenizer)
        why = [
            f"row {i}: " + "; ".join(r) for i, x in enumerate(best_text) if x and (r := self.seed_violations(x, als))
        ]
        if why:
            raise ValueError(f"{self.name}: output violates the threat model: " + " | ".join(why))
        suffix_ids = [encode_text(tok0, x) if x else [] for x in best_text]
        sent, sent_mask, success, retok = sent_prompts(
            self.name, stacks, reqs, best_text, ids_out, mask_out, lambda s: stacks[s].params, self.criterion
        )
        return CrossBEASTResult(
            best_text, success, queries, suffix_ids, best_loss, member_loss, tuple(ids_out), tuple(mask_out), sent,
            sent_mask, retok,
        )  # fmt: skip


__all__ = ["CrossBEAST", "CrossBEASTConfig", "CrossBEASTResult"]
