"""Everything a run needs before its first step, built from the validated config.

`RunContext.open(cfg)` validates the config, checks the model, data and reward files
(run/preflight.py), creates the run directory (config.yaml; removed again when the start fails),
starts or joins Ray, finds the starting model (run/lifecycle.py: writes the built-in one when
model.path and model.pretrained are null), loads the tokenizer, the prompt data sets and
the reward manager. The worker-config builders turn config sections into the workers'
typed configs; `build_groups` places the roles.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybridflow.algorithms import PolicyLossConfig
from hybridflow.config import ConfigError, save_config
from hybridflow.config.dtypes import auto_note, auto_sections
from hybridflow.config.schema import RunConfig, resolve_run_config
from hybridflow.config.sections.resources import ComputeSection
from hybridflow.config.validation import Layout, validate_run_config
from hybridflow.controller import RayHold, RoleSpec, WorkerGroup, network, omp
from hybridflow.data import (
    RLPromptDataset,
    ResumableLoader,
    load_tokenizer,
    rl_records,
)
from hybridflow.engines.models import load_hf_config
from hybridflow.engines.train.config import ActorLossConfig
from hybridflow.protocol import DataProto
from hybridflow.rewards import RewardManager, load_reward_fn
from hybridflow.rewards.templates import ComposedScore, parse_templates
from hybridflow.trainer.run.checkpointing import SavedRun, reopen_run_dir
from hybridflow.trainer.observe.display import RunDisplay
from hybridflow.trainer.run.lifecycle import base_model_path
from hybridflow.trainer.observe.loggers import RunLoggers, build_loggers
from hybridflow.trainer.run.preflight import check_lengths_fit, preflight
from hybridflow.trainer.run.run_dir import create_run_dir, discard_unused_run_dir
from hybridflow.workers import (
    ActorRolloutRefConfig,
    ActorRolloutRefWorker,
    CriticWorker,
    CriticWorkerConfig,
    PlacementSpec,
    RewardModelWorker,
    RewardModelWorkerConfig,
    build_role_groups,
    shutdown_role_groups,
)


@dataclass
class RunContext:
    """The run's directory, logs, tokenizer, data and reward manager (shared by SFT and RL)."""

    cfg: RunConfig
    layout: Layout
    run_dir: Path
    log: RunLoggers  # every logger of trainer.loggers behind one write()
    display: RunDisplay
    model_path: str
    tokenizer: Any
    val_batch: DataProto | None
    reward: Any  # RewardManager
    ray: RayHold
    cost: Any = None  # RewardManager of cost_model.custom_fn_path (safe_rlhf), built with the roles
    keep_phases: tuple[str, ...] = ("sft",)  # metrics.jsonl phases a resume keeps whole (reopen_run_dir)
    exports: tuple[str, ...] = ("final_model",)  # what a resume sets aside (reopen_run_dir)
    train_data: Any = None  # the training prompts when they were read to count trainer.total_epochs

    @classmethod
    def open(cls, cfg: RunConfig, resume_from: Path | SavedRun | None = None,
             ray_hold: RayHold | None = None, keep_phases: tuple[str, ...] = ("sft",),
             exports: tuple[str, ...] = ("final_model",)) -> RunContext:
        """Validate, then set everything up; `ctx.cfg` is the resolved config (no nulls that
        stand for a value), the one saved in the run directory. `resume_from`: a checkpoint
        directory (or a SavedRun); the run continues in its run directory instead of a new one
        (keeping the `keep_phases` records of metrics.jsonl whole: an RL run's warm start; the
        earlier `exports` set aside).
        `ray_hold`: the Ray of the context this one replaces (`reopen`)."""
        # Rebuilding the reward sections records a reward function assigned to
        # custom_fn_path after the config was made by its import path (config/sections/rewards.py: reward_reference).
        cfg = dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward),
                                  cost_model=dataclasses.replace(cfg.cost_model))
        validate_run_config(cfg)  # before anything starts
        preflight(cfg, new_run=resume_from is None)  # model, data and reward files, before the run dir
        mapping = None
        if cfg.resources.placement == "auto":  # the planner's mapping becomes the run's settings
            from hybridflow.planner.apply import resolve_auto_placement

            cfg, mapping = resolve_auto_placement(cfg)
        autos = auto_sections(cfg)
        omp_auto = cfg.resources.omp_wait_policy == "auto"
        loop_auto = cfg.rollout.decode_loop == "auto"
        cfg = resolve_run_config(cfg)
        layout = validate_run_config(cfg)
        run_dir = (create_run_dir(cfg) if resume_from is None
                   else reopen_run_dir(cfg, resume_from, keep_phases, exports))
        reward = None
        try:
            # Without the "console" logger nothing is printed (trainer.console picks the style).
            display = start_display(cfg.trainer.display_mode(), run_dir, auto_note(cfg, autos), cfg.resources,
                                    omp_auto)
            display.message(decode_loop_note(cfg, loop_auto))
            if mapping is not None:
                save_plan(run_dir, mapping)
                display.message(f"placement auto: {mapping.placement()}, predicted step {mapping.step_s:.2f} s (plan.json)")
            model_path = base_model_path(cfg, run_dir, write_builtin=True)
            tokenizer = load_tokenizer(model_path, trust_remote_code=cfg.model.trust_remote_code)
            train_data = None
            if cfg.trainer.total_epochs is not None:  # the steps are counted from the prompts kept
                train_data = train_prompts(cfg, tokenizer)
                cfg = with_epoch_steps(cfg, len(train_data), display)
                save_config(cfg, run_dir / "config.yaml")
            val_batch = val_prompts(cfg, tokenizer)
            if val_batch is not None:
                longest = int(val_batch.batch["attention_mask"].sum(-1).max())
                check_lengths_fit(cfg, longest, "the longest held-out prompt")
            reward = build_reward_manager(cfg, tokenizer)
            cpus = (layout.world_size + layout.rollout_pool_ranks) * rank_cpus(cfg.resources, layout)
            ray_hold = start_run_ray(cfg.resources, cpus, ray_hold)
            log = build_loggers(cfg, run_dir, display)
        except BaseException:
            if reward is not None:
                reward.close()
            if resume_from is None:
                discard_unused_run_dir(run_dir)
            raise
        return cls(cfg, layout, run_dir, log, display, model_path, tokenizer, val_batch, reward, ray_hold,
                   keep_phases=keep_phases, exports=exports, train_data=train_data)

    def reopen(self, checkpoint: Path, cfg: RunConfig) -> RunContext:
        """The context of this run continuing from `checkpoint` with `cfg` (an automatic
        restart, run/recovery.py; cfg differs at most in resources.*): as `--resume` opens it
        (metrics after the checkpoint set aside), on the same Ray hold."""
        self.close(keep_ray=True)
        return RunContext.open(cfg, resume_from=checkpoint, ray_hold=self.ray, keep_phases=self.keep_phases,
                               exports=self.exports)

    def close(self, keep_ray: bool = False) -> None:
        self.display.stop()
        self.reward.close()
        if self.cost is not None:
            self.cost.close()
        self.log.close()
        if not keep_ray:
            self.ray.close()


def save_plan(run_dir: Path, mapping: Any) -> None:
    """The planner's chosen mapping and its prediction, beside config.yaml (placement auto)."""
    path = run_dir / "plan.json"
    if not path.exists():  # a resumed run keeps the plan it started with
        path.write_text(json.dumps(mapping.to_dict(), indent=2))


def start_display(mode: str, run_dir: Path, dtype_line: str, resources: ComputeSection,
                  omp_auto: bool) -> RunDisplay:
    """The console of a job (`mode`: trainer.console or "none") after the lines it prints at its start:
    the run directory, its resolved precision (also in config.yaml) and its OpenMP wait policy
    (`omp_auto`: resources.omp_wait_policy was "auto", so with what "auto" saw)."""
    display = RunDisplay(mode)
    display.message(f"run directory: [bold]{run_dir}[/bold]")
    display.message(dtype_line)
    display.message(omp.describe(resources.omp_wait_policy, omp.last_auto() if omp_auto else None))
    return display


def decode_loop_note(cfg: RunConfig, auto: bool) -> str:
    """The line a run prints at its start: the native rollout engine's resolved decode loop."""
    why = f" (auto: {'a GPU run' if cfg.resources.use_gpu else 'no GPU'})" if auto else ""
    r = cfg.rollout
    extra = "".join(f", {key}" for key in ("compile_decode", "cuda_graphs") if getattr(r, key))
    every = f", read back every {r.readback_every} steps" if r.decode_loop == "device" else ""
    return f"decode loop: {r.decode_loop}{why}{every}{extra} (rollout.decode_loop)"


def start_run_ray(resources: ComputeSection, cpus: int, hold: RayHold | None = None) -> RayHold:
    """A job's hold on Ray (controller/ray_runtime.py: RayHold) for ranks reserving `cpus`
    (`hold`: an existing one, sized again), with the job's resolved
    resources.omp_wait_policy put in the environment first: Ray's processes load OpenMP
    with it (controller/omp.py); so is resources.network_interface (controller/network.py)."""
    omp.export_policy(resources.omp_wait_policy)
    network.export_interface(resources.network_interface)
    if hold is None:
        return RayHold(resources.ray_address, cpus, resources.nodes)
    hold.cpus = cpus
    hold.use(busy=hold.busy)
    return hold


def rank_cpus(resources: ComputeSection, layout: Layout) -> int:
    """Ray CPUs of one rank's slot: its torch threads on CPU (resources.threads_per_rank);
    the cores are shared with the rollout pool of the asynchronous modes."""
    return resources.resolved_threads_per_rank(layout.world_size + layout.rollout_pool_ranks)


def build_reward_manager(cfg: RunConfig, tokenizer: Any) -> Any:
    fn, specs = None, parse_templates(cfg.reward.templates)
    if cfg.reward.custom_fn_path is not None:
        fn = load_reward_fn(cfg.reward.custom_fn_path, cfg.reward.custom_fn_name, cfg.reward.custom_fn_weights,
                            resolve=False)
    elif any(s.level == "trajectory" for s in specs):
        fn = ComposedScore(specs)
    return RewardManager(tokenizer, cfg.reward.manager, compute_score=fn, turn_templates=specs)


def build_cost_manager(cfg: RunConfig, tokenizer: Any) -> Any:
    """The rule-based cost function of safe_rlhf scored like a reward function (reward.manager
    settings), or None without cost_model.custom_fn_path."""
    if cfg.cost_model.custom_fn_path is None:
        return None
    fn = load_reward_fn(cfg.cost_model.custom_fn_path, cfg.cost_model.custom_fn_name, resolve=False)
    return RewardManager(tokenizer, cfg.reward.manager, compute_score=fn)


def train_prompts(cfg: RunConfig, tokenizer: Any) -> RLPromptDataset:
    """The training prompts; how many were over data.prompt.max_prompt_length goes to the console."""
    if cfg.data.train_files:
        ds = RLPromptDataset(cfg.data.train_files, tokenizer, cfg.data.prompt)
    else:
        task = cfg.data.builtin
        ds = RLPromptDataset(None, tokenizer, cfg.data.prompt, rows=rl_records(task.task, "train", task.num_train))
    stats = ds.stats
    RunDisplay(cfg.trainer.display_mode()).message(
        f"train prompts: {stats['kept']} of {stats['rows']} kept; longer than data.prompt.max_prompt_length="
        f"{cfg.data.prompt.max_prompt_length} tokens: {stats['filtered_overlong']} filtered, "
        f"{stats['truncated']} truncated"
    )
    return ds


def with_epoch_steps(cfg: RunConfig, prompts: int, display: RunDisplay) -> RunConfig:
    """cfg with trainer.total_steps counted from trainer.total_epochs: epochs x whole batches
    of the `prompts` kept (the last partial batch dropped), or total_steps when set and fewer."""
    t, batch = cfg.trainer, cfg.data.train_batch_size
    steps = t.total_epochs * (prompts // batch)
    if t.total_steps is not None and t.total_steps <= steps:
        return cfg
    if steps < 1:
        raise ConfigError(f"{prompts} training prompts make no whole batch of data.train_batch_size={batch}",
                          "trainer.total_epochs")
    display.message(f"trainer.total_steps={steps}: trainer.total_epochs={t.total_epochs} x {prompts // batch} "
                    f"batches of {batch} prompts ({prompts} kept)")
    return dataclasses.replace(cfg, trainer=dataclasses.replace(t, total_steps=steps))


def val_prompts(cfg: RunConfig, tokenizer: Any) -> DataProto | None:
    """The held-out prompts as one batch (None: nothing to evaluate on): data.val_files
    (verl columns; data_source picks the scorer and the val/<data_source>/* metrics), or
    the built-in task's held-out split."""
    if cfg.data.val_files:
        ds = RLPromptDataset(cfg.data.val_files, tokenizer, cfg.data.prompt)
    elif not cfg.data.train_files:
        task = cfg.data.builtin
        ds = RLPromptDataset(None, tokenizer, cfg.data.prompt, rows=rl_records(task.task, "test", task.num_val))
    else:
        return None
    return first_prompts(ds, cfg.data.max_val_samples)


def first_prompts(ds: RLPromptDataset, limit: int | None) -> DataProto:
    """The first `limit` prompts of `ds` (all with None) as one batch, in file order."""
    count = len(ds) if limit is None else min(len(ds), limit)
    return ds.collate([ds[i] for i in range(count)])


def endless(loader: ResumableLoader) -> Iterator[Any]:
    """Batches of the loader, epoch after epoch."""
    while True:
        yield from loader


# ----------------------------------------------------------------------------- workers


def actor_config(cfg: RunConfig, model_path: str) -> ActorRolloutRefConfig:
    return ActorRolloutRefConfig(
        engine=cfg.actor.engine_config(model_path, cfg.seed, cfg.model.trust_remote_code), loss=cfg.actor.loss,
        rollout=cfg.rollout, use_reference=cfg.use_reference, fuse_old_log_probs=cfg.fuses_old_log_probs,
    )


def sft_actor_config(cfg: RunConfig, model_path: str) -> ActorRolloutRefConfig:
    """The actor for supervised fine-tuning: the "gpg" policy loss -A log pi with A = 1
    on every response token is the token-mean negative log-likelihood (see jobs/sft.py)."""
    engine = dataclasses.replace(
        cfg.actor.engine_config(model_path, cfg.seed, cfg.model.trust_remote_code), optim=cfg.sft.optim,
        micro_batch=cfg.sft.micro_batch(cfg.actor.micro_batch.forward_micro_batch_size_per_device))
    loss = ActorLossConfig(policy=PolicyLossConfig(loss_mode="gpg", loss_agg_mode="token-mean"))
    return ActorRolloutRefConfig(engine=engine, loss=loss, rollout=cfg.rollout, use_reference=False)


def critic_config(cfg: RunConfig, policy_path: str) -> CriticWorkerConfig:
    path = cfg.critic.model_path if cfg.critic.model_path is not None else policy_path
    return CriticWorkerConfig(engine=cfg.critic.engine_config(path, cfg.seed, cfg.model.trust_remote_code),
                              loss=cfg.critic.loss)


def placement(cfg: RunConfig, layout: Layout, roles: list[str]) -> PlacementSpec:
    """Split placement puts the critics (the algorithm's `critics`) on the critic ranks,
    every other role (reward and cost models too) on the actor's."""
    use_gpu = cfg.resources.use_gpu
    critics = cfg.algorithm.spec.critics
    nodes = cfg.resources.process_on_nodes()  # ranks per node, nodes in order
    if cfg.resources.placement == "split" and any(role in critics for role in roles):
        actor_nodes, critic_nodes = split_nodes(nodes, [layout.actor_ranks, layout.critic_ranks])
        return PlacementSpec(
            pools={"actor_pool": actor_nodes, "critic_pool": critic_nodes},
            mapping={role: "critic_pool" if role in critics else "actor_pool" for role in roles},
            use_gpu=use_gpu, cpus_per_slot=rank_cpus(cfg.resources, layout), parts_of=nodes,
        )
    return PlacementSpec.colocated(nodes, use_gpu=use_gpu, cpus_per_slot=rank_cpus(cfg.resources, layout))


def split_nodes(nodes: list[int], sizes: list[int]) -> list[list[int]]:
    """Cut ranks-per-node `nodes` into consecutive parts of `sizes` ranks, each as its own
    ranks-per-node list: split_nodes([2, 2], [3, 1]) == [[2, 1], [1]]."""
    parts, node, left = [], 0, nodes[0]
    for size in sizes:
        part = []
        while size:
            take = min(size, left)
            part.append(take)
            size, left = size - take, left - take
            if left == 0 and node + 1 < len(nodes):
                node, left = node + 1, nodes[node + 1]
        parts.append(part)
    return parts


def build_groups(cfg: RunConfig, layout: Layout, roles: dict[str, RoleSpec]) -> dict[str, WorkerGroup]:
    """Place and initialise the roles (model loading, sharding, generation engine); every
    call of theirs is limited to trainer.call_timeout_s."""
    groups = build_role_groups(roles, placement(cfg, layout, list(roles)))
    for group in groups.values():
        group.call_timeout_s = cfg.trainer.call_timeout_s
    try:
        for group in groups.values():
            group.init_model()
    except BaseException:
        shutdown_role_groups(groups)
        raise
    return groups


def rl_roles(cfg: RunConfig, model_path: str) -> dict[str, RoleSpec]:
    """The worker roles of cfg.algorithm: the actor; the critics its spec names (critic, and
    cost_critic for safe_rlhf, each with the critic.* settings); reward_model and cost_model
    where their path is set."""
    roles = {"actor": RoleSpec(ActorRolloutRefWorker, (actor_config(cfg, model_path),))}
    for role in cfg.algorithm.spec.critics:
        roles[role] = RoleSpec(CriticWorker, (critic_config(cfg, model_path),))
    for key in ("reward_model", "cost_model"):
        section = getattr(cfg, key)
        if section.path is not None:
            roles[key] = RoleSpec(RewardModelWorker, (score_model_config(cfg, key, model_path),))
    return roles


def score_model_config(cfg: RunConfig, key: str, policy_path: str) -> RewardModelWorkerConfig:
    """The worker config of `cfg.<key>` (reward_model or cost_model), checked against the
    policy: the scorer reads the policy's token ids, so its vocabulary must cover them."""
    section = getattr(cfg, key)
    trust = cfg.model.trust_remote_code
    scorer = load_hf_config(section.path, trust_remote_code=trust)
    policy = load_hf_config(policy_path, trust_remote_code=trust)
    if scorer.vocab_size < policy.vocab_size:
        raise ConfigError(
            f"{key}.path={section.path!r} has a vocabulary of {scorer.vocab_size} tokens but the policy "
            f"({policy_path}) has {policy.vocab_size}: a scoring model must share the policy's tokenizer"
        )
    return RewardModelWorkerConfig(engine=section.engine_config(section.path, cfg.seed, trust))
