"""Judging an LLM pool's responses for SAR: the judges (:func:`refusal_judge_fn`,
:func:`harmbench_judge_fn`), the pool's greedy responder (:class:`PoolResponder`) and
:func:`judge_members`, which asks every member and judges each answer.

``Judge``: ``judge(behaviors [N], generations [N]) -> [N] bool`` (True: the response complies,
the member is broken); ``Respond``: ``respond(ids [N, T], mask [N, T]) -> [M][N] str``. The run
(:mod:`sarjax.sar.llm`) sees the pool only through these two.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from sarjax.attacks.text.autodan_judge import judge_labels
from sarjax.attacks.text.requests import slot_texts
from sarjax.judges.refusal import GCG_REFUSAL_PHRASES, refusal_judge
from sarjax.models.llm.generate import stack_greedy_generate
from sarjax.models.llm.pool import left_pad, tokenizer_fingerprint
from sarjax.models.llm.prompts import encode_text
from sarjax.sar.llm_requests import request_blocks

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
    the suffix slot (:func:`~sarjax.attacks.text.requests.slot_texts`); each other group renders
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
            self.blocks = [request_blocks(t, reqs, system, separator) for t in self.tokenizers]
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


__all__ = [
    "Judge",
    "PoolResponder",
    "Respond",
    "compact_left",
    "harmbench_judge_fn",
    "judge_members",
    "refusal_judge_fn",
]
