"""Which families' causal LMs return their output head's values as the logits, untouched (no soft cap, no scale):
for them the fine-tuning loss may be taken from the head's input in chunks, never forming (tokens, vocab) logits.
Gemma 2/3 cap the logits, Cohere and Granite scale them: those, and every family not listed, keep the full logits.
"""

from __future__ import annotations

PLAIN_HEAD_FAMILIES = (
    "gemma",
    "llama",
    "mistral",
    "mixtral",
    "olmo",
    "olmo2",
    "phi3",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "smollm3",
    "stablelm",
    "starcoder2",
)


def logits_are_head_output(model_type: str | None) -> bool:
    """Whether a model of ``model_type`` returns ``lm_head(hidden_states)`` itself as its logits."""
    return model_type in PLAIN_HEAD_FAMILIES
