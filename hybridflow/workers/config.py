"""Typed configs of the worker roles, validated when built."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hybridflow.engines.precision import DTYPE_NAMES, DtypeName
from hybridflow.engines.reshard.method import ReshardMethod
from hybridflow.engines.rollout.external import EXTERNAL_ENGINES, check_external_backend
from hybridflow.engines.rollout.registry import check_rollout_backend, multi_turn_backends
from hybridflow.engines.rollout.settings import (
    DECODE_LOOPS,
    LOG_PROB_MODES,
    MATMUL_MODES,
    InvalidSampling,
    SamplingParams,
)
from hybridflow.envs.agent.config import AgentConfig
from hybridflow.engines.train.config import (
    ActorLossConfig,
    CriticLossConfig,
    EngineSettings,
    TrainEngineConfig,
    TrainEngineSettings,
)
from hybridflow.errors import ConfigError


@dataclass
class RolloutWorkerConfig:
    """Generation settings of the hybrid actor (verl: `actor_rollout_ref.rollout.*`).

    name: generation backend, a name registered in engines/rollout/registry.py ("native":
        hybridflow's own engine; "hf": transformers generate, t_g = 1 only; "vllm" /
        "sglang": the external engines, GPU only, package installed separately,
        docs/rollout_backends.md) or "package.module:name" for one registered outside hybridflow.
    tensor_model_parallel_size: t_g, the generation tensor-parallel size; it must divide
        the actor's world size (the rest are micro-data-parallel generation groups).
    reshard_method: "hybrid" (HybridFlow grouping), "plain" or "gather_all" (baselines),
        see docs/reshard.md.
    dtype: generation weight dtype ("auto": bf16 on GPUs, the measured faster on CPUs; precision.py).
    max_num_seqs / max_model_len / prefill_token_budget / log_prob_mode / matmul: engine
        knobs (engines/rollout/engine.py; matmul "auto" runs bf16 products as fp32 panels on
        CPUs without native bf16, engines/rollout/gemm.py).
    decode_loop / readback_every / compile_decode / cuda_graphs: the native engine's decode
        loop (engines/rollout/config.py, device_loop.py): "auto" is "device" with
        resources.use_gpu and "host" otherwise, resolved when the run starts (config.yaml);
        compile_decode and cuda_graphs need the device loop, cuda_graphs a GPU (checked with
        the run's resources, config/validation.py).
    seed: base seed; each generation call and micro-DP group derives its own from it.
    temperature ... stop: default sampling; a call's prompts.meta_info overrides any of
        them (keys temperature, top_p, top_k, max_new_tokens or response_length, n,
        do_sample, ignore_eos, stop_token_ids, stop, seed). do_sample=False is greedy.
    """

    name: str = "native"
    tensor_model_parallel_size: int = 1
    reshard_method: str = "hybrid"
    dtype: DtypeName = "auto"
    max_num_seqs: int = 256
    max_model_len: int | None = None
    prefill_token_budget: int = 8192
    log_prob_mode: str = "scaled"
    matmul: str = "auto"
    decode_loop: str = "auto"
    readback_every: int = 8
    compile_decode: bool = False
    cuda_graphs: bool = False
    seed: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    response_length: int = 128
    n: int = 1
    do_sample: bool = True
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    agent: AgentConfig = field(default_factory=AgentConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.tensor_model_parallel_size, int) or self.tensor_model_parallel_size < 1:
            raise ConfigError(f"must be an integer >= 1, got {self.tensor_model_parallel_size!r}",
                              "tensor_model_parallel_size")
        try:  # the registry knows the backends (and which can run tensor parallel)
            check_rollout_backend(self.name, self.tensor_model_parallel_size)
        except ValueError as err:
            raise ConfigError(str(err), "name") from None
        if self.name in EXTERNAL_ENGINES:  # vllm / sglang: layouts and log-probs they can give
            sampling = self.sampling_defaults()
            problem = check_external_backend(self.name, tp_size=self.tensor_model_parallel_size,
                                             reshard_method=self.reshard_method, log_prob_mode=self.log_prob_mode,
                                             temperature=sampling["temperature"], top_k=self.top_k, top_p=self.top_p)
            if problem is not None:
                raise ConfigError(problem.message, problem.key)
        try:
            ReshardMethod.parse(self.reshard_method)
        except ValueError as err:
            raise ConfigError(str(err), "reshard_method") from None
        for key, value, allowed in (("dtype", self.dtype, DTYPE_NAMES), ("log_prob_mode", self.log_prob_mode,
                                    LOG_PROB_MODES), ("matmul", self.matmul, MATMUL_MODES),
                                    ("decode_loop", self.decode_loop, DECODE_LOOPS)):
            if value not in allowed:
                raise ConfigError(f"must be one of {tuple(allowed)}, got {value!r}", key)
        for key in ("max_num_seqs", "prefill_token_budget", "readback_every"):
            if getattr(self, key) < 1:
                raise ConfigError(f"must be >= 1, got {getattr(self, key)}", key)
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ConfigError(f"must be >= 2 or null, got {self.max_model_len}", "max_model_len")
        if self.seed < 0:
            raise ConfigError(f"must be >= 0, got {self.seed}", "seed")
        self.stop_token_ids = tuple(self.stop_token_ids)
        self.stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if self.agent.enable and (self.name not in multi_turn_backends() or self.stop):
            # A turn must end on a stop token, which the chat template renders. The native
            # engine continues each sequence from its KV cache, the hf backend regenerates from
            # the prefix (engines/rollout/turns.py, regen_turns.py). t_g > 1 runs the loop in
            # lockstep over the generation group (envs/agent/lockstep.py); a backend that
            # cannot run t_g > 1 at all is refused by check_rollout_backend above.
            raise ConfigError(f"multi-turn rollouts need name in {multi_turn_backends()} and no stop strings; got "
                              f"name={self.name!r}, stop={self.stop}", "agent.enable")
        try:
            SamplingParams(**self.sampling_defaults())
        except InvalidSampling as err:  # named by this section's key (rollout.n), not SamplingParams' argument
            arg, text = err.problems[0]
            raise ConfigError(text, {"max_new_tokens": "response_length"}.get(arg, arg)) from None

    def sampling_defaults(self) -> dict[str, Any]:
        """SamplingParams keyword arguments for a call whose meta_info sets nothing."""
        return {
            "temperature": self.temperature if self.do_sample else 0.0,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "max_new_tokens": self.response_length,
            "n": self.n,
            "ignore_eos": self.ignore_eos,
            "stop_token_ids": self.stop_token_ids,
            "stop": self.stop,
        }


@dataclass
class ActorRolloutRefConfig:
    """The hybrid-engine role: actor training, generation and the reference policy.

    engine: the actor's model, parallelism, optimizer and micro-batches. The reference
        policy (when used) loads the same model_path with the same parallelism, frozen,
        in the compute dtype; with LoRA it is the actor with its adapters switched off.
    use_reference: keep a reference policy (needed by the KL loss and by KL-in-reward).
    fuse_old_log_probs: the update computes the old log-probs itself (on-policy, one optimizer
        step: decided once by the run, RunConfig.fuses_old_log_probs); its batches have none.
    """

    engine: TrainEngineConfig
    loss: ActorLossConfig = field(default_factory=ActorLossConfig)
    rollout: RolloutWorkerConfig = field(default_factory=RolloutWorkerConfig)
    use_reference: bool = False
    fuse_old_log_probs: bool = False

    def __post_init__(self) -> None:
        _check_types(self, engine=TrainEngineConfig, loss=ActorLossConfig, rollout=RolloutWorkerConfig)
        if self.loss.use_kl_loss and not self.use_reference:
            raise ConfigError("needs the reference policy's log-probs; set use_reference=True", "loss.use_kl_loss")

    @property
    def model_path(self) -> str:
        return self.engine.model_path


@dataclass
class CriticWorkerConfig:
    """The critic role (verl: `critic.*`): a value model trained with the clipped value loss."""

    engine: TrainEngineConfig
    loss: CriticLossConfig = field(default_factory=CriticLossConfig)

    def __post_init__(self) -> None:
        _check_types(self, engine=TrainEngineConfig, loss=CriticLossConfig)
        _check_engine(self, "critic")


@dataclass
class RewardModelWorkerConfig:
    """The reward-model role (verl: `reward_model.*`): a frozen one-label sequence classifier.

    The model must share the actor's tokenizer: it scores the actor's `input_ids` as they are.
    """

    engine: TrainEngineConfig

    def __post_init__(self) -> None:
        _check_types(self, engine=TrainEngineConfig)
        _check_engine(self, "reward_model")


# Roles whose engine may carry LoRA adapters: peft adapts a causal LM, not a scoring head model.
LORA_ROLES = ("actor",)
# Roles that may run with pp_size > 1 in an RL run (check_role_pipeline).
PIPELINE_ROLES = ("actor", "critic", "cost_critic")


def check_role_engine(role: str, engine: TrainEngineSettings) -> None:
    """The rules a role puts on its engine settings (keys relative to the settings). One copy:
    the worker configs below call it, and so does the run config's validation."""
    if engine.lora.enabled and role not in LORA_ROLES:
        raise ConfigError(f"must be 0 for the {role}: LoRA is supported for the {' and '.join(LORA_ROLES)} only",
                          "lora.rank")
    check_role_pipeline(role, engine)


def check_role_pipeline(role: str, engine: EngineSettings) -> None:
    """pp_size > 1 in an RL run: the actor (and with it the reference, built with its sizes)
    and the critics (key relative to the settings).

    The actor's log-probs and update run through the pipeline (engines/train/pipeline.py)
    and the 3D-HybridEngine gathers its stages into generation at p_g = 1
    (engines/reshard/grouping.py); the frozen score models (reward, cost) have no
    pipelined forward."""
    if engine.pp_size == 1 or role in PIPELINE_ROLES:
        return
    raise ConfigError(f"must be 1 for the {role} in an RL run: the {role}'s model has no pipelined forward; use "
                      "tp_size / data parallelism", "pp_size")


def _check_engine(config: object, role: str) -> None:
    try:
        check_role_engine(role, config.engine)
    except ConfigError as err:
        raise err.within("engine") from None


def _check_types(config: object, **expected: type) -> None:
    for name, cls in expected.items():
        value = getattr(config, name)
        if not isinstance(value, cls):
            raise ConfigError(f"must be a {cls.__name__}, got {type(value).__name__}", name)
