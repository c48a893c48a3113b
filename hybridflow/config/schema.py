"""The config tree of a training run (`hybridflow train` / `hybridflow sft` / `RLTrainer`).

    cfg = load_run_config("examples/grpo_arithmetic.yaml", ["actor.optim.lr=1e-4"])
    cfg = RunConfig()                     # the built-in default: arithmetic, tiny model, GRPO

Sections (each a dataclass; every default lives here, once):

    name, seed                  run name (run dir `<trainer.output_dir>/<name>-<timestamp>`); seed of
                                model init, data order, warm-start data and engines (sampling
                                has its own, rollout.seed)
    trainer                     steps, evaluation / checkpoint cadence, output dir, console
    resources                   ranks, colocated or split placement, Ray address
    model                       HF model dir, a pretrained model (model.pretrained), or the built-in
                                tiny model (both null)
    data                        RL prompt files, or the built-in arithmetic task; batch sizes
    algorithm                   step program (grpo, ppo, remax, rloo, reinforce_plus_plus[_baseline],
                                drgrpo, dapo, safe_rlhf; ALGORITHM_SPECS), advantage estimator, KL in
                                reward, DAPO and Safe-RLHF settings
    actor                       training engine of the policy (optimizer, micro-batches, loss)
    rollout                     generation (n samples, temperature, response length, TP)
    critic                      value model (PPO)
    reward                      rule-based reward manager (process pool, timeouts) or your function
    reward_model, cost_model    learned scorers (HF sequence classifiers); the cost of safe_rlhf
    sft                         supervised warm start (steps, data, optimizer)

`validate_run_config(cfg)` checks what single sections cannot: sizes against each other
and against the world size (batch vs dp x micro-batch, n samples, tensor-parallel sizes,
placement). It runs before any worker starts; its errors say which keys to change.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal

import yaml

from hybridflow.algorithms import AdvantageConfig, LagrangeMultiplier, get_adv_estimator, get_kl_estimator
from hybridflow.config.loader import ConfigError, load_config
from hybridflow.data.arithmetic import ArithmeticConfig
from hybridflow.data.rl_dataset import PromptDataConfig
from hybridflow.data.sft_dataset import SFTDataConfig
from hybridflow.engines.precision import DtypeName
from hybridflow.engines.pretrained import PRETRAINED_MODELS
from hybridflow.engines.train.config import (
    ActorLossConfig,
    CriticLossConfig,
    LoraConfig,
    MicroBatchConfig,
    OptimConfig,
    TrainEngineConfig,
)
from hybridflow.rewards.manager import RewardConfig
from hybridflow.workers.config import RolloutWorkerConfig

# Critic-free estimators that need several samples per prompt (a group baseline).
GROUP_ESTIMATORS = ("grpo", "grpo_passk", "rloo", "opo", "gpg", "reinforce_plus_plus_baseline")


@dataclass(frozen=True)
class AlgorithmSpec:
    """What an `algorithm.name` implies (one row of ALGORITHM_SPECS).

    estimators: the adv_estimator values it accepts; the first is its default (null).
    critic: trains a value model (and, for safe_rlhf, a second one for the costs).
    min_samples: rollout.n at least (group baselines compare the samples of a prompt).
    presets: dotted config keys and the values the name sets, unless the YAML file or an
        override sets that key itself (`load_run_config`).
    required: preset keys the algorithm is defined by; another value is a ConfigError.
    """

    estimators: tuple[str, ...]
    critic: bool = False
    min_samples: int = 1
    presets: tuple[tuple[str, object], ...] = ()
    required: tuple[str, ...] = ()


# Every step program of hybridflow/trainer/algorithms.py and what it implies (docs/algorithms.md).
ALGORITHM_SPECS: dict[str, AlgorithmSpec] = {
    "grpo": AlgorithmSpec(GROUP_ESTIMATORS, min_samples=2),
    "ppo": AlgorithmSpec(("gae",), critic=True),
    "remax": AlgorithmSpec(("remax",)),
    "rloo": AlgorithmSpec(("rloo",), min_samples=2),
    "reinforce_plus_plus": AlgorithmSpec(("reinforce_plus_plus",)),
    "reinforce_plus_plus_baseline": AlgorithmSpec(("reinforce_plus_plus_baseline",), min_samples=2),
    # Dr.GRPO (Liu et al. 2025): group-centred rewards without the std, length-unbiased loss.
    "drgrpo": AlgorithmSpec(
        ("grpo",), min_samples=2,
        presets=(("algorithm.norm_adv_by_std_in_grpo", False),
                 ("actor.loss.policy.loss_agg_mode", "seq-mean-token-sum-norm")),
        required=("algorithm.norm_adv_by_std_in_grpo", "actor.loss.policy.loss_agg_mode"),
    ),
    # DAPO (Yu et al. 2025): token-level loss and clip-higher (paper: eps_high 0.28).
    "dapo": AlgorithmSpec(
        GROUP_ESTIMATORS, min_samples=2,
        presets=(("actor.loss.policy.loss_agg_mode", "token-mean"), ("actor.loss.policy.clip_ratio_high", 0.28)),
        required=("actor.loss.policy.loss_agg_mode",),
    ),
    "safe_rlhf": AlgorithmSpec(("gae",), critic=True),
}
AlgorithmName = Literal["grpo", "ppo", "remax", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline",
                        "drgrpo", "dapo", "safe_rlhf"]
# The estimator each algorithm uses when algorithm.adv_estimator is null.
STANDARD_ESTIMATOR = {name: spec.estimators[0] for name, spec in ALGORITHM_SPECS.items()}


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
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.do_sample and self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 when do_sample is true, got {self.temperature}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")


@dataclass
class TrainerSection:
    """The loop: how long, how often to evaluate and save, where the run goes.

    total_steps: RL steps (one batch of prompts each).
    test_freq: greedy held-out evaluation every this many steps (0: only before and after).
    save_freq: checkpoint every this many steps (0: never) into
        <run>/checkpoints/global_step_<N>: models, optimizers, schedules, data position,
        RNG, algorithm state; `hybridflow train --resume` continues from the newest one.
    keep_last_checkpoints: keep only the newest this many checkpoints (null: all).
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
    """

    total_steps: int = 30
    test_freq: int = 10
    save_freq: int = 0
    keep_last_checkpoints: int | None = None
    save_final_model: bool = True
    output_dir: str = "runs"
    run_dir: str | None = None
    console: Literal["rich", "plain", "none"] = "rich"
    val_before_train: bool = True
    validation: ValidationSection = field(default_factory=ValidationSection)
    loggers: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    wandb_project: str = "hybridflow"

    def __post_init__(self) -> None:
        unknown = [name for name in self.loggers if name not in LOGGER_NAMES]
        if unknown or len(set(self.loggers)) != len(self.loggers):
            raise ValueError(f"loggers must be distinct names from {list(LOGGER_NAMES)}, got {self.loggers}")
        if "wandb" in self.loggers and importlib.util.find_spec("wandb") is None:
            raise ValueError("loggers includes 'wandb' but the wandb package is not installed: "
                             "`pip install wandb`, or remove 'wandb' from trainer.loggers")
        if self.total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, got {self.total_steps}")
        if self.test_freq < 0 or self.save_freq < 0:
            raise ValueError(f"test_freq and save_freq must be >= 0 (0 = off), got {self.test_freq}, {self.save_freq}")
        if self.keep_last_checkpoints is not None and self.keep_last_checkpoints < 1:
            raise ValueError(f"keep_last_checkpoints must be >= 1 or null (keep all), got {self.keep_last_checkpoints}")


@dataclass
class ResourceSection:
    """Processes and where the roles run.

    world_size: ranks in total (one per CPU slot or GPU); null = one per local core
        (or GPU), at most 8, rounded down to a power of two so batch sizes divide.
    placement: "colocated" (every role in the same processes, verl's default) or
        "split" (actor and critic in separate processes that run at the same time).
    critic_ranks: with split placement, ranks of the critic; the actor gets the rest.
    use_gpu: one GPU per rank; false runs on CPU (gloo).
    ray_address: join this Ray cluster; null starts an embedded Ray on 127.0.0.1.
    """

    world_size: int | None = None
    placement: Literal["colocated", "split"] = "colocated"
    critic_ranks: int = 1
    use_gpu: bool = False
    ray_address: str | None = None

    def __post_init__(self) -> None:
        if self.world_size is not None and self.world_size < 1:
            raise ValueError(f"world_size must be >= 1 or null (one per local core), got {self.world_size}")
        if self.critic_ranks < 1:
            raise ValueError(f"critic_ranks must be >= 1, got {self.critic_ranks}")

    def resolved_world_size(self) -> int:
        if self.world_size is not None:
            return self.world_size
        if self.use_gpu:
            import torch

            local = torch.cuda.device_count()
        else:
            local = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return 2 ** int(math.log2(max(1, min(local, 8))))


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
            raise ValueError(f"set path or pretrained, not both (path={self.path!r}, pretrained={self.pretrained!r})")
        if self.pretrained is not None and self.pretrained not in PRETRAINED_MODELS:
            raise ValueError(f"pretrained={self.pretrained!r} is unknown; known: {sorted(PRETRAINED_MODELS)}")

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
        if self.num_train < 1 or self.num_val < 1:
            raise ValueError(f"num_train and num_val must be >= 1, got {self.num_train}, {self.num_val}")


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
    prompt: PromptDataConfig = field(default_factory=lambda: PromptDataConfig(max_prompt_length=32))
    builtin: BuiltinTaskSection = field(default_factory=BuiltinTaskSection)

    def __post_init__(self) -> None:
        if self.train_batch_size < 1:
            raise ValueError(f"train_batch_size must be >= 1, got {self.train_batch_size}")
        if self.val_files and not self.train_files:
            raise ValueError("val_files is set but train_files is empty (the built-in task); set both or neither")


@dataclass
class KLControlSection:
    """Coefficient of the KL penalty in the reward: "fixed" or "adaptive" (Ziegler et al.)."""

    type: Literal["fixed", "adaptive"] = "fixed"
    kl_coef: float = 0.001
    target_kl: float = 0.1
    horizon: int = 10000


@dataclass
class DynamicSamplingSection:
    """DAPO dynamic sampling: drop the groups whose rewards are all equal (no signal) and
    generate more prompts until data.train_batch_size groups are kept.

    max_extra_rounds: generation rounds after the first, at most, per step; when they are
        spent, the step trains on the groups kept so far (cut to whole actor mini-batches;
        metric dapo/cap_hit), or fails if that is none.
    """

    enable: bool = True
    max_extra_rounds: int = 8

    def __post_init__(self) -> None:
        if self.max_extra_rounds < 0:
            raise ValueError(f"max_extra_rounds must be >= 0, got {self.max_extra_rounds}")


@dataclass
class OverlongBufferSection:
    """DAPO overlong reward shaping: responses longer than rollout.response_length - len lose
    up to penalty_factor, linearly over the last `len` tokens. len null: a quarter of
    rollout.response_length (at least 1)."""

    enable: bool = True
    len: int | None = None
    penalty_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.len is not None and self.len < 1:
            raise ValueError(f"len must be >= 1 (tokens) or null, got {self.len}")
        if not self.penalty_factor >= 0:
            raise ValueError(f"penalty_factor must be >= 0, got {self.penalty_factor}")


@dataclass
class DAPOSection:
    """algorithm.name=dapo only: dynamic sampling and overlong shaping."""

    filter_groups: DynamicSamplingSection = field(default_factory=DynamicSamplingSection)
    overlong_buffer: OverlongBufferSection = field(default_factory=OverlongBufferSection)


@dataclass
class SafeRLHFSection:
    """algorithm.name=safe_rlhf only: the Lagrange multiplier lambda of E[cost] <= cost_limit.

    Each step: ln lambda += lambda_lr * lambda * (mean episode cost - cost_limit), capped at
    lambda_max (null: no cap); the policy follows (A_reward - lambda A_cost) / (1 + lambda).
    """

    lambda_init: float = 1.0
    lambda_lr: float = 0.1
    cost_limit: float = 0.0
    lambda_max: float | None = None

    def __post_init__(self) -> None:
        LagrangeMultiplier(self.lambda_init, self.lambda_lr, self.cost_limit, self.lambda_max)  # raises if invalid


@dataclass
class AlgorithmSection:
    """Which step program runs and its advantage / KL settings (docs/algorithms.md).

    name: one of ALGORITHM_SPECS (grpo, ppo, remax, rloo, reinforce_plus_plus,
        reinforce_plus_plus_baseline, drgrpo, dapo, safe_rlhf); the name also sets the
        defaults in its presets (e.g. drgrpo: no std normalisation, seq-mean-token-sum-norm).
    adv_estimator: null = the algorithm's own; grpo and dapo also accept the other group
        estimators (rloo, opo, ...).
    use_kl_in_reward / kl_penalty / kl_ctrl: r_t = score_t - beta * KL_t (needs the
        reference policy). KL as a loss instead is actor.loss.use_kl_loss.
    dapo / safe_rlhf: settings read only by those two algorithms.
    """

    name: AlgorithmName = "grpo"
    adv_estimator: str | None = None
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    whiten_gae_advantages: bool = True
    use_kl_in_reward: bool = False
    kl_penalty: str = "k1"
    kl_ctrl: KLControlSection = field(default_factory=KLControlSection)
    dapo: DAPOSection = field(default_factory=DAPOSection)
    safe_rlhf: SafeRLHFSection = field(default_factory=SafeRLHFSection)

    def __post_init__(self) -> None:
        estimator = self.estimator
        get_adv_estimator(estimator)  # unknown names raise, listing the known ones
        spec = ALGORITHM_SPECS[self.name]
        if estimator not in spec.estimators:
            if spec.critic:
                hint = f"algorithm.name={self.name} trains a critic and uses adv_estimator=gae"
            elif spec.estimators == GROUP_ESTIMATORS:
                hint = (f"algorithm.name={self.name} is critic-free and needs a group estimator "
                        f"{list(GROUP_ESTIMATORS)}")
            else:
                hint = f"algorithm.name={self.name} uses adv_estimator={spec.estimators[0]} (leave it null)"
            owners = [n for n, s in ALGORITHM_SPECS.items() if s.estimators[0] == estimator]  # table order
            raise ValueError(f"{hint}, got {estimator!r}" + (f"; for {estimator} use algorithm.name={owners[0]}"
                                                             if owners else ""))
        if self.use_kl_in_reward:
            get_kl_estimator(self.kl_penalty)

    @property
    def estimator(self) -> str:
        return self.adv_estimator if self.adv_estimator is not None else STANDARD_ESTIMATOR[self.name]

    def advantage_config(self) -> AdvantageConfig:
        return AdvantageConfig(
            gamma=self.gamma, lam=self.lam, norm_adv_by_std_in_grpo=self.norm_adv_by_std_in_grpo,
            whiten_gae_advantages=self.whiten_gae_advantages,
        )


@dataclass
class EngineSection:
    """Training-engine settings of one role: `TrainEngineConfig` minus the model path and
    seed, which come from `model.path` and `seed` (see TrainEngineConfig for each key)."""

    dtype: DtypeName = "auto"
    tp_size: int = 1
    gradient_checkpointing: bool = False
    param_offload: bool = False
    optimizer_offload: bool = False
    pack_sequences: bool = False
    logits_chunk_size: int = 1024
    attn_implementation: str = "sdpa"
    peak_flops_per_device: float | None = None
    optim: OptimConfig = field(default_factory=OptimConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    micro_batch: MicroBatchConfig = field(default_factory=MicroBatchConfig)

    def engine_config(self, model_path: str, seed: int) -> TrainEngineConfig:
        """The engine config of this role (every field of this section passes through)."""
        values = {f.name: getattr(self, f.name) for f in fields(EngineSection)}
        return TrainEngineConfig(model_path=model_path, seed=seed, **values)


@dataclass
class ActorSection(EngineSection):
    """The policy: engine settings plus the loss (policy loss, KL loss, entropy bonus)."""

    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-4, weight_decay=0.0))
    micro_batch: MicroBatchConfig = field(
        default_factory=lambda: MicroBatchConfig(mini_batch_size=128, micro_batch_size_per_device=64,
                                                 forward_micro_batch_size_per_device=64))
    loss: ActorLossConfig = field(default_factory=ActorLossConfig)


@dataclass
class CriticSection(EngineSection):
    """The value model (algorithm.name=ppo). model_path null starts it from the policy model."""

    model_path: str | None = None
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3, weight_decay=0.0))
    micro_batch: MicroBatchConfig = field(
        default_factory=lambda: MicroBatchConfig(mini_batch_size=128, micro_batch_size_per_device=32,
                                                 forward_micro_batch_size_per_device=64))
    loss: CriticLossConfig = field(default_factory=CriticLossConfig)


@dataclass
class RewardSection:
    """Rule-based rewards scored in worker processes (errors and hangs are contained).

    custom_fn_path / custom_fn_name: your `compute_score(data_source, solution_str,
        ground_truth, extra_info)` in a Python file; null uses the built-in scorers.
    """

    manager: RewardConfig = field(default_factory=lambda: RewardConfig(num_workers=1, timeout_s=10.0))
    custom_fn_path: str | None = None
    custom_fn_name: str = "compute_score"


@dataclass
class ScoreModelSection(EngineSection):
    """A frozen sequence scorer: a Hugging Face `*ForSequenceClassification` directory with
    num_labels=1 (what `hybridflow rm` writes) that shares the policy's tokenizer, run on the
    actor's ranks. path null: none. Engine keys as in EngineSection (optim and lora unused)."""

    path: str | None = None
    micro_batch: MicroBatchConfig = field(
        default_factory=lambda: MicroBatchConfig(mini_batch_size=8, micro_batch_size_per_device=1,
                                                 forward_micro_batch_size_per_device=64))


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
        if self.steps < 0 or self.test_freq < 0:
            raise ValueError(f"steps and test_freq must be >= 0, got {self.steps}, {self.test_freq}")
        if self.batch_size < 1 or self.micro_batch_size_per_device < 1 or self.num_builtin_pairs < 1:
            raise ValueError("batch_size, micro_batch_size_per_device and num_builtin_pairs must be >= 1")
        if not 0.0 <= self.builtin_carry_drop_rate <= 1.0:
            raise ValueError(f"builtin_carry_drop_rate must be in [0, 1], got {self.builtin_carry_drop_rate}")


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
    rollout: RolloutWorkerConfig = field(default_factory=lambda: RolloutWorkerConfig(n=8, response_length=6))
    critic: CriticSection = field(default_factory=CriticSection)
    reward: RewardSection = field(default_factory=RewardSection)
    reward_model: RewardModelSection = field(default_factory=RewardModelSection)
    cost_model: CostModelSection = field(default_factory=CostModelSection)
    sft: SFTSection = field(default_factory=SFTSection)

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name.strip() != self.name:
            raise ValueError(f"name must be a non-empty directory-safe word, got {self.name!r}")

    @property
    def use_critic(self) -> bool:
        return ALGORITHM_SPECS[self.algorithm.name].critic

    @property
    def use_reference(self) -> bool:
        return self.actor.loss.use_kl_loss or self.algorithm.use_kl_in_reward


def load_run_config(path: str | Path | None = None, overrides: list[str] = ()) -> RunConfig:
    """Load and fully validate a run config (YAML file + dotted overrides). The presets of
    `algorithm.name` (ALGORITHM_SPECS) fill the keys that neither the file nor an override sets."""
    cfg = load_config(RunConfig, path, list(overrides))
    presets = _unset_presets(ALGORITHM_SPECS[cfg.algorithm.name], path, overrides)
    if presets:
        cfg = load_config(RunConfig, path, presets + list(overrides))
    validate_run_config(cfg)
    return cfg


def _unset_presets(spec: AlgorithmSpec, path: str | Path | None, overrides: list[str]) -> list[str]:
    """The algorithm's presets as overrides, minus the keys the user set (or set a parent of)."""
    explicit = {text.split("=", 1)[0] for text in overrides}
    if path is not None:
        explicit |= _dotted_keys(yaml.safe_load(Path(path).read_text()) or {})

    def user_set(key: str) -> bool:
        parts = key.split(".")
        return any(".".join(parts[:i]) in explicit for i in range(1, len(parts) + 1))

    # JSON is YAML, which is how override values are parsed.
    return [f"{key}={json.dumps(value)}" for key, value in spec.presets if not user_set(key)]


def _dotted_keys(tree: dict, prefix: str = "") -> set[str]:
    keys = set()
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        keys.add(dotted)
        if isinstance(value, dict):
            keys |= _dotted_keys(value, f"{dotted}.")
    return keys


def resolve_run_config(cfg: RunConfig) -> RunConfig:
    """A copy with the values that null stands for filled in (resources.world_size,
    algorithm.adv_estimator, algorithm.dapo.overlong_buffer.len): what a run saves as its config.yaml."""
    alg = cfg.algorithm
    dapo = alg.dapo
    if alg.name == "dapo":  # the other algorithms leave the section at its defaults
        dapo = dataclasses.replace(dapo, overlong_buffer=dataclasses.replace(dapo.overlong_buffer,
                                                                            len=overlong_buffer_len(cfg)))
    return dataclasses.replace(
        cfg,
        resources=dataclasses.replace(cfg.resources, world_size=cfg.resources.resolved_world_size()),
        algorithm=dataclasses.replace(alg, adv_estimator=alg.estimator, dapo=dapo),
    )


def overlong_buffer_len(cfg: RunConfig) -> int:
    """algorithm.dapo.overlong_buffer.len, or a quarter of rollout.response_length when null."""
    buffer = cfg.algorithm.dapo.overlong_buffer.len
    return buffer if buffer is not None else max(1, cfg.rollout.response_length // 4)


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
    _check_algorithm(cfg)
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


def _check_algorithm(cfg: RunConfig) -> None:
    """algorithm.name against the settings it implies (ALGORITHM_SPECS) and reads."""
    alg = cfg.algorithm
    spec = ALGORITHM_SPECS[alg.name]
    if cfg.rollout.n < spec.min_samples:
        raise ConfigError(
            f"rollout.n={cfg.rollout.n}: algorithm.name={alg.name} compares the samples of one prompt with each "
            f"other and needs rollout.n >= {spec.min_samples}"
        )
    presets = dict(spec.presets)
    for key in spec.required:
        value = _config_value(cfg, key)
        if value != presets[key]:
            raise ConfigError(
                f"algorithm.name={alg.name} is defined by {key}={json.dumps(presets[key])}, got {json.dumps(value)}; "
                f"remove that setting (the name sets it) or choose another algorithm.name"
            )
    defaults = AlgorithmSection()
    if alg.name != "dapo" and alg.dapo != defaults.dapo:
        raise ConfigError(f"algorithm.dapo.* is read only by algorithm.name=dapo (this run: {alg.name}); remove it")
    if alg.name != "safe_rlhf" and (alg.safe_rlhf != defaults.safe_rlhf or cfg.cost_model != CostModelSection()):
        raise ConfigError(f"algorithm.safe_rlhf.* and cost_model.* are read only by algorithm.name=safe_rlhf "
                          f"(this run: {alg.name}); remove them")
    if alg.name == "dapo":
        policy = cfg.actor.loss.policy
        if not policy.clip_ratio_high > policy.clip_ratio_low:
            raise ConfigError(
                f"algorithm.name=dapo clips higher than lower (clip-higher): actor.loss.policy.clip_ratio_high="
                f"{policy.clip_ratio_high} must be > clip_ratio_low={policy.clip_ratio_low}"
            )
        if alg.dapo.overlong_buffer.enable and overlong_buffer_len(cfg) > cfg.rollout.response_length:
            raise ConfigError(
                f"algorithm.dapo.overlong_buffer.len={overlong_buffer_len(cfg)} exceeds rollout.response_length="
                f"{cfg.rollout.response_length}; the buffer is the last tokens of the allowed length"
            )
    if alg.name == "safe_rlhf" and cfg.cost_model.path is None and cfg.cost_model.custom_fn_path is None:
        raise ConfigError("algorithm.name=safe_rlhf needs a cost: set cost_model.path (a cost model directory) "
                          "and/or cost_model.custom_fn_path (a Python file with a rule-based cost function)")


def _config_value(cfg: RunConfig, dotted: str) -> object:
    value: object = cfg
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


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
