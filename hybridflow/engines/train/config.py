"""Typed configuration of the training engine, validated when built.

`TrainEngineConfig` is what one model role (actor, critic, reference, reward model)
needs to be loaded, parallelised and trained; the trainer's config tree embeds it. The
loss settings of the actor and critic live in `ActorLossConfig` / `CriticLossConfig`
and are passed to those engines separately. Errors say which key is wrong and how to
fix it; checks that need the world size run in `TrainEngineConfig.check_parallel`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hybridflow.algorithms import PolicyLossConfig, get_kl_estimator, get_loss_agg_mode
from hybridflow.engines.precision import DTYPE_NAMES, DtypeName

LR_SCHEDULES = ("constant", "cosine")


class EngineConfigError(ValueError):
    """An inconsistent or out-of-range engine setting."""


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise EngineConfigError(f"{name} must be > 0, got {value}")


@dataclass
class OptimConfig:
    """AdamW with gradient clipping and a warmup + (constant | cosine) schedule.

    The schedule advances once per `update_*` call (one trainer step), not per
    mini-batch. `total_steps` is the number of trainer steps; cosine decay and
    `warmup_ratio` need it. `grad_clip <= 0` disables clipping (the norm is still
    reported).
    """

    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    lr_schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = 0
    warmup_ratio: float = 0.0
    min_lr_ratio: float = 0.0
    total_steps: int | None = None

    def __post_init__(self) -> None:
        _positive("optim.lr", self.lr)
        _positive("optim.eps", self.eps)
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise EngineConfigError(f"optim.betas must be in [0, 1), got {self.betas}")
        if self.weight_decay < 0:
            raise EngineConfigError(f"optim.weight_decay must be >= 0, got {self.weight_decay}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise EngineConfigError(f"optim.lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        if self.warmup_steps < 0 or not 0.0 <= self.warmup_ratio < 1.0:
            raise EngineConfigError(
                f"optim.warmup_steps must be >= 0 and optim.warmup_ratio in [0, 1), got "
                f"{self.warmup_steps} and {self.warmup_ratio}"
            )
        if self.warmup_steps and self.warmup_ratio:
            raise EngineConfigError("set either optim.warmup_steps or optim.warmup_ratio, not both")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise EngineConfigError(f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        needs_total = self.lr_schedule == "cosine" or self.warmup_ratio > 0
        if needs_total and (self.total_steps is None or self.total_steps < 1):
            raise EngineConfigError(
                "optim.total_steps (number of trainer steps) must be set >= 1 for a cosine "
                f"schedule or a warmup_ratio; got {self.total_steps}"
            )

    def resolved_warmup_steps(self) -> int:
        """Warmup length in steps (from `warmup_steps` or `warmup_ratio * total_steps`)."""
        if self.warmup_ratio:
            return int(self.warmup_ratio * (self.total_steps or 0))
        return self.warmup_steps


@dataclass
class LoraConfig:
    """LoRA adapters for the actor (peft). rank 0 means full fine-tuning."""

    rank: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = (
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    )

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise EngineConfigError(f"lora.rank must be >= 0 (0 disables LoRA), got {self.rank}")
        if self.rank:
            _positive("lora.alpha", self.alpha)
            if not 0.0 <= self.dropout < 1.0:
                raise EngineConfigError(f"lora.dropout must be in [0, 1), got {self.dropout}")
            if not self.target_modules:
                raise EngineConfigError("lora.target_modules is empty; name the Linear layers to adapt")

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@dataclass
class MicroBatchConfig:
    """How a batch is cut for updates (epochs x mini-batches x micro-batches) and for scoring.

    mini_batch_size: sequences per optimizer step, summed over all dp ranks.
    micro_batch_size_per_device: sequences per forward/backward (fixed-count mode).
    use_dynamic_bsz: cut micro-batches by a token budget instead of a count;
        max_tokens_per_device then bounds the tokens of one micro-batch (valid tokens
        with sequence packing, padded tokens without). A longer single sequence is an error.
    forward_*: the same two knobs for no-grad scoring (log-probs, values, rewards).
    epochs / shuffle: passes over the batch per update, and whether to reshuffle
        sequences (seeded, identical on every rank) before each pass.
    """

    mini_batch_size: int = 8
    micro_batch_size_per_device: int = 2
    use_dynamic_bsz: bool = False
    max_tokens_per_device: int = 4096
    forward_micro_batch_size_per_device: int = 8
    forward_max_tokens_per_device: int = 8192
    epochs: int = 1
    shuffle: bool = False

    def __post_init__(self) -> None:
        for name in (
            "mini_batch_size", "micro_batch_size_per_device", "max_tokens_per_device",
            "forward_micro_batch_size_per_device", "forward_max_tokens_per_device", "epochs",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise EngineConfigError(f"micro_batch.{name} must be an integer >= 1, got {value!r}")

    def check(self, dp_size: int) -> None:
        """Divisibility rules that depend on the number of data-parallel ranks."""
        if self.mini_batch_size % dp_size != 0:
            raise EngineConfigError(
                f"micro_batch.mini_batch_size={self.mini_batch_size} is not divisible by the "
                f"data-parallel size {dp_size}; every dp rank must get the same number of sequences"
            )
        per_rank = self.mini_batch_size // dp_size
        if not self.use_dynamic_bsz and per_rank % self.micro_batch_size_per_device != 0:
            raise EngineConfigError(
                f"mini-batch per dp rank ({self.mini_batch_size} / dp {dp_size} = {per_rank}) is not "
                f"divisible by micro_batch_size_per_device={self.micro_batch_size_per_device}; make "
                "mini_batch_size a multiple of micro_batch_size_per_device x dp, or set use_dynamic_bsz"
            )


@dataclass
class TrainEngineConfig:
    """Everything needed to load, shard and train (or only run) one model.

    dtype: "bf16" computes in bf16 with fp32 master weights and fp32 gradient
        reduction; "fp32" computes in fp32; "auto" (default) is bf16 on GPUs and CPUs
        with native bf16 instructions, fp32 elsewhere (see engines/precision.py). Models that are not trained (reference,
        reward) are stored in the compute dtype.
    tp_size: tensor-parallel degree; dp = world_size / tp_size.
    pack_sequences: remove padding and pack each micro-batch into one row with
        per-sequence position ids (same results as the padded batch, less compute).
    logits_chunk_size: rows of the vocabulary-wide logits upcast to fp32 at a time.
    param_offload / optimizer_offload: keep parameters / optimizer state on the CPU
        between calls (GPU only; see TrainEngine.offload / onload).
    peak_flops_per_device: for the MFU metric; None uses a known-GPU table, or a
        measured bf16/fp32 matmul rate on CPU.
    """

    model_path: str
    dtype: DtypeName = "auto"
    tp_size: int = 1
    gradient_checkpointing: bool = False
    param_offload: bool = False
    optimizer_offload: bool = False
    pack_sequences: bool = False
    logits_chunk_size: int = 1024
    attn_implementation: str = "sdpa"
    seed: int = 0
    peak_flops_per_device: float | None = None
    optim: OptimConfig = field(default_factory=OptimConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    micro_batch: MicroBatchConfig = field(default_factory=MicroBatchConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.model_path, str) or not self.model_path:
            raise EngineConfigError(f"model_path must be a non-empty path string, got {self.model_path!r}")
        if self.dtype not in DTYPE_NAMES:
            raise EngineConfigError(f"dtype must be one of {DTYPE_NAMES}, got {self.dtype!r}")
        if not isinstance(self.tp_size, int) or self.tp_size < 1:
            raise EngineConfigError(f"tp_size must be an integer >= 1, got {self.tp_size!r}")
        if self.logits_chunk_size < 1:
            raise EngineConfigError(f"logits_chunk_size must be >= 1, got {self.logits_chunk_size}")
        if self.lora.enabled and self.tp_size > 1:
            raise EngineConfigError("LoRA with tensor parallelism is not supported; use tp_size=1 with lora.rank > 0")
        if self.peak_flops_per_device is not None:
            _positive("peak_flops_per_device", self.peak_flops_per_device)

    def check_parallel(self, world_size: int, has_gpu: bool) -> int:
        """Validate against the running world; returns the data-parallel size."""
        if world_size % self.tp_size != 0:
            raise EngineConfigError(
                f"tp_size={self.tp_size} does not divide the world size {world_size}"
            )
        if (self.param_offload or self.optimizer_offload) and not has_gpu:
            raise EngineConfigError(
                "param_offload / optimizer_offload move state from GPU to CPU memory; on a "
                "CPU-only machine everything already lives in CPU memory, set both to False"
            )
        dp = world_size // self.tp_size
        self.micro_batch.check(dp)
        return dp


@dataclass
class ActorLossConfig:
    """Actor objective: policy loss + kl_loss_coef * KL(pi || pi_ref) - entropy_coeff * H.

    The KL and entropy terms are aggregated with `policy.loss_agg_mode` like the policy
    loss. `loss_scale_factor` is the constant of `seq-mean-token-sum-norm` (e.g. the max
    response length); None uses the padded response length.
    """

    policy: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    loss_scale_factor: float | None = None

    def __post_init__(self) -> None:
        if self.entropy_coeff < 0 or self.kl_loss_coef < 0:
            raise EngineConfigError(
                f"entropy_coeff and kl_loss_coef must be >= 0, got {self.entropy_coeff} and {self.kl_loss_coef}"
            )
        if self.use_kl_loss:
            get_kl_estimator(self.kl_loss_type)


@dataclass
class CriticLossConfig:
    """Clipped value loss; cliprange_value None disables clipping."""

    cliprange_value: float | None = 0.5
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: float | None = None

    def __post_init__(self) -> None:
        if self.cliprange_value is not None:
            _positive("cliprange_value", self.cliprange_value)
        get_loss_agg_mode(self.loss_agg_mode)
