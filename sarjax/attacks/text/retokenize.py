"""The text that is sent (host side, and a host callback for compiled searches).

The blocks of a request are tokenized apart, so ``before | suffix | after`` need not be the ids
the tokenizer gives for the whole rendered prompt (SentencePiece-style tokenizers keep a lone
``▁`` for the space before the suffix; byte-level BPE splits ``" really"`` as ``Ġ re ally``
instead of ``Ġreally``). :func:`sent_ids` gives the ids of the whole prompt text;
:class:`Retokenizer` gives a compiled step the sent ids of its candidates (with GCG's
re-tokenization filter); :func:`exchange_suffix` and :func:`suffix_text_violations` pass and
check a suffix as TEXT across tokenizers; :func:`allowed_vocab` is GCG's vocabulary filter.
"""

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.attacks.text.requests import (
    SlotTexts,
    TextBatch,
)
from sarjax.models.llm.prompts import encode_text, retokenizes

DECODE = dict(skip_special_tokens=False, clean_up_tokenization_spaces=False)


def sent_ids(tokenizer, before_text: str, suffix_text: str, after_text: str) -> list[int]:
    """The ids the tokenizer gives for the WHOLE prompt text ``before + suffix + after`` (no special
    tokens added; special tokens written in the template text are kept): what a user sending the
    suffix text gets, as opposed to the three blocks tokenized apart."""
    return encode_text(tokenizer, before_text + suffix_text + after_text)


def texts_of(name: str, tokenizer, texts, batch: TextBatch) -> tuple[list[str], list[str]]:
    """The ``(before, after)`` texts of a call: checked against the batch's blocks when given,
    else decoded block by block."""
    b = TextBatch(*(np.asarray(a) for a in batch))
    bsz = b.before.shape[0]
    real = lambda ids, m: ids[m != 0].tolist()  # noqa: E731
    if texts is None:
        return (
            [tokenizer.decode(real(b.before[i], b.before_mask[i]), **DECODE) for i in range(bsz)],
            [tokenizer.decode(real(b.after[i], b.after_mask[i]), **DECODE) for i in range(bsz)],
        )
    if not (isinstance(texts, (tuple, list)) and len(texts) == 2):
        raise TypeError(f"{name}: texts must be (before [B] str, after [B] str), got {type(texts).__name__}")
    before, after = list(texts[0]), list(texts[1])
    if len(before) != bsz or len(after) != bsz or not all(isinstance(x, str) for x in before + after):
        raise ValueError(f"{name}: texts must hold B={bsz} before and after strings, got {len(before)}, {len(after)}")
    bad = [
        i
        for i in range(bsz)
        if encode_text(tokenizer, before[i]) != real(b.before[i], b.before_mask[i])
        or encode_text(tokenizer, after[i]) != real(b.after[i], b.after_mask[i])
    ]
    if bad:
        raise ValueError(f"{name}: texts rows {bad} do not encode to the batch's before / after blocks")
    return before, after


class Retokenizer:
    """The tokenizer as a compiled search sees it: a host callback (``jax.pure_callback``) that
    turns candidate suffix ids into the ids of the prompt TEXT that is sent, with GCG's
    re-tokenization filter (Zou et al. 2023, the reference's ``filter_cand``: a candidate whose
    decoded text does not encode back to its ids is dropped). Equal and hashed by the
    tokenizer's identity, so a static config may hold it.

    Args:
      tokenizer: a transformers tokenizer (``decode`` and ``__call__``).
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __eq__(self, other) -> bool:
        return isinstance(other, Retokenizer) and other.tokenizer is self.tokenizer

    def __hash__(self) -> int:
        return hash(("Retokenizer", id(self.tokenizer)))

    def __repr__(self) -> str:
        return f"Retokenizer({type(self.tokenizer).__name__})"

    def host_sent(self, width, before, before_mask, after, after_mask, tb, tbl, ta, tal, cands, n):
        """Host side of :meth:`sent` for one request (numpy in, numpy out)."""
        tok = self.tokenizer

        def text(raw, length, ids, mask):
            if int(length) >= 0:
                return bytes(np.asarray(raw, np.uint8)[: int(length)]).decode("utf-8")
            return tok.decode(np.asarray(ids)[np.asarray(mask) != 0].tolist(), **DECODE)

        bt, at = text(tb, tbl, before, before_mask), text(ta, tal, after, after_mask)
        cands = np.asarray(cands)
        k, ls = int(n), cands.shape[1]
        ids = np.zeros((cands.shape[0], width), np.int32)
        mask = np.zeros((cands.shape[0], width), np.int32)
        ok = np.zeros((cands.shape[0],), bool)
        memo: dict = {}
        for j in range(cands.shape[0]):
            real = cands[j, ls - k :].tolist() if k > 0 else []
            key = tuple(real)
            if key not in memo:
                suffix = tok.decode(real, **DECODE) if real else ""
                seq = sent_ids(tok, bt, suffix, at) if encode_text(tok, suffix) == real else []
                memo[key] = seq if 0 < len(seq) <= width else None
            seq = memo[key]
            if seq is not None:
                ids[j, width - len(seq) :], mask[j, width - len(seq) :], ok[j] = seq, 1, True
        return ids, mask, ok

    def sent(self, r: TextBatch, texts, cands, n, width: int):
        """The sent prompts of ``N`` candidate suffixes of one request (traced; vmap-safe).

        Args:
          r: the request (one row of the :class:`TextBatch`).
          texts: its row of the problem's :class:`SlotTexts`, or None (the blocks' ids decoded).
          cands: ``[N, Ls]`` int32 right-aligned suffixes; n: int32, their real tokens.
          width: ``W``, static.

        Returns:
          ``(ids [N, W] int32 left-padded, mask [N, W] int32, ok [N] bool)``: the ids of
          ``before text + decode(suffix) + after text`` tokenized whole; ``ok`` False (and the
          row empty) where the suffix ids do not re-tokenize to themselves or the prompt does
          not fit ``W`` tokens.
        """
        if texts is None:
            texts = SlotTexts(jnp.zeros((1,), jnp.uint8), jnp.int32(-1), jnp.zeros((1,), jnp.uint8), jnp.int32(-1))
        nc = cands.shape[0]
        shapes = (
            jax.ShapeDtypeStruct((nc, width), jnp.int32),
            jax.ShapeDtypeStruct((nc, width), jnp.int32),
            jax.ShapeDtypeStruct((nc,), jnp.bool_),
        )
        return jax.pure_callback(
            functools.partial(self.host_sent, width), shapes, r.before, r.before_mask, r.after, r.after_mask,
            texts.before, texts.before_len, texts.after, texts.after_len, cands.astype(jnp.int32),
            jnp.asarray(n, jnp.int32), vmap_method="sequential",
        )  # fmt: skip


def exchange_suffix(ids: Sequence[int], source, targets: Sequence[Any]) -> list[list[int]] | None:
    """Passes a suffix between tokenizers as TEXT (the SAR paper: joint GCG exchanges suffixes as
    text, not ids): decode with ``source``, re-encode with each of ``targets`` (host side).

    Args:
      ids: the suffix in ``source``'s ids.
      source: the proposer's tokenizer.
      targets: every member's tokenizer.

    Returns:
      One id list per target, or None when the text does not survive a target: its ids must
      decode back to the same text and re-tokenize to themselves (the re-tokenization filter).
    """
    kw = dict(skip_special_tokens=False, clean_up_tokenization_spaces=False)
    text = source.decode([int(i) for i in ids], **kw)
    out = []
    for tok in targets:
        enc = encode_text(tok, text)
        if not enc or tok.decode(enc, **kw) != text or not retokenizes(tok, enc):
            return None
        out.append(enc)
    return out


def suffix_text_violations(text: str, tokenizers: Sequence[Any], allowed: Sequence[Any], slots: Sequence[int]):
    """The threat-model check of a suffix exchanged as TEXT across a pool's tokenizers (host side).

    A suffix is valid for a member when its text encodes (no special tokens) to ids that decode
    back to the same text (so they re-tokenize to themselves: ``encode(decode(ids)) == ids``),
    every id is in that member's allowed vocabulary (no special tokens, no id past the tokenizer's
    vocabulary, see :func:`allowed_vocab`), and the ids fit the suffix slots.

    Args:
      text: the suffix text.
      tokenizers: one tokenizer per stack.
      allowed: one ``[V_s]`` bool per stack.
      slots: the suffix slots of each stack.

    Returns:
      ``(ids, reasons)``: one id list per stack (None where encoding failed) and the list of
      violations (empty: valid for every stack).
    """
    kw = dict(skip_special_tokens=False, clean_up_tokenization_spaces=False)
    ids, reasons = [], []
    for s, (tok, al, n) in enumerate(zip(tokenizers, allowed, slots, strict=True)):
        enc = encode_text(tok, text)
        ids.append(enc)
        if not enc:
            reasons.append(f"stack {s}: the text encodes to no token")
        elif tok.decode(enc, **kw) != text:
            reasons.append(f"stack {s}: the ids do not decode back to the text (no re-tokenization)")
        elif len(enc) > n:
            reasons.append(f"stack {s}: {len(enc)} tokens exceed the {n} suffix slots")
        else:
            a = np.asarray(enc)
            bad = sorted({int(t) for t in a if not (0 <= t < len(al) and al[t])})
            if bad:
                reasons.append(f"stack {s}: ids outside the allowed vocabulary: {bad}")
    return ids, reasons


def allowed_vocab(tokenizer, vocab_size: int, ascii_only: bool = True) -> np.ndarray:
    """``[V]`` bool: ids a suffix may use (GCG's filter: no special tokens, no ids past the
    tokenizer's vocabulary (padded embedding rows), and with ``ascii_only`` only tokens whose
    decoded text is printable ASCII; Zou et al. 2023 reference defaults, also nanoGCG's).

    Args:
      tokenizer: a transformers tokenizer.
      vocab_size: ``V`` of the model (the embedding rows; may exceed ``len(tokenizer)``).
    """
    al = np.zeros((vocab_size,), bool)
    n = min(len(tokenizer), vocab_size)
    al[:n] = True
    for i in getattr(tokenizer, "all_special_ids", []):
        if 0 <= i < vocab_size:
            al[i] = False
    if ascii_only:
        for i in range(n):
            if al[i]:
                s = tokenizer.decode([i])
                al[i] = bool(s) and s.isascii() and s.isprintable()
    return al


__all__ = [
    "DECODE",
    "Retokenizer",
    "allowed_vocab",
    "exchange_suffix",
    "sent_ids",
    "suffix_text_violations",
    "texts_of",
]
