"""Everything a run needs before its first step, built from the validated config.

`RunContext.open(cfg)` validates the config, creates the run directory (config.yaml),
starts or joins Ray, writes the built-in model when `model.path` is null, loads the
tokenizer, the prompt data sets and the reward manager. The worker-config builders turn
config sections into the workers' typed configs; `build_groups` places the roles.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from hybridflow.algorithms import PolicyLossConfig
from hybridflow.config.schema import Layout, RunConfig, resolve_run_config, validate_run_config
from hybridflow.controller import RoleSpec, WorkerGroup, init_ray
from hybridflow.data import (
    RLPromptDataset,
    ResumableLoader,
    load_tokenizer,
    make_builtin_model_dir,
    rl_records,
)
from hybridflow.engines.train.config import ActorLossConfig, MicroBatchConfig
from hybridflow.protocol import DataProto
from hybridflow.trainer.display import RunDisplay
from hybridflow.trainer.run_dir import MetricsLog, create_run_dir
from hybridflow.workers import (
    ActorRolloutRefConfig,
    ActorRolloutRefWorker,
    CriticWorker,
    CriticWorkerConfig,
    PlacementSpec,
    build_role_groups,
    shutdown_role_groups,
)


@dataclass
class RunContext:
    """The run's directory, logs, tokenizer, data and reward manager (shared by SFT and RL)."""

    cfg: RunConfig
    layout: Layout
    run_dir: Path
    log: MetricsLog
    display: RunDisplay
    model_path: str
    tokenizer: Any
    val_batch: DataProto | None
    reward: Any  # RewardManager
    ray_started: bool

    @classmethod
    def open(cls, cfg: RunConfig) -> RunContext:
        """Validate, then set everything up; `ctx.cfg` is the resolved config (no nulls that
        stand for a value), the one saved in the run directory."""
        validate_run_config(cfg)  # before anything starts
        cfg = resolve_run_config(cfg)
        layout = validate_run_config(cfg)
        run_dir = create_run_dir(cfg)
        display = RunDisplay(cfg.trainer.console)
        display.message(f"run directory: [bold]{run_dir}[/bold]")
        model_path = prepare_model(cfg, run_dir)
        tokenizer = load_tokenizer(model_path)
        val_batch = val_prompts(cfg, tokenizer)
        reward = build_reward_manager(cfg, tokenizer)
        try:
            ray_started = start_ray(cfg, layout)
        except BaseException:
            reward.close()
            raise
        return cls(cfg, layout, run_dir, MetricsLog(run_dir / "metrics.jsonl"), display, model_path, tokenizer,
                   val_batch, reward, ray_started)

    def close(self) -> None:
        self.display.stop()
        self.reward.close()
        self.log.close()
        if self.ray_started and ray.is_initialized():
            ray.shutdown()


def prepare_model(cfg: RunConfig, run_dir: Path) -> str:
    """model.path, or the built-in tiny model written into <run>/model."""
    if cfg.model.path is not None:
        return cfg.model.path
    sizes = dataclasses.asdict(cfg.model.builtin)
    family = sizes.pop("family")
    return str(make_builtin_model_dir(run_dir / "model", family=family, seed=cfg.seed, **sizes))


def start_ray(cfg: RunConfig, layout: Layout) -> bool:
    """Join resources.ray_address, or start an embedded Ray; reuse one already running.
    Returns whether this call started it (and the run should stop it)."""
    if ray.is_initialized():
        return False
    if cfg.resources.ray_address is not None:
        init_ray(address=cfg.resources.ray_address)
    else:
        # One logical CPU per rank at least; the ranks set their own thread counts.
        init_ray(num_cpus=max(os.cpu_count() or 1, layout.world_size))
    return True


def build_reward_manager(cfg: RunConfig, tokenizer: Any) -> Any:
    from hybridflow.rewards import RewardManager, load_reward_fn

    fn = None
    if cfg.reward.custom_fn_path is not None:
        fn = load_reward_fn(cfg.reward.custom_fn_path, cfg.reward.custom_fn_name)
    return RewardManager(tokenizer, cfg.reward.manager, compute_score=fn)


def train_prompts(cfg: RunConfig, tokenizer: Any) -> RLPromptDataset:
    if cfg.data.train_files:
        return RLPromptDataset(cfg.data.train_files, tokenizer, cfg.data.prompt)
    task = cfg.data.builtin
    return RLPromptDataset(None, tokenizer, cfg.data.prompt, rows=rl_records(task.task, "train", task.num_train))


def val_prompts(cfg: RunConfig, tokenizer: Any) -> DataProto | None:
    """The held-out prompts as one batch (None: nothing to evaluate on)."""
    if cfg.data.val_files:
        ds = RLPromptDataset(cfg.data.val_files, tokenizer, cfg.data.prompt)
    elif not cfg.data.train_files:
        task = cfg.data.builtin
        ds = RLPromptDataset(None, tokenizer, cfg.data.prompt, rows=rl_records(task.task, "test", task.num_val))
    else:
        return None
    count = len(ds) if cfg.data.max_val_samples is None else min(len(ds), cfg.data.max_val_samples)
    return ds.collate([ds[i] for i in range(count)])


def endless(loader: ResumableLoader) -> Iterator[Any]:
    """Batches of the loader, epoch after epoch."""
    while True:
        yield from loader


# ----------------------------------------------------------------------------- workers


def actor_config(cfg: RunConfig, model_path: str) -> ActorRolloutRefConfig:
    return ActorRolloutRefConfig(
        engine=cfg.actor.engine_config(model_path, cfg.seed), loss=cfg.actor.loss, rollout=cfg.rollout,
        use_reference=cfg.use_reference,
    )


def sft_actor_config(cfg: RunConfig, model_path: str) -> ActorRolloutRefConfig:
    """The actor for supervised fine-tuning: the "gpg" policy loss -A log pi with A = 1
    on every response token is the token-mean negative log-likelihood (see sft.py)."""
    engine = dataclasses.replace(
        cfg.actor.engine_config(model_path, cfg.seed),
        optim=cfg.sft.optim,
        micro_batch=MicroBatchConfig(
            mini_batch_size=cfg.sft.batch_size, micro_batch_size_per_device=cfg.sft.micro_batch_size_per_device,
            forward_micro_batch_size_per_device=cfg.actor.micro_batch.forward_micro_batch_size_per_device,
        ),
    )
    loss = ActorLossConfig(policy=PolicyLossConfig(loss_mode="gpg", loss_agg_mode="token-mean"))
    return ActorRolloutRefConfig(engine=engine, loss=loss, rollout=cfg.rollout, use_reference=False)


def critic_config(cfg: RunConfig, policy_path: str) -> CriticWorkerConfig:
    path = cfg.critic.model_path if cfg.critic.model_path is not None else policy_path
    return CriticWorkerConfig(engine=cfg.critic.engine_config(path, cfg.seed), loss=cfg.critic.loss)


def placement(cfg: RunConfig, layout: Layout, roles: list[str]) -> PlacementSpec:
    use_gpu = cfg.resources.use_gpu
    if cfg.resources.placement == "split" and "critic" in roles:
        return PlacementSpec(
            pools={"actor_pool": [layout.actor_ranks], "critic_pool": [layout.critic_ranks]},
            mapping={"actor": "actor_pool", "critic": "critic_pool"}, use_gpu=use_gpu,
        )
    return PlacementSpec.colocated([layout.world_size], use_gpu=use_gpu)


def build_groups(cfg: RunConfig, layout: Layout, roles: dict[str, RoleSpec]) -> dict[str, WorkerGroup]:
    """Place and initialise the roles (model loading, sharding, generation engine)."""
    groups = build_role_groups(roles, placement(cfg, layout, list(roles)))
    try:
        for group in groups.values():
            group.init_model()
    except BaseException:
        shutdown_role_groups(groups)
        raise
    return groups


def rl_roles(cfg: RunConfig, model_path: str) -> dict[str, RoleSpec]:
    roles = {"actor": RoleSpec(ActorRolloutRefWorker, (actor_config(cfg, model_path),))}
    if cfg.use_critic:
        roles["critic"] = RoleSpec(CriticWorker, (critic_config(cfg, model_path),))
    return roles
