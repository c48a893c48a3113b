"""The `model` section: the policy model (a local directory, a pretrained model, or the built-in tiny one)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hybridflow.engines.pretrained import PRETRAINED_MODELS
from hybridflow.errors import ConfigError


@dataclass
class BuiltinModelSection:
    """The tiny randomly initialised model `model.path: null` creates in the run dir."""

    family: Literal["llama", "qwen2"] = "llama"
    hidden_size: int = 64
    intermediate_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 64


@dataclass
class ModelSection:
    """The policy model: a local Hugging Face dir, a pretrained model from a pip package, or
    the built-in tiny one (both path and pretrained null).

    path: a local Hugging Face model directory (config.json, safetensors, tokenizer).
    pretrained: a name in hybridflow.engines.pretrained.PRETRAINED_MODELS (e.g.
        smollm2-135m-instruct), converted once into $HYBRIDFLOW_CACHE (~/.cache/hybridflow).
    trust_remote_code: let transformers run Python code that a model directory of the run
        names (an `auto_map` in config.json or tokenizer_config.json), with your permissions,
        in the controller and every worker. false (the default): such a directory is refused
        before anything starts. Only for directories whose code you have read.
    """

    path: str | None = None
    pretrained: str | None = None
    builtin: BuiltinModelSection = field(default_factory=BuiltinModelSection)
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        if self.path is not None and self.pretrained is not None:
            raise ConfigError(f"set path or pretrained, not both (path={self.path!r}, pretrained={self.pretrained!r})",
                              "pretrained")
        if self.pretrained is not None and self.pretrained not in PRETRAINED_MODELS:
            raise ConfigError(f"{self.pretrained!r} is unknown; known: {sorted(PRETRAINED_MODELS)}", "pretrained")

    @property
    def uses_builtin(self) -> bool:
        """True when the run writes the built-in tiny model (neither path nor pretrained)."""
        return self.path is None and self.pretrained is None
