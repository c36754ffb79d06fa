"""SAR of a pool of sarjax decoders, end to end: :func:`pool_llm_sar`.

The requests, the responder, the judge and the attack (through the attack's pool adapter,
:data:`sarjax.sar.llm_adapters.POOL_ADAPTERS`) assembled around :func:`sarjax.sar.run_llm_sar`,
then the report and the plots.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sarjax.models.llm.pool import tokenizer_fingerprint
from sarjax.runtime.compile_stats import count_compiles
from sarjax.runtime.provenance import provenance
from sarjax.sar.llm import LLMSARAttack, LLMSARRun, run_llm_sar
from sarjax.sar.llm_adapters import POOL_ADAPTERS, PoolRequest
from sarjax.sar.llm_judging import Judge, PoolResponder, refusal_judge_fn
from sarjax.sar.llm_report import llm_sar_report, plot_llm_sar
from sarjax.sar.llm_requests import pool_digest
from sarjax.sar.llm_settings import LLMAttackSpec, LLMSARSettings, PoolLLMSARSettings


def pool_llm_sar(
    pool: Any,
    behaviors: Sequence[str],
    deltas: Sequence[float],
    *,
    key: Any,
    attack: LLMAttackSpec | str = "beast",
    judge: Judge | None = None,
    settings: PoolLLMSARSettings | None = None,
) -> tuple[LLMSARRun, dict[str, Any]]:
    """SAR (and per-member ASR) of a pool of sarjax decoders on text requests, end to end.

    Args:
      pool: an :class:`~sarjax.models.llm.pool.LLMPool`. Its stacks may use different tokenizers
        (and chat templates) for ``"beast"`` and ``"gcg"``: the suffix then passes between
        members as TEXT (joint GCG: :func:`~sarjax.attacks.text.gcg.make_gcg`, the proposer
        rotating; BEAST: :func:`~sarjax.attacks.text.beast.make_beast`, the first
        stack's tokenizer proposing), every member renders, scores and answers in its own tokens
        (:class:`PoolResponder`), and the recorded prompts are the first stack's ids.
        ``"autodan"`` works on both: with several tokenizers each stack renders the rewritten
        request in its own tokenizer and chat template (and the unmodified request for the
        clean judgement), and a candidate's coverage is AutoDAN's own judgement of every member
        (:func:`~sarjax.sar.llm_adapters.autodan_pool_attack`).
      behaviors: ``[B]`` requests (HarmBench behaviors).
      deltas: allowed uncovered shares.
      key: PRNG key (required).
      attack: the :class:`~sarjax.sar.llm_settings.LLMAttackSpec` (the attack's name in
        :data:`~sarjax.sar.llm_adapters.POOL_ADAPTERS`, whose pool adapter builds it, and its
        hyperparameters: ``options`` (overrides of
        :data:`~sarjax.sar.llm_adapters.ATTACK_DEFAULTS`), BEAST's ``target``, GCG's
        ``refusal``, AutoDAN's ``attacker``, BEAST's warm start ``seed_fn`` / ``seed_tokens``),
        or a name alone (``"beast"``, ``"gcg"``, ``"autodan"``: ``LLMAttackSpec(name)``). With
        several tokenizers BEAST's seed is cut in the first stack's tokens, and a seed that
        another tokenizer cannot reproduce is dropped for its request (listed in the report's
        ``settings["settings"]["seeds"]["dropped"]``).
      judge: default :func:`refusal_judge_fn`.
      settings: the pipeline's knobs (:class:`~sarjax.sar.llm_settings.PoolLLMSARSettings`:
        ``max_new_tokens`` judged, ``system`` message, ``with_asr``, ``out`` directory for the
        checkpoint, ``llm_sar.json`` and ``llm_sar.png``, ``overwrite``, ``progress``); default
        ``PoolLLMSARSettings()``.

    Returns:
      ``(run, report)``: the :class:`LLMSARRun` and the JSON report (also written to ``out``;
      ``"compile"``: the run's XLA compilations, :meth:`sarjax.runtime.compile_stats.CompileStats.to_json`).
    """
    spec = LLMAttackSpec(attack) if isinstance(attack, str) else attack
    if not isinstance(spec, LLMAttackSpec):
        raise TypeError(f"pool_llm_sar: attack must be an LLMAttackSpec or a name, got {type(attack).__name__}")
    if settings is None:
        settings = PoolLLMSARSettings()
    if not isinstance(settings, PoolLLMSARSettings):
        raise TypeError(f"pool_llm_sar: settings must be a PoolLLMSARSettings or None, got {type(settings).__name__}")
    compiles = count_compiles()  # the report's "compile": this run's XLA programs
    adapter = POOL_ADAPTERS.get(spec.name)
    if adapter is None:  # registered when the spec was built, gone since
        raise ValueError(f"attack must be one of {', '.join(map(repr, POOL_ADAPTERS))}, got {spec.name!r}")
    max_new_tokens, system, out = settings.max_new_tokens, settings.system, settings.out
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
            pool, list(behaviors), respond, judge, mixed, {**(spec.options or {})}, spec.target, spec.refusal, system,
            int(max_new_tokens), spec.attacker, spec.seed_fn, spec.seed_tokens,
        )
    )  # fmt: skip
    fp = {
        "pool": pool_digest(pool),
        "members": list(pool.names),
        "attack": spec.name,
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
        LLMSARAttack(
            parts.attack, parts.params, parts.batch, parts.attack_kwargs, self_judged=parts.self_judged,
            clean_prompts=parts.clean_prompts,
        ),
        behaviors, respond, judge, deltas, key=key, num_members=m, fingerprint=fp,
        settings=LLMSARSettings(
            calls=int(parts.calls), with_asr=settings.with_asr, checkpoint_dir=out, overwrite=settings.overwrite,
            progress=settings.progress,
        ),
    )  # fmt: skip
    report = {"settings": fp, **llm_sar_report(run, tok, pool.names)}
    report["compile"] = compiles.stop().to_json()  # CompileStats.to_json
    report["provenance"] = provenance()  # command, commit, machine, date, load
    if out is not None:
        Path(out, "llm_sar.json").write_text(json.dumps(report, indent=1))
        plot_llm_sar(run, Path(out, "llm_sar.png"), title=f"LLM SAR, {spec.name}, M={m}, {len(behaviors)} requests")
    return run, report


__all__ = ["pool_llm_sar"]
