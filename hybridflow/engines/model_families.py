"""The Hugging Face model families the engines support, by config.json's model_type.

Torch- and transformers-free, so the pre-flight checks (trainer/run/preflight.py) can
refuse an unsupported model directory before anything heavy is imported; engines/models.py
(docs/models.md has the support matrix) builds on it.
"""

from __future__ import annotations

# model_type (as in config.json) -> transformers config class name
SUPPORTED_FAMILIES: dict[str, str] = {
    "llama": "LlamaConfig",
    "qwen2": "Qwen2Config",
    "qwen3": "Qwen3Config",
    "mistral": "MistralConfig",
    "gemma2": "Gemma2Config",
    "gemma3_text": "Gemma3TextConfig",  # Gemma3ForCausalLM (text-only checkpoints, e.g. gemma-3-1b)
    "qwen3_moe": "Qwen3MoeConfig",
    "deepseek_v3": "DeepseekV3Config",
}

# Mixture-of-experts families: their experts are fused 3-D tensors that the tensor-parallel
# plan does not split (they are sharded over dp by FSDP like every other parameter).
MOE_FAMILIES = ("qwen3_moe", "deepseek_v3")

# Families whose attention soft-caps its logits (tanh), which only the eager kernel applies;
# transformers refuses sdpa for them.
EAGER_ATTENTION_FAMILIES = ("gemma2",)
