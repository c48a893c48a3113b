"""Architecture description of a supported decoder, read from a Hugging Face config."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from hybridflow.engines.models import ModelLoadError
from hybridflow.engines.rollout.batch_io import id_tuple

# The decoder layouts the native engine implements. The training engine supports more
# (engines/models.py SUPPORTED_FAMILIES); those generate with the hf backend.
NATIVE_FAMILIES = ("llama", "qwen2", "qwen3", "mistral")

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeSpec:
    """Rotary embedding: base theta plus an optional scaling rule (HF `rope_parameters`)."""

    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class DecoderSpec:
    """Shapes and switches of one decoder-only checkpoint (full, unsharded sizes)."""

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool
    rope: RopeSpec
    # one entry per layer: attention window in tokens, or None for full attention
    sliding_windows: tuple[int | None, ...]
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...]
    pad_token_id: int

    @classmethod
    def from_hf_config(cls, config) -> "DecoderSpec":
        """Build from a transformers config object of a supported family."""
        family = getattr(config, "model_type", None)
        if family not in NATIVE_FAMILIES:
            raise ModelLoadError(
                f"model_type {family!r} is not supported by the native rollout engine (families: "
                f"{sorted(NATIVE_FAMILIES)}); generate with the Hugging Face backend: rollout.name=hf"
            )
        act = getattr(config, "hidden_act", "silu")
        if act != "silu":
            raise ModelLoadError(f"hidden_act {act!r} is not supported (only 'silu' / SwiGLU)")
        heads = int(config.num_attention_heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        if heads % kv_heads:
            raise ModelLoadError(f"num_attention_heads={heads} is not a multiple of kv heads={kv_heads}")
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        attention_bias = bool(getattr(config, "attention_bias", False))
        # Qwen2 hard-codes biases on q/k/v (not o); llama/qwen3 follow attention_bias for all four
        qkv_bias = True if family == "qwen2" else attention_bias
        o_bias = False if family == "qwen2" else attention_bias
        pad = config.pad_token_id if getattr(config, "pad_token_id", None) is not None else 0
        return cls(
            family=family,
            vocab_size=int(config.vocab_size),
            hidden_size=int(config.hidden_size),
            intermediate_size=int(config.intermediate_size),
            num_layers=int(config.num_hidden_layers),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=int(head_dim),
            rms_norm_eps=float(config.rms_norm_eps),
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
            qk_norm=family == "qwen3",
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            rope=_rope_from_config(config),
            sliding_windows=_sliding_windows(config, family),
            max_position_embeddings=int(config.max_position_embeddings),
            eos_token_ids=id_tuple(getattr(config, "eos_token_id", None)),
            pad_token_id=int(pad),
        )


def _rope_from_config(config) -> RopeSpec:
    """Read rope theta/scaling from `rope_parameters` (transformers 5) or the older fields."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    legacy_scaling = getattr(config, "rope_scaling", None)
    if not params and isinstance(legacy_scaling, dict):
        params = dict(legacy_scaling)
    theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ModelLoadError("partial_rotary_factor != 1 is not supported by the rollout engine")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ModelLoadError(
            f"rope type {rope_type!r} is not supported by the rollout engine; "
            f"supported: {SUPPORTED_ROPE_TYPES}"
        )
    return RopeSpec(
        theta=float(theta),
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(
            params.get("original_max_position_embeddings", config.max_position_embeddings)
        ),
    )


def _sliding_windows(config, family: str) -> tuple[int | None, ...]:
    """Per-layer attention window: Mistral applies `sliding_window` everywhere, Qwen per layer_types."""
    window = getattr(config, "sliding_window", None)
    layers = int(config.num_hidden_layers)
    if window is None:
        return (None,) * layers
    if family == "mistral":
        return (int(window),) * layers
    layer_types = getattr(config, "layer_types", None)
    if layer_types is None or not getattr(config, "use_sliding_window", False):
        return (None,) * layers
    return tuple(int(window) if t == "sliding_attention" else None for t in layer_types)


def rope_inv_freq(rope: RopeSpec, head_dim: int) -> torch.Tensor:
    """Inverse frequencies (fp32, [head_dim/2]) after applying the configured scaling."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        return _llama3_scale(inv_freq, rope)
    return inv_freq


def _llama3_scale(inv_freq: torch.Tensor, rope: RopeSpec) -> torch.Tensor:
    """Llama 3.1 scaling: long wavelengths divided by `factor`, short kept, a smooth ramp between."""
    old_ctx = rope.original_max_position_embeddings
    low_freq_wavelen = old_ctx / rope.low_freq_factor
    high_freq_wavelen = old_ctx / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_ctx / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    ramp = (1 - smooth) * scaled / rope.factor + smooth * scaled
    in_between = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(in_between, ramp, scaled)


def rope_tables(rope: RopeSpec, head_dim: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position * inv_freq, fp32, each [length, head_dim/2]."""
    positions = torch.arange(length, dtype=torch.float32)
    angles = torch.outer(positions, rope_inv_freq(rope, head_dim))
    return angles.cos(), angles.sin()
