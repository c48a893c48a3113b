"""The `sft` section: the supervised warm start (`hybridflow sft`, and before RL when sft.steps > 0)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hybridflow.config.loader import at_least, in_unit
from hybridflow.data.configs import SFTDataConfig
from hybridflow.engines.train.config import MicroBatchConfig, OptimConfig


@dataclass
class SFTSection:
    """Supervised warm start: `hybridflow sft`, and before RL when steps > 0.

    files: prompt/response pairs (columns prompt, response); empty = the built-in task's
        pairs (train split). batch_size: sequences per optimizer step (all ranks).
    test_freq: greedy held-out evaluation every this many SFT steps (0: before and after only).
    num_builtin_pairs / builtin_carry_drop_rate: the built-in task's pairs come from an
        imperfect teacher who forgets the carry in this share of its answers (see
        trainer/jobs/builtin.py; 0 gives exact answers).
    """

    steps: int = 400
    test_freq: int = 0
    files: list[str] = field(default_factory=list)
    batch_size: int = 256
    micro_batch_size_per_device: int = 128
    num_builtin_pairs: int = 8000
    builtin_carry_drop_rate: float = 0.6
    data: SFTDataConfig = field(default_factory=lambda: SFTDataConfig(max_length=64))
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=2e-3, weight_decay=0.0))

    def __post_init__(self) -> None:
        at_least(self, 0, "steps", "test_freq")
        at_least(self, 1, "batch_size", "micro_batch_size_per_device", "num_builtin_pairs")
        in_unit(self, "builtin_carry_drop_rate")

    def micro_batch(self, forward_micro_batch_size_per_device: int) -> MicroBatchConfig:
        """How the SFT actor cuts its batches: one optimizer step per batch_size sequences."""
        return MicroBatchConfig(
            mini_batch_size=self.batch_size, micro_batch_size_per_device=self.micro_batch_size_per_device,
            forward_micro_batch_size_per_device=forward_micro_batch_size_per_device,
        )
