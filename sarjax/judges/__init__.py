"""Judges of jailbreak success: refusal phrases (offline) and the HarmBench classifier."""

from sarjax.judges.harmbench import (
    HARMBENCH_CONTEXTUAL_PROMPT,
    HARMBENCH_PROMPT,
    HarmBenchClassifier,
    classifier_prompt,
    clip_generation,
    encode_classifier_inputs,
    label_from_text,
)
from sarjax.judges.refusal import (
    GCG_REFUSAL_PHRASES,
    TokenRefusalJudge,
    is_refusal,
    refusal_judge,
    token_refusal_judge,
)

__all__ = [
    "classifier_prompt",
    "clip_generation",
    "encode_classifier_inputs",
    "GCG_REFUSAL_PHRASES",
    "HARMBENCH_CONTEXTUAL_PROMPT",
    "HARMBENCH_PROMPT",
    "HarmBenchClassifier",
    "is_refusal",
    "label_from_text",
    "refusal_judge",
    "TokenRefusalJudge",
    "token_refusal_judge",
]
