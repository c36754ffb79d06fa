"""SAR of a pool of sarjax decoders, end to end: :func:`pool_llm_sar`.

The requests, the responder, the judge and the attack (through the attack's pool adapter,
:data:`sarjax.sar.llm_adapters.POOL_ADAPTERS`) assembled around :func:`sarjax.sar.run_llm_sar`,
then the report and the plots.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sarjax.models.llm.pool import tokenizer_fingerprint
from sarjax.sar.llm import LLMSARRun, run_llm_sar
from sarjax.sar.llm_adapters import POOL_ADAPTERS, PoolRequest
from sarjax.sar.llm_judging import Judge, PoolResponder, refusal_judge_fn
from sarjax.sar.llm_report import llm_sar_report, plot_llm_sar
from sarjax.sar.llm_requests import pool_digest


def pool_llm_sar(
    pool: Any,
    behaviors: Sequence[str],
    deltas: Sequence[float],
    *,
    key: Any,
    attack: str = "beast",
    judge: Judge | None = None,
    target: str = "Sure, here is",
    refusal: str = "I'm sorry, but I cannot help with that.",
    settings: dict[str, Any] | None = None,
    max_new_tokens: int = 32,
    with_asr: bool = True,
    system: str | None = None,
    out: str | os.PathLike | None = None,
    overwrite: bool = False,
    progress: bool = False,
    attacker: Any = None,
    seed_fn: Callable[[str], Sequence[str]] | None = None,
    seed_tokens: int = 20,
) -> tuple[LLMSARRun, dict[str, Any]]:
    """SAR (and per-member ASR) of a pool of sarjax decoders on text requests, end to end.

    Args:
      pool: an :class:`~sarjax.models.llm.pool.LLMPool`. Its stacks may use different tokenizers
        (and chat templates) for ``"beast"`` and ``"gcg"``: the suffix then passes between
        members as TEXT (joint GCG: :func:`~sarjax.attacks.text.gcg_joint.make_joint_gcg`, the proposer
        rotating; BEAST: :func:`~sarjax.attacks.text.beast_cross.make_cross_beast`, the first
        stack's tokenizer proposing), every member renders, scores and answers in its own tokens
        (:class:`PoolResponder`), and the recorded prompts are the first stack's ids.
        ``"autodan"`` works on both: with several tokenizers each stack renders the rewritten
        request in its own tokenizer and chat template (and the unmodified request for the
        clean judgement), and a candidate's coverage is AutoDAN's own judgement of every member
        (:func:`~sarjax.sar.llm_adapters.autodan_pool_attack`).
      behaviors: ``[B]`` requests (HarmBench behaviors).
      deltas: allowed uncovered shares.
      key: PRNG key (required).
      attack: a name in :data:`~sarjax.sar.llm_adapters.POOL_ADAPTERS` (the attack's pool adapter
        builds it): ``"beast"`` (target ``target``, mean per-token NLL minimised), ``"gcg"`` (the
        refusal ``refusal``'s NLL maximised) or ``"autodan"`` (the request rewritten by
        ``attacker``; :mod:`sarjax.attacks.text.autodan`).
      judge: default :func:`refusal_judge_fn`.
      target, refusal: the scored responses of BEAST and GCG.
      settings: overrides of the attack's defaults (:data:`~sarjax.sar.llm_adapters.ATTACK_DEFAULTS`) (``suffix_len``, ``beam_width``,
        ``max_queries``, ``calls``, ``num_steps``, ``topk``, ``num_candidates``, ...).
      max_new_tokens: greedy response length judged.
      with_asr: measure the per-member ASR too (its attacks serve as the greedy's fallback).
      system: optional system message of the chat template.
      out: directory for the checkpoint, ``llm_sar.json`` and ``llm_sar.png`` (None: nothing written).
      overwrite, progress: see :func:`run_llm_sar`.
      attacker: AutoDAN's attacker: an LLM pool whose first member rewrites (None: the target
        pool's first member; see :func:`sarjax.attacks.text.autodan.make_autodan`) or a proposer
        ``propose(anchors, key, sample_ids) -> rewrites``.
      seed_fn: BEAST's warm start: ``seed_fn(request) -> suffix texts`` (the SAR paper uses
        AmpleGCG; any callable); every call starts its beams from the first ``seed_tokens``
        tokens (20, the SAR paper Table 2) of the first usable candidate
        (:func:`~sarjax.attacks.text.beast.seed_suffixes`; with several tokenizers the seed is
        cut in the first stack's tokens, and a seed that another tokenizer cannot reproduce is
        dropped for its request, listed in ``settings["seeds"]["dropped"]``). None: no seed.
        :func:`sampled_seed_fn` makes one from a local checkpoint.

    Returns:
      ``(run, report)``: the :class:`LLMSARRun` and the JSON report (also written to ``out``).
    """
    adapter = POOL_ADAPTERS.get(attack)
    if adapter is None:
        raise ValueError(f"attack must be one of {', '.join(map(repr, POOL_ADAPTERS))}, got {attack!r}")
    fps = [tokenizer_fingerprint(s.tokenizer) for s in pool.stacks]
    if None in fps:
        raise ValueError(f"pool_llm_sar: every stack needs a tokenizer, stack {fps.index(None)} has none")
    mixed = len(set(fps)) > 1
    tok = pool.stacks[0].tokenizer
    judge = judge or refusal_judge_fn()
    respond = PoolResponder(
        pool, max_new_tokens=max_new_tokens, requests=list(behaviors) if mixed else None, system=system
    )
    parts = adapter(
        PoolRequest(
            pool, list(behaviors), respond, judge, mixed, {**(settings or {})}, target, refusal, system,
            int(max_new_tokens), attacker, seed_fn, seed_tokens,
        )
    )  # fmt: skip
    fp = {
        "pool": pool_digest(pool),
        "members": list(pool.names),
        "attack": attack,
        "settings": parts.settings,
        "judge": getattr(judge, "name", "custom"),
        "response": parts.response,
        "max_new_tokens": int(max_new_tokens),
        "system": system,
    }
    if mixed:  # (absent for one tokenizer: earlier checkpoints keep their fingerprint)
        fp["tokenizers"] = len(set(fps))
    m = pool.size
    run = run_llm_sar(
        parts.attack, parts.params, parts.batch, behaviors, respond, judge, deltas, key=key, num_members=m,
        calls=parts.calls, attack_kwargs=parts.attack_kwargs, with_asr=with_asr, checkpoint_dir=out, fingerprint=fp,
        overwrite=overwrite, progress=progress, self_judged=parts.self_judged, clean_prompts=parts.clean_prompts,
    )  # fmt: skip
    report = {"settings": fp, **llm_sar_report(run, tok, pool.names)}
    if out is not None:
        Path(out, "llm_sar.json").write_text(json.dumps(report, indent=1))
        plot_llm_sar(run, Path(out, "llm_sar.png"), title=f"LLM SAR, {attack}, M={m}, {len(behaviors)} requests")
    return run, report


__all__ = ["pool_llm_sar"]
