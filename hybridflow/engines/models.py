"""Hugging Face model families we support, tiny configs for tests, and safe loading.

Both the training engine and the rollout engine read models from a local Hugging Face
directory; nothing is ever downloaded. `save_tiny_model` writes a small randomly
initialised model of a supported family so tests and the built-in demo need no weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, PretrainedConfig

# model_type (as in config.json) -> transformers config class name
SUPPORTED_FAMILIES: dict[str, str] = {
    "llama": "LlamaConfig",
    "qwen2": "Qwen2Config",
    "qwen3": "Qwen3Config",
    "mistral": "MistralConfig",
}


class ModelLoadError(ValueError):
    """A model directory is missing, malformed, or of an unsupported family."""


def make_tiny_config(
    family: str = "llama",
    *,
    vocab_size: int = 256,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    max_position_embeddings: int = 512,
    tie_word_embeddings: bool = False,
) -> PretrainedConfig:
    """A small config of `family` with grouped-query attention (kv heads < heads)."""
    if family not in SUPPORTED_FAMILIES:
        raise ModelLoadError(
            f"unknown model family {family!r}; supported: {sorted(SUPPORTED_FAMILIES)}"
        )
    config_cls = getattr(transformers, SUPPORTED_FAMILIES[family])
    return config_cls(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


def save_tiny_model(path: str | Path, family: str = "llama", *, seed: int = 0, **sizes) -> Path:
    """Create a randomly initialised causal LM of `family` and save it in HF format (fp32)."""
    path = Path(path)
    config = make_tiny_config(family, **sizes)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(path, safe_serialization=True)
    return path


def load_hf_config(path: str | Path) -> PretrainedConfig:
    """Read config.json of a local model directory, with errors that say what is wrong."""
    path = Path(path)
    if not path.is_dir():
        raise ModelLoadError(
            f"model path {str(path)!r} is not a directory; give a local Hugging Face model "
            "directory (config.json + safetensors). Nothing is downloaded at run time."
        )
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"model directory {str(path)!r} has no config.json")
    try:
        model_type = json.loads(config_file.read_text()).get("model_type")
    except json.JSONDecodeError as err:
        raise ModelLoadError(f"{config_file} is not valid JSON: {err}") from err
    if model_type not in SUPPORTED_FAMILIES:
        raise ModelLoadError(
            f"{config_file}: model_type {model_type!r} is not supported; "
            f"supported families: {sorted(SUPPORTED_FAMILIES)}"
        )
    return AutoConfig.from_pretrained(path, local_files_only=True)
