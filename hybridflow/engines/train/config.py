"""Typed configuration of the training engine, validated when built."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Literal

from hybridflow.algorithms.settings import KL_ESTIMATORS, LOSS_AGG_MODES, OffPolicyConfig, PolicyLossConfig
from hybridflow.engines.precision import DTYPE_NAMES, DtypeName
from hybridflow.errors import ConfigError

LR_SCHEDULES = ("constant", "cosine")


def _positive(key: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"must be > 0, got {value}", key)


def _count(key: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"must be an integer >= 1, got {value!r}", key)


def _registered(key: str, lookup: Callable[[str], object], name: str) -> None:
    """`lookup(name)` (a registry check); its unknown-name ValueError becomes a ConfigError on `key`."""
    try:
        lookup(name)
    except ValueError as err:
        raise ConfigError(str(err), key) from None


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
        _positive("lr", self.lr)
        _positive("eps", self.eps)
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"must both be in [0, 1), got {self.betas}", "betas")
        if self.weight_decay < 0:
            raise ConfigError(f"must be >= 0, got {self.weight_decay}", "weight_decay")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ConfigError(f"must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}", "lr_schedule")
        if self.warmup_steps < 0:
            raise ConfigError(f"must be >= 0, got {self.warmup_steps}", "warmup_steps")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ConfigError(f"must be in [0, 1), got {self.warmup_ratio}", "warmup_ratio")
        if self.warmup_steps and self.warmup_ratio:
            raise ConfigError("set warmup_steps or warmup_ratio, not both", "warmup_ratio")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"must be in [0, 1], got {self.min_lr_ratio}", "min_lr_ratio")
        needs_total = self.lr_schedule == "cosine" or self.warmup_ratio > 0
        if needs_total and (self.total_steps is None or self.total_steps < 1):
            raise ConfigError(
                f"(the number of trainer steps) must be set >= 1 for a cosine schedule or a warmup_ratio; "
                f"got {self.total_steps}", "total_steps",
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
            raise ConfigError(f"must be >= 0 (0 disables LoRA), got {self.rank}", "rank")
        if self.rank:
            _positive("alpha", self.alpha)
            if not 0.0 <= self.dropout < 1.0:
                raise ConfigError(f"must be in [0, 1), got {self.dropout}", "dropout")
            if not self.target_modules:
                raise ConfigError("is empty; name the Linear layers to adapt", "target_modules")

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@dataclass
class ForwardBatchConfig:
    """How a batch is cut for no-grad scoring (log-probs, values, rewards): all that a frozen
    engine (reference, reward or cost model) reads.

    use_dynamic_bsz: cut micro-batches by a token budget instead of a count;
        forward_max_tokens_per_device then bounds the tokens of one micro-batch (valid
        tokens with sequence packing, padded tokens without). A longer single sequence is an error.
    forward_micro_batch_size_per_device: sequences per forward pass (fixed-count mode).
    """

    use_dynamic_bsz: bool = False
    forward_micro_batch_size_per_device: int = 8
    forward_max_tokens_per_device: int = 8192

    def __post_init__(self) -> None:
        for name in ("forward_micro_batch_size_per_device", "forward_max_tokens_per_device"):
            _count(name, getattr(self, name))


@dataclass
class MicroBatchConfig(ForwardBatchConfig):
    """ForwardBatchConfig plus how a trained engine cuts its updates (epochs x mini-batches x
    micro-batches).

    mini_batch_size: sequences per optimizer step, summed over all dp ranks.
    micro_batch_size_per_device: sequences per forward/backward (fixed-count mode).
    max_tokens_per_device: the token budget of one update micro-batch with use_dynamic_bsz.
    epochs / shuffle: passes over the batch per update, and whether to reshuffle
        sequences (seeded, identical on every rank) before each pass.
    """

    mini_batch_size: int = 8
    micro_batch_size_per_device: int = 2
    max_tokens_per_device: int = 4096
    epochs: int = 1
    shuffle: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("mini_batch_size", "micro_batch_size_per_device", "max_tokens_per_device", "epochs"):
            _count(name, getattr(self, name))

    def check(self, dp_size: int) -> None:
        """Divisibility of a training mini-batch over `dp_size` data-parallel ranks."""
        if self.mini_batch_size % dp_size != 0:
            raise ConfigError(
                f"{self.mini_batch_size} is not divisible by the data-parallel size {dp_size} (ranks / (tp_size x pp_size)); "
                "every dp rank must get the same number of sequences", "mini_batch_size",
            )
        per_rank = self.mini_batch_size // dp_size
        if not self.use_dynamic_bsz and per_rank % self.micro_batch_size_per_device != 0:
            raise ConfigError(
                f"{self.micro_batch_size_per_device} does not divide the {per_rank} sequences of a mini-batch per dp "
                f"rank ({self.mini_batch_size} / dp {dp_size}); make the mini-batch a multiple of this x dp, or cut "
                "micro-batches by tokens (use_dynamic_bsz)", "micro_batch_size_per_device",
            )


def _needs_gpu(key: str, enabled: bool, has_gpu: bool) -> None:
    if enabled and not has_gpu:
        raise ConfigError(
            "moves state from GPU to CPU memory between calls; on a CPU-only run everything already "
            "lives in CPU memory: set it to false (or run on GPUs)", key,
        )


@dataclass
class EngineSettings:
    """What any engine reads, frozen (reference, reward model) or trained.

    dtype: "bf16" computes in bf16 with fp32 master weights and fp32 gradient
        reduction; "fp32" computes in fp32; "auto" (default) is bf16 on GPUs and, on
        CPUs, the faster of the two in a cached matmul probe (engines/precision.py; a run
        resolves it once, config/dtypes.py). Models
        that are not trained (reference, reward) are stored in the compute dtype.
    tp_size: tensor-parallel degree; dp = world_size / (tp_size * pp_size).
    pp_size: pipeline-parallel degree: the decoder layers cut into pp_size stages run by
        a 1F1B schedule over the micro-batches (engines/train/pipeline.py); causal LMs
        (actor, reference) only, fixed-count micro-batches, no sequence packing.
    param_offload: keep parameters on the CPU between calls (GPU only; see
        TrainEngine.offload / onload).
    pack_sequences: remove padding and pack each micro-batch into one row with
        per-sequence position ids (same results as the padded batch, less compute).
    logits_chunk_size: rows of the vocabulary-wide logits upcast to fp32 at a time.
    fused_head: compute the response log-probs and entropy inside the lm_head, a
        logits_chunk_size chunk of rows at a time, so no [tokens, vocab] logits exist
        (engines/train/vocab_head.py); needs tp_size = pp_size = 1 and a plain Linear head.
    compile_kernels: torch.compile each decoder layer (fusing RMSNorm, rotary and SwiGLU
        into few kernels) and the fused head's per-chunk vocabulary math. Off by default:
        compiling costs minutes on CPUs and is measured on GPUs by benchmarks/gpu/gpu_check.py.
    attn_implementation: the Hugging Face attention kernel ("sdpa", "eager", ...).
    peak_flops_per_device: for the MFU metric; None uses a known-GPU table, or a
        measured bf16/fp32 matmul rate on CPU.
    micro_batch: how batches are cut for scoring (a trained engine's MicroBatchConfig adds
        the update keys).
    """

    dtype: DtypeName = "auto"
    tp_size: int = 1
    pp_size: int = 1
    param_offload: bool = False
    pack_sequences: bool = False
    logits_chunk_size: int = 1024
    fused_head: bool = False
    compile_kernels: bool = False
    attn_implementation: str = "sdpa"
    peak_flops_per_device: float | None = None
    micro_batch: ForwardBatchConfig = field(default_factory=ForwardBatchConfig)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_NAMES:
            raise ConfigError(f"must be one of {DTYPE_NAMES}, got {self.dtype!r}", "dtype")
        _count("tp_size", self.tp_size)
        _count("pp_size", self.pp_size)
        if self.pp_size > 1 and self.pack_sequences:
            raise ConfigError("cannot be true with pp_size > 1: a pipeline's micro-batches must share one shape "
                              "(set pack_sequences: false)", "pack_sequences")
        if self.pp_size > 1 and self.micro_batch.use_dynamic_bsz:
            raise ConfigError("cannot be true with pp_size > 1: a pipeline's micro-batches must share one shape "
                              "(cut them by count: micro_batch_size_per_device)", "micro_batch.use_dynamic_bsz")
        _count("logits_chunk_size", self.logits_chunk_size)
        if self.fused_head and (self.tp_size > 1 or self.pp_size > 1):
            raise ConfigError("needs tp_size = pp_size = 1 (a head split over ranks needs a vocabulary-parallel "
                              "softmax): set it to false", "fused_head")
        if self.peak_flops_per_device is not None:
            _positive("peak_flops_per_device", self.peak_flops_per_device)

    def check_parallel(self, world_size: int, has_gpu: bool, *, trainable: bool) -> int:
        """The rules that need the engine's world size; returns the data-parallel size.
        The mini-batch rules hold only for a trained engine (a frozen one only scores)."""
        if world_size % self.tp_size != 0:
            raise ConfigError(f"{self.tp_size} does not divide the {world_size} ranks of this model", "tp_size")
        if world_size % (self.tp_size * self.pp_size) != 0:
            raise ConfigError(f"tp_size x pp_size = {self.tp_size} x {self.pp_size} does not divide the "
                              f"{world_size} ranks of this model", "pp_size")
        _needs_gpu("param_offload", self.param_offload, has_gpu)
        dp = world_size // (self.tp_size * self.pp_size)
        if trainable:
            try:
                self.micro_batch.check(dp)
            except ConfigError as err:
                raise err.within("micro_batch") from None
            per_rank = self.micro_batch.mini_batch_size // dp
            if self.pp_size > 1 and per_rank // self.micro_batch.micro_batch_size_per_device < self.pp_size:
                raise ConfigError(
                    f"{self.micro_batch.micro_batch_size_per_device} leaves {per_rank // self.micro_batch.micro_batch_size_per_device} "
                    f"micro-batches in a mini-batch of {per_rank} per dp rank, fewer than the pp_size={self.pp_size} "
                    "pipeline stages (1F1B needs one per stage, and more to fill the pipeline): make micro-batches "
                    "smaller or mini-batches larger", "micro_batch.micro_batch_size_per_device")
        return dp

    def engine_config(self, model_path: str, seed: int, trust_remote_code: bool) -> TrainEngineConfig:
        """The engine config of a model at `model_path` with these settings (the settings this
        class does not hold keep TrainEngineConfig's defaults); `trust_remote_code`: the run's
        model.trust_remote_code."""
        settings = TrainEngineSettings if isinstance(self, TrainEngineSettings) else EngineSettings
        values = {f.name: getattr(self, f.name) for f in fields(settings)}
        if not isinstance(self.micro_batch, MicroBatchConfig):  # a frozen engine: update keys unused
            values["micro_batch"] = MicroBatchConfig(**asdict(self.micro_batch))
        return TrainEngineConfig(model_path=model_path, seed=seed, trust_remote_code=trust_remote_code, **values)


@dataclass
class TrainEngineSettings(EngineSettings):
    """What a trained engine reads in addition.

    gradient_checkpointing: recompute activations in the backward pass (less memory).
    optimizer_offload: keep the optimizer state on the CPU between calls (GPU only).
    optim: AdamW and its schedule. lora: adapters instead of full fine-tuning (actor only).
    """

    gradient_checkpointing: bool = False
    optimizer_offload: bool = False
    optim: OptimConfig = field(default_factory=OptimConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    micro_batch: MicroBatchConfig = field(default_factory=MicroBatchConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pp_size > 1 and self.lora.enabled:
            raise ConfigError("must be 1 with LoRA (lora.rank > 0): adapters are not cut into pipeline stages; "
                              "use tensor or data parallelism for a LoRA actor", "pp_size")

    def check_parallel(self, world_size: int, has_gpu: bool, *, trainable: bool) -> int:
        _needs_gpu("optimizer_offload", self.optimizer_offload, has_gpu)
        return super().check_parallel(world_size, has_gpu, trainable=trainable)


@dataclass
class TrainEngineConfig(TrainEngineSettings):
    """Everything needed to load, shard and train (or only run) one model: the settings
    above plus the model directory and the seed of initialisation and shuffling.

    All three are keyword-only: `TrainEngineConfig(model_path="...", dtype="fp32")`.
    trust_remote_code: let transformers run code the model directory names (auto_map; the
    run's model.trust_remote_code), never asked interactively.
    """

    model_path: str = field(kw_only=True)
    seed: int = field(default=0, kw_only=True)
    trust_remote_code: bool = field(default=False, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.model_path, str) or not self.model_path:
            raise ConfigError(f"must be a non-empty path string, got {self.model_path!r}", "model_path")


@dataclass
class ActorLossConfig:
    """Actor objective: policy loss + kl_loss_coef * KL(pi || pi_ref) - entropy_coeff * H.

    The KL and entropy terms are aggregated with `policy.loss_agg_mode` like the policy
    loss. `loss_scale_factor` is the constant of `seq-mean-token-sum-norm` (e.g. the max
    response length); None uses the padded response length. `off_policy`: truncated
    importance weights between the rollout (behaviour) policy and the old (proximal)
    policy, the decoupled PPO objective (algorithms/off_policy.py; the update then reads
    `rollout_log_probs`).

    skip_no_signal_updates: true (default): an optimizer step whose mini-batch has every
        advantage 0 on every rank (e.g. GRPO when every group scored its responses alike)
        is not taken: no forward or backward pass, parameters, AdamW moments and step
        count stay as they were (the KL and entropy terms alone do not make a step; the
        lr schedule still counts the trainer step). Metric actor/skipped_no_signal: the
        share of the update's optimizer steps skipped so. false: step anyway (AdamW's
        momentum and weight decay then move the weights on nothing).
    """

    policy: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    off_policy: OffPolicyConfig = field(default_factory=OffPolicyConfig)
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    loss_scale_factor: float | None = None
    skip_no_signal_updates: bool = True

    def __post_init__(self) -> None:
        for key in ("entropy_coeff", "kl_loss_coef"):
            if getattr(self, key) < 0:
                raise ConfigError(f"must be >= 0, got {getattr(self, key)}", key)
        if self.use_kl_loss:
            _registered("kl_loss_type", KL_ESTIMATORS.check, self.kl_loss_type)


@dataclass
class CriticLossConfig:
    """Clipped value loss; cliprange_value None disables clipping."""

    cliprange_value: float | None = 0.5
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: float | None = None

    def __post_init__(self) -> None:
        if self.cliprange_value is not None:
            _positive("cliprange_value", self.cliprange_value)
        _registered("loss_agg_mode", LOSS_AGG_MODES.check, self.loss_agg_mode)
