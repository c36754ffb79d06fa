"""Pools of LLMs: members of equal architecture and shapes stacked on a leading axis.

A ``LLMStack`` is one architecture (one ``DecoderConfig``, one tokenizer) with its
members' parameters stacked on ``[M_s, ...]``; an ``LLMPool`` is a tuple of stacks,
members named and ordered stack by stack. Stacks may use different tokenizers:
text is the exchange format between stacks (``pool_target_nll_text``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.models.llm import generate
from sarjax.models.llm.config import DecoderConfig
from sarjax.models.llm.loader import check_tokenizer_vocab, load_model
from sarjax.models.llm.prompts import load_tokenizer
from sarjax.models.llm.scoring import stack_target_nll


@dataclasses.dataclass(frozen=True)
class GenerationDefaults:
    """The decoding defaults of a checkpoint (its ``generation_config.json``).

    Attributes:
      eos_token_id: end tokens (the list form of Llama-3 / Qwen2.5 configs), or None.
      pad_token_id: padding / filler id, or None.
      max_new_tokens: or None.
      do_sample: the checkpoint's sampling flag (informational: sarjax decodes greedily unless a
        call asks for sampling, as the SAR paper judges deterministic decoding).
      temperature: 1.0 when unset (transformers' ``GenerationConfig`` default).
      top_k: 50 when unset (transformers' default).
      top_p: 1.0 when unset (transformers' default).
    """

    eos_token_id: tuple[int, ...] | None = None
    pad_token_id: int | None = None
    max_new_tokens: int | None = None
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0


def generation_defaults(raw: dict[str, Any] | None) -> GenerationDefaults:
    """A :class:`GenerationDefaults` from a parsed ``generation_config.json`` (None: the defaults).

    Raises:
      TypeError: ``raw`` is not a dict, or a field has the wrong type (named).
    """
    if raw is None:
        return GenerationDefaults()
    if not isinstance(raw, dict):
        raise TypeError(f"generation config: expected a dict, got {type(raw).__name__}")

    def opt(name, conv, default=None):
        v = raw.get(name)
        if v is None:
            return default
        try:
            return conv(v)
        except (TypeError, ValueError):
            raise TypeError(f"generation config field {name!r}: cannot read {v!r}") from None

    eos = raw.get("eos_token_id")
    if eos is not None:
        eos = tuple(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]))
    return GenerationDefaults(
        eos_token_id=eos or None,
        pad_token_id=opt("pad_token_id", int),
        max_new_tokens=opt("max_new_tokens", int),
        do_sample=bool(raw.get("do_sample", False)),
        temperature=opt("temperature", float, 1.0),
        top_k=opt("top_k", int, 50),
        top_p=opt("top_p", float, 1.0),
    )


def load_generation_config(path: str) -> GenerationDefaults:
    """Reads ``<path>/generation_config.json`` (plain JSON; no transformers); a folder without
    one gets the defaults, with the end token of ``config.json`` when it names one (what
    transformers falls back to)."""
    f = os.path.join(path, "generation_config.json")
    if os.path.isfile(f):
        with open(f) as fh:
            return generation_defaults(json.load(fh))
    c = os.path.join(path, "config.json")
    raw = {}
    if os.path.isfile(c):
        with open(c) as fh:
            cj = json.load(fh)
        raw = {k: cj[k] for k in ("eos_token_id", "pad_token_id") if cj.get(k) is not None}
    return generation_defaults(raw)


@dataclasses.dataclass
class LLMStack:
    """Members of one architecture.

    Attributes:
      cfg: shared configuration.
      params: stacked parameter tree, leading axis [M_s].
      names: member names, length M_s.
      tokenizer: shared tokenizer (or None for id-only use).
      generation: the members' decoding defaults (``generation_config.json``), or None.
    """

    cfg: DecoderConfig
    params: Any
    names: tuple[str, ...]
    tokenizer: Any = None
    generation: GenerationDefaults | None = None

    @property
    def size(self) -> int:
        return len(self.names)


@dataclasses.dataclass
class LLMPool:
    """A tuple of stacks; member order is stack by stack."""

    stacks: tuple[LLMStack, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for s in self.stacks for n in s.names)

    @property
    def size(self) -> int:
        return len(self.names)


def tokenizer_fingerprint(tokenizer) -> str | None:
    """A hash of a tokenizer's vocabulary, special tokens and chat template (None for None)."""
    if tokenizer is None:
        return None
    h = hashlib.sha256()
    for tok, i in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
        h.update(f"{i}:{tok}\n".encode())
    h.update(repr(getattr(tokenizer, "all_special_tokens", None)).encode())
    h.update(repr(getattr(tokenizer, "chat_template", None)).encode())
    return h.hexdigest()


def _shape_key(params) -> tuple:
    leaves, tree = jax.tree_util.tree_flatten(params)
    return (str(tree),) + tuple(
        (tuple(np.shape(x)), str(x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype)) for x in leaves
    )


def stack_params(members: Sequence[Any]):
    """Stacks parameter trees of equal structure on a new leading axis [M]."""
    if not members:
        raise ValueError("expected at least one member parameter tree, got none")
    keys = {_shape_key(m) for m in members}
    if len(keys) != 1:
        raise ValueError("members to stack must have identical tree structure, shapes and dtypes")
    return jax.tree.map(lambda *xs: jnp.stack(xs), *members)


def unstack_params(params, m: int):
    """Member ``m`` of a stacked parameter tree."""
    return jax.tree.map(lambda x: x[m], params)


def build_pool(members: Sequence[tuple]) -> LLMPool:
    """Groups members into stacks by (config, shapes/dtypes, tokenizer, generation defaults) and
    stacks them.

    Args:
      members: sequence of ``(name, cfg, params, tokenizer)`` or ``(name, cfg, params, tokenizer,
        generation)``; ``tokenizer`` and ``generation`` (a :class:`GenerationDefaults`) may be None.

    Returns:
      The pool; stacks are ordered by first appearance, members within a stack
      keep their input order.

    Raises:
      ValueError: duplicate names or an empty list.
      TypeError: ``cfg`` is not a ``DecoderConfig``.
    """
    if not members:
        raise ValueError("expected at least one member, got none")
    names = [m[0] for m in members]
    if len(set(names)) != len(names):
        raise ValueError(f"member names must be unique, got {names}")
    groups: dict[tuple, list] = {}
    for member in members:
        if len(member) not in (4, 5):
            raise ValueError(f"expected (name, cfg, params, tokenizer[, generation]) tuples, got {len(member)} fields")
        name, cfg, params, tok = member[:4]
        gen = member[4] if len(member) == 5 else None
        if not isinstance(cfg, DecoderConfig):
            raise TypeError(f"member {name!r}: expected a DecoderConfig, got {type(cfg).__name__}")
        if gen is not None and not isinstance(gen, GenerationDefaults):
            raise TypeError(f"member {name!r}: expected GenerationDefaults or None, got {type(gen).__name__}")
        key = (cfg, _shape_key(params), tokenizer_fingerprint(tok), gen)
        groups.setdefault(key, []).append((name, params, tok))
    stacks = []
    for (cfg, _, _, gen), items in groups.items():
        params = stack_params([p for _, p, _ in items])
        stacks.append(LLMStack(cfg, params, tuple(n for n, _, _ in items), items[0][2], gen))
    return LLMPool(tuple(stacks))


def load_pool(paths: Sequence[str], names: Sequence[str] | None = None, dtype: str = "float32") -> LLMPool:
    """A pool from local Hugging Face checkpoint folders (weights, tokenizer, generation config).

    Args:
      paths: checkpoint folders (``config.json``, safetensors, tokenizer files; optionally
        ``generation_config.json``).
      names: member names (default: the folder names).
      dtype: ``"float32"`` or ``"bfloat16"``.

    Returns:
      The pool (members with equal configs, shapes, tokenizers and generation defaults share a
      stack).

    Raises:
      ValueError: ``names`` of another length than ``paths``, duplicate names, a folder without
        tokenizer files (named, with the files expected), or a tokenizer with more tokens than the
        model's vocabulary (naming the member and both sizes).
    """
    paths = list(paths)
    names = [os.path.basename(os.path.normpath(p)) for p in paths] if names is None else list(names)
    if len(names) != len(paths):
        raise ValueError(f"load_pool: expected one name per path ({len(paths)}), got {len(names)}")
    members = []
    for name, p in zip(names, paths, strict=True):
        cfg, params = load_model(p, dtype)
        tok = load_tokenizer(p)
        check_tokenizer_vocab(tok, cfg, name, p)
        members.append((name, cfg, params, tok, load_generation_config(p)))
    return build_pool(members)


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int = 0, length: int | None = None):
    """Left-pads token lists: returns (ids [N, T] int32, mask [N, T] int32).

    Args:
      seqs: N token-id lists.
      pad_id: filler id.
      length: T (default: the longest sequence); fixed lengths avoid recompiles.
    """
    n = max((len(s) for s in seqs), default=0)
    t = n if length is None else length
    if t < n:
        raise ValueError(f"length={length} is shorter than the longest sequence ({n})")
    ids = np.full((len(seqs), t), pad_id, np.int32)
    mask = np.zeros((len(seqs), t), np.int32)
    for i, s in enumerate(seqs):
        if len(s):
            ids[i, t - len(s) :] = s
            mask[i, t - len(s) :] = 1
    return ids, mask


def pool_target_nll_text(pool: LLMPool, prompts: Sequence[str], target: str, reduce: str = "mean") -> np.ndarray:
    """Target NLL of text prompts for every member of a pool (text is the exchange format).

    Each stack tokenizes the prompts and the target with its own tokenizer (no
    special tokens added; render chat templates beforehand), then scores them in
    one compiled call per stack.

    Args:
      pool: the pool; every stack needs a tokenizer.
      prompts: N prompt strings.
      target: the target continuation.
      reduce: ``"mean"`` or ``"sum"`` over target tokens.

    Returns:
      [M, N] float32 numpy array, members in ``pool.names`` order.
    """
    if reduce not in ("mean", "sum"):
        raise ValueError(f"reduce must be 'mean' or 'sum', got {reduce!r}")
    out = []
    for s in pool.stacks:
        if s.tokenizer is None:
            raise ValueError(f"stack {s.names} has no tokenizer; text scoring needs one")
        enc = [s.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        tgt = s.tokenizer(target, add_special_tokens=False)["input_ids"]
        pad = s.tokenizer.pad_token_id if s.tokenizer.pad_token_id is not None else 0
        ids, mask = left_pad(enc, pad)
        nll = np.asarray(stack_target_nll(s.params, s.cfg, ids, mask, np.asarray(tgt, np.int32)))
        out.append(nll.mean(-1) if reduce == "mean" else nll.sum(-1))
    return np.concatenate(out, axis=0)


def render_requests(tokenizer, requests: Sequence[Any], system: str | None = None, chat_template: bool = True):
    """Token ids of each request as the model reads it (no special tokens added: a BOS the chat
    template writes is kept, as in ``apply_chat_template(..., tokenize=True)``).

    Args:
      tokenizer: a transformers tokenizer.
      requests: N user requests (strings) or conversations (lists of ``{"role", "content"}``).
      system: optional system message before a string request.
      chat_template: render with the tokenizer's chat template and the generation prompt (the
        assistant header); False: the raw text (base models).

    Returns:
      N id lists.

    Raises:
      ValueError: ``chat_template`` without a template on the tokenizer, or an empty rendering.
      TypeError: a request that is neither a string nor a list of messages.
    """
    if chat_template and getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("the tokenizer has no chat_template; set one or pass chat_template=False")
    out = []
    for i, req in enumerate(requests):
        if isinstance(req, str):
            msgs = ([] if system is None else [{"role": "system", "content": system}]) + [
                {"role": "user", "content": req}
            ]
        elif isinstance(req, (list, tuple)) and all(isinstance(m, dict) for m in req):
            msgs = list(req)
        else:
            raise TypeError(f"request {i}: expected a string or a list of message dicts, got {type(req).__name__}")
        if chat_template:
            text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        else:
            text = "\n".join(m["content"] for m in msgs)
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        if not ids:
            raise ValueError(f"request {i}: renders to no tokens")
        out.append(ids)
    return out


def stack_decoding(stack: LLMStack) -> tuple[tuple[int, ...] | None, int]:
    """``(end tokens, pad id)`` a stack decodes with: ``generation_config.json``'s ``eos_token_id``
    (else the tokenizer's end token), its ``pad_token_id`` (else the tokenizer's, else the first
    end token, else 0)."""
    gen = stack.generation or GenerationDefaults()
    tok = stack.tokenizer
    eos = gen.eos_token_id
    if eos is None and tok is not None and tok.eos_token_id is not None:
        eos = (int(tok.eos_token_id),)
    pad = gen.pad_token_id
    if pad is None and tok is not None and tok.pad_token_id is not None:
        pad = int(tok.pad_token_id)
    if pad is None:
        pad = eos[0] if eos else 0
    return eos, int(pad)


def pool_generate_text(
    pool: LLMPool,
    requests: Sequence[Any],
    *,
    max_new_tokens: int | None = None,
    key=None,
    sampling: generate.SamplingConfig | None = None,
    system: str | None = None,
    chat_template: bool = True,
    sample_ids=None,
    pad_to_multiple: int = 16,
) -> list[list[str]]:
    """Text in, text out for every member of a pool: chat template, batching, left padding,
    decoding (greedy by default) and detokenization, one compiled call per stack.

    Each stack renders the requests with its own tokenizer and chat template
    (:func:`render_requests`), decodes with the end tokens and pad id of its
    ``generation_config.json`` (:func:`stack_decoding`), cuts each response at its first end
    token and decodes it without special tokens.

    Args:
      pool: the pool; every stack needs a tokenizer.
      requests: N user requests (strings) or conversations (lists of message dicts).
      max_new_tokens: tokens to generate (default: the stack's ``generation_config.json``
        ``max_new_tokens``, else 32).
      key: None (default): greedy decoding, deterministic (the SAR paper judges greedy decoding;
        a checkpoint's ``do_sample`` is not followed). A PRNG key: sampled decoding; member ``m``
        (its index in ``pool.names``) of request ``n`` draws from
        ``fold_in(fold_in(key, sample_ids[n]), m)``.
      sampling: with a key, the :class:`~sarjax.models.llm.generate.SamplingConfig` whose
        temperature, top_k and top_p every stack samples with (default None: each stack's
        generation config, else transformers' defaults 1.0 / 50 / 1.0). Its ``eos_id`` and
        ``pad_id`` must stay None / 0: each stack decodes with its own (:func:`stack_decoding`).
      system: optional system message for string requests.
      chat_template: False for base models (raw text).
      sample_ids: [N] non-negative ints (default ``arange(N)``).
      pad_to_multiple: prompts are left-padded to a multiple of this length, so that batches of
        similar lengths share one compiled kernel.

    Returns:
      ``[M][N]`` response strings, members in ``pool.names`` order.

    Raises:
      TypeError: ``sampling`` without a key, or not a :class:`~sarjax.models.llm.generate.SamplingConfig`.
      ValueError / TypeError: a stack without a tokenizer, ``sampling`` naming end tokens / a pad
        id, and the errors of :func:`render_requests` and the decoders.
    """

    if sampling is not None:
        if not isinstance(sampling, generate.SamplingConfig):
            raise TypeError(
                f"pool_generate_text: sampling must be a SamplingConfig or None, got {type(sampling).__name__}"
            )
        if key is None:
            raise TypeError("pool_generate_text: sampling needs a key (a jax.random key); no key: greedy decoding")
        if sampling.eos_id is not None or sampling.pad_id != 0:
            raise ValueError(
                "pool_generate_text: each stack decodes with its own end tokens and pad id (stack_decoding); "
                f"sampling must leave eos_id / pad_id unset, got eos_id={sampling.eos_id!r}, pad_id={sampling.pad_id!r}"
            )
    if len(requests) == 0:
        raise ValueError("pool_generate_text: expected at least one request")
    if pad_to_multiple < 1:
        raise ValueError(f"pad_to_multiple: expected an int >= 1, got {pad_to_multiple!r}")
    out: list[list[str]] = []
    offset = 0
    for s in pool.stacks:
        tok = s.tokenizer
        if tok is None:
            raise ValueError(f"stack {s.names} has no tokenizer; text generation needs one")
        gen = s.generation or GenerationDefaults()
        eos, pad = stack_decoding(s)
        n_new = int(max_new_tokens or gen.max_new_tokens or 32)
        enc = render_requests(tok, requests, system, chat_template)
        longest = max(len(e) for e in enc)
        ids, mask = left_pad(enc, pad, length=-(-longest // pad_to_multiple) * pad_to_multiple)
        eos_ids = list(eos) if eos else None
        if key is not None:
            t, k, p = (gen.temperature, gen.top_k, gen.top_p) if sampling is None else sampling[:3]
            toks = generate.stack_sample_generate(
                s.params, s.cfg, ids, mask, n_new, key=key, sample_ids=sample_ids,
                member_ids=np.arange(offset, offset + s.size), sampling=generate.SamplingConfig(t, k, p, eos_ids, pad),
            )  # fmt: skip
        else:
            toks = generate.stack_greedy_generate(s.params, s.cfg, ids, mask, n_new, eos_id=eos_ids, pad_id=pad)
        toks = np.asarray(toks)
        ends = set(eos or ())
        for m in range(s.size):
            texts = []
            for row in toks[m].tolist():
                cut = next((i for i, t in enumerate(row) if t in ends), len(row))
                texts.append(tok.decode(row[:cut], skip_special_tokens=True))
            out.append(texts)
        offset += s.size
    return out
