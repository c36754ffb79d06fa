"""sarjax.sar: SAR of model pools, the pipelines that drive :mod:`sarjax.cover`'s greedy with attacks.

- :mod:`~sarjax.sar.vision`: image-classifier pools with joint PGD (:func:`run_sar`, its default
  attack :func:`default_sar_attack`, its settings :class:`SARSettings` from :mod:`~sarjax.sar.settings`);
- :mod:`~sarjax.sar.llm`: LLM pools with a text attack, a responder and a judge
  (:func:`run_llm_sar`), its judges and responder (:mod:`~sarjax.sar.llm_judging`) and requests
  (:mod:`~sarjax.sar.llm_requests`); :mod:`~sarjax.sar.llm_pool`: the whole run on a pool of sarjax decoders
  (:func:`pool_llm_sar`), their settings in :mod:`~sarjax.sar.llm_settings`, each text attack through its pool adapter
  (:mod:`~sarjax.sar.llm_adapters`, one table: :data:`POOL_ADAPTERS`); :mod:`~sarjax.sar.llm_report`:
  the report and plots;
- :mod:`~sarjax.sar.driver`: the resumable run both pipelines share (fingerprint, cached steps,
  the greedy per part, finished results re-derived for other deltas);
- :mod:`~sarjax.sar.distributed`: :func:`run_sar` with the samples split over JAX processes.

:mod:`sarjax.cover` stays the algorithm (the greedy, exact covers, metrics, results) and knows no
attack or model; this layer sits between it and :mod:`sarjax.experiments`.
"""

from sarjax.sar import (
    distributed,
    driver,
    llm,
    llm_adapters,
    llm_judging,
    llm_pool,
    llm_report,
    llm_requests,
    llm_settings,
    settings,
    vision,
)
from sarjax.sar.distributed import allgather_parts, process_checkpoint_dir, run_sar_across_processes
from sarjax.sar.driver import ResumableRun
from sarjax.sar.llm import LLMSARAttack, LLMSARRun, make_llm_oracles, member_asr, run_llm_sar
from sarjax.sar.llm_adapters import ATTACK_DEFAULTS, POOL_ADAPTERS, PoolAttack, PoolRequest
from sarjax.sar.llm_judging import PoolResponder, compact_left, harmbench_judge_fn, judge_members, refusal_judge_fn
from sarjax.sar.llm_pool import pool_llm_sar
from sarjax.sar.llm_report import llm_sar_report, plot_llm_sar
from sarjax.sar.llm_requests import behavior_batch, clean_prompt_ids, load_llm_pool, pool_digest, sampled_seed_fn
from sarjax.sar.llm_settings import LLMAttackSpec, LLMSARSettings, PoolLLMSARSettings
from sarjax.sar.settings import SARSettings
from sarjax.sar.vision import (
    NO_PACKING,
    PACK_LEVELS,
    Packing,
    StackGate,
    default_sar_attack,
    make_attack_oracles,
    pack_sizes,
    run_sar,
)

__all__ = [
    "distributed",
    "driver",
    "llm",
    "llm_adapters",
    "llm_judging",
    "llm_pool",
    "llm_report",
    "llm_requests",
    "llm_settings",
    "settings",
    "vision",
    "ATTACK_DEFAULTS",
    "LLMAttackSpec",
    "LLMSARAttack",
    "LLMSARRun",
    "LLMSARSettings",
    "PACK_LEVELS",
    "POOL_ADAPTERS",
    "PoolAttack",
    "PoolLLMSARSettings",
    "PoolRequest",
    "PoolResponder",
    "ResumableRun",
    "SARSettings",
    "StackGate",
    "allgather_parts",
    "behavior_batch",
    "clean_prompt_ids",
    "compact_left",
    "default_sar_attack",
    "harmbench_judge_fn",
    "judge_members",
    "llm_sar_report",
    "load_llm_pool",
    "make_attack_oracles",
    "NO_PACKING",
    "Packing",
    "make_llm_oracles",
    "member_asr",
    "pack_sizes",
    "plot_llm_sar",
    "pool_digest",
    "pool_llm_sar",
    "process_checkpoint_dir",
    "refusal_judge_fn",
    "run_llm_sar",
    "run_sar",
    "run_sar_across_processes",
    "sampled_seed_fn",
]
