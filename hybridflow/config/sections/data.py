"""The `data` section: RL prompt files or the built-in arithmetic task, and the batch size."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hybridflow.config.loader import at_least, in_unit
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
class CurriculumSection:
    """Easy prompts first (hybridflow/data/curriculum.py): in the first pass over the training
    prompts, step k draws its prompts from the easiest share start_fraction + (1 -
    start_fraction) * min(1, k / ramp_steps) of them, each prompt once; later passes are
    shuffled as without a curriculum.

    by: null (off); "column": each training row's `column` (a number, lower is easier; at
        the top of the row or in its extra_info), free; "pass_rate": the share of
        `pass_rate_samples` responses (at rollout.temperature) the policy gets right on each
        of `pass_rate_prompts` training prompts (a seeded choice) before the first RL step
        (after an SFT warm start), higher is easier, the other prompts after them: costs
        generating and scoring pass_rate_prompts x pass_rate_samples responses once, is
        printed, and is saved in <run>/curriculum_pass_rates.json (a resume reads it).
    """

    by: Literal["column", "pass_rate"] | None = None
    column: str = "difficulty"
    start_fraction: float = 0.25
    ramp_steps: int = 20
    pass_rate_prompts: int = 128
    pass_rate_samples: int = 4

    def __post_init__(self) -> None:
        in_unit(self, "start_fraction")
        at_least(self, 1, "ramp_steps", "pass_rate_prompts", "pass_rate_samples")


@dataclass
class DataSection:
    """RL prompts (verl parquet/jsonl columns), or the built-in task when train_files is empty.

    train_batch_size: prompts per RL step (each sampled rollout.n times).
    val_files: held-out prompts scored greedily (empty with the built-in task: its
        held-out split; empty with your own files: no evaluation).
    max_val_samples: cap on held-out prompts evaluated (null: all).
    curriculum: easy prompts first (CurriculumSection; off by default).
    """

    train_files: list[str] = field(default_factory=list)
    val_files: list[str] = field(default_factory=list)
    train_batch_size: int = 16
    max_val_samples: int | None = None
    shuffle: bool = True
    prompt: PromptDataConfig = field(default_factory=PromptDataConfig)
    builtin: BuiltinTaskSection = field(default_factory=BuiltinTaskSection)
    curriculum: CurriculumSection = field(default_factory=CurriculumSection)

    def __post_init__(self) -> None:
        at_least(self, 1, "train_batch_size")
        if self.val_files and not self.train_files:
            raise ConfigError("is set but train_files is empty (the built-in task); set both or neither", "val_files")
