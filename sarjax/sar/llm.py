"""SAR of an LLM pool: the greedy of :mod:`sarjax.cover` driven by a text attack and a judge.

the SAR paper (LLM half): a request (a HarmBench behavior) is broken for a member when the member's
DETERMINISTIC (greedy) response to the attacked prompt is judged harmful. Members that already
comply with the unmodified request count as broken without an attack (they are reported in
``clean_broken``). The rest follows the cover module: each round one joint attack on the
still-uncovered members of every request (at most ``calls`` calls with fresh keys for the requests
that are not broken yet, the SAR paper Table 2: "at most 4 calls" of BEAST), the single-member
fallback when the joint attack breaks nothing new, one run for every delta.

The adapter sees the pool through three host callables, so any model family, attack and judge fit:

- ``attack(params, batch, None, *, key, mask [B, M], **attack_kwargs) -> result`` (every sarjax
  text attack's call shape) with ``sent, sent_mask [B, T]`` (the whole attacked prompt as it is
  sent, holes allowed; a tuple per stack: the first stack's is read), ``member_loss [B, M]``
  (minimised by the attacker), ``queries [B, M]`` and ``success [B, M]``: a
  :class:`~sarjax.attacks.text.core.TextAttackFn` (joint BEAST, joint GCG), a pool attack
  (:class:`~sarjax.attacks.text.gcg_joint.JointGCG`, :class:`~sarjax.attacks.text.beast_cross.CrossBEAST`:
  ``params`` the pool, ``batch`` the request strings) or the AutoDAN-style rewriter
  (:mod:`sarjax.attacks.text.autodan`). With ``self_judged`` the result's ``success`` is the
  coverage (AutoDAN: the SAR judge's verdict on every member, each in its own tokens); otherwise
  every candidate is judged through ``respond``. A batch with ``judge_clean(judge, behaviors)``
  (AutoDAN's) judges the unmodified requests itself;
- ``respond(ids [N, T], mask [N, T]) -> [M][N] str``: every member's greedy response
  (:class:`PoolResponder` for sarjax decoder pools);
- ``judge(behaviors [N], generations [N]) -> [N] bool``: True = the response complies (broken):
  :func:`refusal_judge_fn` (GCG's refusal phrases) or :func:`harmbench_judge_fn`.

Queries in the result are the attack's (one forward pass of one member on one candidate = 1);
the greedy decoding used to judge a candidate is not charged to the attack's budget.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from sarjax.attacks.text.autodan_judge import judge_labels
from sarjax.attacks.text.core import slot_texts, text_batch
from sarjax.cover.metrics import coverage_target
from sarjax.cover.result import SARResult
from sarjax.cover.types import Candidates, JointAttack, SingleAttack
from sarjax.judges.refusal import GCG_REFUSAL_PHRASES, refusal_judge
from sarjax.models.llm.generate import stack_greedy_generate
from sarjax.models.llm.loader import check_tokenizer_vocab, load_model
from sarjax.models.llm.pool import LLMPool, LLMStack, build_pool, left_pad, pool_generate_text, tokenizer_fingerprint
from sarjax.models.llm.prompts import encode_text, load_tokenizer
from sarjax.runtime import fingerprint as fingerprints
from sarjax.sar.driver import ResumableRun

_JOINT_STREAM = 0
_SINGLE_STREAM = 1
_ASR_STREAM = 2
_CKPT_FILES = ("fingerprint.json", "clean.json", "greedy", "result", "asr.npz")  # what run_llm_sar writes
_CKPT_HINT = "pass overwrite=True (--overwrite) to discard it or choose another output directory"

Judge = Callable[[Sequence[str], Sequence[str]], np.ndarray]
Respond = Callable[[Any, Any], list[list[str]]]


# ---------------------------------------------------------------------------------------------
# judges and responders


def refusal_judge_fn(phrases: Sequence[str] | None = None, case_sensitive: bool = False) -> Judge:
    """A judge from GCG's refusal-phrase list (:func:`sarjax.judges.refusal_judge`).

    Args:
      phrases: refusal phrases (None: ``GCG_REFUSAL_PHRASES``, Zou et al. 2023).
      case_sensitive: GCG matches with case; sarjax ignores it by default.

    Returns:
      ``judge(behaviors [N], generations [N]) -> [N] bool`` (True: no refusal phrase, broken).
    """
    ph = tuple(GCG_REFUSAL_PHRASES if phrases is None else phrases)

    def judge(behaviors: Sequence[str], generations: Sequence[str]) -> np.ndarray:
        del behaviors  # the phrase judge reads the response only
        return refusal_judge(list(generations), ph, case_sensitive).astype(bool)

    judge.name = "refusal"  # type: ignore[attr-defined]
    return judge


def harmbench_judge_fn(classifier: Any, contexts: Sequence[str] | None = None) -> Judge:
    """A judge from HarmBench's classifier (:class:`sarjax.judges.HarmBenchClassifier`).

    Args:
      classifier: ``classifier(behaviors, generations, contexts) -> [N] int`` (1 yes, 0 no, -1 unparsed).
      contexts: optional per-behavior context strings (HarmBench's contextual prompt); the
        judge is then called with the behaviors in their original order only.

    Returns:
      ``judge(behaviors [N], generations [N]) -> [N] bool``: True where the classifier says
      "yes" (an unparsed answer counts as not broken, as HarmBench scores it). When the classifier
      has ``scores`` (:meth:`sarjax.judges.HarmBenchClassifier.scores`), the judge carries
      ``judge.scores(behaviors, generations) -> (broken [N] bool, P(Yes) [N])``, the confidence
      AutoDAN ranks by.
    """

    def judge(behaviors: Sequence[str], generations: Sequence[str]) -> np.ndarray:
        ctx = None if contexts is None else [contexts[i % len(contexts)] for i in range(len(behaviors))]
        return np.asarray(classifier(list(behaviors), list(generations), ctx)) == 1

    if hasattr(classifier, "scores"):  # AutoDAN ranks by the classifier's own P(Yes) (judge_labels prefers it)

        def scores(behaviors: Sequence[str], generations: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
            ctx = None if contexts is None else [contexts[i % len(contexts)] for i in range(len(behaviors))]
            labels, conf = classifier.scores(list(behaviors), list(generations), ctx)
            return np.asarray(labels) == 1, np.asarray(conf)

        judge.scores = scores  # type: ignore[attr-defined]
    judge.name = "harmbench"  # type: ignore[attr-defined]
    return judge


def compact_left(ids: Any, mask: Any, pad_id: int = 0, length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Moves the real tokens of each row to the right end (holes removed), host side.

    Args:
      ids: ``[N, T]`` int prompts with holes (mask 0) anywhere; mask: ``[N, T]`` 0/1.
      pad_id: filler of the left padding.
      length: output width (default ``T``; fixed widths avoid recompiles).

    Returns:
      ``(ids [N, L] int32, mask [N, L] int32)`` left-padded.
    """
    ids, mask = np.asarray(ids), np.asarray(mask).astype(bool)
    n, t = ids.shape
    width = t if length is None else int(length)
    out = np.full((n, width), pad_id, np.int32)
    om = np.zeros((n, width), np.int32)
    for i in range(n):
        real = ids[i][mask[i]]
        if real.size > width:
            raise ValueError(f"compact_left: row {i} has {real.size} real tokens, more than length={width}")
        if real.size:
            out[i, width - real.size :] = real
            om[i, width - real.size :] = 1
    return out, om


class PoolResponder:
    """Greedy responses of every member of a sarjax decoder pool, one or several tokenizers.

    Args:
      pool: a :class:`~sarjax.models.llm.pool.LLMPool` (every stack with a tokenizer).
      max_new_tokens: response length judged (32 here; HarmBench generates 512 tokens for its
        classifier: raise it on real models).
      eos_id: end token(s) (None: each tokenizer's ``eos_token_id``); one tokenizer only.
      requests: the ``N`` requests in row order (the behaviors); required when the stacks use
        more than one tokenizer, ignored otherwise.
      system, separator: how the requests were rendered around the suffix (as
        :func:`behavior_batch`); used with several tokenizers only.

    Calling it with ``(ids [N, T], mask [N, T])`` (holes allowed) returns ``[M][N]`` decoded
    responses (special tokens skipped), members in ``pool.names`` order. The prompts are token
    ids of the FIRST stack's tokenizer (the reference). With one tokenizer they are compacted and
    left-padded to ``T`` (one compile) and every stack decodes them.

    Several tokenizers: stacks are grouped by tokenizer fingerprint. Row ``i`` must be request
    ``i``'s reference prompt with only the suffix changed, or the unmodified request
    (:func:`clean_prompt_ids`); a ValueError names the rows that are not. The row is decoded to
    text with the reference tokenizer and its suffix text read between the rendered text around
    the suffix slot (:func:`~sarjax.attacks.text.core.slot_texts`); each other group renders
    request ``i`` with its own tokenizer and chat template around that text and tokenizes the
    whole text at once (the prompt its members read as sent), then decodes greedily with its own
    end token and decodes the response with its own tokenizer. A suffix text that another
    tokenizer cannot reproduce (``decode(encode(text)) != text``) raises a ValueError naming the
    row.
    """

    def __init__(
        self,
        pool: Any,
        max_new_tokens: int = 32,
        eos_id: Any = None,
        *,
        requests: Sequence[str] | None = None,
        system: str | None = None,
        separator: str = " ",
    ):
        fps = [tokenizer_fingerprint(s.tokenizer) for s in pool.stacks]
        if None in fps:
            raise ValueError(f"PoolResponder: every stack needs a tokenizer, stack {fps.index(None)} has none")
        if int(max_new_tokens) < 1:
            raise ValueError(f"PoolResponder: max_new_tokens must be >= 1, got {max_new_tokens}")
        order = list(dict.fromkeys(fps))
        self.pool = pool
        self.group_of = [order.index(f) for f in fps]  # stack -> tokenizer group (0: the reference)
        self.tokenizers = [pool.stacks[fps.index(f)].tokenizer for f in order]
        self.tokenizer = self.tokenizers[0]
        self.max_new_tokens = int(max_new_tokens)
        self.mixed = len(order) > 1
        if self.mixed and eos_id is not None:
            raise ValueError("PoolResponder: eos_id is one tokenizer's; with several tokenizers leave it None")
        self.eos_ids = [t.eos_token_id if eos_id is None else eos_id for t in self.tokenizers]
        self.pad_ids = [int(t.pad_token_id) if t.pad_token_id is not None else 0 for t in self.tokenizers]
        self.eos_id, self.pad_id = self.eos_ids[0], self.pad_ids[0]
        self.blocks = None
        self.texts: list = []
        self.clean: list = []
        if self.mixed:
            if requests is None:
                raise ValueError(
                    f"PoolResponder: the pool's stacks use {len(order)} tokenizers; pass requests= (the "
                    "behaviors in row order) so that each tokenizer renders its own prompt"
                )
            reqs = list(requests)
            self.blocks = [_request_blocks(t, reqs, system, separator) for t in self.tokenizers]
            self.texts = [slot_texts(t, reqs, system=system, separator=separator) for t in self.tokenizers]
            self.clean = []
            for t in self.tokenizers:
                bt, at = slot_texts(t, reqs, system=system, separator="")
                self.clean.append([encode_text(t, b + a) for b, a in zip(bt, at, strict=True)])

    def prompts(self, ids: Any, mask: Any) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each tokenizer group's left-padded prompts ``(ids [N, L_g], mask [N, L_g])`` (group 0:
        the reference's, compacted to width ``T``)."""
        ids, mask = np.asarray(ids), np.asarray(mask)
        out = [compact_left(ids, mask, self.pad_ids[0])]
        if not self.mixed:
            return out
        assert self.blocks is not None
        n = ids.shape[0]
        if n != len(self.clean[0]):
            raise ValueError(f"PoolResponder: got {n} prompts for {len(self.clean[0])} requests (rows are requests)")
        dec = dict(skip_special_tokens=False, clean_up_tokenization_spaces=False)
        texts: list[str | None] = []
        bad = []
        for i in range(n):
            real = ids[i][mask[i].astype(bool)].tolist()
            if real == self.clean[0][i]:  # the unmodified request
                texts.append(None)
                continue
            text = self.tokenizer.decode(real, **dec)
            bt, at = self.texts[0][0][i], self.texts[0][1][i]
            if len(text) < len(bt) + len(at) or not text.startswith(bt) or not text.endswith(at):
                bad.append(i)
                continue
            texts.append(text[len(bt) : len(text) - len(at)] or None)
        if bad:
            raise ValueError(
                f"PoolResponder: rows {bad} are not their request's reference rendering with only the suffix changed"
            )
        for g in range(1, len(self.tokenizers)):
            tok, (before, after) = self.tokenizers[g], self.texts[g]
            rows = []
            for i, text in enumerate(texts):
                if text is None:
                    rows.append(self.clean[g][i])
                    continue
                if tok.decode(encode_text(tok, text), **dec) != text:
                    raise ValueError(
                        f"PoolResponder: row {i}'s suffix {text!r} does not survive tokenizer group {g} "
                        "(its ids do not decode back to the text)"
                    )
                rows.append(encode_text(tok, before[i] + text + after[i]))  # the whole text, as it is sent
            width = -(-max(map(len, rows)) // 16) * 16  # multiples of 16: similar batches share a kernel
            out.append(left_pad(rows, self.pad_ids[g], width))
        return out

    def tokens(self, ids: Any, mask: Any) -> np.ndarray:
        """``[M, N, max_new_tokens]`` int32 greedy continuations (each member in its own vocabulary)."""
        per_group = self.prompts(ids, mask)
        outs = []
        for s, g in zip(self.pool.stacks, self.group_of, strict=True):
            gi, gm = per_group[g]
            outs.append(
                np.asarray(
                    stack_greedy_generate(
                        s.params, s.cfg, gi, gm, self.max_new_tokens, self.eos_ids[g], self.pad_ids[g]
                    )
                )
            )
        return np.concatenate(outs, axis=0)

    def __call__(self, ids: Any, mask: Any) -> list[list[str]]:
        toks = self.tokens(ids, mask)
        tok_of = [self.tokenizers[g] for s, g in zip(self.pool.stacks, self.group_of, strict=True) for _ in s.names]
        return [[tok.decode(row, skip_special_tokens=True) for row in member] for tok, member in zip(tok_of, toks)]


def judge_members(respond: Respond, judge: Judge, behaviors: Sequence[str], ids: Any, mask: Any):
    """``(broken [N, M] bool, generations [M][N])``: every member's response judged.

    Args:
      respond: see the module docstring; judge: idem.
      behaviors: ``[N]`` the request each row stands for (the judge's context).
      ids, mask: ``[N, T]`` prompts.

    The judge's labels are bools, or integers broken only when 1 (HarmBench's -1, an unparsed
    answer, is not broken; :func:`~sarjax.attacks.text.autodan_judge.judge_labels`); another dtype or
    length raises.
    """
    gens = respond(ids, mask)
    n = np.shape(ids)[0]
    cols = []
    for m, g in enumerate(gens):
        if len(g) != n:
            raise ValueError(f"respond returned {len(g)} generations for member {m}, expected {n}")
        cols.append(judge_labels(judge(list(behaviors), list(g)), n))
    return np.stack(cols, axis=1), gens


# ---------------------------------------------------------------------------------------------
# oracles


def _prompt_ids(res: Any) -> tuple[np.ndarray, np.ndarray]:
    """The recorded prompt of an attack's result: ``sent`` / ``sent_mask`` (the first stack's when
    the result holds one per stack)."""
    ids, mask = res.sent, res.sent_mask
    if isinstance(ids, (tuple, list)):
        ids, mask = ids[0], mask[0]
    return np.asarray(ids), np.asarray(mask)


def make_llm_oracles(
    attack: Callable,
    params: Any,
    batch: Any,
    behaviors: Sequence[str],
    respond: Respond,
    judge: Judge,
    key: Any,
    *,
    num_members: int,
    calls: int = 1,
    attack_kwargs: dict | None = None,
    sample_ids: Any = None,
    single_attack: Callable | None = None,
    log: dict | None = None,
    self_judged: bool = False,
) -> tuple[JointAttack, SingleAttack]:
    """Joint and single-member oracles for :func:`sarjax.cover.greedy_sar` from a text attack.

    Args:
      attack: ``attack(params, batch, None, *, key, mask [B, M], **attack_kwargs)`` -> a result
        with ``sent``, ``sent_mask`` ``[B, T]`` (or one per stack: the first is recorded),
        ``member_loss [B, M]`` (minimised), ``queries [B, M]`` and, with ``self_judged``,
        ``success [B, M]``.
      params: passed through to ``attack`` untouched.
      batch: the requests (e.g. a :class:`~sarjax.attacks.text.core.TextBatch`), ``B`` rows.
      behaviors: ``[B]`` request texts (the judge's context).
      respond, judge: see the module docstring.
      key: PRNG key. Round ``r``, call ``c`` of the joint attack uses
        ``fold_in(fold_in(fold_in(key, 0), r), c)``; the fallback stream 1 likewise.
      num_members: ``M``.
      calls: at most this many attack calls per round and oracle; a call runs only the requests
        whose earlier calls broke no targeted member (the SAR paper Table 2: BEAST "at most 4
        calls" of 15,000 queries; 1 for GCG's rounds and AutoDAN).
      attack_kwargs: extra keyword arguments of every call (``max_queries``, ``allowed``, ...).
      sample_ids: ``[B]`` ids folded into the attack's per-request keys (default ``arange(B)``).
      single_attack: the fallback's attack (default ``attack`` with a one-member mask).
      log: optional dict; ``log["calls"]`` collects ``(oracle, round, call, rows attacked)``.
      self_judged: the result's ``success`` is the coverage (the attack judged every member with
        the SAR's judge: AutoDAN); False: every candidate's prompt is judged through ``respond``.

    Returns:
      ``(joint, single)``. ``x_adv`` of a candidate is its prompt ``[B, W]`` with -1 at holes
      (real tokens right-aligned in the width ``W`` of the first result); ``objective`` is minus
      the attack's ``member_loss`` (the fallback then targets the member the joint attack came
      closest to breaking).

    Raises:
      ValueError: a result whose ``success`` / ``queries`` are not ``[B, M]``, or whose prompt
        holds more tokens than the recorded width (naming the row).
    """
    kw = dict(attack_kwargs or {})
    if int(calls) < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    b, m = len(behaviors), int(num_members)
    ids_kw = {} if sample_ids is None else {"sample_ids": np.asarray(sample_ids)}
    single_fn = attack if single_attack is None else single_attack

    width: dict[str, int] = {}

    def recorded(pid: np.ndarray, pm: np.ndarray) -> np.ndarray:
        """The prompts right-aligned in the run's fixed width, -1 at holes."""
        w = width.setdefault("w", pid.shape[1])
        ids, om = compact_left(pid, pm, 0, length=max(w, int(np.asarray(pm).astype(bool).sum(1).max(initial=0))))
        if ids.shape[1] > w:
            rows = np.flatnonzero(om.sum(1) > w).tolist()
            raise ValueError(f"rows {rows}: the attack's prompt holds more tokens than the recorded width {w}")
        return np.where(om.astype(bool), ids, -1).astype(np.int64)

    def run(fn: Callable, stream: int, mask: np.ndarray, r: int) -> Candidates:
        base = jax.random.fold_in(jax.random.fold_in(key, stream), r)
        x = None
        covered = np.zeros((b, m), bool)
        queries = np.zeros(b, np.int64)
        objective = np.full((b, m), -np.inf)
        todo = np.asarray(mask.any(axis=1), bool)
        for c in range(int(calls)):
            if not todo.any():
                break
            call_mask = np.where(todo[:, None], mask, False)
            res = fn(params, batch, None, key=jax.random.fold_in(base, c), mask=call_mask, **kw, **ids_kw)
            pid, pm = _prompt_ids(res)
            if self_judged:  # the attack judged its own output (AutoDAN: every member, own tokens)
                broken = np.asarray(res.success, bool)
                if broken.shape != (b, m):
                    raise ValueError(f"the attack's success must be [B={b}, M={m}], got shape {broken.shape}")
            else:
                broken, _ = judge_members(respond, judge, behaviors, pid, pm)
            q = np.asarray(res.queries)
            if q.shape != (b, m):
                raise ValueError(f"the attack's queries must be [B={b}, M={m}], got shape {q.shape}")
            xs = recorded(pid, pm)
            if x is None:
                x = np.full_like(xs, -1)
            rows = todo
            x[rows] = xs[rows]
            covered[rows] = broken[rows]
            objective[rows] = -np.asarray(res.member_loss, np.float64)[rows]
            queries += np.where(rows, q.astype(np.int64).sum(1), 0)
            if log is not None:
                log.setdefault("calls", []).append((["joint", "single"][stream], int(r), c, int(rows.sum())))
            todo = todo & ~(broken & mask).any(axis=1)
        assert x is not None
        return Candidates(x, covered, queries, objective)

    def joint(uncovered: np.ndarray, round_index: int) -> Candidates:
        return run(attack, _JOINT_STREAM, np.asarray(uncovered, bool), round_index)

    def single(target: np.ndarray, active: np.ndarray, round_index: int) -> Candidates:
        mask = (np.arange(m)[None, :] == np.asarray(target)[:, None]) & np.asarray(active, bool)[:, None]
        return run(single_fn, _SINGLE_STREAM, mask, round_index)

    return joint, single


# ---------------------------------------------------------------------------------------------
# the run


@dataclasses.dataclass
class LLMSARRun:
    """What :func:`run_llm_sar` returns.

    Attributes:
      result: the :class:`~sarjax.cover.SARResult` (``inputs [R, B, T]``: the recorded prompts,
        -1 at holes).
      behaviors: ``[B]`` request texts.
      clean_generations: ``[M][B]`` greedy responses to the unmodified requests.
      asr: ``[M]`` per-member attack success rate of single-member attacks (None unless asked),
        counting a member that complies with the clean request as broken.
      member_broken: ``[B, M]`` bool behind ``asr`` (None unless asked).
    """

    result: SARResult
    behaviors: list[str]
    clean_generations: list[list[str]]
    asr: np.ndarray | None = None
    member_broken: np.ndarray | None = None


def member_asr(joint: JointAttack, clean_broken: Any) -> dict[str, np.ndarray]:
    """Per-member ASR: each member attacked ALONE on each request (the individual robustness
    ``1 - ASR`` of the SAR paper, Table 6), one oracle call per member over all requests.

    A member that complies with the clean request is broken without an attack (the SAR paper,
    success determination) and is not attacked.

    Args:
      joint: the joint oracle of :func:`make_llm_oracles` (build it on its own key stream, as
        :func:`run_llm_sar` does: ``fold_in(key, 2)``); member ``j`` is attacked through it with
        the one-member mask ``[:, j]`` as round ``j``.
      clean_broken: ``[B, M]`` bool, the members that comply with the clean requests.

    Returns:
      ``{"asr": [M] float64, "broken": [B, M] bool, "covered": [M, B, M] bool (the whole pool's
      judgement of member j's attacked prompt), "prompts": [M, B, T] int64 (-1 at holes; -1
      everywhere where member j was not attacked), "queries": [M, B] int64}``.
    """
    cb = np.asarray(clean_broken, bool)
    b, m = cb.shape
    broken = cb.copy()
    covered = np.zeros((m, b, m), bool)
    queries = np.zeros((m, b), np.int64)
    prompts = None
    for j in range(m):
        mask = np.zeros((b, m), bool)
        mask[:, j] = ~cb[:, j]
        if not mask.any():
            continue
        cand = joint(mask, j)
        if prompts is None:
            prompts = np.full((m,) + cand.x_adv.shape, -1, np.int64)
        rows = mask[:, j]
        prompts[j][rows] = cand.x_adv[rows]
        covered[j][rows] = cand.covered[rows]
        queries[j] = np.where(rows, cand.queries, 0)
        broken[:, j] |= cand.covered[:, j] & rows
    if prompts is None:
        prompts = np.full((m, b, 1), -1, np.int64)
    return {"asr": broken.mean(axis=0), "broken": broken, "covered": covered, "prompts": prompts, "queries": queries}


def run_llm_sar(
    attack: Callable,
    params: Any,
    batch: Any,
    behaviors: Sequence[str],
    respond: Respond,
    judge: Judge,
    deltas: Sequence[float],
    *,
    key: Any,
    num_members: int,
    calls: int = 1,
    attack_kwargs: dict | None = None,
    single_attack: Callable | None = None,
    with_asr: bool = False,
    checkpoint_dir: str | os.PathLike | None = None,
    fingerprint: dict | None = None,
    overwrite: bool = False,
    progress: bool = False,
    self_judged: bool = False,
    clean_prompts: tuple[Any, Any] | None = None,
) -> LLMSARRun:
    """SAR_{1-delta} of an LLM pool on a batch of requests (the SAR paper, LLM half).

    Args:
      attack, params, batch, behaviors, respond, judge, calls, attack_kwargs, single_attack,
        self_judged: see :func:`make_llm_oracles`.
      clean_prompts: ``(ids [B, T], mask [B, T])`` of the unmodified requests as they are sent
        (:func:`clean_prompt_ids`); None: ``batch.clean_prompts()`` when the batch has it, else
        the batch's ``before | after`` blocks.
      deltas: allowed uncovered shares, each in ``[0, 1)``; one run serves all of them.
      key: PRNG key (required).
      num_members: ``M``.
      with_asr: also measure the per-member ASR (:func:`member_asr`); its single-member attacks
        then serve as the greedy's fallback (the fallback for member ``j`` IS member ``j``
        attacked alone on the clean request), at no extra attack cost.
      checkpoint_dir: if set, the greedy checkpoints every round there and the run resumes with
        the fingerprint rule (:mod:`sarjax.runtime.fingerprint`): ``fingerprint.json`` holds
        ``fingerprint`` (the caller's: pool hash, attack settings, judge, ...) plus the
        requests' digest, deltas, key and options; a rerun with other settings raises naming
        them; other deltas are re-derived from a finished run.
      fingerprint: the caller's part of the fingerprint (JSON data).
      overwrite: delete an earlier run's files in ``checkpoint_dir`` first.
      progress: show the greedy's progress bar.

    Returns:
      :class:`LLMSARRun`.

    Raises:
      TypeError: no key. ValueError: bad deltas, a mismatching checkpoint.
    """
    if key is None:
        raise TypeError("run_llm_sar: key is required (a jax.random key); sarjax never defaults it")
    if isinstance(deltas, (int, float)):
        deltas = (float(deltas),)
    deltas = tuple(float(d) for d in deltas)
    if not deltas:
        raise ValueError("deltas must hold at least one delta")
    m = int(num_members)
    for d in deltas:
        coverage_target(d, m)
    behaviors = list(behaviors)
    run = ResumableRun(checkpoint_dir, hint=_CKPT_HINT)
    if run.root is not None:
        fp = {
            "kind": "llm_sar",
            "sarjax_version": fingerprints.sarjax_version(),
            **(fingerprint or {}),
            "num_members": m,
            "deltas": list(deltas),
            "behaviors": fingerprints.array_digest(np.frombuffer("\x00".join(behaviors).encode(), np.uint8)),
            "batch": fingerprints.array_digest(*[np.asarray(a) for a in batch]) if isinstance(batch, tuple) else None,
            "key": fingerprints.key_fingerprint(key),
            "calls": int(calls),
            "with_asr": bool(with_asr),
        }
        run.open(fp, overwrite=overwrite, files=_CKPT_FILES, results=("greedy", "result"), parts=("result",))

    def oracles(fn: Callable, k: Any, **kw: Any) -> tuple[JointAttack, SingleAttack]:
        return make_llm_oracles(
            fn,
            params,
            batch,
            behaviors,
            respond,
            judge,
            k,
            num_members=m,
            calls=calls,
            attack_kwargs=attack_kwargs,
            self_judged=self_judged,
            **kw,
        )

    def judge_clean() -> dict[str, Any]:  # deterministic decoding of the unmodified request
        judge_batch = getattr(batch, "judge_clean", None)
        if judge_batch is not None:  # each member on its own rendering (AutoDAN's batch)
            broken, gens = judge_batch(judge, behaviors)
        else:
            cids, cmask = _clean_prompts(batch) if clean_prompts is None else clean_prompts
            broken, gens = judge_members(respond, judge, behaviors, cids, cmask)
        return {"broken": np.asarray(broken).tolist(), "generations": gens}

    clean = run.cached_json("clean.json", judge_clean)
    clean_broken = np.asarray(clean["broken"], bool)
    clean_gens = clean["generations"]
    single_runs = None
    if with_asr:

        def per_member() -> dict[str, np.ndarray]:
            asr_joint, _ = oracles(single_attack or attack, jax.random.fold_in(key, _ASR_STREAM))
            return member_asr(asr_joint, clean_broken)

        single_runs = run.cached_arrays("asr.npz", per_member)

    def greedy_oracles() -> tuple[JointAttack, SingleAttack]:
        joint, single = oracles(attack, key, single_attack=single_attack)
        if single_runs is not None:
            single = precomputed_single(single_runs)
        return joint, single

    result = run.greedy(greedy_oracles, clean_broken, deltas, checkpoint="greedy", result="result", progress=progress)
    asr = None if single_runs is None else single_runs["asr"]
    broken_single = None if single_runs is None else single_runs["broken"]
    return LLMSARRun(result, behaviors, [list(g) for g in clean_gens], asr, broken_single)


def precomputed_single(single_runs: dict[str, np.ndarray]) -> SingleAttack:
    """The greedy's fallback read off per-member attacks already run (:func:`member_asr`).

    The fallback of Algorithm 1 attacks one uncovered member alone on the request; those
    attacks ARE the per-member ASR attacks, so the fallback for member ``j`` on request ``b``
    returns ``prompts[j, b]`` with its whole-pool coverage ``covered[j, b]`` and its queries, at
    no new attack cost (as :func:`sarjax.sar.vision.precomputed_single` does for images).

    Args:
      single_runs: the dict of :func:`member_asr` (``covered [M, B, M]``, ``prompts [M, B, T]``,
        ``queries [M, B]``).
    """
    cov_all = np.asarray(single_runs["covered"], bool)
    prompts = np.asarray(single_runs["prompts"])
    q = np.asarray(single_runs["queries"], np.int64)

    def single(target: np.ndarray, active: np.ndarray, round_index: int) -> Candidates:
        del round_index  # the member attacks are fixed inputs
        m, b = q.shape
        rows = np.arange(b)
        t = np.asarray(target)
        act = np.asarray(active, bool)
        return Candidates(
            prompts[t, rows], cov_all[t, rows] & act[:, None], np.where(act, q[t, rows], 0), np.zeros((b, m))
        )

    return single


def _clean_prompts(batch: Any) -> tuple[np.ndarray, np.ndarray]:
    """``before | after`` of each request (no suffix), ``[B, Pb + Pa]``."""
    if hasattr(batch, "clean_prompts"):
        return batch.clean_prompts()
    ids = np.concatenate([np.asarray(batch.before), np.asarray(batch.after)], axis=1)
    mask = np.concatenate([np.asarray(batch.before_mask), np.asarray(batch.after_mask)], axis=1)
    return ids, mask


# ---------------------------------------------------------------------------------------------
# requests and pools of sarjax decoders


def _request_blocks(
    tokenizer: Any, behaviors: Sequence[str], system: str | None = None, separator: str = " "
) -> tuple[list[list[int]], list[list[int]]]:
    """``(before, after)`` id lists of each request around the suffix slot: the texts of
    :func:`~sarjax.attacks.text.core.slot_texts` (the chat template split at the suffix; without a
    template the request and ``separator`` before, nothing after: a base model), each tokenized."""
    bt, at = slot_texts(tokenizer, behaviors, system=system, separator=separator)
    return [encode_text(tokenizer, x) for x in bt], [encode_text(tokenizer, x) for x in at]


def clean_prompt_ids(
    tokenizer: Any, behaviors: Sequence[str], system: str | None = None, *, chat_template: bool | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(ids [B, T], mask [B, T])`` int32, left-padded: each unmodified request as it is sent (the
    chat template rendered around the request alone, the whole text tokenized at once; without a
    template the request itself). The clean judgement of :func:`run_llm_sar` reads these."""
    bt, at = slot_texts(tokenizer, behaviors, system=system, separator="", chat_template=chat_template)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return left_pad([encode_text(tokenizer, b + a) for b, a in zip(bt, at, strict=True)], int(pad))


def behavior_batch(
    tokenizer: Any, behaviors: Sequence[str], response: str, system: str | None = None, separator: str = " "
) -> Any:
    """The :class:`~sarjax.attacks.text.core.TextBatch` of requests (suffix slot after each request).

    Args:
      tokenizer: the pool's tokenizer (the first stack's when the pool has several); its chat
        template is rendered around the suffix
        (:func:`~sarjax.models.llm.prompts.split_chat_template`); without one the request is
        followed by the suffix and nothing else (a base model).
      behaviors: ``[B]`` request texts.
      response: the scored response: BEAST's target (e.g. ``"Sure, here is"``) or GCG's refusal.
      system: optional system message.
      separator: text between the request and the suffix.
    """
    before, after = _request_blocks(tokenizer, behaviors, system, separator)
    tgt = encode_text(tokenizer, response)
    if not tgt:
        raise ValueError(f"behavior_batch: the response {response!r} encodes to no tokens")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return text_batch(before, after, [tgt] * len(behaviors), pad_id=int(pad))


def load_llm_pool(dirs: Sequence[str | os.PathLike], dtype: str = "float32") -> Any:
    """An :class:`~sarjax.models.llm.pool.LLMPool` from local Hugging Face checkpoint folders
    (``config.json``, safetensors, tokenizer files); members are named by folder name."""
    members = []
    for d in dirs:
        path = str(Path(d).resolve())
        cfg, params = load_model(path, dtype)
        tok = load_tokenizer(path)
        check_tokenizer_vocab(tok, cfg, Path(path).name, path)
        members.append((Path(path).name, cfg, params, tok))
    names = [m[0] for m in members]
    if len(set(names)) != len(names):
        raise ValueError(f"pool folders must have distinct names, got {names}")
    return build_pool(members)


def pool_digest(pool: Any) -> str:
    """SHA-256 over the member names, configurations and parameter bytes of an LLM pool."""
    parts = [
        np.frombuffer(repr((s.names, s.cfg, tokenizer_fingerprint(s.tokenizer))).encode(), np.uint8)
        for s in pool.stacks
    ]
    leaves = [np.asarray(x) for s in pool.stacks for x in jax.tree.leaves(s.params)]
    return fingerprints.array_digest(*parts, *leaves)


def sampled_seed_fn(
    generator: Any,
    requests: Sequence[str],
    *,
    key: Any,
    max_new_tokens: int = 20,
    num_samples: int = 4,
    prompt: str = "{request}",
    chat_template: bool = False,
) -> Callable[[str], list[str]]:
    """BEAST's seed generator from a local causal LM: ``request -> suffix candidates`` by sampling.

    the SAR paper (Table 2) warm-starts BEAST from AmpleGCG (a Llama-2 fine-tuned to generate
    adversarial suffixes for a request) and keeps 20 seed tokens; any checkpoint that continues a
    request with a suffix fits here. Every request is written into ``prompt`` and the generator
    samples ``num_samples`` continuations of ``max_new_tokens`` tokens, all requests in one
    batched call (:func:`~sarjax.models.llm.pool.pool_generate_text`; the generator's
    ``generation_config.json`` temperature / top-k / top-p, else transformers' defaults
    1.0 / 50 / 1.0). Sample ``j`` of request ``i`` draws from ``fold_in(fold_in(key, i *
    num_samples + j), 0)`` (``i``: the request's index among the distinct requests, in order): same
    key, same seeds.

    Args:
      generator: an :class:`~sarjax.models.llm.pool.LLMPool` (its first member samples), e.g.
        ``load_llm_pool([DIR])``.
      requests: the requests (the behaviors).
      key: PRNG key (required).
      max_new_tokens: tokens sampled per candidate (20: the SAR paper Table 2 keeps 20 seed tokens).
      num_samples: candidates per request (the first usable one seeds BEAST).
      prompt: the generator's input, ``{request}`` replaced by the request; use the format the
        generator was trained with (see its model card).
      chat_template: render the prompt as a user turn of the generator's chat template (default:
        the raw text, as a suffix generator trained on plain text expects).

    Returns:
      ``seed_fn(request) -> [num_samples] str`` (a ValueError for a request it was not built for).

    Raises:
      TypeError: no key. ValueError: ``prompt`` without ``{request}``, non-positive sizes.
    """
    if key is None:
        raise TypeError("sampled_seed_fn: key is required (a jax.random key); sarjax never defaults it")
    if "{request}" not in prompt:
        raise ValueError(f"sampled_seed_fn: prompt must contain '{{request}}', got {prompt!r}")
    if int(max_new_tokens) < 1 or int(num_samples) < 1:
        raise ValueError(f"sampled_seed_fn: need max_new_tokens, num_samples >= 1, got {max_new_tokens}, {num_samples}")
    s = generator.stacks[0]
    one = LLMPool((LLMStack(s.cfg, jax.tree.map(lambda a: a[:1], s.params), s.names[:1], s.tokenizer, s.generation),))
    reqs = list(dict.fromkeys(requests))
    k = int(num_samples)
    texts = [prompt.replace("{request}", r) for r in reqs for _ in range(k)]
    out = pool_generate_text(
        one, texts, max_new_tokens=int(max_new_tokens), do_sample=True, key=key, chat_template=chat_template,
        sample_ids=np.arange(len(texts)),
    )[0]  # fmt: skip
    table = {r: out[i * k : (i + 1) * k] for i, r in enumerate(reqs)}

    def seed_fn(request: str) -> list[str]:
        if request not in table:
            raise ValueError(f"sampled_seed_fn: no seeds were sampled for the request {request!r}")
        return list(table[request])

    return seed_fn


__all__ = [
    "LLMSARRun",
    "PoolResponder",
    "behavior_batch",
    "clean_prompt_ids",
    "compact_left",
    "harmbench_judge_fn",
    "judge_members",
    "load_llm_pool",
    "make_llm_oracles",
    "member_asr",
    "pool_digest",
    "precomputed_single",
    "refusal_judge_fn",
    "run_llm_sar",
    "sampled_seed_fn",
]
