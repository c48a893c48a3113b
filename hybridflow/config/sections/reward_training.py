"""The `rm` section of reward-model training runs (`hybridflow rm`, config/rm_schema.py): the
preference pairs, the training engine, how long, how often to evaluate, the export.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hybridflow.config.loader import at_least
from hybridflow.data.configs import PairwiseDataConfig
from hybridflow.engines.train.config import MicroBatchConfig, OptimConfig, TrainEngineSettings
from hybridflow.errors import ConfigError


@dataclass
class RMDataSection:
    """Preference pairs (columns prompt, chosen, rejected) and how they are batched.

    val_files: held-out pairs; empty = a seeded val_fraction of the training pairs.
    max_val_pairs: cap on held-out pairs evaluated (null: all).
    batch_size: pairs per trainer step (all ranks); split into optimizer steps of
        rm.engine.micro_batch.mini_batch_size pairs.
    eval_batch_size: pairs per scoring call during evaluation (bounds padding and memory).
    pairs: columns, chat template, the length limit and overlong handling.
    """

    train_files: list[str] = field(default_factory=list)
    val_files: list[str] = field(default_factory=list)
    val_fraction: float = 0.1
    max_val_pairs: int | None = None
    batch_size: int = 32
    eval_batch_size: int = 256
    shuffle: bool = True
    pairs: PairwiseDataConfig = field(default_factory=PairwiseDataConfig)

    def __post_init__(self) -> None:
        at_least(self, 1, "batch_size", "eval_batch_size")
        if not self.val_files and not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"must be in (0, 1) when val_files is empty, got {self.val_fraction}", "val_fraction")
        at_least(self, 1, "max_val_pairs", null="")


@dataclass
class RMSection:
    """What a reward-model run trains on and how long.

    data: the preference pairs (RMDataSection).
    engine: the training engine (optimizer, micro-batches, precision, TP); its micro_batch
        sizes count pairs (one pair = two sequences in one forward).
    epochs: passes over the training pairs (used when total_steps is null).
    total_steps: steps of data.batch_size pairs each; null = epochs x (train pairs // batch_size).
    eval_freq: held-out pairwise accuracy every this many steps (0: before and after only).
    save_model: export the trained reward model to <run>/reward_model (HF format).
    """

    data: RMDataSection = field(default_factory=RMDataSection)
    # A reward model's own defaults (its micro-batch sizes count pairs); the class is the
    # engine's, so every engine setting is an `rm.engine.*` key.
    engine: TrainEngineSettings = field(default_factory=lambda: TrainEngineSettings(
        optim=OptimConfig(lr=1e-5, weight_decay=0.0), micro_batch=MicroBatchConfig(
            mini_batch_size=32, micro_batch_size_per_device=8, forward_micro_batch_size_per_device=32)))
    epochs: int = 1
    total_steps: int | None = None
    eval_freq: int = 0
    save_model: bool = True

    def __post_init__(self) -> None:
        at_least(self, 1, "epochs")
        at_least(self, 1, "total_steps", null="from epochs")
        at_least(self, 0, "eval_freq", note="0 = before and after only")
