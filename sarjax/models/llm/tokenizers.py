"""A tiny word-level Hugging Face fast tokenizer built offline from a token list.

Tests and the offline demo (``sarjax llm-demo``) need a real ``PreTrainedTokenizerFast`` (chat
template, special tokens, ``save_pretrained``) without downloading one from a model hub.
:func:`word_level_tokenizer` builds one: every token is one id, text is split on whitespace
(optionally on punctuation too), and decoding joins tokens with spaces, so ids decode to text that
re-encodes to the same ids whenever no token is unknown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SPLITS = ("whitespace_split", "whitespace")


@dataclass(frozen=True)
class WordLevelOptions:
    """How a :func:`word_level_tokenizer` normalizes, splits and decodes text.

    Attributes:
      lowercase: lower-case the text before splitting (a ``Lowercase`` normalizer); default none.
      split: ``"whitespace_split"`` splits on whitespace only (``"x."`` is one piece, unknown
        unless it is a token); ``"whitespace"`` also splits punctuation from words (the regex
        ``\\w+|[^\\w\\s]+``).
      cleanup: the WordPiece decoder's clean-up (True: ``"x ."`` decodes to ``"x."``, ``"i ' m"``
        to ``"i'm"``; False: the tokens joined by spaces, so decode -> encode round-trips).
      clean_up_tokenization_spaces: passed to ``PreTrainedTokenizerFast`` when not None (it is
        then saved in ``tokenizer_config.json``); None keeps transformers' default.

    Raises:
      ValueError: ``split`` not one of ``"whitespace_split"`` / ``"whitespace"``; a flag that is
        not a bool (``clean_up_tokenization_spaces``: a bool or None), naming the field and value.
    """

    lowercase: bool = False
    split: str = "whitespace_split"
    cleanup: bool = True
    clean_up_tokenization_spaces: bool | None = None

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"WordLevelOptions.split must be one of {SPLITS}, got {self.split!r}")
        for name in ("lowercase", "cleanup", "clean_up_tokenization_spaces"):
            v = getattr(self, name)
            if not isinstance(v, bool) and not (v is None and name == "clean_up_tokenization_spaces"):
                raise ValueError(f"WordLevelOptions.{name} must be a bool, got {v!r}")


def word_level_tokenizer(
    tokens: Sequence[str],
    *,
    unk: str = "<unk>",
    bos: str | None = None,
    eos: str | None = None,
    pad: str | None = None,
    extra_special: Sequence[str] = (),
    chat_template: str | None = None,
    options: WordLevelOptions | None = None,
) -> Any:
    """A word-level ``transformers.PreTrainedTokenizerFast`` over ``tokens``, built offline.

    For tests and demos that need a real fast tokenizer (encode / decode, special tokens, chat
    templates, ``save_pretrained``) without a model hub or a download. The ``tokenizers`` model is
    ``WordLevel``: a text maps to the ids of its pieces, a piece not in ``tokens`` to ``unk``'s id.
    Decoding is the WordPiece decoder with prefix ``"##"`` (no token carries it), which joins the
    tokens with single spaces.

    Args:
      tokens: the full ordered token list, special tokens included (callers put them first). Ids
        follow first occurrence; later duplicates are dropped (as ``dict.fromkeys``).
      unk: the unknown token (must be in ``tokens``).
      bos, eos, pad: the begin / end / padding tokens, or None for none (each must be in
        ``tokens``). None leaves the argument out of the ``PreTrainedTokenizerFast`` call.
      extra_special: further special tokens (``additional_special_tokens``, e.g. ``"[INST]"``);
        each must be in ``tokens``. Empty leaves the argument out.
      chat_template: the jinja chat template, or None for none.
      options: how text is normalized, split and decoded (:class:`WordLevelOptions`; default
        None: ``WordLevelOptions()``, case kept, whitespace split, decoder clean-up on).

    Returns:
      The ``PreTrainedTokenizerFast``.

    Raises:
      TypeError: ``tokens`` is a single string, a token is not a string, or ``options`` is not a
        :class:`WordLevelOptions`.
      ValueError: ``tokens`` is empty, or ``unk`` or a special token is not in ``tokens``.
    """
    if isinstance(tokens, str):
        raise TypeError(f"word_level_tokenizer: tokens must be a sequence of strings, got the string {tokens!r}")
    tokens = list(tokens)
    bad = [t for t in tokens if not isinstance(t, str)]
    if bad:
        raise TypeError(f"word_level_tokenizer: every token must be a str, got {bad[:3]!r}")
    if not tokens:
        raise ValueError("word_level_tokenizer: expected at least one token, got an empty token list")
    if options is None:
        options = WordLevelOptions()
    if not isinstance(options, WordLevelOptions):
        raise TypeError(
            f"word_level_tokenizer: options must be a WordLevelOptions or None, got {type(options).__name__}"
        )
    vocab = {t: i for i, t in enumerate(dict.fromkeys(tokens))}
    specials = {"unk": unk, "bos": bos, "eos": eos, "pad": pad}
    specials.update({f"extra_special[{i}]": t for i, t in enumerate(extra_special)})
    missing = [f"{name}={t!r}" for name, t in specials.items() if t is not None and t not in vocab]
    if missing:
        raise ValueError(f"word_level_tokenizer: special tokens not in tokens: {', '.join(missing)}")

    # heavy optional dependencies (tokenizers, transformers), imported only to build the tokenizer
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=unk))
    if options.lowercase:
        tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = (
        pre_tokenizers.WhitespaceSplit() if options.split == "whitespace_split" else pre_tokenizers.Whitespace()
    )
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=options.cleanup)  # joins tokens with spaces
    kwargs: dict[str, Any] = {"unk_token": unk}
    kwargs.update({f"{name}_token": t for name, t in (("bos", bos), ("eos", eos), ("pad", pad)) if t is not None})
    if extra_special:
        kwargs["additional_special_tokens"] = list(extra_special)
    if options.clean_up_tokenization_spaces is not None:
        kwargs["clean_up_tokenization_spaces"] = options.clean_up_tokenization_spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs)
    if chat_template is not None:
        fast.chat_template = chat_template
    return fast


__all__ = ["WordLevelOptions", "word_level_tokenizer"]
