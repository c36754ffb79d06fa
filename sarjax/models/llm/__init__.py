"""LLM pools in JAX: decoder-only transformers loaded from Hugging Face checkpoints.

See docs/llm.md for the public API.

The narrative page (docs/llm.md) follows.

.. include:: ../../../docs/llm.md
"""

from sarjax.models.llm.config import DecoderConfig, config_from_hf, rope_inv_freq
from sarjax.models.llm.decoder import (
    KVBlock,
    embed_tokens,
    hidden_states,
    init_params,
    lm_head,
    logits,
    logits_from_embeds,
    logits_from_one_hot,
    positions_from_mask,
    prefill,
)
from sarjax.models.llm.finetune import (
    SFTData,
    make_sft_data,
    restore_params,
    save_params,
    sft_loss,
    sft_pool,
)
from sarjax.models.llm.generate import (
    filter_logits,
    greedy_generate,
    greedy_one,
    sample_generate,
    sample_one,
    sample_token,
    stack_greedy_generate,
    stack_sample_generate,
)
from sarjax.models.llm.loader import load_config, load_model, load_params
from sarjax.models.llm.pool import (
    GenerationDefaults,
    LLMPool,
    LLMStack,
    build_pool,
    generation_defaults,
    left_pad,
    load_generation_config,
    load_pool,
    pool_generate_text,
    pool_target_nll_text,
    render_requests,
    stack_decoding,
    stack_params,
    tokenizer_fingerprint,
    unstack_params,
)
from sarjax.models.llm.prompts import (
    PromptSlices,
    build_prompt,
    load_tokenizer,
    retokenization_mask,
    retokenizes,
    split_chat_template,
)
from sarjax.models.llm.scoring import (
    stack_prefix_cache,
    stack_target_nll,
    target_nll,
    target_nll_from_embeds,
)
from sarjax.models.llm.tokenizers import word_level_tokenizer

__all__ = [
    "build_pool",
    "build_prompt",
    "config_from_hf",
    "DecoderConfig",
    "embed_tokens",
    "filter_logits",
    "GenerationDefaults",
    "generation_defaults",
    "greedy_generate",
    "greedy_one",
    "hidden_states",
    "init_params",
    "KVBlock",
    "left_pad",
    "LLMPool",
    "LLMStack",
    "lm_head",
    "load_config",
    "load_generation_config",
    "load_model",
    "load_params",
    "load_pool",
    "load_tokenizer",
    "logits",
    "logits_from_embeds",
    "logits_from_one_hot",
    "make_sft_data",
    "pool_generate_text",
    "pool_target_nll_text",
    "positions_from_mask",
    "prefill",
    "render_requests",
    "PromptSlices",
    "restore_params",
    "retokenization_mask",
    "retokenizes",
    "rope_inv_freq",
    "sample_generate",
    "sample_one",
    "sample_token",
    "save_params",
    "sft_loss",
    "sft_pool",
    "SFTData",
    "stack_decoding",
    "split_chat_template",
    "stack_greedy_generate",
    "stack_params",
    "stack_prefix_cache",
    "stack_sample_generate",
    "stack_target_nll",
    "target_nll",
    "target_nll_from_embeds",
    "tokenizer_fingerprint",
    "unstack_params",
    "word_level_tokenizer",
]
