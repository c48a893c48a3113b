"""The config tree of a training run (`hybridflow train` / `hybridflow sft` / `RLTrainer`).

    cfg = load_run_config("examples/grpo_arithmetic.yaml", ["actor.optim.lr=1e-4"])
    cfg = load_run_config()               # the built-in demo: arithmetic, tiny model, GRPO

Sections (each a dataclass). Every setting is declared once, where it is read: the role
sections are the engine's and the workers' own config classes (actor and critic subclass
TrainEngineSettings, reward_model and cost_model EngineSettings, rollout is a
RolloutWorkerConfig), so their defaults are those classes' defaults; the algorithm's
settings live in algorithm.py. The built-in demo's own values (group size, 6-token
answers, learning rates and batch cuts of the tiny model) are DEMO_PRESETS, applied by
`load_run_config` when the run uses the built-in model or task; `RunConfig()` is the bare
tree without them.

    name, seed                  run name (run dir `<trainer.output_dir>/<name>-<timestamp>`); seed of
                                model init, data order, warm-start data and engines (sampling
                                has its own, rollout.seed)
    trainer                     steps, evaluation / checkpoint cadence, output dir, console
    resources                   ranks, colocated or split placement, Ray address
    model                       HF model dir, a pretrained model (model.pretrained), or the built-in
                                tiny model (both null)
    data                        RL prompt files, or the built-in arithmetic task; batch sizes
    algorithm                   step program (grpo, ppo, remax, rloo, reinforce_plus_plus[_baseline],
                                drgrpo, dapo, safe_rlhf, or your own: the registry in algorithm.py),
                                advantage estimator, KL in reward, DAPO and Safe-RLHF settings
    actor                       training engine of the policy (optimizer, micro-batches, LoRA, loss)
    rollout                     generation (n samples, temperature, response length, TP)
    critic                      value model (PPO)
    reward                      rule-based reward manager (process pool, timeouts) or your function
    reward_model, cost_model    learned scorers (HF sequence classifiers, frozen: engine keys without
                                optim/lora); the cost of safe_rlhf
    sft                         supervised warm start (steps, data, optimizer)

`validate_run_config(cfg)` (validation.py) checks what single sections cannot: sizes against
each other and against the world size, and the algorithm against what it implies. It runs
before any worker starts (load_run_config calls it). Every check raises ConfigError naming
the dotted key (hybridflow/errors.py).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from hybridflow.config.algorithm import AlgorithmSection, resolved_algorithm
from hybridflow.config.async_schema import AsyncSection
from hybridflow.config.loader import _build, _set_path, at_least, in_unit, nest_dotted, user_tree
from hybridflow.config.model_presets import read_model_presets
from hybridflow.config.validation import validate_run_config
from hybridflow.data.arithmetic import ArithmeticConfig
from hybridflow.data.configs import PromptDataConfig, SFTDataConfig
from hybridflow.engines.pretrained import PRETRAINED_MODELS
from hybridflow.engines.train.config import (
    ActorLossConfig,
    CriticLossConfig,
    EngineSettings,
    MicroBatchConfig,
    OptimConfig,
    TrainEngineSettings,
)
from hybridflow.errors import ConfigError
from hybridflow.rewards.config import RewardConfig
from hybridflow.rewards.registry import reward_fn_reference
from hybridflow.workers.config import RolloutWorkerConfig

# trainer.loggers: where metrics go (hybridflow/trainer/loggers.py).
LOGGER_NAMES = ("console", "jsonl", "tensorboard", "wandb")


@dataclass
class ValidationSection:
    """Sampling of the held-out evaluation (verl: rollout.val_kwargs); greedy by default.

    do_sample: false = greedy, the most likely token at each position (temperature,
        top_p and top_k are then unused).
    n: responses per prompt; val/accuracy and val/score are means over all of them.
    temperature / top_p / top_k: sampling settings when do_sample is true.
    seed: sampling seed of every evaluation call, so two evaluations of the same policy
        draw the same random numbers (and `hybridflow eval` repeats an in-run evaluation).
    """

    do_sample: bool = False
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int = 0

    def __post_init__(self) -> None:
        at_least(self, 1, "n")
        if self.do_sample and self.temperature <= 0:
            raise ConfigError(f"must be > 0 when do_sample is true, got {self.temperature}", "temperature")
        at_least(self, 0, "seed")


@dataclass
class TrainerSection:
    """The loop: how long, how often to evaluate and save, where the run goes.

    total_steps: RL steps (one batch of prompts each).
    test_freq: greedy held-out evaluation every this many steps (0: only before and after).
    save_freq: checkpoint every this many steps (0: never) into
        <run>/checkpoints/global_step_<N>: models, optimizers, schedules, data position,
        RNG, algorithm state; `hybridflow train --resume` continues from the newest one.
    keep_last_checkpoints: keep only the newest this many checkpoints (null: all).
    save_on_signal: on SIGTERM or SIGINT, finish the current step and checkpoint it before stopping
        (exit status 143 or 130); false: stop after the step with the newest checkpoint there is.
    save_final_model: export the trained actor as a Hugging Face dir (<run>/final_model).
    output_dir / run_dir: runs go to <output_dir>/<name>-<timestamp>/; run_dir picks an
        exact directory instead (it must not exist: a run never overwrites another).
    console: "rich" progress display, "plain" one line per step, or "none".
    val_before_train: evaluate the starting policy (logged at step 0) before the first step.
    validation: sampling of the held-out evaluation (greedy by default).
    loggers: where metrics go: "console" (the display above; without it nothing is
        printed), "jsonl" (<run>/metrics.jsonl, read by `hybridflow plot`),
        "tensorboard" (<run>/tensorboard), "wandb" (needs `pip install wandb`; honours
        WANDB_MODE=offline). Plots of reward, KL, entropy and length go to <run>/plots.
    wandb_project: the W&B project of the run (the run is named after its directory).
    balance_batch: before each call that splits the batch over dp ranks (log-probs,
        values, updates), swap rows between ranks so each gets a near-equal token count;
        every mini-/micro-batch keeps its samples, so results only change by float order.
    mode: "sync" (every phase waits for the previous one), "one_step_off" or "async"
        (generation on a separate rollout pool, overlapped with training; settings in
        async_rl, docs/async.md).
    max_restarts: when a worker process or node dies, a call raises in a worker, or a call
        outlives call_timeout_s, tear every worker group down, start them again, load the
        newest complete checkpoint (trainer.save_freq; a failure before the first one stops
        the run) and go on; at most this many times per run (0: stop at the first failure).
        Each restart is a "restart" record in metrics.jsonl. See docs/resilience.md.
    call_timeout_s: longest a worker-group call may run (seconds; null: no limit). A rank
        stuck in a collective its peers never reach is reported (and restarted) after it.
    max_no_signal_steps: stop the run (cleanly: it is still evaluated and exported) after
        this many steps in a row without learning signal, i.e. every group's advantages 0
        (all responses to each prompt scored alike); null: never stop. Each such step is
        said on the console either way and counted in adv/no_signal_steps.
    """

    total_steps: int = 30
    test_freq: int = 10
    save_freq: int = 0
    keep_last_checkpoints: int | None = None
    save_on_signal: bool = True
    save_final_model: bool = True
    output_dir: str = "runs"
    run_dir: str | None = None
    console: Literal["rich", "plain", "none"] = "rich"
    val_before_train: bool = True
    validation: ValidationSection = field(default_factory=ValidationSection)
    loggers: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    wandb_project: str = "hybridflow"
    balance_batch: bool = True
    max_restarts: int = 2
    call_timeout_s: float | None = 1800.0
    mode: Literal["sync", "one_step_off", "async"] = "sync"
    max_no_signal_steps: int | None = None

    def __post_init__(self) -> None:
        at_least(self, 1, "max_no_signal_steps", null="never stop")
        at_least(self, 0, "max_restarts", note="0 = stop at the first worker failure")
        if self.call_timeout_s is not None and not self.call_timeout_s > 0:
            raise ConfigError(f"must be > 0 seconds or null (no limit), got {self.call_timeout_s}", "call_timeout_s")
        unknown = [name for name in self.loggers if name not in LOGGER_NAMES]
        if unknown or len(set(self.loggers)) != len(self.loggers):
            raise ConfigError(f"must be distinct names from {list(LOGGER_NAMES)}, got {self.loggers}", "loggers")
        if "wandb" in self.loggers and importlib.util.find_spec("wandb") is None:
            raise ConfigError("includes 'wandb' but the wandb package is not installed: `pip install wandb`, or "
                              "remove 'wandb' from trainer.loggers", "loggers")
        at_least(self, 1, "total_steps")
        at_least(self, 0, "test_freq", "save_freq", note="0 = off")
        at_least(self, 1, "keep_last_checkpoints", null="keep all")


@dataclass
class ComputeSection:
    """Ranks and machines (the `resources` of every job; RL runs add the placement below).

    world_size: ranks in total (one per CPU slot or GPU); null = on GPUs one per local GPU,
        at most 8, rounded down to a power of two so batch sizes divide; on CPU with an
        embedded Ray 1 rank that gets every core as threads (on one machine, data-parallel
        ranks only add gloo traffic and model copies: 1 rank x 2 threads ran the GRPO step
        in half the time of 2 ranks x 1 thread on both the tiny and the SmolLM2 workload,
        README "GRPO step vs TRL"); on CPU joining a cluster one per local core as on GPUs.
    threads_per_rank: torch threads of each CPU rank (its Ray CPU share); null = the local
        cores divided by world_size (at least 1) with an embedded Ray, else 1. GPU ranks
        reserve 1 CPU.
    omp_wait_policy: how the ranks' OpenMP (torch intra-op) threads wait at a barrier:
        "short_spin" spins 1000 turns then sleeps, "passive" sleeps at once, so that when
        another job shares the cores a waiting thread does not burn the run's CPU share
        (a step beside one competing job 1.4-2x slower instead of 4-6x; controller/omp.py);
        "inherit" keeps OMP_WAIT_POLICY / GOMP_SPINCOUNT as the environment sets them
        (unset: GNU OpenMP spins ~300000 turns first).
    use_gpu: one GPU per rank; false runs on CPU (gloo).
    ray_address: join this Ray cluster; null starts an embedded Ray on 127.0.0.1.
    nodes: machines the ranks are spread over (each its own node of the Ray cluster; more
        than 1 needs ray_address). Every role is placed on all of them, rank order filling
        one node after the other (docs/resilience.md, "Multi-node").
    ranks_per_node: ranks on each node; null = world_size / nodes (world_size null: one
        per local core or GPU on each node). world_size, when set too, must equal
        nodes * ranks_per_node.
    """

    world_size: int | None = None
    threads_per_rank: int | None = None
    omp_wait_policy: Literal["short_spin", "passive", "inherit"] = "short_spin"
    use_gpu: bool = False
    ray_address: str | None = None
    nodes: int = 1
    ranks_per_node: int | None = None

    def __post_init__(self) -> None:
        at_least(self, 1, "world_size", null="picked for the machine")
        at_least(self, 1, "threads_per_rank", null="local cores / world_size")
        at_least(self, 1, "nodes")
        at_least(self, 1, "ranks_per_node", null="world_size / nodes")
        if self.ranks_per_node is not None and self.world_size is not None \
                and self.world_size != self.nodes * self.ranks_per_node:
            raise ConfigError(f"{self.ranks_per_node} ranks on each of nodes={self.nodes} is "
                              f"{self.nodes * self.ranks_per_node} ranks, but world_size={self.world_size}; set "
                              "one of them (or make them agree)", "ranks_per_node")
        if self.ranks_per_node is None and self.world_size is not None and self.world_size % self.nodes:
            raise ConfigError(f"world_size={self.world_size} ranks do not split evenly over nodes={self.nodes}; "
                              "set ranks_per_node", "nodes")

    def process_on_nodes(self) -> list[int]:
        """Ranks per node, one entry per node (a `ResourcePool`'s process_on_nodes)."""
        return [self.resolved_world_size() // self.nodes] * self.nodes

    def resolved_world_size(self) -> int:
        if self.ranks_per_node is not None:
            return self.nodes * self.ranks_per_node
        if self.world_size is not None:
            return self.world_size
        return self.nodes * self._local_ranks()

    def _local_ranks(self) -> int:
        if self.use_gpu:
            import torch

            local = torch.cuda.device_count()
        elif self.ray_address is None:
            return 1
        else:
            local = local_cores()
        return 2 ** int(math.log2(max(1, min(local, 8))))

    def resolved_threads_per_rank(self, world_size: int) -> int:
        """Torch threads (= Ray CPUs) of each rank when the job has `world_size` ranks."""
        if self.threads_per_rank is not None:
            return self.threads_per_rank
        if self.use_gpu or self.ray_address is not None:
            return 1
        return max(1, local_cores() // world_size)


def local_cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@dataclass
class ResourceSection(ComputeSection):
    """Processes and where the roles run: ComputeSection's keys and

    placement: "colocated" (every role in the same processes, verl's default),
        "split" (actor and critic in separate processes; the step calls their phases one after another), or
        "auto" (the planner picks placement, critic_ranks and the tp sizes; docs/planner.md).
    critic_ranks: with split placement, ranks of the critic; the actor gets the rest.
    min_world_size / max_world_size: elastic restarts (trainer.max_restarts): when the
        cluster has fewer (or more) free slots after a failure, e.g. a lost node, the run
        continues on the largest world size in this range that the cluster holds and the
        batch sizes divide, loading its checkpoint resharded (null min: no elastic
        change, the run needs its world size back; null max: world_size).
    """

    placement: Literal["colocated", "split", "auto"] = "colocated"
    critic_ranks: int = 1
    min_world_size: int | None = None
    max_world_size: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "critic_ranks")
        at_least(self, 1, "min_world_size", "max_world_size", null="")
        if self.min_world_size is not None and self.max_world_size is not None \
                and self.min_world_size > self.max_world_size:
            raise ConfigError(f"{self.min_world_size} is above max_world_size={self.max_world_size}",
                              "min_world_size")

    def resolved_world_size(self) -> int:
        world = super().resolved_world_size()
        if self.world_size is None and self.placement == "split":
            return max(world, self.critic_ranks + 1)  # the actor keeps at least one rank
        return world


@dataclass
class BuiltinModelSection:
    """The tiny randomly initialised model `model.path: null` creates in the run dir."""

    family: Literal["llama", "qwen2"] = "llama"
    hidden_size: int = 64
    intermediate_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 64


@dataclass
class ModelSection:
    """The policy model: a local Hugging Face dir, a pretrained model from a pip package, or
    the built-in tiny one (both path and pretrained null).

    path: a local Hugging Face model directory (config.json, safetensors, tokenizer).
    pretrained: a name in hybridflow.engines.pretrained.PRETRAINED_MODELS (e.g.
        smollm2-135m-instruct), converted once into $HYBRIDFLOW_CACHE (~/.cache/hybridflow).
    """

    path: str | None = None
    pretrained: str | None = None
    builtin: BuiltinModelSection = field(default_factory=BuiltinModelSection)

    def __post_init__(self) -> None:
        if self.path is not None and self.pretrained is not None:
            raise ConfigError(f"set path or pretrained, not both (path={self.path!r}, pretrained={self.pretrained!r})",
                              "pretrained")
        if self.pretrained is not None and self.pretrained not in PRETRAINED_MODELS:
            raise ConfigError(f"{self.pretrained!r} is unknown; known: {sorted(PRETRAINED_MODELS)}", "pretrained")

    @property
    def uses_builtin(self) -> bool:
        """True when the run writes the built-in tiny model (neither path nor pretrained)."""
        return self.path is None and self.pretrained is None


@dataclass
class BuiltinTaskSection:
    """The built-in arithmetic task used when data.train_files is empty."""

    task: ArithmeticConfig = field(default_factory=ArithmeticConfig)
    num_train: int = 4000
    num_val: int = 200

    def __post_init__(self) -> None:
        at_least(self, 1, "num_train", "num_val")


@dataclass
class DataSection:
    """RL prompts (verl parquet/jsonl columns), or the built-in task when train_files is empty.

    train_batch_size: prompts per RL step (each sampled rollout.n times).
    val_files: held-out prompts scored greedily (empty with the built-in task: its
        held-out split; empty with your own files: no evaluation).
    max_val_samples: cap on held-out prompts evaluated (null: all).
    """

    train_files: list[str] = field(default_factory=list)
    val_files: list[str] = field(default_factory=list)
    train_batch_size: int = 16
    max_val_samples: int | None = None
    shuffle: bool = True
    prompt: PromptDataConfig = field(default_factory=PromptDataConfig)
    builtin: BuiltinTaskSection = field(default_factory=BuiltinTaskSection)

    def __post_init__(self) -> None:
        at_least(self, 1, "train_batch_size")
        if self.val_files and not self.train_files:
            raise ConfigError("is set but train_files is empty (the built-in task); set both or neither", "val_files")


@dataclass
class ActorSection(TrainEngineSettings):
    """The policy: the training engine's settings (TrainEngineSettings, one definition with
    the engine) plus the loss (policy loss, KL loss, entropy bonus). The model path and
    seed come from `model` and `seed`.

    old_log_probs: "auto" skips the separate old-log-prob pass when the update makes one
        optimizer step over the step's batch (micro_batch.epochs 1, mini_batch_size = all
        sequences of the step) and nothing reads them before it (no reference policy): the
        update then takes them from its own forward pass, detached (the same weights, so the
        same values up to float summation order; ActorEngine.update_policy). "recompute"
        always runs the pass.
    """

    loss: ActorLossConfig = field(default_factory=ActorLossConfig)
    old_log_probs: Literal["auto", "recompute"] = "auto"


@dataclass
class CriticSection(TrainEngineSettings):
    """The value model (algorithm.name=ppo): engine settings as the actor's, plus the value
    loss. model_path null starts it from the policy model. LoRA does not apply to it."""

    model_path: str | None = None
    loss: CriticLossConfig = field(default_factory=CriticLossConfig)


@dataclass
class RewardSection:
    """Rule-based rewards scored in worker processes (errors and hangs are contained).

    custom_fn_path / custom_fn_name: your `compute_score(data_source, solution_str,
        ground_truth, extra_info)` in a Python file or an importable module (dotted name);
        null uses the built-in scorers. From Python, custom_fn_path may be the function
        itself: it is recorded by its import path (see `reward_fn_reference`).
    """

    manager: RewardConfig = field(default_factory=lambda: RewardConfig(num_workers=1, timeout_s=10.0))
    custom_fn_path: str | None = None
    custom_fn_name: str = "compute_score"
    # reward templates composed with weights (rewards/templates.py, docs/agents.md); empty:
    # the data source's scorer (or custom_fn). Entries: {name, weight, level, args}.
    templates: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        from hybridflow.rewards.templates import parse_templates

        self.custom_fn_path, self.custom_fn_name = reward_reference(self.custom_fn_path, self.custom_fn_name)
        parse_templates(self.templates, "templates")
        if self.templates and self.custom_fn_path is not None:
            raise ConfigError("give either templates or custom_fn_path; a file function is the template "
                              "{name: user, args: {path: ..., name: ...}}", "templates")


def reward_reference(path: Any, name: str) -> tuple[str | None, str]:
    """(custom_fn_path, custom_fn_name) with a Python function given as the path replaced by
    its import path (rewards.registry.reward_fn_reference), so the config saves as YAML."""
    if not callable(path):
        return path, name
    try:
        return reward_fn_reference(path)
    except ValueError as err:
        raise ConfigError(str(err), "custom_fn_path") from None


@dataclass
class ScoreModelSection(EngineSettings):
    """A frozen sequence scorer: a Hugging Face `*ForSequenceClassification` directory with
    num_labels=1 (what `hybridflow rm` writes) that shares the policy's tokenizer, run on the
    actor's ranks. path null: none. The keys of a frozen engine (EngineSettings: no optimizer,
    no LoRA, micro_batch holds only the scoring keys: ForwardBatchConfig)."""

    path: str | None = None


@dataclass
class RewardModelSection(ScoreModelSection):
    """A learned reward model (any algorithm): its score, put on the last response token, is
    the reward instead of the rule-based one; add_rule_reward: true sums the two."""

    add_rule_reward: bool = False


@dataclass
class CostModelSection(ScoreModelSection):
    """The cost of algorithm.name=safe_rlhf: a cost model (path) and/or a rule-based cost
    function `custom_fn_name(data_source, solution_str, ground_truth, extra_info)` in the Python
    file custom_fn_path, scored like reward functions (reward.manager settings); both: summed."""

    custom_fn_path: str | None = None
    custom_fn_name: str = "compute_score"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.custom_fn_path, self.custom_fn_name = reward_reference(self.custom_fn_path, self.custom_fn_name)


@dataclass
class SFTSection:
    """Supervised warm start: `hybridflow sft`, and before RL when steps > 0.

    files: prompt/response pairs (columns prompt, response); empty = the built-in task's
        pairs (train split). batch_size: sequences per optimizer step (all ranks).
    test_freq: greedy held-out evaluation every this many SFT steps (0: before and after only).
    num_builtin_pairs / builtin_carry_drop_rate: the built-in task's pairs come from an
        imperfect teacher who forgets the carry in this share of its answers (see
        trainer/builtin.py; 0 gives exact answers).
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


@dataclass
class RunConfig:
    """The whole run (see the module docstring)."""

    name: str = "arithmetic-grpo"
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

    def __post_init__(self) -> None:
        check_run_name(self.name)

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


def check_run_name(name: str) -> None:
    """The `name` of a run becomes a directory name."""
    if not name or "/" in name or name.strip() != name:
        raise ConfigError(f"must be a non-empty directory-safe word, got {name!r}", "name")


# The built-in demo's own values: what the tiny model (64 positions) and the arithmetic task
# (answers of a few tokens, 16 prompts x 8 samples per step) are tuned for. They apply when a
# run uses the built-in model or the built-in task, to the keys the user does not set; every
# other run gets the defaults of the config classes (one definition per setting).
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
    """Load and fully validate a run config (YAML file + dotted overrides). The presets
    (`run_presets`; `demo` False: without the built-in demo's) fill the keys that neither
    the file nor an override sets."""
    return run_config_from_tree(user_tree(path, list(overrides)), demo)


def run_config_from_tree(tree: dict[str, Any], demo: bool = True) -> RunConfig:
    """Build and fully validate a run config from a user's tree (a YAML file's, with its
    overrides applied; or a dict, which may use dotted keys and give a reward function as
    the function itself). The presets (`run_presets`; `demo` False: without the built-in
    demo's) fill the keys the tree does not set. The tree is read, never re-read from its file."""
    tree = _function_references(nest_dotted(tree))
    cfg = _build(RunConfig, copy.deepcopy(tree))
    presets = _unset_presets(run_presets(cfg, demo), tree)
    if presets:
        with_presets = copy.deepcopy(tree)
        for text in presets:
            key, value = text.split("=", 1)
            _set_path(with_presets, key.split("."), json.loads(value))
        cfg = _build(RunConfig, with_presets)
    validate_run_config(cfg)
    return cfg


def _function_references(tree: dict[str, Any], where: str = "") -> dict[str, Any]:
    """`tree` with every reward function given as a Python object in a custom_fn_path
    replaced by its import path and name (reward_reference), so the saved config is YAML."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out[key] = _function_references(value, f"{where}{key}.")
        elif key == "custom_fn_path" and callable(value):
            try:
                out[key], out["custom_fn_name"] = reward_reference(value, tree.get("custom_fn_name", "compute_score"))
            except ConfigError as err:
                raise err.within(where.rstrip(".")) from None
        else:
            out.setdefault(key, value)
    return out


def _unset_presets(presets: tuple[tuple[str, object], ...], tree: dict) -> list[str]:
    """`presets` as overrides, minus those the user's `tree` sets: the key itself, or a parent
    given a value rather than a section (e.g. `actor.loss.policy: null`)."""
    explicit = _leaf_keys(tree)

    def user_set(key: str) -> bool:
        parts = key.split(".")
        return any(".".join(parts[:i]) in explicit for i in range(1, len(parts) + 1))

    # JSON is YAML, which is how override values are parsed.
    return [f"{key}={json.dumps(value)}" for key, value in dict(presets).items() if not user_set(key)]


def _leaf_keys(tree: dict[str, Any], prefix: str = "") -> set[str]:
    """Dotted keys of the values in `tree` (a section that holds keys is not a value)."""
    keys = set()
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        keys |= _leaf_keys(value, f"{dotted}.") if isinstance(value, dict) else {dotted}
    return keys


def resolve_run_config(cfg: RunConfig) -> RunConfig:
    """A copy with the values that null or auto stand for filled in (resources.world_size
    and threads_per_rank, algorithm.adv_estimator, algorithm.dapo.overlong_buffer.len, each
    role's dtype: auto, config/dtypes.py): what a run saves as its config.yaml."""
    from hybridflow.config.dtypes import resolved_dtypes

    cfg = dataclasses.replace(cfg, resources=resolved_resources(cfg.resources), algorithm=resolved_algorithm(cfg))
    return resolved_dtypes(cfg)


def resolved_resources(resources: ResourceSection) -> ResourceSection:
    """`resources` with world_size and threads_per_rank picked for this machine where null."""
    world = resources.resolved_world_size()
    return dataclasses.replace(resources, world_size=world,
                               threads_per_rank=resources.resolved_threads_per_rank(world))
