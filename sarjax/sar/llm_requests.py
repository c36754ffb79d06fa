"""Requests and pools of sarjax decoders for LLM SAR: the requests' token blocks around the suffix
slot (:func:`behavior_batch`, :func:`clean_prompt_ids`), pools from Hugging Face checkpoint folders
(:func:`load_llm_pool`, :func:`pool_digest`) and BEAST's sampled warm start (:func:`sampled_seed_fn`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from sarjax.attacks.text.requests import slot_texts, text_batch
from sarjax.models.llm.loader import check_tokenizer_vocab, load_model
from sarjax.models.llm.pool import LLMPool, LLMStack, build_pool, left_pad, pool_generate_text, tokenizer_fingerprint
from sarjax.models.llm.prompts import encode_text, load_tokenizer
from sarjax.runtime import fingerprint as fingerprints

# ---------------------------------------------------------------------------------------------
# requests and pools of sarjax decoders


def request_blocks(
    tokenizer: Any, behaviors: Sequence[str], system: str | None = None, separator: str = " "
) -> tuple[list[list[int]], list[list[int]]]:
    """``(before, after)`` id lists of each request around the suffix slot: the texts of
    :func:`~sarjax.attacks.text.requests.slot_texts` (the chat template split at the suffix; without a
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
    """The :class:`~sarjax.attacks.text.requests.TextBatch` of requests (suffix slot after each request).

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
    before, after = request_blocks(tokenizer, behaviors, system, separator)
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
        one, texts, max_new_tokens=int(max_new_tokens), key=key, chat_template=chat_template,
        sample_ids=np.arange(len(texts)),
    )[0]  # fmt: skip
    table = {r: out[i * k : (i + 1) * k] for i, r in enumerate(reqs)}

    def seed_fn(request: str) -> list[str]:
        if request not in table:
            raise ValueError(f"sampled_seed_fn: no seeds were sampled for the request {request!r}")
        return list(table[request])

    return seed_fn


__all__ = ["behavior_batch", "request_blocks", "clean_prompt_ids", "load_llm_pool", "pool_digest", "sampled_seed_fn"]
