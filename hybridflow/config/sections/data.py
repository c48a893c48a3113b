"""The `data` section: RL prompt files or the built-in arithmetic task, and the batch size."""

from __future__ import annotations

from dataclasses import dataclass, field

from hybridflow.config.loader import at_least
from hybridflow.data.arithmetic import ArithmeticConfig
from hybridflow.data.configs import PromptDataConfig
from hybridflow.errors import ConfigError


@dataclass
class BuiltinTaskSection:
    """The built-in arithmetic task used when data.train_files is empty."""

    task: ArithmeticConfig = field(default_factory=ArithmeticConfig)
    num_train: int = 4000
    num_val: int = 200

    def __post_init__(self) -> None:
        at_least(self, 1, "num_train", "num_val")


@dataclass
class DataSection:
    """RL prompts (verl parquet/jsonl columns), or the built-in task when train_files is empty.

    train_batch_size: prompts per RL step (each sampled rollout.n times).
    val_files: held-out prompts scored greedily (empty with the built-in task: its
        held-out split; empty with your own files: no evaluation).
    max_val_samples: cap on held-out prompts evaluated (null: all).
    """

    train_files: list[str] = field(default_factory=list)
    val_files: list[str] = field(default_factory=list)
    train_batch_size: int = 16
    max_val_samples: int | None = None
    shuffle: bool = True
    prompt: PromptDataConfig = field(default_factory=PromptDataConfig)
    builtin: BuiltinTaskSection = field(default_factory=BuiltinTaskSection)

    def __post_init__(self) -> None:
        at_least(self, 1, "train_batch_size")
        if self.val_files and not self.train_files:
            raise ConfigError("is set but train_files is empty (the built-in task); set both or neither", "val_files")
