"""Joint GCG across tokenizers (the SAR paper; Zou et al. 2023, "Universal and Transferable
Adversarial Attacks on Aligned Language Models"): GCG on an
:class:`~sarjax.models.llm.pool.LLMPool` whose members may have different tokenizers.

The proposer rotates within the pool, suffixes pass between members as TEXT, and every candidate
goes through the re-tokenization filter. Tokenizers run on the host, so a step is a host loop
around two compiled kernels (the proposer's gradient + candidate sampling, and the batched scoring
of one stack on the prompts as they are sent, :func:`~sarjax.attacks.text.pool.score_sent`) instead
of a ``lax.scan``.
:func:`~sarjax.attacks.text.gcg.make_gcg` is the fully compiled GCG of a pool that shares one
vocabulary.
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
    start_text,
)
from sarjax.models.llm import scoring
from sarjax.models.llm.prompts import encode_text


def _select_member(x, m, select: str = "sum"):
    """Member ``m`` (traced) of a stacked leaf ``x [M_s, ...]``.

    ``select="sum"``: a masked sum over the member axis. A dynamic slice along a pool-sharded axis
    is partitioned by XLA as an all-gather of the whole stack along ``pool`` (every device would
    hold every member's weights during the step); a masked sum is partitioned as a local sum plus
    an all-reduce of ONE member's shard. Exact: the other members contribute exact zeros
    (``where``, so a non-finite weight elsewhere cannot leak). It reads every member's weights, so
    on unsharded params ``select="slice"`` (a dynamic slice: one member read) is the cheaper
    equal; :func:`_member_select` chooses.
    """
    if select == "slice":
        return jax.lax.dynamic_index_in_dim(x, m, axis=0, keepdims=False)
    sel = (jnp.arange(x.shape[0]) == m).reshape((-1,) + (1,) * (x.ndim - 1))
    return jnp.sum(jnp.where(sel, x, jnp.zeros((), x.dtype)), axis=0, dtype=x.dtype)


def _member_select(params) -> str:
    """``"sum"`` when a leaf of the stacked ``params`` is split over several devices (a pool on a
    mesh: :func:`_select_member`'s masked sum avoids gathering the stack), else ``"slice"``."""
    for leaf in jax.tree.leaves(params):
        sharding = getattr(leaf, "sharding", None)
        if sharding is not None and len(sharding.device_set) > 1 and not sharding.is_fully_replicated:
            return "sum"
    return "slice"


@functools.partial(jax.jit, static_argnames=("cfg", "loss", "topk", "nc", "select"))
def _propose(params, m, batch: TR.TextBatch, suffix, smask, allowed, keys, *, cfg, loss, topk, nc, select="sum"):
    """Member ``m`` of a stack proposes ``nc`` single-token substitutions per request.

    Args:
      params: the stack's stacked parameters ``[M_s, ...]``; m: traced member index.
      batch: the stack's :class:`~sarjax.attacks.text.requests.TextBatch` ``[B, ...]``.
      suffix, smask: ``[B, Ls]`` current suffix ids and its right-aligned real slots.
      allowed: ``[V]`` bool; keys: ``[B]`` keys of this step.
      select: how member ``m`` is taken from ``params`` (:func:`_select_member`).

    Returns:
      ``(cands [B, nc, Ls] int32, ok [B, nc] bool)``: ``ok`` is False for a banned id (fewer
      allowed ids than ``topk``).
    """
    p = jax.tree.map(lambda x: _select_member(x, m, select), params)
    v = allowed.shape[0]
    k = min(topk, v)
    ls = suffix.shape[1]
    pb = batch.before.shape[1]

    def one(r, s, sm, key):
        ids, pm = TR.assemble(r, s, sm)
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


class JointGCGResult(NamedTuple):
    """The best-so-far suffix of a :class:`JointGCG` call (member axis ``[B, M]``, members in
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
      member_loss: ``[B, M]`` every member's loss on it, on :attr:`sent` (the ids the search
        scored: the whole prompt text in the member's tokenizer).
      ids: one ``[B, T_s]`` int32 array per stack, the suffix's blocks ``before | suffix | after``
        (the three blocks tokenized apart; the proposer's gradient reads them); mask: one
        ``[B, T_s]`` int32 array per stack.
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


class JointGCGConfig(NamedTuple):
    """The settings of a :class:`JointGCG` (built and checked by
    :func:`~sarjax.attacks.text.gcg.make_gcg` from its arguments and
    :class:`~sarjax.attacks.text.gcg.GCGOptions`).

    Attributes:
      num_steps: steps per call.
      suffix_len: the start suffix's length in words.
      topk: top-k substitutions per position.
      num_candidates: candidates per step.
      loss: per-member loss, minimised.
      criterion: ``"refusal"`` or ``"target"``.
      target: the default ``ref`` (the refusal or target string).
      init_text: the start suffix text (None: :func:`~sarjax.attacks.text.pool.start_text`).
      slots: the suffix token slots of every stack.
      ascii_only: the default allowed vocabulary keeps printable-ASCII tokens only.
    """

    num_steps: int
    suffix_len: int
    topk: int
    num_candidates: int
    loss: Any
    criterion: str
    target: str
    init_text: str | None
    slots: int
    ascii_only: bool


class JointGCG(HostDrivenEntry):
    """Joint GCG on an :class:`~sarjax.models.llm.pool.LLMPool` whose members may use different
    tokenizers (the SAR paper; Zou et al. 2023). Build with :func:`~sarjax.attacks.text.gcg.make_gcg` on an ``LLMPool``; call
    ``fn(params, inputs, ref, *, key, mask=None, max_queries=None, sample_ids=None,
    suffix_init=None, allowed=None) -> JointGCGResult``
    (``inputs``: :class:`~sarjax.attacks.text.requests.TextRequests` or request strings; ``ref``: the
    targets, the refusal, one string or one per request; None: the factory's default target). Host-driven:
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
       (:func:`~sarjax.attacks.text.retokenize.suffix_text_violations`; ids past a tokenizer's
       vocabulary and special tokens are never allowed);
    3. every kept candidate is scored by every covered member in its own tokens, on the ids of the
       whole prompt text that is sent (1 query per member and candidate); the suffix moves to the candidate of least joint loss (even when it
       is worse, as GCG) and the best-so-far is kept.

    A request stops when its next step could pass its cap (``1 + num_candidates x |C_b|``); the
    start suffix costs ``|C_b|``. Same key, same result: request ``b`` draws from
    ``fold_in(fold_in(key, sample_ids[b]), step)``.

    Every candidate (and the start) is scored on the ids of the whole prompt TEXT that is sent,
    ``before text + suffix text + after text`` tokenized at once in each member's tokenizer (what a
    user sending the suffix gets; :attr:`JointGCGResult.sent`), and every member's success is
    judged on those ids. The proposer's token gradient (step 1) is taken on the blocks
    ``before | suffix | after`` tokenized apart (:attr:`JointGCGResult.ids`), where each suffix
    token has its own position.

    Compute: the two kernels are compiled once per stack configuration and shapes (requests are
    padded to multiples of 8 tokens); a step runs one gradient kernel per distinct proposer and
    one scoring call per stack (all of its members, covered or not; only covered members are
    counted as queries).
    """

    host_reason = "the tokenizers run on the host between steps"

    def __init__(self, pool, config: JointGCGConfig):
        """Builds the attack (use the factory, which checks ``config`` first).

        Args:
          pool: the :class:`~sarjax.models.llm.pool.LLMPool`.
          config: its :class:`JointGCGConfig` (checked by :func:`~sarjax.attacks.text.gcg.make_gcg`, which builds both)."""
        if not isinstance(config, JointGCGConfig):
            raise TypeError(f"JointGCG: config must be a JointGCGConfig, got {type(config).__name__}")
        self.pool = pool
        self.name = "joint_gcg"
        self.__name__ = self.name
        self.config = config
        self.num_steps = config.num_steps
        self.suffix_len = config.suffix_len
        self.topk = config.topk
        self.num_candidates = config.num_candidates
        self.loss = config.loss
        self.target = config.target
        self.init_text = config.init_text
        self.slots = config.slots
        self.ascii_only = config.ascii_only
        self.criterion = config.criterion

    def __repr__(self) -> str:
        return f"JointGCG(steps={self.num_steps}, Ls={self.suffix_len}, topk={self.topk}, nc={self.num_candidates})"

    def _encode_suffixes(self, ids_lists, slots):
        out = np.zeros((len(ids_lists), slots), np.int32)
        m = np.zeros((len(ids_lists), slots), np.int32)
        for i, q in enumerate(ids_lists):
            if q:
                out[i, slots - len(q) :] = q
                m[i, slots - len(q) :] = 1
        return out, m

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
        suffix_init: str | Sequence[str] | None = None,
        allowed: Sequence[Any] | None = None,
        **call,
    ) -> JointGCGResult:
        """Runs the attack (see the class docstring).

        Args:
          params: one stacked parameter tree per stack of the factory's pool
            (:func:`~sarjax.attacks.text.pool.pool_params`; e.g. its placed or updated weights).
          inputs: the ``B`` requests, a :class:`~sarjax.attacks.text.requests.TextRequests` (prompts,
            system message, chat template or none: ``chat_template=False`` renders ``prompt + " " +
            suffix`` for base models); a plain sequence of request strings is shorthand for
            ``TextRequests(prompts)`` (:func:`~sarjax.attacks.text.requests.text_requests`).
          ref: the targets: the refusal this search scores (one string, or one per request); None:
            the factory's default target (``GCGOptions.target``).
          key: PRNG key (keyword-only, required).
          mask: ``[M]`` or ``[B, M]`` bool or 0/1, the members the objective covers (default all).
          max_queries: None, a scalar or ``[B]`` per-request cap (summed over members).
          sample_ids: ``[B]`` non-negative ints (default ``arange(B)``).
          suffix_init: the start suffix text (one, or one per request); default the factory's.
          allowed: optional ``[V_s]`` bool per stack (default :func:`~sarjax.attacks.text.retokenize.allowed_vocab`).
          **call: none (an unknown keyword raises ``TypeError``; the base's ``**call`` is kept so
            that the signature stays compatible with :meth:`~sarjax.attacks.core.entry.Entry.__call__`).

        Returns:
          :class:`JointGCGResult`.

        Raises:
          TypeError: no key; ``params`` not one tree per stack.
          ValueError: bad shapes or values (``params`` unlike the pool's included); a start suffix that violates the threat model (naming
            the row and why); an audit failure of the output.
        """
        if key is None:
            raise TypeError(f"{self.name}: key is required (a jax.random key); sarjax never defaults it")
        self._reject_keywords(call)
        pool = bind_params(self.name, self.pool, params)
        c = pool_call(self.name, pool, inputs, ref, self.target, key, mask, sample_ids, max_queries)
        stacks, requests, mk, targets, sid, cap = c
        bsz = len(requests.prompts)
        offsets = np.cumsum([0] + [st.size for st in stacks])[:-1]
        stack_of = np.concatenate([np.full(st.size, i) for i, st in enumerate(stacks)])
        cov = mk > 0
        ncov = cov.sum(1)
        toks = [st.tokenizer for st in stacks]
        if allowed is None:
            als = [allowed_for(st.tokenizer, st.cfg.vocab_size, self.ascii_only) for st in stacks]
        else:
            als = [np.asarray(a, bool) for a in allowed]
            if len(als) != len(stacks) or any(a.shape != (st.cfg.vocab_size,) for a, st in zip(als, stacks)):
                raise ValueError(f"{self.name}: allowed must be one [V_s] bool array per stack")
        slots = [self.slots] * len(stacks)
        init = self.init_text if suffix_init is None else suffix_init
        if init is None:  # the factory's default: GCG's "! ! ...", or a start every tokenizer reproduces
            try:
                init = start_text(toks, als, slots, self.suffix_len)
            except ValueError as e:
                raise ValueError(f"{self.name}: {e}") from None
        init_texts = [init] * bsz if isinstance(init, str) else list(init)
        if len(init_texts) != bsz:
            raise ValueError(f"{self.name}: suffix_init must be one string or {bsz}, got {len(init_texts)}")
        reqs = [pool_requests(self.name, st, requests, targets) for st in stacks]
        batches = [r.batch for r in reqs]
        jb = [TR.TextBatch(*(jnp.asarray(a) for a in b)) for b in batches]
        bad = []
        cur_ids = [[None] * bsz for _ in stacks]
        for i, text in enumerate(init_texts):
            ids, why = TK.suffix_text_violations(text, toks, als, slots)
            if why:
                bad.append(f"row {i}: " + "; ".join(why))
            for s in range(len(stacks)):
                cur_ids[s][i] = ids[s]
        if bad:
            raise ValueError(f"{self.name}: the start suffix violates the threat model: " + " | ".join(bad))

        def score(texts, n):
            """texts[b][c] (suffix text or None) -> member losses [B, M, n], each member on the ids
            of the whole prompt text that is sent in its own tokenizer."""
            out = [score_sent(st, reqs[s], texts, n, self.loss, slots[s]) for s, st in enumerate(stacks)]
            return np.concatenate(out, axis=1)

        def joint(ml):  # [B, M, n] -> [B, n]
            return np.einsum("bm,bmn->bn", mk, ml) / np.maximum(mk.sum(1), 1.0)[:, None]

        ml0 = score([[x] for x in init_texts], 1)
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
                    select=_member_select(st.params),
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
                        memo[text] = TK.suffix_text_violations(text, toks, als, slots)
                    ids, why = memo[text]
                    if why:
                        continue
                    valid[b, j] = True
                    for s in range(len(stacks)):
                        cand_ids[s][b][j] = ids[s]
            kept = [[cand_text[b][j] if valid[b, j] else None for j in range(nc)] for b in range(bsz)]
            jl = np.where(valid, joint(ml := score(kept, nc)), np.inf)
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
            enc = [TK.suffix_text_violations(x, [toks[s]], [als[s]], [slots[s]])[0][0] for x in best_text]
            sf, sm = self._encode_suffixes(enc, slots[s])
            b = batches[s]
            ids_out.append(np.concatenate([b.before, sf, b.after], axis=1))
            mask_out.append(np.concatenate([b.before_mask, sm, b.after_mask], axis=1))
            problem = TR.TextProblem(b, mk, als[s], cap, key, sid, sf, sm.sum(1))
            q_s = queries[:, offsets[s] : offsets[s] + st.size]
            res = TE.TextAttackResult(
                ids_out[-1], None, q_s, mask_out[-1], sf, sm, best_loss, best_ml, None, None, None
            )
            TE.audit_text(
                f"{self.name} (stack {s})",
                problem._replace(mask=cov[:, offsets[s] : offsets[s] + st.size]),
                res,
                st.tokenizer,
            )
        why = [
            f"row {i}: " + "; ".join(r)
            for i, x in enumerate(best_text)
            if (r := TK.suffix_text_violations(x, toks, als, slots)[1])
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


__all__ = [
    "JointGCG",
    "JointGCGConfig",
    "JointGCGResult",
]
