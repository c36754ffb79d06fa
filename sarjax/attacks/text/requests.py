"""The requests of the suffix attacks on LLM pools: the token layout, its padding and the text
around each suffix slot (host-side builders, jit-safe assembly).

A request is three token blocks around an adversarial suffix::

    before (left-padded) | suffix (right-aligned, Ls slots) | after (left-padded) | target

``before`` is everything up to the suffix (chat template head + request), ``after`` the template
tail (it may be empty: ``Pa = 0``) and ``target`` the response whose NLL is scored. Padding
slots are holes (mask 0): positions come from the mask (``cumsum(mask) - 1``), so a hole changes
nothing. The suffix is right-aligned in its ``Ls`` slots, so a suffix of ``n < Ls`` tokens
(BEAST while it grows) is ``Ls - n`` holes followed by the tokens.
"""

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.attacks.core.validate import check_mask
from sarjax.models.llm.prompts import encode_text, split_chat_template


class TextRequests(NamedTuple):
    """B requests as TEXT: the input of every text attack's host call (build or check with
    :func:`text_requests`).

    The targets (the refusal or target string a suffix search scores) are never part of the
    requests: they are the call's ``ref``. A plain sequence of strings is read as
    ``TextRequests(prompts=...)`` with every other field at its default.

    Attributes:
      prompts: the ``B`` request strings (e.g. HarmBench behaviors), ``B >= 1``.
      system: optional system message of the chat template (None: the template's own).
      chat_template: False renders ``prompt + " " + suffix`` without a template (base models).
      behaviors: optional ``B`` strings a judge reads as the behaviour each request asks for
        (AutoDAN); None: the prompts themselves.
    """

    prompts: tuple[str, ...]
    system: str | None = None
    chat_template: bool = True
    behaviors: tuple[str, ...] | None = None


def text_requests(name: str, inputs: Any) -> TextRequests:
    """``inputs`` as a checked :class:`TextRequests` (host side).

    Args:
      name: the caller, for messages.
      inputs: a :class:`TextRequests`, or a non-empty sequence of request strings.

    Returns:
      The requests with ``prompts`` (and ``behaviors``) as tuples of strings.

    Raises:
      TypeError: a single string, prompts or behaviors that are not strings, a system message
        that is not a string, ``chat_template`` not a bool.
      ValueError: no request; ``behaviors`` not one per request.
    """
    req = inputs if isinstance(inputs, TextRequests) else None
    if req is None:
        if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence):
            raise TypeError(
                f"{name}: inputs must be TextRequests or a sequence of request strings, got {type(inputs).__name__}"
            )
        req = TextRequests(tuple(inputs))
    prompts = req.prompts
    if isinstance(prompts, (str, bytes)) or not all(isinstance(p, str) for p in prompts):
        raise TypeError(f"{name}: the requests' prompts must be a sequence of strings")
    prompts = tuple(prompts)
    if not prompts:
        raise ValueError(f"{name}: expected at least one request")
    if req.system is not None and not isinstance(req.system, str):
        raise TypeError(f"{name}: system must be a string or None, got {type(req.system).__name__}")
    if not isinstance(req.chat_template, (bool, np.bool_)):
        raise TypeError(f"{name}: chat_template must be a bool, got {type(req.chat_template).__name__}")
    beh = req.behaviors
    if beh is not None:
        if isinstance(beh, (str, bytes)) or not all(isinstance(b, str) for b in beh):
            raise TypeError(f"{name}: behaviors must be a sequence of strings or None")
        beh = tuple(beh)
        if len(beh) != len(prompts):
            raise ValueError(f"{name}: behaviors must hold one string per request (B={len(prompts)}), got {len(beh)}")
    return TextRequests(prompts, req.system, bool(req.chat_template), beh)


class TextBatch(NamedTuple):
    """B requests, padded (build with :func:`text_batch`).

    Attributes:
      before: ``[B, Pb]`` int32 ids before the suffix, left-padded (>= 1 real token per row).
      before_mask: ``[B, Pb]`` 0/1.
      after: ``[B, Pa]`` int32 ids between the suffix and the target, left-padded (``Pa`` may be
        0; when ``Pa > 0`` every row has >= 1 real token).
      after_mask: ``[B, Pa]`` 0/1.
      target: ``[B, Tt]`` int32 target (or refusal) ids, right-padded (>= 1 real token).
      target_mask: ``[B, Tt]`` 0/1.
    """

    before: Any
    before_mask: Any
    after: Any
    after_mask: Any
    target: Any
    target_mask: Any


class TextProblem(NamedTuple):
    """One call of a suffix attack, normalised (every field traced, shapes static).

    Attributes:
      batch: the :class:`TextBatch`.
      mask: ``[B, M]`` float32, the members the objective covers (the uncovered ones).
      allowed: ``[V]`` bool, the token ids a suffix may use.
      cap: ``[B]`` int32 query cap (``queries.NO_CAP``: none).
      key: PRNG key of the call (required).
      sample_ids: ``[B]`` int32; sample ``b`` draws from ``fold_in(key, sample_ids[b])``.
      suffix_init: ``[B, Ls]`` int32 start suffix, right-aligned (slots before the last
        ``init_len`` are ignored).
      init_len: ``[B]`` int32 real tokens of the start suffix (GCG: ``Ls``; BEAST: 0 unless seeded).
      texts: optional :class:`SlotTexts`, the rendered text around each request's suffix slot as
        UTF-8 bytes (read by a search that scores the ids of the text that is sent,
        :class:`Retokenizer`); None: each block's ids decoded on the host.
    """

    batch: TextBatch
    mask: Any
    allowed: Any
    cap: Any
    key: Any
    sample_ids: Any
    suffix_init: Any
    init_len: Any
    texts: Any = None


class SlotTexts(NamedTuple):
    """The text before and after each request's suffix slot, as traced UTF-8 bytes (build with
    :func:`slot_text_bytes`).

    Attributes:
      before: ``[B, Lb]`` uint8, zero-padded on the right; before_len: ``[B]`` int32 bytes.
      after: ``[B, La]`` uint8 (``La >= 1``); after_len: ``[B]`` int32 bytes.
    """

    before: Any
    before_len: Any
    after: Any
    after_len: Any


def row(batch: TextBatch, b) -> TextBatch:
    """Request ``b`` of a batch (every field indexed on its leading axis)."""
    return TextBatch(*(a[b] for a in batch))


def suffix_mask(ls: int, n):
    """``[Ls]`` int32 mask of a right-aligned suffix of ``n`` tokens."""
    return (jnp.arange(ls) >= ls - n).astype(jnp.int32)


def assemble(r: TextBatch, suffix, smask):
    """``before | suffix | after`` of one request: ids ``[T]``, mask ``[T]`` int32."""
    ids = jnp.concatenate([r.before, suffix, r.after]).astype(jnp.int32)
    mask = jnp.concatenate([r.before_mask, smask, r.after_mask]).astype(jnp.int32)
    return ids, mask


def sample_keys(problem: TextProblem):
    """``[B]`` keys ``fold_in(key, sample_id)``."""
    return jax.vmap(lambda s: jax.random.fold_in(problem.key, s))(problem.sample_ids.astype(jnp.uint32))


def text_batch(
    before: Sequence[Sequence[int]], after: Sequence[Sequence[int]], target: Sequence[Sequence[int]], pad_id: int = 0
) -> TextBatch:
    """Pads token-id lists into a :class:`TextBatch` (host side).

    Args:
      before: B lists of ids before the suffix (>= 1 each).
      after: B lists of ids after it (all empty, or >= 1 each).
      target: B lists of target ids (>= 1 each).
      pad_id: id of padding slots (never attended).

    Raises:
      ValueError: lengths differ, or a block is empty where it may not be (naming the row).
    """
    if not (len(before) == len(after) == len(target)) or len(before) == 0:
        raise ValueError(
            f"text_batch: before/after/target must have the same B >= 1 rows, got {len(before)}, {len(after)}, {len(target)}"
        )
    for name, seqs in (("before", before), ("target", target)):
        empty = [i for i, s in enumerate(seqs) if len(s) == 0]
        if empty:
            raise ValueError(f"text_batch: {name} rows {empty} are empty (each needs >= 1 token)")
    la = [len(s) for s in after]
    if max(la) > 0 and min(la) == 0:
        raise ValueError(
            f"text_batch: after rows {[i for i, n in enumerate(la) if n == 0]} are empty while others are not"
        )

    def pad(seqs, left):
        n = max(len(s) for s in seqs)
        ids = np.full((len(seqs), n), pad_id, np.int32)
        mask = np.zeros((len(seqs), n), np.int32)
        for i, s in enumerate(seqs):
            if len(s):
                sl = slice(n - len(s), n) if left else slice(0, len(s))
                ids[i, sl] = np.asarray(s, np.int32)
                mask[i, sl] = 1
        return ids, mask

    b, bm = pad(before, True)
    a, am = pad(after, True)
    t, tm = pad(target, False)
    return TextBatch(b, bm, a, am, t, tm)


def check_ref_none(name: str, ref) -> None:
    """A token-level call's ``ref`` must be None: the :class:`TextBatch` carries its targets.

    Raises:
      TypeError: another ``ref``.
    """
    if ref is not None:
        raise TypeError(
            f"{name}: ref must be None with a TextBatch (its target rows are the targets; pass TextRequests with "
            f"ref = the target strings to have them rendered), got {type(ref).__name__}"
        )


def check_member_mask(name: str, mask, bsz: int, m: int) -> np.ndarray:
    """The ``[B, M]`` float32 member mask of a call (host side): None (every member), ``[M]`` or
    ``[B, M]``, bool or {0, 1} (the members the objective covers), checked by the one validator
    (:func:`sarjax.attacks.core.validate.check_mask`).

    Raises:
      TypeError: a non-numeric mask. ValueError: a value other than 0 / 1 (NaN included), a shape
        other than ``[M]`` / ``[B, M]``.
    """
    a = check_mask(mask, bsz, m, name=name)
    if a is None:
        return np.ones((bsz, m), np.float32)
    mk = a.astype(np.float32)
    return np.ascontiguousarray(np.broadcast_to(mk[None] if mk.ndim == 1 else mk, (bsz, m)))


def slot_texts(
    tokenizer,
    instructions: Sequence[str],
    *,
    system: str | None = None,
    separator: str = " ",
    chat_template: bool | None = None,
) -> tuple[list[str], list[str]]:
    """``(before [B], after [B])``: the rendered text of each request before and after its suffix
    slot (host side). With a chat template, the user turn ``instruction + separator + suffix``
    rendered with the generation prompt and split at the suffix
    (:func:`~sarjax.models.llm.prompts.split_chat_template`); without one (a base model),
    ``instruction + separator`` before and nothing after.

    Args:
      chat_template: True / False; None: the tokenizer's template when it has one.
    """
    use = getattr(tokenizer, "chat_template", None) is not None if chat_template is None else chat_template
    before, after = [], []
    for instr in instructions:
        if use:
            b, a = split_chat_template(tokenizer, instr, system, separator)
        else:
            b, a = instr + separator, ""
        before.append(b)
        after.append(a)
    return before, after


def request_targets(name: str, ref: Any, default: str | None, bsz: int) -> list[str]:
    """The ``B`` target strings of a text call's ``ref`` (host side): the refusal or target string
    each request's suffix search scores.

    Args:
      name: the caller, for messages.
      ref: one string (every request), ``B`` strings, or None (``default``).
      default: the factory's default target (None: ``ref`` is required).
      bsz: ``B``.

    Raises:
      TypeError: ``ref`` None without a default; ``ref`` neither a string nor a sequence.
      ValueError: ``ref`` not one string or ``B`` strings.
    """
    tgt = default if ref is None else ref
    if tgt is None:
        raise TypeError(f"{name}: ref (the target strings, one or {bsz}) is required with TextRequests")
    if not isinstance(tgt, (str, Sequence)):
        raise TypeError(f"{name}: ref (the target) must be a string or {bsz} strings, got {type(tgt).__name__}")
    targets = [tgt] * bsz if isinstance(tgt, str) else list(tgt)
    if len(targets) != bsz or not all(isinstance(x, str) for x in targets):
        raise ValueError(f"{name}: ref (the target) must be one string or {bsz}, got {len(targets)}")
    return targets


class RenderedRequests(NamedTuple):
    """``B`` requests rendered by one tokenizer (host side; :func:`render_requests`).

    Attributes:
      before, after, target: ``B`` id lists of each block (``before`` and ``target`` >= 1 token
        each; ``after`` all empty or all non-empty).
      before_text, after_text: ``B`` texts around each suffix slot (:func:`slot_texts`).
    """

    before: list
    after: list
    target: list
    before_text: list
    after_text: list


def render_requests(name: str, tokenizer, requests: TextRequests, targets: Sequence[str], where: str = ""):
    """Each request rendered around its suffix slot by ``tokenizer`` (host side): the texts of
    :func:`slot_texts` (the chat template split at the suffix with the requests' system message, or
    ``prompt + " "`` without a template) and the ids of every block, each text tokenized apart.
    The one rendering of the text attacks: the pool searches pad it per stack, the compiled entry
    of a :class:`TextRequests` call pads it with :func:`text_batch`.

    Args:
      name: the caller, for messages; where: a prefix naming the renderer (e.g. a stack).
      tokenizer: the tokenizer (its chat template when ``requests.chat_template``).
      requests: checked :class:`TextRequests` (:func:`text_requests`).
      targets: ``B`` target strings (:func:`request_targets`).

    Returns:
      :class:`RenderedRequests`.

    Raises:
      ValueError: a block that encodes to no token; some requests with a template tail, others
        none; a chat template requested from a tokenizer without one.
    """
    try:
        bt, at = slot_texts(tokenizer, requests.prompts, system=requests.system, chat_template=requests.chat_template)
    except ValueError as e:
        raise ValueError(f"{name}: {where}{e} (TextRequests(..., chat_template=False) renders without one)") from None
    before = [encode_text(tokenizer, x) for x in bt]
    after = [encode_text(tokenizer, x) for x in at]
    target = [encode_text(tokenizer, x) for x in targets]
    for what, seqs in (("before", before), ("target", target)):
        if any(len(q) == 0 for q in seqs):
            raise ValueError(f"{name}: {where}a request's {what} block encodes to no token")
    if any(len(q) == 0 for q in after) and any(len(q) for q in after):
        raise ValueError(f"{name}: {where}some requests have a template tail, others none")
    return RenderedRequests(before, after, target, bt, at)


def slot_text_bytes(before: Sequence[str], after: Sequence[str]) -> SlotTexts:
    """The :class:`SlotTexts` of ``B`` before / after texts (host side): UTF-8 bytes, zero-padded."""

    def enc(xs):
        bs = [x.encode("utf-8") for x in xs]
        out = np.zeros((len(bs), max(1, max(map(len, bs), default=0))), np.uint8)
        for i, b in enumerate(bs):
            out[i, : len(b)] = np.frombuffer(b, np.uint8)
        return out, np.asarray([len(b) for b in bs], np.int32)

    b, bl = enc(before)
    a, al = enc(after)
    return SlotTexts(b, bl, a, al)


__all__ = [
    "RenderedRequests",
    "SlotTexts",
    "TextBatch",
    "TextProblem",
    "TextRequests",
    "assemble",
    "check_member_mask",
    "check_ref_none",
    "render_requests",
    "request_targets",
    "row",
    "sample_keys",
    "slot_text_bytes",
    "slot_texts",
    "suffix_mask",
    "text_batch",
    "text_requests",
]
