"""The config tree of a reward-model training run (`hybridflow rm`, trainer/rm.py).

    cfg = load_rm_config("examples/rm_hh_rlhf.yaml", ["engine.optim.lr=2e-5"])

Sections (each a dataclass; every default lives here, once):

    name, seed      run name (run dir `<trainer.output_dir>/<name>-<timestamp>`); seed of the
                    score-head init, the held-out split, data order and the engine
    trainer         epochs or steps, held-out evaluation cadence, output dir, console
    resources       ranks, GPUs, Ray address
    model           a local HF causal LM (a one-label score head is added) or an existing
                    one-label *ForSequenceClassification; null = the built-in tiny model
    data            preference-pair files (`hybridflow preprocess hh-rlhf` output), held-out
                    files or fraction, pairs per step, length limit
    engine          the training engine (optimizer, micro-batches, precision, TP); its
                    micro_batch sizes count pairs (one pair = two sequences in one forward)

`validate_rm_config(cfg)` checks sizes against each other and the world size before
anything starts, and returns the resolved world size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from hybridflow.config.loader import ConfigError, load_config
from hybridflow.config.schema import BuiltinModelSection, EngineSection, ResourceSection
from hybridflow.data.pairwise_dataset import PairwiseDataConfig
from hybridflow.engines.train.config import EngineConfigError, MicroBatchConfig, OptimConfig
from hybridflow.workers.config import RewardModelWorkerConfig, WorkerConfigError


@dataclass
class RMTrainerSection:
    """How long, how often to evaluate, where the run goes.

    epochs: passes over the training pairs (used when total_steps is null).
    total_steps: trainer steps of data.batch_size pairs each; null = epochs x (train
        pairs // data.batch_size).
    eval_freq: held-out pairwise accuracy every this many steps (0: before and after only).
    save_model: export the trained reward model to <run>/reward_model (HF format).
    output_dir / run_dir / console: as in the RL run config (trainer section).
    """

    epochs: int = 1
    total_steps: int | None = None
    eval_freq: int = 0
    save_model: bool = True
    output_dir: str = "runs"
    run_dir: str | None = None
    console: Literal["rich", "plain", "none"] = "rich"

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if self.total_steps is not None and self.total_steps < 1:
            raise ValueError(f"total_steps must be >= 1 or null (from epochs), got {self.total_steps}")
        if self.eval_freq < 0:
            raise ValueError(f"eval_freq must be >= 0 (0 = before and after only), got {self.eval_freq}")


@dataclass
class RMResourceSection:
    """Ranks (null: one per local core or GPU, see ResourceSection), GPUs, Ray address."""

    world_size: int | None = None
    use_gpu: bool = False
    ray_address: str | None = None

    def __post_init__(self) -> None:
        if self.world_size is not None and self.world_size < 1:
            raise ValueError(f"world_size must be >= 1 or null (one per local core), got {self.world_size}")

    def resolved_world_size(self) -> int:
        return ResourceSection(world_size=self.world_size, use_gpu=self.use_gpu).resolved_world_size()


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
        if self.batch_size < 1 or self.eval_batch_size < 1:
            raise ValueError(f"batch_size and eval_batch_size must be >= 1, got {self.batch_size}, "
                             f"{self.eval_batch_size}")
        if not self.val_files and not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1) when val_files is empty, got {self.val_fraction}")
        if self.max_val_pairs is not None and self.max_val_pairs < 1:
            raise ValueError(f"max_val_pairs must be >= 1 or null, got {self.max_val_pairs}")


def _default_engine() -> EngineSection:
    return EngineSection(
        optim=OptimConfig(lr=1e-5, weight_decay=0.0),
        micro_batch=MicroBatchConfig(mini_batch_size=32, micro_batch_size_per_device=8,
                                     forward_micro_batch_size_per_device=32),
    )


@dataclass
class RMConfig:
    """A reward-model training run (see the module docstring)."""

    name: str = "reward-model"
    seed: int = 0
    trainer: RMTrainerSection = field(default_factory=RMTrainerSection)
    resources: RMResourceSection = field(default_factory=RMResourceSection)
    model: RMModelSection = field(default_factory=RMModelSection)
    data: RMDataSection = field(default_factory=RMDataSection)
    engine: EngineSection = field(default_factory=_default_engine)

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name.strip() != self.name:
            raise ValueError(f"name must be a non-empty directory-safe word, got {self.name!r}")


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
        raise ConfigError("data.train_files is empty; give preference-pair files (prompt, chosen, rejected), e.g. "
                          "from `hybridflow preprocess hh-rlhf --input FILE --output pairs.parquet`")
    if cfg.model.path is None and cfg.data.pairs.max_length > cfg.model.builtin.max_position_embeddings:
        raise ConfigError(
            f"data.pairs.max_length={cfg.data.pairs.max_length} exceeds the built-in model's "
            f"model.builtin.max_position_embeddings={cfg.model.builtin.max_position_embeddings}; lower the one "
            "or raise the other"
        )
    world = cfg.resources.resolved_world_size()
    mb = cfg.engine.micro_batch
    if cfg.data.batch_size % mb.mini_batch_size != 0:
        raise ConfigError(
            f"data.batch_size={cfg.data.batch_size} pairs per step is not a multiple of "
            f"engine.micro_batch.mini_batch_size={mb.mini_batch_size} (pairs per optimizer step)"
        )
    try:
        worker = rm_worker_config(cfg, cfg.model.path or "<built-in>")
        worker.engine.check_parallel(world, cfg.resources.use_gpu)
    except (EngineConfigError, WorkerConfigError) as err:
        raise ConfigError(f"engine (world size {world}): {err}") from err
    return world
