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

# MOE_FAMILIES is imported from here by the sharding code
from hybridflow.engines.model_families import EAGER_ATTENTION_FAMILIES, MOE_FAMILIES, SUPPORTED_FAMILIES  # noqa: F401
from hybridflow.errors import UserInputError


def _tiny_family_settings(family: str, *, num_attention_heads: int, hidden_size: int) -> dict:
    """Family-specific fields of a tiny config, small enough that every feature is exercised
    on test sequences of ~10 tokens (a 4-token sliding window, strong soft-caps, 4 experts)."""
    head_dim = hidden_size // num_attention_heads
    gemma = dict(head_dim=head_dim, query_pre_attn_scalar=head_dim, sliding_window=4,
                 final_logit_softcapping=5.0, layer_types=["sliding_attention", "full_attention"])
    return {
        "gemma2": {**gemma, "attn_logit_softcapping": 2.0},
        "gemma3_text": gemma,
        "qwen3_moe": dict(head_dim=head_dim, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                          norm_topk_prob=True),
        # MLA: low-rank q and kv projections, rope on a slice of each head; layer 0 dense,
        # layer 1 one shared expert + 4 routed (top 2).
        "deepseek_v3": dict(num_key_value_heads=num_attention_heads, moe_intermediate_size=32,
                            n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=1,
                            topk_group=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24,
                            qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=head_dim),
    }.get(family, {})


class ModelLoadError(UserInputError):
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
    fields = dict(
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
    fields.update(_tiny_family_settings(family, num_attention_heads=num_attention_heads, hidden_size=hidden_size))
    if family in EAGER_ATTENTION_FAMILIES:
        fields["attn_implementation"] = "eager"
    return config_cls(**fields)


def save_tiny_model(path: str | Path, family: str = "llama", *, seed: int = 0, **sizes) -> Path:
    """Create a randomly initialised causal LM of `family` and save it in HF format (fp32)."""
    path = Path(path)
    config = make_tiny_config(family, **sizes)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=False)
    model.save_pretrained(path, safe_serialization=True)
    return path


def load_hf_config(path: str | Path, *, trust_remote_code: bool = False) -> PretrainedConfig:
    """Read config.json of a local model directory, with errors that say what is wrong.
    `trust_remote_code` (model.trust_remote_code): let transformers run code the directory
    names (auto_map); never asked interactively."""
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
    return AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)


# ---------------------------------------------------------------------------------------
# Loading the three model kinds the engines use: a causal LM (actor, reference, rollout),
# a critic (backbone + scalar value head) and a reward model (sequence classifier, one label).

MODEL_KINDS = ("causal_lm", "critic", "reward")

# model kind -> transformers Auto class used to load and export it
_AUTO_CLASS_FOR_KIND = {
    "causal_lm": "AutoModelForCausalLM",
    "critic": "AutoModelForTokenClassification",
    "reward": "AutoModelForSequenceClassification",
}


class TokenScoreModel(torch.nn.Module):
    """A backbone and a linear head that give one scalar per token.

    The critic reads values at response positions, the reward model reads the score at
    the last valid token. Attribute names (`model`, `score`) match the Hugging Face
    `*ForTokenClassification` / `*ForSequenceClassification` classes, so parameter names
    and state-dict keys are exactly those of the Hugging Face checkpoint. We do not call
    the HF classes' own forward: the sequence classifier finds the last token through
    `pad_token_id` (wrong when pad == eos) and the token classifier applies dropout.
    """

    def __init__(self, backbone: torch.nn.Module, score: torch.nn.Linear, kind: str) -> None:
        super().__init__()
        if kind not in ("critic", "reward"):
            raise ValueError(f"TokenScoreModel kind must be 'critic' or 'reward', got {kind!r}")
        self.model = backbone
        self.score = score
        self.kind = kind
        self.config = backbone.config

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Per-token scalar scores [B, T] (in the compute dtype)."""
        hidden = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
        ).last_hidden_state
        # A copy, not a view: FSDP2 hooks the root's output for backward, and an
        # in-place op by a caller on a view would silently drop that hook.
        return self.score(hidden).squeeze(-1).clone()

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        """Recompute decoder-layer activations in backward (delegates to the backbone)."""
        self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gradient_checkpointing_kwargs)


def _check_weights_present(path: Path) -> None:
    patterns = ("*.safetensors", "pytorch_model*.bin")
    if not any(any(path.glob(p)) for p in patterns):
        raise ModelLoadError(
            f"model directory {str(path)!r} has a config.json but no weights "
            "(*.safetensors or pytorch_model*.bin); save the model with save_pretrained"
        )


def load_model(
    path: str | Path,
    kind: str = "causal_lm",
    *,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "sdpa",
    trust_remote_code: bool = False,
) -> torch.nn.Module:
    """Load a model of `kind` ("causal_lm", "critic", "reward") from a local HF directory.

    A critic may start from a causal-LM checkpoint: its value head is then newly
    initialised from the torch RNG (seed it identically on every rank). A reward model
    must be a saved `*ForSequenceClassification` with one label, since a fresh random
    head would score nonsense silently.
    """
    if kind not in MODEL_KINDS:
        raise ValueError(f"model kind must be one of {MODEL_KINDS}, got {kind!r}")
    path = Path(path)
    config = load_hf_config(path, trust_remote_code=trust_remote_code)
    _check_weights_present(path)
    if kind == "reward":
        _check_reward_config(path, config)
    if config.model_type in EAGER_ATTENTION_FAMILIES and attn_implementation != "eager":
        raise ModelLoadError(
            f"{str(path)!r} is a {config.model_type} model, whose attention soft-caps its logits; only the "
            f"eager kernel does that, not {attn_implementation!r}: set attn_implementation: eager"
        )
    auto_cls = getattr(transformers, _AUTO_CLASS_FOR_KIND[kind])
    extra = {"num_labels": 1} if kind != "causal_lm" else {}
    try:
        model = auto_cls.from_pretrained(
            path,
            dtype=dtype,
            attn_implementation=attn_implementation,
            local_files_only=True,
            trust_remote_code=trust_remote_code,
            **extra,
        )
    except (OSError, ValueError, RuntimeError) as err:
        raise ModelLoadError(f"could not load a {kind} model from {str(path)!r}: {err}") from err
    if kind == "causal_lm":
        return model
    return TokenScoreModel(model.model, model.score, kind)


def _check_reward_config(path: Path, config: PretrainedConfig) -> None:
    archs = getattr(config, "architectures", None) or []
    if not any(a.endswith("ForSequenceClassification") for a in archs):
        raise ModelLoadError(
            f"{str(path)!r} is not a reward model: its architectures are {archs}; a reward "
            "model must be saved as a *ForSequenceClassification with num_labels=1"
        )
    if getattr(config, "num_labels", 1) != 1:
        raise ModelLoadError(
            f"reward model {str(path)!r} has num_labels={config.num_labels}; exactly 1 is needed"
        )


def hf_model_for_export(model: torch.nn.Module, *, trust_remote_code: bool) -> transformers.PreTrainedModel:
    """An empty Hugging Face model of the same class as `model`, for `save_pretrained`.

    Built on the meta device, so it costs no memory until a state dict is assigned.
    """
    if isinstance(model, TokenScoreModel):
        auto_cls = getattr(transformers, _AUTO_CLASS_FOR_KIND[model.kind])
        config = model.config
    elif isinstance(model, transformers.PreTrainedModel):
        auto_cls, config = transformers.AutoModelForCausalLM, model.config
    else:
        raise TypeError(f"cannot export a {type(model).__name__}; expected a HF model or TokenScoreModel")
    with torch.device("meta"):
        return auto_cls.from_config(config, trust_remote_code=trust_remote_code)


def backbone_shapes(path: str | Path, *, trust_remote_code: bool) -> dict[str, list[int]]:
    """Parameter name -> shape of the decoder backbone (AutoModel) that the config.json of
    `path` describes, built on the meta device (no memory, no weights read), and of a causal
    LM's `lm_head.weight`. Checkpoint names carry a "model." prefix the backbone's lack
    (pre-flight compares the two)."""
    config = load_hf_config(path, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = transformers.AutoModel.from_config(config, trust_remote_code=trust_remote_code)
    shapes = {name: list(t.shape) for name, t in model.state_dict().items()}
    vocab, hidden = getattr(config, "vocab_size", None), getattr(config, "hidden_size", None)
    if vocab and hidden:  # an untied causal LM's head: a wrong shape would be re-initialised silently
        shapes["lm_head.weight"] = [vocab, hidden]
    return shapes


def model_family(model: torch.nn.Module) -> str:
    """The model_type ("llama", "qwen2", ...) of a loaded model; error if unsupported."""
    family = getattr(getattr(model, "config", None), "model_type", None)
    if family not in SUPPORTED_FAMILIES:
        raise ModelLoadError(
            f"model family {family!r} is not supported; supported: {sorted(SUPPORTED_FAMILIES)}"
        )
    return family


def save_tiny_reward_model(path: str | Path, family: str = "llama", *, seed: int = 0, **sizes) -> Path:
    """A randomly initialised one-label sequence classifier of `family`, saved in HF format."""
    path = Path(path)
    config = make_tiny_config(family, **sizes)
    config.num_labels = 1
    torch.manual_seed(seed)
    model = transformers.AutoModelForSequenceClassification.from_config(config, dtype=torch.float32,
                                                                        trust_remote_code=False)
    model.save_pretrained(path, safe_serialization=True)
    return path
