"""AutoDAN-style rewriting on an LLM pool (the SAR paper, LLM half, Table 4; the black-box attack).

An attacker LM rewrites the WHOLE request; the target members are a black box seen only through
their text responses and a judge. One call, per request (written from the SAR paper's description;
the proposal loop is the anchor/proposal search of AutoDAN-Turbo, Liu et al. 2024, reduced to
rewriting):

1. the anchors start as the request itself;
2. every step, the attacker samples ``proposals`` rewrites of each anchor (temperature 0.8,
   top-p 0.95, 4 proposals per anchor: the SAR paper Table 4) from :data:`REWRITE_PROMPT`;
3. every candidate is sent to every member (greedy decoding, the paper's deterministic judging),
   each response is judged: broken or not, and a confidence in ``[0, 1]``;
4. candidates are ranked LEXICOGRAPHICALLY over the uncovered members (the member mask): number
   broken, then mean confidence, then the 20% quantile of confidence (the SAR paper); the best
   ``anchors`` candidates become the next anchors; the best candidate ever seen is kept.

Two implementations of this loop, behind the one factory :func:`make_autodan` (which one runs:
:func:`autodan_path`):

- the text path (:class:`AutoDANAttack`): the host loop on TEXT. The attacker's rewrite is
  decoded to text; every stack of the pool renders it with ITS OWN tokenizer and chat template,
  decodes greedily and the judge reads the decoded text (:class:`PoolEvaluator`), so pools whose
  members have different tokenizers work, and so does any text judge (GCG's refusal phrases, the
  HarmBench classifier). Responses are in pool member order.
- the token path (:class:`~sarjax.attacks.text.autodan_jit.AutoDANTokenFn`, in
  :mod:`sarjax.attacks.text.autodan_jit`): the same search as a state machine on TOKEN
  IDS (``init``/``step``/``result`` over :class:`AutoDANState`, ``run`` = ``lax.scan`` over
  ``step``) with a jit-safe entry and an audited entry, for a pool and an attacker that share ONE
  tokenizer and a judge on token ids (:class:`~sarjax.judges.refusal.TokenRefusalJudge`, the
  refusal-phrase judge matching token sequences, or any pure ``judge(tokens, length)``). The
  HarmBench classifier cannot run there: its prompt is built from the response TEXT (clipped to
  512 classifier tokens, decoded, formatted into the classifier prompt, re-tokenized by the
  classifier's tokenizer and truncated from the left), string work with no token-level
  equivalent; text judges and mixed tokenizers stay on the host loop.

Confidence (the SAR paper leaves it to the judge): a judge may carry ``judge.scores(behaviors,
generations) -> (labels [N], confidence [N])`` (one pass; the HarmBench classifier's
:meth:`~sarjax.judges.harmbench.HarmBenchClassifier.scores`: its probability of "Yes" normalised
over its "Yes" and "No" answer tokens) or ``judge.confidence(behaviors, generations) -> [N]``;
otherwise :func:`refusal_confidence` (for the refusal-phrase judge of GCG's evaluation, Zou et al.
2023): 1 when the response holds no refusal phrase, else the share of the response (in characters)
before the first refusal phrase, so a response that complies for a while before refusing ranks
above one that refuses at once. Integer labels count as broken only when 1 (HarmBench's -1,
an unparsed answer, is not broken, as HarmBench scores it).

Queries: one response of one UNCOVERED member to one candidate = 1 (the issue's unit: one forward
pass of one member on one candidate); the attacker's generations are counted separately
(``attacker_calls``). A request stops before a step that would pass its cap (``max_queries``) or
once every uncovered member is broken. Same key, same result: the proposals of request ``b``,
step ``s``, anchor ``a``, proposal ``p`` are drawn from ``fold_in(fold_in(fold_in(key, s), sid),
0)`` with sample id ``sid = sample_ids[b] * anchors * proposals + a * proposals + p`` (token
``t`` from a further ``fold_in(., t)``: :func:`sarjax.models.llm.pool.pool_generate_text`'s
streams), in both implementations.
"""

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from sarjax.attacks import queries as Q
from sarjax.attacks.core.entry import HostDrivenEntry
from sarjax.attacks.core.validate import check_sample_ids
from sarjax.attacks.text.autodan_jit import AutoDANTokenFn, build_token_autodan
from sarjax.attacks.text.autodan_judge import judge_generations, judge_labels, rank_key, refusal_text_judge
from sarjax.attacks.text.autodan_options import REWRITE_PROMPT, AutoDANOptions, check_search
from sarjax.attacks.text.requests import TextRequests, check_member_mask, text_requests
from sarjax.judges.refusal import TokenRefusalJudge
from sarjax.models.llm.generate import SamplingConfig, stack_greedy_generate
from sarjax.models.llm.pool import LLMPool, LLMStack, pool_generate_text, stack_decoding, tokenizer_fingerprint
from sarjax.models.llm.prompts import encode_text, split_chat_template


class AutoDANResult(NamedTuple):
    """Best-so-far rewrite per request (member axis ``[B, M]``).

    Attributes:
      x_adv: ``[B]`` the best rewritten request (text).
      success: ``[B, M]`` bool, each member's judgement of the best rewrite (the judge's verdict:
        broken; every member, covered or not), on the prompt it reads (:attr:`sent`).
      queries: ``[B, M]`` int64 responses of member ``m`` charged for request ``b`` (uncovered
        members only).
      confidence: ``[B, M]`` float64.
      member_loss: ``[B, M]`` ``-confidence`` (minimised, as the suffix attacks' losses).
      sent: one ``[B, T_s]`` int32 array per stack, the prompt of the best rewrite in that stack's
        chat template, the whole rendered text tokenized at once (:meth:`PoolEvaluator.encode`),
        left-padded; sent_mask: idem.
      attacker_calls: ``[B]`` int64 rewrites sampled.
    """

    x_adv: list
    success: Any
    queries: Any
    confidence: Any
    member_loss: Any
    sent: tuple
    sent_mask: tuple
    attacker_calls: Any


class AutoDANAttack(HostDrivenEntry):
    """The AutoDAN-style rewriting attack on text (see the module docstring): the text path of
    :func:`make_autodan`.

    Calling it: ``fn(params, requests, ref, *, key, mask=None, max_queries=None, sample_ids=None)
    -> AutoDANResult``:

    - ``params``: None (the pool the attack was built for answers) or an
      :class:`~sarjax.models.llm.pool.LLMPool` of the same members' structure, whose stacks
      answer (per-stack decoding only; an id-level ``respond`` holds its own pool);
    - ``requests``: a :class:`~sarjax.attacks.text.requests.TextRequests` (``B`` request strings
      are read as ``TextRequests(prompts=...)``). The judge reads ``behaviors`` (None: the
      prompts); ``system``: None (the factory's) or a system message, which must equal the
      factory's when the factory has one (a different one raises ``ValueError``);
      ``chat_template=False``: the stacks render the bare request. (:func:`sarjax.sar.run_llm_sar`
      passes an :class:`AutoDANBatch`, which wraps the requests.)
    - ``ref``: None (``ref`` holds the targets of the text attacks; AutoDAN has no target
      string; anything else raises ``TypeError`` naming where the behaviors go).

    Host-driven (the rewrites are text): there is no ``fn.jit`` (it raises ``TypeError``; the
    token path of :func:`make_autodan` has one).
    """

    host_reason = "the rewrites are text; the token path of make_autodan has a jit-safe entry"

    def __init__(self, propose, evaluate, num_members, *, proposals, anchors, num_steps, name="autodan"):
        self.propose = propose
        self.evaluate = evaluate
        self.num_members = int(num_members)
        self.proposals = int(proposals)
        self.anchors = int(anchors)
        self.num_steps = int(num_steps)
        self.name = name
        self.__name__ = name

    def __call__(
        self, params, requests, ref, *, key, mask=None, max_queries=None, sample_ids=None, **call
    ) -> AutoDANResult:
        """Runs the attack (see the class docstring); ``**call``: none (an unknown keyword raises
        ``TypeError``)."""
        if key is None:
            raise TypeError(f"{self.name}: key is required (a jax.random key); sarjax never defaults it")
        self._reject_keywords(call)
        if ref is not None:
            raise TypeError(
                f"{self.name}: ref must be None: ref holds the targets of the text attacks and AutoDAN has no target "
                f"string; the behaviors the judge reads go in TextRequests(behaviors=...), got {type(ref).__name__}"
            )
        req = text_requests(self.name, requests.requests if isinstance(requests, AutoDANBatch) else requests)
        reqs = list(req.prompts)
        b, m = len(reqs), self.num_members
        behaviors = reqs if req.behaviors is None else list(req.behaviors)
        evaluate = self._rendering(req)
        if params is not None:
            on = getattr(evaluate, "on", None)
            if on is None:
                raise TypeError(f"{self.name}: params must be None for this evaluator (it holds its own pool)")
            evaluate = on(params)
        mk = check_member_mask(self.name, mask, b, m) > 0
        sid = np.asarray(check_sample_ids(sample_ids, b)).astype(np.int64)
        cap = np.asarray(Q.normalize_cap(max_queries, b)).astype(np.int64)
        nm = mk.sum(axis=1)
        queries = np.zeros((b, m), np.int64)
        calls = np.zeros(b, np.int64)
        # the request itself is the first candidate (scored with the first step's batch)
        best_text = list(reqs)
        best_key = [(-1.0, -1.0, -1.0)] * b
        best = {"broken": np.zeros((b, m), bool), "conf": np.zeros((b, m))}
        anchors = [[r] for r in reqs]
        for step in range(self.num_steps):
            cost = np.asarray([len(anchors[i]) * self.proposals * nm[i] for i in range(b)])
            done = np.asarray([best_key[i][0] >= nm[i] for i in range(b)])
            active = (nm > 0) & ~done & (queries.sum(1) + cost <= cap)
            if not active.any():
                break
            rows, prompts, ids = [], [], []
            per = self.anchors * self.proposals
            for i in np.flatnonzero(active):
                for a, anchor in enumerate(anchors[i]):
                    for p in range(self.proposals):
                        rows.append((i, anchor))
                        prompts.append(anchor)
                        ids.append(int(sid[i]) * per + a * self.proposals + p)
            texts = self.propose(prompts, jax.random.fold_in(key, step), np.asarray(ids, np.int64))
            texts = [t.strip() or anchor for t, (_, anchor) in zip(texts, rows)]
            broken, conf = evaluate(texts, [behaviors[i] for i, _ in rows])  # [N, M] each
            cand: dict[int, list] = {}
            for n, (i, _) in enumerate(rows):
                cand.setdefault(i, []).append((rank_key(broken[n], conf[n], mk[i]), n))
            for i, lst in cand.items():
                lst.sort(key=lambda kn: kn[0], reverse=True)  # stable: ties keep proposal order
                queries[i] += np.where(mk[i], len(lst), 0)
                calls[i] += len(lst)
                k0, n0 = lst[0]
                if k0 > best_key[i]:
                    best_key[i] = k0
                    best_text[i] = texts[n0]
                    best["broken"][i] = broken[n0]
                    best["conf"][i] = conf[n0]
                anchors[i] = [texts[n] for _, n in lst[: self.anchors]]
        unscored = [i for i in range(b) if best_key[i][0] < 0]
        if unscored:  # no step ran for these rows: report the request itself (bookkeeping, not charged)
            br, cf = evaluate([reqs[i] for i in unscored], [behaviors[i] for i in unscored])
            best["broken"][unscored] = br
            best["conf"][unscored] = cf
        n_stacks = len(getattr(evaluate, "stacks", (None,)))
        enc = [evaluate.encode(best_text, s) for s in range(n_stacks)]
        return AutoDANResult(
            best_text, best["broken"], queries, best["conf"], -best["conf"], tuple(e[0] for e in enc),
            tuple(e[1] for e in enc), calls,
        )  # fmt: skip

    def _rendering(self, req: TextRequests):
        """The evaluator for a call's system message and template flag (the factory's when the call
        keeps them).

        Raises:
          ValueError: a system message other than the factory's.
          TypeError: an evaluator that cannot render another way (a custom ``evaluate``).
        """
        ev = self.evaluate
        own = getattr(ev, "system", None)
        if req.system is not None and own is not None and req.system != own:
            raise ValueError(
                f"{self.name}: the call's system message {req.system!r} differs from the factory's {own!r}; give one"
            )
        system = own if req.system is None else req.system
        if system == own and req.chat_template:
            return ev
        rendering = getattr(ev, "rendering", None)
        if rendering is None:
            raise TypeError(f"{self.name}: this evaluator renders one way; call with system=None, chat_template=True")
        return rendering(system, req.chat_template)

    def __repr__(self) -> str:
        return f"AutoDANAttack(proposals={self.proposals}, anchors={self.anchors}, steps={self.num_steps})"


class PoolEvaluator:
    """Responses of every member of a pool to rewritten requests, judged (host side, on text).

    Two ways to get the responses:

    - ``respond=None``: each stack renders the rewritten request with ITS OWN tokenizer and chat
      template (:meth:`encode` with ``stack=s``), decodes greedily with its end tokens and pad id
      (:func:`~sarjax.models.llm.pool.stack_decoding`: ``generation_config.json``, else the
      tokenizer's), cuts each response at its first end token and decodes it without special
      tokens (as :func:`~sarjax.models.llm.pool.pool_generate_text`). Pools whose stacks have
      different tokenizers work; responses come in pool member order.
    - ``respond(ids, mask) -> [M][N] str`` (e.g. :class:`sarjax.sar.llm_judging.PoolResponder`): an
      id-level responder; the prompts are in the first stack's tokenizer, so every stack must
      share it.

    Args:
      pool: the target :class:`~sarjax.models.llm.pool.LLMPool` (every stack needs a tokenizer).
      respond: see above (None: per-stack decoding).
      judge: ``judge(behaviors, generations) -> [N] bool`` (or int labels, 1 = broken);
        ``judge.scores`` / ``judge.confidence`` optional (:func:`judge_generations`).
      width: prompt width ``T`` per stack (an int for every stack, or one per stack; fixed: one
        compiled decoder); a longer prompt loses the end of its request (the template's tail is
        kept).
      system: optional system message.
      response_tokens: tokens each member generates with ``respond=None`` (32, as
        :class:`sarjax.sar.llm_judging.PoolResponder`; HarmBench generates 512 for its classifier:
        raise it on real models).

    Raises:
      ValueError: a stack without a tokenizer; an id-level ``respond`` with several tokenizers;
        ``width`` of the wrong length; ``response_tokens < 1``.
    """

    def __init__(self, pool, respond, judge, width, system: str | None = None, *, response_tokens: int = 32):
        self.stacks = tuple(pool.stacks)
        self.tokenizers = tuple(s.tokenizer for s in self.stacks)
        if any(t is None for t in self.tokenizers):
            raise ValueError("PoolEvaluator: every stack needs a tokenizer (the rewrite is text)")
        fps = {tokenizer_fingerprint(t) for t in self.tokenizers}
        if respond is not None and len(fps) != 1:
            raise ValueError(
                f"PoolEvaluator: an id-level respond needs one tokenizer shared by every stack, got {len(fps)} "
                "distinct tokenizers; pass respond=None so that each stack renders the text with its own"
            )
        widths = [int(width)] * len(self.stacks) if np.ndim(width) == 0 else [int(w) for w in width]
        if len(widths) != len(self.stacks) or min(widths) < 2:
            raise ValueError(
                f"PoolEvaluator: width must be an int >= 2 or one per stack ({len(self.stacks)}), got {width}"
            )
        if int(response_tokens) < 1:
            raise ValueError(f"PoolEvaluator: response_tokens must be >= 1, got {response_tokens}")
        self.tokenizer = self.tokenizers[0]
        self.respond = respond
        self.judge = judge
        self.widths = tuple(widths)
        self.width = widths[0]
        self.system = system
        self.chat_template = True
        self.response_tokens = int(response_tokens)
        self.num_members = sum(s.size for s in self.stacks)

    def encode(self, requests: Sequence[str], stack: int = 0):
        """``(ids [N, T_s], mask [N, T_s])`` int32 of the requests in stack ``stack``'s chat
        template (its tokenizer), left-padded to its width: the ids of the WHOLE rendered text
        (what a user sending the request gets). A prompt longer than the width keeps its
        template tail and the start of its request (head and tail tokenized apart, the head cut)."""
        tok, width = self.tokenizers[stack], self.widths[stack]
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        ids = np.full((len(requests), width), pad, np.int32)
        mask = np.zeros((len(requests), width), np.int32)
        for n, r in enumerate(requests):
            if self.chat_template and getattr(tok, "chat_template", None) is not None:
                head, tail = split_chat_template(tok, r, self.system, separator="")
            else:
                head, tail = r, ""
            seq = encode_text(tok, head + tail)
            if len(seq) > width:  # the request is cut: its head and the template's tail apart
                t = encode_text(tok, tail)
                seq = (encode_text(tok, head)[: max(width - len(t), 1)] + t)[-width:]
            ids[n, width - len(seq) :] = seq
            mask[n, width - len(seq) :] = 1
        return ids, mask

    def rendering(self, system: str | None, chat_template: bool = True) -> "PoolEvaluator":
        """This evaluator rendering with another system message, or without the chat template
        (``chat_template=False``: the bare request); same widths, judge and stacks."""
        import copy

        out = copy.copy(self)
        out.system = system
        out.chat_template = bool(chat_template)
        return out

    def on(self, pool) -> "PoolEvaluator":
        """This evaluator with ``pool``'s stacks answering (same members' structure, tokenizers,
        widths and judge): the attack's ``params``.

        Raises:
          TypeError: an id-level ``respond`` (it holds its own pool), or ``pool`` is not an LLM
            pool. ValueError: other stacks, member names or tokenizers.
        """
        import copy

        if self.respond is not None:
            raise TypeError("PoolEvaluator: an id-level respond holds its own pool; call the attack with params=None")
        stacks: tuple[Any, ...] = tuple(getattr(pool, "stacks", ()))
        if not stacks:
            raise TypeError(f"PoolEvaluator: params must be None or an LLMPool, got {type(pool).__name__}")
        same = len(stacks) == len(self.stacks) and all(
            a.names == b.names and tokenizer_fingerprint(a.tokenizer) == tokenizer_fingerprint(b.tokenizer)
            for a, b in zip(stacks, self.stacks, strict=True)
        )
        if not same:
            raise ValueError(
                f"PoolEvaluator: the pool's stacks {[s.names for s in stacks]} differ from the attack's "
                f"{[s.names for s in self.stacks]} (names or tokenizers)"
            )
        out = copy.copy(self)
        out.stacks = stacks
        return out

    def responses(self, texts: Sequence[str]) -> list[list[str]]:
        """``[M][N]`` every member's greedy response to each request, members in pool order."""
        if self.respond is not None:
            return self.respond(*self.encode(texts))

        out: list[list[str]] = []
        for s, (stack, tok) in enumerate(zip(self.stacks, self.tokenizers, strict=True)):
            ids, mask = self.encode(texts, s)
            eos, pad = stack_decoding(stack)
            toks = stack_greedy_generate(
                stack.params, stack.cfg, ids, mask, self.response_tokens, eos_id=list(eos) if eos else None, pad_id=pad
            )
            ends = set(eos or ())
            for member in np.asarray(toks).tolist():
                row_texts = []
                for row in member:
                    cut = next((i for i, t in enumerate(row) if t in ends), len(row))
                    row_texts.append(tok.decode(row[:cut], skip_special_tokens=True))
                out.append(row_texts)
        return out

    def __call__(self, texts: Sequence[str], behaviors: Sequence[str]):
        """``(broken [N, M] bool, confidence [N, M] float)`` of the rewritten requests."""
        gens = self.responses(texts)
        if len(gens) != self.num_members:
            raise ValueError(f"PoolEvaluator: {len(gens)} members responded, expected {self.num_members}")
        cols = [judge_generations(self.judge, behaviors, g) for g in gens]
        return np.stack([c[0] for c in cols], axis=1), np.stack([c[1] for c in cols], axis=1)


class AutoDANBatch:
    """The requests of :class:`AutoDANAttack` inside :func:`sarjax.sar.run_llm_sar` (the SAR
    pipeline's batch; a user calls the attack with :class:`~sarjax.attacks.text.requests.TextRequests`):
    the requests (:attr:`requests`, a checked ``TextRequests``, what the attack reads), the
    unmodified prompts in the first stack's ids (``clean_prompts() -> (ids [B, T], mask [B, T])``)
    and, given the attack's :class:`PoolEvaluator`, the clean judgement of every member on ITS OWN
    rendering of each request (:meth:`judge_clean`; pools with several tokenizers need it).

    Args:
      requests: a ``TextRequests`` or ``B`` request strings.
      encode: ``encode(prompts [B]) -> (ids, mask)`` (the evaluator's :meth:`PoolEvaluator.encode`).
      evaluator: the attack's evaluator (for :meth:`judge_clean`).
    """

    def __init__(self, requests, encode: Callable, evaluator: PoolEvaluator | None = None):
        self.requests: TextRequests = text_requests("AutoDANBatch", requests)
        self.encode_text = encode
        self.evaluator = evaluator

    def clean_prompts(self):
        return self.encode_text(list(self.requests.prompts))

    def judge_clean(self, judge, behaviors: Sequence[str]):
        """``(broken [B, M] bool, generations [M][B])``: every member's greedy response to the
        unmodified request, rendered in its own tokenizer and chat template, judged by ``judge``
        (integer labels broken only when 1, :func:`judge_labels`).

        Raises:
          ValueError: no evaluator was given.
        """
        if self.evaluator is None:
            raise ValueError("AutoDANBatch.judge_clean needs the attack's evaluator (AutoDANBatch(..., evaluator=))")
        gens = self.evaluator.responses(list(self.requests.prompts))
        n = len(self.requests.prompts)
        cols = []
        for j, g in enumerate(gens):
            if len(g) != n:
                raise ValueError(f"AutoDANBatch: member {j} gave {len(g)} responses, expected {n}")
            cols.append(judge_labels(judge(list(behaviors), list(g)), n))
        return np.stack(cols, axis=1), [list(g) for g in gens]

    def __len__(self) -> int:
        return len(self.requests.prompts)


def attacker_proposer(
    attacker,
    *,
    temperature: float = 0.8,
    top_p: float = 0.95,
    max_new_tokens: int = 48,
    rewrite_prompt: str = REWRITE_PROMPT,
    pad_to_multiple: int = 16,
):
    """``propose(anchors [N], key, sample_ids [N]) -> [N] rewrites`` sampled from an attacker LM.

    Args:
      attacker: an :class:`~sarjax.models.llm.pool.LLMPool`; its FIRST member writes (pass a
        one-member pool of a large local checkpoint, or the target pool to use member 0).
      temperature, top_p: 0.8 and 0.95 (the SAR paper Table 4); top-k off.
      max_new_tokens: rewrite length.
      rewrite_prompt: the instruction, with ``{request}``.
      pad_to_multiple: the attacker's prompts are left-padded to a multiple of this
        (:func:`~sarjax.models.llm.pool.pool_generate_text`).
    """
    s = attacker.stacks[0]

    one = LLMPool((LLMStack(s.cfg, jax.tree.map(lambda a: a[:1], s.params), s.names[:1], s.tokenizer, s.generation),))

    def propose(anchors, key, sample_ids):
        prompts = [rewrite_prompt.format(request=a) for a in anchors]
        out = pool_generate_text(
            one, prompts, max_new_tokens=max_new_tokens, key=key, sampling=SamplingConfig(temperature, 0, top_p),
            sample_ids=np.asarray(sample_ids), pad_to_multiple=pad_to_multiple,
        )  # fmt: skip
        return out[0]

    return propose


def reads_tokens(judge) -> bool:
    """Whether ``judge`` is a judge on token ids (``judge(tokens [R], length) -> (broken,
    confidence)``, the token path's): a :class:`~sarjax.judges.refusal.TokenRefusalJudge`, or any
    judge with a true ``reads_tokens`` attribute (mark your own token judge so); every other judge
    reads text (``judge(behaviors, generations)``)."""
    return isinstance(judge, TokenRefusalJudge) or getattr(judge, "reads_tokens", False) is True


def _is_proposer(attacker) -> bool:
    return attacker is not None and callable(attacker) and not hasattr(attacker, "stacks")


def autodan_path(pool, judge=None, attacker=None, options: AutoDANOptions | None = None) -> str:
    """The path :func:`make_autodan` takes for these arguments: ``"token"`` or ``"text"``.

    With ``options.path="auto"`` (the default), the TOKEN path (the compiled state machine) when
    all of these hold, else the TEXT path (the host loop):

    - every stack of ``pool`` and the attacker (``attacker``, else ``pool``) share one tokenizer;
    - the attacker is a pool (not a proposer callable);
    - ``judge`` is None or reads token ids (:func:`reads_tokens`);
    - no id-level ``options.respond``.

    ``options.path="text"`` / ``"token"`` forces a path (the token path then raises where it
    cannot run).

    Raises:
      TypeError: ``pool`` without ``stacks``; options not an :class:`AutoDANOptions`.
      ValueError: a token judge where the text path is needed or forced (it cannot read text); the
        token path forced with a proposer or a ``respond``.
    """
    options = AutoDANOptions() if options is None else options
    if not isinstance(options, AutoDANOptions):
        raise TypeError(f"make_autodan: options must be an AutoDANOptions, got {type(options).__name__}")
    stacks: tuple[Any, ...] = tuple(getattr(pool, "stacks", ()))
    if not stacks:
        raise TypeError(f"make_autodan: pool must be an LLMPool (with stacks), got {type(pool).__name__}")
    proposer = _is_proposer(attacker)
    if options.path == "token":
        if proposer or options.respond is not None:
            raise ValueError(
                "make_autodan: path='token' needs an attacker pool (not a proposer callable) and no respond "
                "(the members decode inside the compiled step)"
            )
        return "token"
    att_stacks: tuple[Any, ...] = () if proposer or attacker is None else tuple(attacker.stacks[:1])
    if any(s.tokenizer is None for s in stacks + att_stacks):
        raise ValueError("make_autodan: every stack (and the attacker) needs a tokenizer (the requests are text)")
    fps = {tokenizer_fingerprint(s.tokenizer) for s in stacks + att_stacks}
    why = []
    if len(fps) != 1:
        why.append(f"{len(fps)} tokenizers")
    if proposer:
        why.append("a proposer callable as the attacker")
    if options.respond is not None:
        why.append("an id-level respond")
    if options.path == "text" or why:
        if judge is not None and reads_tokens(judge):
            because = "path='text'" if options.path == "text" else ", ".join(why)
            raise ValueError(
                f"make_autodan: the judge reads token ids, but the text path runs ({because}) and its judge reads "
                "text: judge(behaviors, generations); pass a text judge or None"
            )
        return "text"
    return "token" if judge is None or reads_tokens(judge) else "text"


def make_autodan(
    pool,
    judge=None,
    *,
    attacker=None,
    proposals: int = 4,
    anchors: int = 2,
    num_steps: int = 5,
    max_new_tokens: int = 48,
    response_tokens: int = 32,
    options: AutoDANOptions | None = None,
) -> "AutoDANAttack | AutoDANTokenFn":
    """AutoDAN-style rewriting on a pool (the SAR paper, LLM half, Table 4), whichever pool it is
    given: the pool and the judge decide the path (:func:`autodan_path`).

    - The TOKEN path when every stack and the attacker share one tokenizer, the attacker is a pool
      and the judge is None (:func:`~sarjax.judges.refusal.token_refusal_judge` of GCG's phrases)
      or reads token ids (:func:`reads_tokens`: a
      :class:`~sarjax.judges.refusal.TokenRefusalJudge`): the compiled state machine
      (:class:`~sarjax.attacks.text.autodan_jit.AutoDANTokenFn`), called ``fn(params, requests,
      None, *, key, ...)`` with ``requests`` a :class:`~sarjax.attacks.text.requests.TextRequests`
      (or strings) -> :class:`~sarjax.attacks.text.autodan_jit.AutoDANTokenResult`;
      ``fn.jit(params, batch, None, *, key, ...)`` takes the token batch
      (:class:`~sarjax.attacks.text.autodan_jit.RewriteBatch`, ``fn.batch(prompts)``). Its audit
      refuses a rewrite whose ids do not re-tokenize to themselves: on BPE vocabularies prefer the
      text path.
    - The TEXT path otherwise (several tokenizers, a text judge ``judge(behaviors, generations)``
      such as the HarmBench classifier, a proposer callable, an id-level ``options.respond``): the
      host loop (:class:`AutoDANAttack`), called ``fn(params, requests, None, *, key, ...)`` ->
      :class:`AutoDANResult`; the judge reads ``requests.behaviors`` (None: the prompts); judge
      None: GCG's refusal phrases on the decoded responses
      (:func:`~sarjax.attacks.text.autodan_judge.refusal_text_judge`).

    ``options.path`` forces one path where both are possible. ``ref`` is None on both paths
    (AutoDAN has no target string; a non-None ``ref`` raises ``TypeError``).

    Args:
      pool: the target :class:`~sarjax.models.llm.pool.LLMPool` (its size is ``M``; every stack
        with a tokenizer).
      judge: see above (None: the refusal phrases of GCG's evaluation, Zou et al. 2023, on the
        path's side).
      attacker: the attacker: an ``LLMPool`` whose FIRST member rewrites (None: ``pool``'s member
        0; pass a one-member pool of a large local checkpoint), or, text path only, a proposer
        ``propose(anchors [N], key, sample_ids [N]) -> [N] rewrites``.
      proposals: rewrites per anchor (4, the SAR paper Table 4).
      anchors: candidates kept as the next step's anchors (2: sarjax's choice, not in the paper).
      num_steps: steps per call (5: sarjax's choice, not in the paper).
      max_new_tokens: rewrite length in the attacker's tokens (48: ours).
      response_tokens: each member's greedy response length (32, as
        :class:`sarjax.sar.llm_judging.PoolResponder`; HarmBench generates 512 for its
        classifier: raise it on real models).
      options: the rare knobs (:class:`~sarjax.attacks.text.autodan_options.AutoDANOptions`:
        ``path``; the attacker's ``temperature`` 0.8 and ``top_p`` 0.95, the SAR paper Table 4;
        ``rewrite_prompt``; ``requests`` / ``system`` sizing the slots; text path: ``respond``,
        ``width``; token path: ``slot``). None: its defaults.

    Returns:
      :class:`AutoDANAttack` (text path) or :class:`~sarjax.attacks.text.autodan_jit.AutoDANTokenFn`
      (token path).

    Raises:
      TypeError: options not an :class:`AutoDANOptions`; a pool without stacks.
      ValueError: non-positive sizes; a token judge on the text path; the token path forced where
        it cannot run (several tokenizers, a proposer, a ``respond``); ``options.width`` on the token
        path or ``options.slot`` on the text path; an id-level ``respond`` on a pool with several
        tokenizers.
    """
    options = AutoDANOptions() if options is None else options
    path = autodan_path(pool, judge, attacker, options)
    check_search("make_autodan", proposals, anchors, num_steps, max_new_tokens, options.temperature, options.top_p)
    if int(response_tokens) < 1:
        raise ValueError(f"make_autodan: response_tokens must be >= 1, got {response_tokens}")
    if path == "token":
        if options.width is not None:
            raise ValueError(
                "make_autodan: options.width sizes the text path's prompts; the token path uses options.slot"
            )
        return build_token_autodan(
            pool, judge, attacker, proposals, anchors, num_steps, max_new_tokens, response_tokens, options
        )
    if options.slot is not None:
        raise ValueError("make_autodan: options.slot sizes the token path's rewrites; the text path uses options.width")
    judge = refusal_text_judge if judge is None else judge
    requests, system = options.sizing()
    if _is_proposer(attacker):
        propose = attacker
    else:
        propose = attacker_proposer(
            pool if attacker is None else attacker, temperature=options.temperature, top_p=options.top_p,
            max_new_tokens=max_new_tokens, rewrite_prompt=options.rewrite_prompt,
        )  # fmt: skip
    respond, width = options.respond, options.width
    if width is None:
        probe = PoolEvaluator(pool, respond, judge, 10_000, system, response_tokens=response_tokens)
        width = [
            max((int(probe.encode([r], s)[1].sum()) for r in requests), default=16) + int(max_new_tokens) + 8
            for s in range(len(pool.stacks))
        ]
    ev = PoolEvaluator(pool, respond, judge, width, system, response_tokens=response_tokens)
    return AutoDANAttack(propose, ev, pool.size, proposals=proposals, anchors=anchors, num_steps=num_steps)


__all__ = [
    "REWRITE_PROMPT",
    "AutoDANAttack",
    "AutoDANBatch",
    "AutoDANOptions",
    "AutoDANResult",
    "PoolEvaluator",
    "attacker_proposer",
    "autodan_path",
    "check_search",
    "make_autodan",
    "reads_tokens",
]
