"""The settings of the LLM SAR pipelines (:func:`sarjax.sar.run_llm_sar`, :func:`sarjax.sar.pool_llm_sar`).

Frozen dataclasses, checked when built (a bad value raises naming the field and the value):

- :class:`LLMSARSettings`: how :func:`~sarjax.sar.run_llm_sar` runs (calls per round, the
  per-member ASR, checkpointing, progress);
- :class:`PoolLLMSARSettings`: how :func:`~sarjax.sar.pool_llm_sar` runs and judges (response
  length, system message, the per-member ASR, output directory, progress);
- :class:`LLMAttackSpec`: which text attack :func:`~sarjax.sar.pool_llm_sar` builds through its
  pool adapter (:data:`~sarjax.sar.llm_adapters.POOL_ADAPTERS`) and with which hyperparameters.

The requests, the responder, the judge and the key stay arguments of the pipelines.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sarjax.sar.llm_adapters import POOL_ADAPTERS


def _is_int(v: object) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, np.integer))


def _check_bools(owner: object, names: Sequence[str]) -> None:
    for name in names:
        v = getattr(owner, name)
        if not isinstance(v, (bool, np.bool_)):
            raise ValueError(f"{type(owner).__name__}.{name} must be a bool, got {type(v).__name__} {v!r}")


def _check_dir(owner: object, name: str) -> None:
    v = getattr(owner, name)
    if v is not None and not isinstance(v, (str, os.PathLike)):
        raise ValueError(f"{type(owner).__name__}.{name} must be None, a str or a path, got {type(v).__name__} {v!r}")


@dataclass(frozen=True)
class LLMSARSettings:
    """How :func:`sarjax.sar.run_llm_sar` runs (not what it attacks with: the attack's
    hyperparameters live in its factory).

    Attributes:
      calls: at most this many attack calls per round and oracle, an int ``>= 1`` (default 1); a
        call runs only the requests whose earlier calls broke no targeted member (the SAR paper
        Table 2: BEAST "at most 4 calls" of 15,000 queries; 1 for GCG's rounds and AutoDAN).
      with_asr: also measure the per-member ASR (:func:`sarjax.sar.member_asr`); its
        single-member attacks then serve as the greedy's fallback (default False).
      checkpoint_dir: default None (no checkpoint). If set, the greedy checkpoints every round
        there and a rerun resumes under the fingerprint rule (:mod:`sarjax.runtime.fingerprint`).
      overwrite: delete an earlier run's files in ``checkpoint_dir`` first (default False).
      progress: show the greedy's progress bar (default False).

    Raises:
      ValueError: ``calls`` not an int ``>= 1``; a flag that is not a bool; ``checkpoint_dir``
        not None, a str or a path.
    """

    calls: int = 1
    with_asr: bool = False
    checkpoint_dir: str | os.PathLike | None = None
    overwrite: bool = False
    progress: bool = False

    def __post_init__(self) -> None:
        if not _is_int(self.calls) or self.calls < 1:
            raise ValueError(f"LLMSARSettings.calls must be an int >= 1, got {self.calls!r}")
        _check_bools(self, ("with_asr", "overwrite", "progress"))
        _check_dir(self, "checkpoint_dir")


@dataclass(frozen=True)
class PoolLLMSARSettings:
    """How :func:`sarjax.sar.pool_llm_sar` runs and judges (the attack: :class:`LLMAttackSpec`).

    Attributes:
      max_new_tokens: greedy response length judged, an int ``>= 1`` (default 32).
      system: optional system message of the chat template (default None).
      with_asr: measure the per-member ASR too; its attacks serve as the greedy's fallback
        (default True).
      out: directory for the checkpoint, ``llm_sar.json`` and ``llm_sar.png`` (default None:
        nothing written).
      overwrite: discard an earlier run in ``out`` (default False).
      progress: show the greedy's progress bar (default False).

    Raises:
      ValueError: ``max_new_tokens`` not an int ``>= 1``; ``system`` not None or a str; a flag
        that is not a bool; ``out`` not None, a str or a path.
    """

    max_new_tokens: int = 32
    system: str | None = None
    with_asr: bool = True
    out: str | os.PathLike | None = None
    overwrite: bool = False
    progress: bool = False

    def __post_init__(self) -> None:
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ValueError(f"PoolLLMSARSettings.max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        if self.system is not None and not isinstance(self.system, str):
            raise ValueError(f"PoolLLMSARSettings.system must be None or a str, got {self.system!r}")
        _check_bools(self, ("with_asr", "overwrite", "progress"))
        _check_dir(self, "out")


@dataclass(frozen=True)
class LLMAttackSpec:
    """The text attack of :func:`sarjax.sar.pool_llm_sar`: its name in
    :data:`~sarjax.sar.llm_adapters.POOL_ADAPTERS` (the attack's pool adapter builds it with its
    factory) and the hyperparameters the adapter passes on.

    Attributes:
      name: ``"beast"`` (the target's mean per-token NLL minimised), ``"gcg"`` (the refusal's NLL
        maximised), ``"autodan"`` (the request rewritten by ``attacker``) or any name registered
        in :data:`~sarjax.sar.llm_adapters.POOL_ADAPTERS` (default ``"beast"``).
      options: overrides of the attack's defaults (:data:`~sarjax.sar.llm_adapters.ATTACK_DEFAULTS`:
        ``suffix_len``, ``beam_width``, ``max_queries``, ``calls``, ``num_steps``, ``topk``,
        ``num_candidates``, ...; AutoDAN's ``proposals``, ``anchors``, ...); default None: none.
      target, refusal: the scored responses of BEAST and GCG (non-empty strings).
      attacker: AutoDAN's attacker: an LLM pool whose first member rewrites (None: the target
        pool's first member; see :func:`sarjax.attacks.text.autodan.make_autodan`) or a proposer
        ``propose(anchors, key, sample_ids) -> rewrites``.
      seed_fn: BEAST's warm start: ``seed_fn(request) -> suffix texts`` (the SAR paper uses
        AmpleGCG; :func:`sarjax.sar.sampled_seed_fn` makes one from a local checkpoint); every
        call starts its beams from the first ``seed_tokens`` tokens of the first usable
        candidate (:func:`~sarjax.attacks.text.beast.seed_suffixes`). None: no seed.
      seed_tokens: an int ``>= 1`` (20, the SAR paper Table 2).

    Raises:
      ValueError: ``name`` not in :data:`~sarjax.sar.llm_adapters.POOL_ADAPTERS` (read when the
        spec is built); ``options`` not None or a mapping with str keys; an empty or non-str
        ``target`` / ``refusal``; ``seed_fn`` not None or callable; ``seed_tokens`` not an int
        ``>= 1``.
    """

    name: str = "beast"
    options: Mapping[str, Any] | None = None
    target: str = "Sure, here is"
    refusal: str = "I'm sorry, but I cannot help with that."
    attacker: Any = None
    seed_fn: Callable[[str], Sequence[str]] | None = None
    seed_tokens: int = 20

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or self.name not in POOL_ADAPTERS:
            raise ValueError(
                f"LLMAttackSpec.name: attack must be one of {', '.join(map(repr, POOL_ADAPTERS))}, got {self.name!r}"
            )
        if self.options is not None and (
            not isinstance(self.options, Mapping) or not all(isinstance(k, str) for k in self.options)
        ):
            raise ValueError(f"LLMAttackSpec.options must be None or a mapping with str keys, got {self.options!r}")
        for name in ("target", "refusal"):
            v = getattr(self, name)
            if not isinstance(v, str) or not v:
                raise ValueError(f"LLMAttackSpec.{name} must be a non-empty str, got {v!r}")
        if self.seed_fn is not None and not callable(self.seed_fn):
            raise ValueError(f"LLMAttackSpec.seed_fn must be None or callable, got {self.seed_fn!r}")
        if not _is_int(self.seed_tokens) or self.seed_tokens < 1:
            raise ValueError(f"LLMAttackSpec.seed_tokens must be an int >= 1, got {self.seed_tokens!r}")


__all__ = ["LLMAttackSpec", "LLMSARSettings", "PoolLLMSARSettings"]
