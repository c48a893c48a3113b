"""The config tree of a training run (`hybridflow train` / `hybridflow sft` / `RLTrainer`).

    cfg = load_run_config("examples/grpo_arithmetic.yaml", ["actor.optim.lr=1e-4"])
    cfg = load_run_config()               # the built-in demo: arithmetic, tiny model, GRPO
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hybridflow.config.algorithm import AlgorithmSection, resolved_algorithm
from hybridflow.config.loader import _build, _set_path, nest_dotted, user_tree
from hybridflow.config.model_presets import read_model_presets
from hybridflow.config.sections.async_rl import AsyncSection
from hybridflow.config.sections.data import DataSection
from hybridflow.config.sections.environment import (
    DistributedSection,
    EnvSection,
    PolicySection,
    PPOSection,
    SACSection,
)
from hybridflow.config.sections.model import ModelSection
from hybridflow.config.sections.resources import ResourceSection
from hybridflow.config.sections.reward_training import RMSection
from hybridflow.config.sections.rewards import CostModelSection, RewardModelSection, RewardSection
from hybridflow.config.sections.roles import ActorSection, CriticSection
from hybridflow.config.sections.sft import SFTSection
from hybridflow.config.sections.trainer import TrainerSection, check_run_name
from hybridflow.config.validation import run_decode_loop, validate_run_config
from hybridflow.workers.config import RolloutWorkerConfig


@dataclass
class RunConfig:
    """The whole run (see the module docstring)."""

    name: str | None = "arithmetic-grpo"  # null: an environment task's <env>-<algorithm>
    seed: int = 0
    trainer: TrainerSection = field(default_factory=TrainerSection)
    resources: ResourceSection = field(default_factory=ResourceSection)
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    algorithm: AlgorithmSection = field(default_factory=AlgorithmSection)
    actor: ActorSection = field(default_factory=ActorSection)
    rollout: RolloutWorkerConfig = field(default_factory=RolloutWorkerConfig)
    critic: CriticSection = field(default_factory=CriticSection)
    reward: RewardSection = field(default_factory=RewardSection)
    reward_model: RewardModelSection = field(default_factory=RewardModelSection)
    cost_model: CostModelSection = field(default_factory=CostModelSection)
    sft: SFTSection = field(default_factory=SFTSection)
    async_rl: AsyncSection = field(default_factory=AsyncSection)  # trainer.mode one_step_off / async
    env: EnvSection | None = None
    policy: PolicySection | None = None
    distributed: DistributedSection | None = None
    ppo: PPOSection | None = None
    sac: SACSection | None = None
    rm: RMSection | None = None  # reward-model training runs (`hybridflow rm`, rm_schema.py)

    def __post_init__(self) -> None:
        if self.name is not None:
            check_run_name(self.name)

    @property
    def task_kind(self) -> Any:
        """The TaskKind row of this config (config/tasks.py)."""
        from hybridflow.config.tasks import task_kind_of_config  # tasks.py builds configs with this module

        return task_kind_of_config(self)

    def omitted_keys(self) -> tuple[str, ...]:
        """The keys its tree leaves out (config_to_dict): those only other task kinds read."""
        return tuple(self.task_kind.foreign_keys())

    @property
    def use_critic(self) -> bool:
        return bool(self.algorithm.spec.critics)

    @property
    def use_reference(self) -> bool:
        return self.actor.loss.use_kl_loss or self.algorithm.use_kl_in_reward

    @property
    def fuses_old_log_probs(self) -> bool:
        """The actor update computes old_log_probs itself (actor.old_log_probs: auto)."""
        mb = self.actor.micro_batch
        sequences = self.data.train_batch_size * self.rollout.n
        return (self.actor.old_log_probs == "auto" and mb.epochs == 1 and mb.mini_batch_size >= sequences
                and not self.use_reference)


# The built-in demo's own values (group size, 6-token answers, learning rates and batch cuts):
# what the tiny model (64 positions) and the arithmetic task (answers of a few tokens, 16
# prompts x 8 samples per step) are tuned for. `load_run_config` applies them when a run uses
# the built-in model or the built-in task, to the keys the user does not set; every other run
# gets the defaults of the config classes (one definition per setting).
DEMO_PRESETS: tuple[tuple[str, object], ...] = (
    ("data.prompt.max_prompt_length", 32),
    ("rollout.n", 8),
    ("rollout.response_length", 6),
    ("actor.optim.lr", 1e-4),
    ("actor.optim.weight_decay", 0.0),
    ("actor.micro_batch.mini_batch_size", 128),
    ("actor.micro_batch.micro_batch_size_per_device", 64),
    ("actor.micro_batch.forward_micro_batch_size_per_device", 64),
    ("critic.optim.lr", 1e-3),
    ("critic.optim.weight_decay", 0.0),
    ("critic.micro_batch.mini_batch_size", 128),
    ("critic.micro_batch.micro_batch_size_per_device", 32),
    ("critic.micro_batch.forward_micro_batch_size_per_device", 64),
)


# The built-in tiny model computes in fp32 wherever it runs. `dtype: auto` can measure bf16
# faster even at its size (hidden 64) on a CPU with AVX512_BF16, but bf16 rounding costs this
# model learning: measured on an AMD EPYC with AVX512_BF16 (the demo's SFT + 10 GRPO steps,
# seed 0), greedy held-out accuracy 0.59 -> 0.90 in fp32 and 0.33 -> 0.46 in bf16.
BUILTIN_MODEL_PRESETS: tuple[tuple[str, object], ...] = (
    ("actor.dtype", "fp32"),
    ("rollout.dtype", "fp32"),
    ("critic.dtype", "fp32"),
)


def run_presets(cfg: RunConfig, demo: bool = True) -> tuple[tuple[str, object], ...]:
    """The presets of a run: the demo's when it uses the built-in model or task (and fp32
    for the built-in model; `demo` False leaves the demo's out, as `hybridflow eval` of a
    model directory does), then those saved next to the weights of model.path
    (model_presets.py), then its algorithm's (AlgorithmSpec.presets; a later preset of the
    same key wins)."""
    demo_presets = DEMO_PRESETS if demo and (cfg.model.uses_builtin or not cfg.data.train_files) else ()
    builtin_model = BUILTIN_MODEL_PRESETS if cfg.model.uses_builtin else ()
    return (*demo_presets, *builtin_model, *read_model_presets(cfg.model.path), *cfg.algorithm.spec.presets)


def load_run_config(path: str | Path | None = None, overrides: list[str] = (), demo: bool = True) -> RunConfig:
    """Load and fully validate a run config (YAML file + dotted overrides; `run_config_from_tree`)."""
    return run_config_from_tree(user_tree(path, list(overrides)), demo)


def run_config_from_tree(tree: dict[str, Any], demo: bool = True) -> RunConfig:
    """Build and fully validate a run config from a user's tree (a YAML file's, with its
    overrides applied; or a dict, which may use dotted keys and give a reward function as
    the function itself). The presets (`run_presets`; `demo` False: without the built-in
    demo's) fill the keys the tree does not set. The tree is read, never re-read from its file."""
    from hybridflow.config.tasks import TASK_KINDS, check_own_keys  # tasks.py names this module's builders

    tree = nest_dotted(tree)
    check_own_keys(TASK_KINDS["language_model"], tree)
    if isinstance(tree.get("algorithm"), str):  # the flat form `algorithm: grpo`, as environment tasks write it
        tree["algorithm"] = {"name": tree["algorithm"]}
    cfg = _build(RunConfig, copy.deepcopy(tree))
    presets = [(key, value) for key, value in dict(run_presets(cfg, demo)).items() if not _user_sets(tree, key)]
    if presets:
        with_presets = copy.deepcopy(tree)
        for key, value in presets:
            _set_path(with_presets, key.split("."), copy.deepcopy(value))
        cfg = _build(RunConfig, with_presets)
    validate_run_config(cfg)
    return cfg


def _user_sets(tree: dict[str, Any], key: str) -> bool:
    """Whether the user's `tree` sets the dotted `key`: the key itself, or a parent given a
    value rather than a section (e.g. `actor.loss.policy: null`)."""
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict):
            return True
        if part not in node:
            return False
        node = node[part]
    return True


def resolve_run_config(cfg: RunConfig) -> RunConfig:
    """A copy with the values that null or auto stand for filled in, what a run saves as its
    config.yaml: resources.world_size and threads_per_rank, algorithm.adv_estimator,
    algorithm.dapo.overlong_buffer.len, each role's dtype: auto (config/dtypes.py),
    resources.omp_wait_policy: auto and on a shared machine threads_per_rank (controller/omp.py),
    reward.manager.memory_limit_mb and cpu_time_s: auto (rewards/limits.py), rollout.decode_loop:
    auto (config/validation.py: run_decode_loop)."""
    from hybridflow.config.dtypes import resolved_dtypes
    from hybridflow.controller import omp  # imports Ray and torch: only when a run resolves
    from hybridflow.rewards.limits import resolved_limits

    resources = omp.resolve_for_load(cfg.resources, resolved_resources(cfg.resources))
    reward = dataclasses.replace(cfg.reward, manager=resolved_limits(cfg.reward.manager))
    rollout = dataclasses.replace(cfg.rollout, decode_loop=run_decode_loop(cfg))
    cfg = dataclasses.replace(cfg, resources=resources, algorithm=resolved_algorithm(cfg), reward=reward,
                              rollout=rollout)
    return resolved_dtypes(cfg)


def resolved_resources(resources: ResourceSection) -> ResourceSection:
    """`resources` with world_size and threads_per_rank picked for this machine where null."""
    world = resources.resolved_world_size()
    return dataclasses.replace(resources, world_size=world,
                               threads_per_rank=resources.resolved_threads_per_rank(world))
