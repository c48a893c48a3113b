"""Cross-section checks of a run config: `validate_run_config(cfg) -> Layout`.

Single sections check their own fields; this checks what they cannot: sizes against each
other and against the world size (batch vs dp x micro-batch, n samples, tensor-parallel
sizes, placement) and the algorithm against the settings it implies. It runs before any
worker starts; every error names the keys to change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hybridflow.config.algorithm import check_algorithm
from hybridflow.config.loader import ConfigError
from hybridflow.engines.train.config import MicroBatchConfig

if TYPE_CHECKING:
    from hybridflow.config.schema import EngineSection, RunConfig


@dataclass(frozen=True)
class Layout:
    """Ranks of each role and the sizes derived from them (what validation checked)."""

    world_size: int
    actor_ranks: int
    critic_ranks: int
    actor_dp: int
    critic_dp: int
    rollout_groups: int
    sequences_per_step: int


def validate_run_config(cfg: RunConfig) -> Layout:
    """Cross-section checks; raises ConfigError naming the keys to change."""
    world = cfg.resources.resolved_world_size()
    if cfg.resources.placement == "split":
        if not cfg.use_critic:
            raise ConfigError(
                "resources.placement=split puts the critic on its own ranks, but algorithm.name="
                f"{cfg.algorithm.name} has no critic; use placement=colocated or algorithm.name=ppo"
            )
        if not 0 < cfg.resources.critic_ranks < world:
            raise ConfigError(
                f"resources.critic_ranks={cfg.resources.critic_ranks} must leave the actor at least one of the "
                f"resources.world_size={world} ranks (split placement: actor ranks = world_size - critic_ranks)"
            )
        actor_ranks, critic_ranks = world - cfg.resources.critic_ranks, cfg.resources.critic_ranks
    else:
        actor_ranks = critic_ranks = world
    if cfg.use_critic and cfg.critic.lora.enabled:
        raise ConfigError("critic.lora.rank must be 0: LoRA is supported for the actor only")

    n = cfg.rollout.n
    check_algorithm(cfg)  # what algorithm.name implies (its registry row)
    prompts = cfg.data.train_batch_size
    sequences = prompts * n
    actor_dp = _engine_dp(cfg.actor, actor_ranks, cfg.resources.use_gpu, "actor")
    tp_gen = cfg.rollout.tensor_model_parallel_size
    if actor_ranks % tp_gen:
        raise ConfigError(
            f"rollout.tensor_model_parallel_size={tp_gen} does not divide the actor's {actor_ranks} ranks"
        )
    groups = actor_ranks // tp_gen
    if prompts % groups:
        raise ConfigError(
            f"data.train_batch_size={prompts} prompts cannot be shared by the {groups} generation groups "
            f"(actor ranks {actor_ranks} / rollout.tensor_model_parallel_size {tp_gen}); make it a multiple of {groups}"
        )
    _check_update_batch("actor", cfg.actor.micro_batch, sequences, prompts, n, actor_dp)
    critic_dp = 0
    if cfg.use_critic:
        critic_dp = _engine_dp(cfg.critic, critic_ranks, cfg.resources.use_gpu, "critic")
        _check_update_batch("critic", cfg.critic.micro_batch, sequences, prompts, n, critic_dp)
    for key in ("reward_model", "cost_model"):
        section = getattr(cfg, key)
        if section.path is not None:
            _engine_dp(section, actor_ranks, cfg.resources.use_gpu, key)
            if section.lora.enabled:
                raise ConfigError(f"{key}.lora.rank must be 0: the {key} is frozen")
    if cfg.sft.steps:
        if cfg.data.train_files and not cfg.sft.files:
            raise ConfigError(
                f"sft.steps={cfg.sft.steps} asks for a warm start on your data (data.train_files is set) but "
                "sft.files is empty; give the prompt/response pairs in sft.files, or set sft.steps=0"
            )
        if cfg.sft.batch_size % (actor_dp * cfg.sft.micro_batch_size_per_device):
            raise ConfigError(
                f"sft.batch_size={cfg.sft.batch_size} is not a multiple of the actor's dp {actor_dp} x "
                f"sft.micro_batch_size_per_device {cfg.sft.micro_batch_size_per_device}"
            )
    max_len = cfg.data.prompt.max_prompt_length + cfg.rollout.response_length
    if cfg.model.uses_builtin and max_len > cfg.model.builtin.max_position_embeddings:
        raise ConfigError(
            f"data.prompt.max_prompt_length + rollout.response_length = {max_len} exceeds the built-in model's "
            f"model.builtin.max_position_embeddings={cfg.model.builtin.max_position_embeddings}"
        )
    return Layout(world, actor_ranks, critic_ranks if cfg.use_critic else 0, actor_dp, critic_dp, groups, sequences)


def _engine_dp(section: EngineSection, ranks: int, use_gpu: bool, role: str) -> int:
    if ranks % section.tp_size:
        raise ConfigError(f"{role}.tp_size={section.tp_size} does not divide the {role}'s {ranks} ranks")
    if (section.param_offload or section.optimizer_offload) and not use_gpu:
        raise ConfigError(f"{role}.param_offload / optimizer_offload need resources.use_gpu=true; set both to false")
    return ranks // section.tp_size


def _check_update_batch(role: str, mb: MicroBatchConfig, sequences: int, prompts: int, n: int, dp: int) -> None:
    where = f"data.train_batch_size ({prompts}) x rollout.n ({n}) = {sequences} sequences per step"
    if sequences % mb.mini_batch_size:
        raise ConfigError(f"{where} is not a multiple of {role}.micro_batch.mini_batch_size={mb.mini_batch_size}")
    if mb.mini_batch_size % dp:
        raise ConfigError(
            f"{role}.micro_batch.mini_batch_size={mb.mini_batch_size} is not divisible by the {role}'s "
            f"data-parallel size {dp} (ranks / tp_size); every rank must get the same number of sequences"
        )
    per_rank = mb.mini_batch_size // dp
    if not mb.use_dynamic_bsz and per_rank % mb.micro_batch_size_per_device:
        raise ConfigError(
            f"{role}.micro_batch.mini_batch_size / dp = {per_rank} sequences per rank is not a multiple of "
            f"{role}.micro_batch.micro_batch_size_per_device={mb.micro_batch_size_per_device}"
        )
