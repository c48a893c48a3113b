"""The config tree of a reward-model training run (`hybridflow rm`, trainer/jobs/rm.py).

    cfg = load_rm_config("examples/rm_hh_rlhf.yaml", ["engine.optim.lr=2e-5"])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hybridflow.config.loader import at_least, load_config
from hybridflow.config.sections.model import BuiltinModelSection
from hybridflow.config.sections.resources import ComputeSection
from hybridflow.config.sections.trainer import RunOutputSection, check_run_name
from hybridflow.data.configs import PairwiseDataConfig
from hybridflow.engines.train.config import MicroBatchConfig, OptimConfig, TrainEngineSettings
from hybridflow.errors import ConfigError
from hybridflow.workers.config import RewardModelWorkerConfig


@dataclass
class RMTrainerSection(RunOutputSection):
    """How long, how often to evaluate, where the run goes (RunOutputSection's keys).

    epochs: passes over the training pairs (used when total_steps is null).
    total_steps: trainer steps of data.batch_size pairs each; null = epochs x (train
        pairs // data.batch_size).
    eval_freq: held-out pairwise accuracy every this many steps (0: before and after only).
    save_model: export the trained reward model to <run>/reward_model (HF format).
    """

    epochs: int = 1
    total_steps: int | None = None
    eval_freq: int = 0
    save_model: bool = True

    def __post_init__(self) -> None:
        at_least(self, 1, "epochs")
        at_least(self, 1, "total_steps", null="from epochs")
        at_least(self, 0, "eval_freq", note="0 = before and after only")


@dataclass
class RMModelSection:
    """The model to start from: a local HF dir with its tokenizer, or the built-in tiny one.

    A causal LM gets a freshly initialised one-label score head (seeded) and is written to
    <run>/init_reward_model; a one-label *ForSequenceClassification is trained as it is.
    """

    path: str | None = None
    builtin: BuiltinModelSection = field(default_factory=lambda: BuiltinModelSection(max_position_embeddings=512))


@dataclass
class RMDataSection:
    """Preference pairs (columns prompt, chosen, rejected) and how they are batched.

    val_files: held-out pairs; empty = a seeded val_fraction of the training pairs.
    max_val_pairs: cap on held-out pairs evaluated (null: all).
    batch_size: pairs per trainer step (all ranks); split into optimizer steps of
        engine.micro_batch.mini_batch_size pairs.
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
class RMConfig:
    """A reward-model training run (see the module docstring)."""

    name: str = "reward-model"
    seed: int = 0
    trainer: RMTrainerSection = field(default_factory=RMTrainerSection)
    resources: ComputeSection = field(default_factory=ComputeSection)
    model: RMModelSection = field(default_factory=RMModelSection)
    data: RMDataSection = field(default_factory=RMDataSection)
    # A reward model's own defaults (its micro-batch sizes count pairs); the class is the
    # engine's, so every engine setting is an `engine.*` key here too.
    engine: TrainEngineSettings = field(default_factory=lambda: TrainEngineSettings(
        optim=OptimConfig(lr=1e-5, weight_decay=0.0), micro_batch=MicroBatchConfig(
            mini_batch_size=32, micro_batch_size_per_device=8, forward_micro_batch_size_per_device=32)))

    def __post_init__(self) -> None:
        check_run_name(self.name)


def load_rm_config(path: str | Path | None = None, overrides: list[str] = ()) -> RMConfig:
    """Load a reward-model run config (YAML file + dotted overrides) and validate it."""
    cfg = load_config(RMConfig, path, overrides)
    validate_rm_config(cfg)
    return cfg


def rm_worker_config(cfg: RMConfig, model_path: str) -> RewardModelWorkerConfig:
    """The worker config of the trained reward model."""
    return RewardModelWorkerConfig(engine=cfg.engine.engine_config(model_path, cfg.seed))


def validate_rm_config(cfg: RMConfig) -> int:
    """Cross-section checks (ConfigError naming the keys to change); returns the world size."""
    if not cfg.data.train_files:
        raise ConfigError("is empty; give preference-pair files (prompt, chosen, rejected), e.g. from "
                          "`hybridflow preprocess hh-rlhf --input FILE --output pairs.parquet`", "data.train_files")
    if cfg.model.path is None and cfg.data.pairs.max_length > cfg.model.builtin.max_position_embeddings:
        raise ConfigError(
            f"{cfg.data.pairs.max_length} exceeds the built-in model's model.builtin.max_position_embeddings="
            f"{cfg.model.builtin.max_position_embeddings}; lower the one or raise the other", "data.pairs.max_length",
        )
    world = cfg.resources.resolved_world_size()
    mb = cfg.engine.micro_batch
    if cfg.data.batch_size % mb.mini_batch_size != 0:
        raise ConfigError(
            f"{cfg.data.batch_size} pairs per step is not a multiple of engine.micro_batch.mini_batch_size="
            f"{mb.mini_batch_size} (pairs per optimizer step)", "data.batch_size",
        )
    rm_worker_config(cfg, cfg.model.path or "<built-in>")  # the role's rules; its keys are engine.* here too
    try:
        cfg.engine.check_parallel(world, cfg.resources.use_gpu, trainable=True)
    except ConfigError as err:
        raise err.within("engine") from None
    return world
