"""Cross-section checks of a run config: `validate_run_config(cfg) -> Layout`.

Single sections check their own fields; this checks what they cannot: sizes against each
other and against the world size (sequences per step vs mini-batches, prompts vs generation
groups, placement) and the algorithm against the settings it implies. It runs before any
worker starts; every error is a ConfigError naming the key to change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hybridflow.config.algorithm import check_algorithm
from hybridflow.config.sections.async_rl import check_async_settings
from hybridflow.engines.rollout.external import EXTERNAL_ENGINES, require_gpu
from hybridflow.engines.rollout.settings import checked_decode_loop
from hybridflow.engines.train.config import EngineSettings
from hybridflow.errors import ConfigError
from hybridflow.workers.config import check_role_engine, check_role_pipeline

if TYPE_CHECKING:
    from hybridflow.config.schema import RunConfig


@dataclass(frozen=True)
class Layout:
    """Ranks of each role and the sizes derived from them (what validation checked)."""

    world_size: int
    actor_ranks: int
    critic_ranks: int
    rollout_groups: int
    sequences_per_step: int
    rollout_pool_ranks: int = 0  # the generation-only pool of trainer.mode one_step_off / async


def validate_run_config(cfg: RunConfig) -> Layout:
    """Cross-section checks; raises ConfigError naming the keys to change."""
    world = cfg.resources.resolved_world_size()
    if cfg.resources.placement == "split":
        if not cfg.use_critic:
            raise ConfigError(
                f"split puts the critic on its own ranks, but algorithm.name={cfg.algorithm.name} has no critic; "
                "use placement=colocated or an algorithm with a critic (e.g. algorithm.name=ppo)",
                "resources.placement",
            )
        if not 0 < cfg.resources.critic_ranks < world:
            raise ConfigError(
                f"{cfg.resources.critic_ranks} must leave the actor at least one of the resources.world_size={world} "
                "ranks (split placement: actor ranks = world_size - critic_ranks)", "resources.critic_ranks",
            )
        actor_ranks, critic_ranks = world - cfg.resources.critic_ranks, cfg.resources.critic_ranks
    else:
        actor_ranks = critic_ranks = world
    check_algorithm(cfg)  # what algorithm.name implies (its registry row)
    prompts = cfg.data.train_batch_size
    tp_gen = cfg.rollout.tensor_model_parallel_size
    if cfg.rollout.name in EXTERNAL_ENGINES and (why := require_gpu(cfg.rollout.name, cfg.resources.use_gpu)):
        raise ConfigError(why, "resources.use_gpu")
    run_decode_loop(cfg)
    if actor_ranks % tp_gen:
        raise ConfigError(f"{tp_gen} does not divide the actor's {actor_ranks} ranks",
                          "rollout.tensor_model_parallel_size")
    _check_actor_pipeline(cfg, actor_ranks, tp_gen)
    groups = actor_ranks // tp_gen
    if prompts % groups:
        raise ConfigError(
            f"{prompts} prompts cannot be shared by the {groups} generation groups (actor ranks {actor_ranks} / "
            f"rollout.tensor_model_parallel_size {tp_gen}); make it a multiple of {groups}", "data.train_batch_size",
        )
    actor_dp = _role_dp(cfg, "actor", actor_ranks, trainable=True)
    if cfg.use_critic:
        _role_dp(cfg, "critic", critic_ranks, trainable=True)
    for key in ("reward_model", "cost_model"):
        if getattr(cfg, key).path is not None:
            _role_dp(cfg, key, actor_ranks, trainable=False)
    _check_model_template(cfg)
    if cfg.sft.steps:
        _check_sft(cfg, actor_dp)
    max_len = cfg.data.prompt.max_prompt_length + cfg.rollout.response_length
    if cfg.model.uses_builtin and max_len > cfg.model.builtin.max_position_embeddings:
        raise ConfigError(
            f"{cfg.rollout.response_length} + data.prompt.max_prompt_length {cfg.data.prompt.max_prompt_length} = "
            f"{max_len} tokens exceed the built-in model's model.builtin.max_position_embeddings="
            f"{cfg.model.builtin.max_position_embeddings}", "rollout.response_length",
        )
    check_async_settings(cfg)
    pool = cfg.async_rl.rollout_ranks if cfg.trainer.mode != "sync" else 0
    return Layout(world, actor_ranks, critic_ranks if cfg.use_critic else 0, groups, prompts * cfg.rollout.n, pool)


def run_decode_loop(cfg: RunConfig) -> str:
    """rollout.decode_loop as the run's native rollout engines resolve it ("auto": "device"
    with resources.use_gpu, else "host"); ConfigError keyed rollout.* where
    rollout.compile_decode or rollout.cuda_graphs cannot run with it."""
    r = cfg.rollout
    try:
        return checked_decode_loop(r.decode_loop, "cuda" if cfg.resources.use_gpu else "cpu",
                                   compile_decode=r.compile_decode, cuda_graphs=r.cuda_graphs)
    except ConfigError as err:
        raise err.within("rollout") from None


def _check_actor_pipeline(cfg: RunConfig, actor_ranks: int, tp_gen: int) -> None:
    """actor.pp_size > 1: generation runs at p_g = 1 with its TP groups inside one pipeline
    stage (engines/reshard/grouping.py), and only the colocated sync mode moves the weights
    through the 3D-HybridEngine (the weight bridge to a separate rollout pool sends from
    rank 0, which holds one stage)."""
    pp = cfg.actor.pp_size
    if pp == 1:
        return
    if cfg.trainer.mode != "sync":
        raise ConfigError(f"must be 1 with trainer.mode={cfg.trainer.mode}: the weight bridge to the rollout pool "
                          "sends from training rank 0, which holds one pipeline stage; use trainer.mode=sync or "
                          "tensor / data parallelism for the actor", "actor.pp_size")
    if actor_ranks % pp == 0 and (actor_ranks // pp) % tp_gen:
        raise ConfigError(f"{tp_gen} does not divide the {actor_ranks // pp} ranks of each of the actor's {pp} "
                          "pipeline stages (generation groups lie inside one stage: p_g = 1)",
                          "rollout.tensor_model_parallel_size")


def _check_model_template(cfg: RunConfig) -> None:
    """The `reward_model` reward template needs the model, and is the whole composition."""
    from hybridflow.rewards.templates import model_weight

    if model_weight(cfg.reward.templates) is None:
        return
    if cfg.reward_model.path is None:
        raise ConfigError("names the reward_model template but reward_model.path is null; set reward_model.path "
                          "to a *ForSequenceClassification directory (e.g. from `hybridflow rm`)", "reward.templates")
    if cfg.reward_model.add_rule_reward:
        raise ConfigError("must stay false when reward.templates names reward_model: the templates list (with "
                          "its weights) already says how the model's score and the rules add up",
                          "reward_model.add_rule_reward")


def _role_dp(cfg: RunConfig, role: str, ranks: int, *, trainable: bool) -> int:
    """The role's data-parallel size on `ranks`, after the engine's and the role's own rules
    (a trained role's mini-batch must divide the sequences of a step)."""
    section: EngineSettings = getattr(cfg, role)
    prompts, n = cfg.data.train_batch_size, cfg.rollout.n
    try:
        if trainable and prompts * n % section.micro_batch.mini_batch_size:
            raise ConfigError(f"{section.micro_batch.mini_batch_size} does not divide the data.train_batch_size "
                              f"({prompts}) x rollout.n ({n}) = {prompts * n} sequences per step",
                              "micro_batch.mini_batch_size")
        (check_role_engine if trainable else check_role_pipeline)(role, section)
        return section.check_parallel(ranks, cfg.resources.use_gpu, trainable=trainable)
    except ConfigError as err:
        raise err.within(role) from None


# SFTSection keys of the MicroBatchConfig the SFT actor trains with (SFTSection.micro_batch).
_SFT_KEYS = {"mini_batch_size": "batch_size", "micro_batch_size_per_device": "micro_batch_size_per_device"}


def _check_sft(cfg: RunConfig, actor_dp: int) -> None:
    if cfg.data.train_files and not cfg.sft.files:
        raise ConfigError(
            f"is {cfg.sft.steps}: a warm start on your data (data.train_files is set), but sft.files is empty; give "
            "the prompt/response pairs in sft.files, or set sft.steps=0", "sft.steps",
        )
    try:
        cfg.sft.micro_batch(cfg.actor.micro_batch.forward_micro_batch_size_per_device).check(actor_dp)
    except ConfigError as err:
        raise ConfigError(err.message, f"sft.{_SFT_KEYS[err.key]}") from None
