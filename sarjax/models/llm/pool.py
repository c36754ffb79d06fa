"""Pools of LLMs: members of equal architecture and shapes stacked on a leading axis.

A ``LLMStack`` is one architecture (one ``DecoderConfig``, one tokenizer) with its
members' parameters stacked on ``[M_s, ...]``; an ``LLMPool`` is a tuple of stacks,
members named and ordered stack by stack. Stacks may use different tokenizers:
text is the exchange format between stacks (``pool_target_nll_text``).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.models.llm.config import DecoderConfig
from sarjax.models.llm.scoring import stack_target_nll


@dataclasses.dataclass
class LLMStack:
    """Members of one architecture.

    Attributes:
      cfg: shared configuration.
      params: stacked parameter tree, leading axis [M_s].
      names: member names, length M_s.
      tokenizer: shared tokenizer (or None for id-only use).
    """

    cfg: DecoderConfig
    params: Any
    names: tuple[str, ...]
    tokenizer: Any = None

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


def build_pool(members: Sequence[tuple[str, DecoderConfig, Any, Any]]) -> LLMPool:
    """Groups members into stacks by (config, shapes/dtypes, tokenizer) and stacks them.

    Args:
      members: sequence of ``(name, cfg, params, tokenizer)``; ``tokenizer`` may be None.

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
    for name, cfg, params, tok in members:
        if not isinstance(cfg, DecoderConfig):
            raise TypeError(f"member {name!r}: expected a DecoderConfig, got {type(cfg).__name__}")
        key = (cfg, _shape_key(params), tokenizer_fingerprint(tok))
        groups.setdefault(key, []).append((name, params, tok))
    stacks = []
    for (cfg, _, _), items in groups.items():
        stacks.append(LLMStack(cfg, stack_params([p for _, p, _ in items]), tuple(n for n, _, _ in items), items[0][2]))
    return LLMPool(tuple(stacks))


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
