"""Tokenizers, chat templates and exact prompt / suffix / target token slices.

transformers provides the tokenizer and the chat template (jinja2); sarjax renders
the user turn with a placeholder where the adversarial suffix goes, splits the
rendered text around it and tokenizes the pieces separately, so the slices of
the prompt, the suffix and the target are exact by construction. Whether the
concatenated ids survive a decode -> encode round trip (GCG's candidate filter)
is checked by ``retokenizes``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from sarjax.models.llm.loader import check_tokenizer_files

PLACEHOLDER = "\u2063SARJAX_SUFFIX\u2063"


def load_tokenizer(path: str, **kwargs):
    """``AutoTokenizer.from_pretrained(path, local_files_only=True)``: never downloads.

    A local folder without tokenizer files raises ValueError naming it and the files expected
    (:func:`sarjax.models.llm.loader.check_tokenizer_files`)."""
    from transformers import AutoTokenizer  # heavy (about 3 s): imported only to load a tokenizer

    if os.path.isdir(path):
        check_tokenizer_files(path)
    return AutoTokenizer.from_pretrained(path, local_files_only=True, **kwargs)


@dataclasses.dataclass(frozen=True)
class PromptSlices:
    """Token ids of ``before + suffix + after + target`` and the slice of each part.

    Attributes:
      ids: [T] int32 all ids.
      before: chat template + system + instruction (up to the suffix).
      suffix: the adversarial suffix.
      after: end of the user turn and the assistant header.
      target: the target continuation.
    """

    ids: np.ndarray
    before: slice
    suffix: slice
    after: slice
    target: slice

    @property
    def prompt(self) -> slice:
        """Everything the model reads before the target."""
        return slice(0, self.target.start)


def split_chat_template(
    tokenizer,
    instruction: str,
    system: str | None = None,
    separator: str = " ",
) -> tuple[str, str]:
    """Renders the chat template around the suffix position.

    Args:
      tokenizer: a transformers tokenizer with a chat template.
      instruction: the user request (e.g. a HarmBench behavior).
      system: optional system message.
      separator: text between the instruction and the suffix.

    Returns:
      (before, after): rendered text before and after the suffix, with the
      generation prompt (assistant header) at the end of ``after``.

    Raises:
      ValueError: the tokenizer has no chat template, or the template does not
        reproduce the user message verbatim.
    """
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("the tokenizer has no chat_template; set tokenizer.chat_template first")
    msgs = [] if system is None else [{"role": "system", "content": system}]
    msgs.append({"role": "user", "content": instruction + separator + PLACEHOLDER})
    text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    if text.count(PLACEHOLDER) != 1:
        raise ValueError(
            f"expected the chat template to render the user message once, verbatim; found "
            f"{text.count(PLACEHOLDER)} suffix placeholders"
        )
    before, after = text.split(PLACEHOLDER)
    return before, after


def encode_text(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def build_prompt(
    tokenizer,
    instruction: str,
    suffix: str | Sequence[int],
    target: str | Sequence[int] = "",
    system: str | None = None,
    separator: str = " ",
    use_chat_template: bool = True,
) -> PromptSlices:
    """Token ids and exact slices of ``template(instruction + suffix) + target``.

    The pieces are tokenized separately (no special tokens added; a BOS written by
    the template text is kept), so every slice is exact. Use ``retokenizes`` to check
    that the concatenation is also what the tokenizer would produce from the text.

    Args:
      tokenizer: transformers tokenizer.
      instruction: user request.
      suffix: adversarial suffix, as text or as token ids.
      target: target continuation (text or ids), e.g. "Sure, here is ...".
      system: optional system message.
      separator: text between instruction and suffix.
      use_chat_template: False for base models: before = instruction + separator, after = "".

    Returns:
      PromptSlices.
    """
    if use_chat_template:
        before, after = split_chat_template(tokenizer, instruction, system, separator)
    else:
        before, after = instruction + separator, ""
    b = encode_text(tokenizer, before)
    s = encode_text(tokenizer, suffix) if isinstance(suffix, str) else [int(t) for t in suffix]
    a = encode_text(tokenizer, after)
    t = encode_text(tokenizer, target) if isinstance(target, str) else [int(x) for x in target]
    ids = np.asarray(b + s + a + t, np.int32)
    i1, i2, i3 = len(b), len(b) + len(s), len(b) + len(s) + len(a)
    return PromptSlices(ids, slice(0, i1), slice(i1, i2), slice(i2, i3), slice(i3, len(ids)))


def retokenizes(tokenizer, ids: Sequence[int]) -> bool:
    """True when ``encode(decode(ids)) == ids`` (no special tokens added).

    GCG keeps only candidate suffixes that pass this check, so that the attacked
    token sequence is what a user typing the text would send.
    """
    ids = [int(i) for i in ids]
    text = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return encode_text(tokenizer, text) == ids


def retokenization_mask(tokenizer, batch: Any) -> np.ndarray:
    """``retokenizes`` for every row of a [N, T] id array (or list of lists) -> [N] bool."""
    return np.asarray([retokenizes(tokenizer, row) for row in batch], bool)
