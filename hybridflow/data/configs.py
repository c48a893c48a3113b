"""The data sections' config classes (`data.*`, `sft.data.*`, the rm command's `data.*`).

Torch- and transformers-free, so that the run config is validated before either is
imported; the datasets that read them (rl_dataset.py, sft_dataset.py,
pairwise_dataset.py) re-export them.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from hybridflow.errors import ConfigError


@dataclasses.dataclass
class PromptDataConfig:
    """How prompts are read, rendered, length-limited and padded.

    truncation: what to do with a prompt longer than max_prompt_length tokens when it is
        not filtered: "error" (raise, naming the row), "left" (keep the last tokens),
        "right" (keep the first tokens).
    filter_overlong_prompts: drop overlong prompts instead (counted in `stats`).
    apply_chat_template: true renders every prompt with the tokenizer's chat template (a
        plain-text prompt as one user message); false uses plain-text prompts as written;
        "conversational" templates the prompts given as chat messages and uses plain-text
        ones as written (TRL's rule).
    pad_to: "batch" pads each batch to its longest prompt; "max_length" always pads to
        max_prompt_length (fixed shapes).
    default_data_source: used for rows without a data_source column.
    """

    prompt_key: str = "prompt"
    max_prompt_length: int = 512
    truncation: Literal["error", "left", "right"] = "error"
    filter_overlong_prompts: bool = True
    apply_chat_template: bool | Literal["conversational"] = True
    pad_to: Literal["batch", "max_length"] = "batch"
    default_data_source: str | None = None
    max_samples: int | None = None

    def __post_init__(self) -> None:
        if self.max_prompt_length < 1:
            raise ConfigError(f"must be >= 1, got {self.max_prompt_length}", "max_prompt_length")
        if self.truncation not in ("error", "left", "right"):
            raise ConfigError(f"must be 'error', 'left' or 'right', got {self.truncation!r}", "truncation")
        if self.pad_to not in ("batch", "max_length"):
            raise ConfigError(f"must be 'batch' or 'max_length', got {self.pad_to!r}", "pad_to")
        if self.max_samples is not None and self.max_samples < 1:
            raise ConfigError(f"must be >= 1 or null, got {self.max_samples}", "max_samples")


@dataclasses.dataclass
class SFTDataConfig:
    """Columns, the length limit and what to do with pairs that exceed it.

    overlong: "filter" drops a pair whose prompt + response exceeds max_length,
        "truncate" cuts the response (keeping at least one response token), "error" raises.
    messages_key: a row with this column instead of prompt/response is a whole conversation
        (a list of chat messages): the model's own turns are trained on, the rest is
        context (data/conversation.py, docs/agents.md).
    """

    prompt_key: str = "prompt"
    response_key: str = "response"
    messages_key: str = "messages"
    max_length: int = 512
    overlong: Literal["filter", "truncate", "error"] = "filter"
    apply_chat_template: bool = True
    append_eos: bool = True

    def __post_init__(self) -> None:
        if self.max_length < 2:
            raise ConfigError(f"must be >= 2, got {self.max_length}", "max_length")
        if self.overlong not in ("filter", "truncate", "error"):
            raise ConfigError(f"must be 'filter', 'truncate' or 'error', got {self.overlong!r}", "overlong")


@dataclasses.dataclass
class PairwiseDataConfig:
    """Columns, the length limit and what to do with pairs over it (module docstring)."""

    prompt_key: str = "prompt"
    chosen_key: str = "chosen"
    rejected_key: str = "rejected"
    max_length: int = 512
    overlong: Literal["filter", "truncate", "error"] = "filter"
    apply_chat_template: bool = True
    append_eos: bool = True
    max_samples: int | None = None

    def __post_init__(self) -> None:
        if self.max_length < 2:
            raise ConfigError(f"must be >= 2, got {self.max_length}", "max_length")
        if self.overlong not in ("filter", "truncate", "error"):
            raise ConfigError(f"must be 'filter', 'truncate' or 'error', got {self.overlong!r}", "overlong")
        if self.max_samples is not None and self.max_samples < 1:
            raise ConfigError(f"must be >= 1 or null, got {self.max_samples}", "max_samples")
