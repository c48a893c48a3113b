"""What a rollout (generation) backend must offer to the workers and the HybridEngine.

Workers and `engines/reshard` talk to generation only through `RolloutEngine`, so a new
backend (vLLM, SGLang, ...) is one new module in engines/rollout: a subclass registered
with `@register_rollout_backend("name")` (registry.py) and selected by `rollout.name`.
Built in: "native" (engine.py) and "hf" (hf_backend.py, transformers `generate`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import ClassVar

import torch

from hybridflow.engines.models import load_hf_config
from hybridflow.engines.rollout.config import RolloutConfig
from hybridflow.engines.rollout.sampling import SamplingParams
from hybridflow.engines.rollout.weights import iter_safetensors, tp_shard_dim
from hybridflow.protocol import DataProto


class RolloutEngine(ABC):
    """Contract between rollout workers (and the HybridEngine) and any generation backend."""

    # False: the backend runs on one rank only; building it for t_g > 1 is refused with a
    # clear error (registry.check_rollout_backend) instead of failing inside the engine.
    supports_tensor_parallel: ClassVar[bool] = False
    # How the HybridEngine hands weights over (engines/reshard/engine.py): None, one parameter
    # per load_weights call as soon as it is gathered (an in-process copy costs nothing per
    # call, and at most one gathered parameter is alive: the exact memory of formulas.py);
    # a byte count, buckets of that size in the rollout dtype (engines behind a round trip).
    sync_bucket_bytes: ClassVar[int | None] = None

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, config: RolloutConfig = RolloutConfig(), *,
                        process_group=None, tokenizer=None) -> "RolloutEngine":
        """Build from a local HF directory and load its safetensors (each rank keeps its shard)."""
        engine = cls(load_hf_config(model_dir, trust_remote_code=config.trust_remote_code), config,
                     process_group=process_group, tokenizer=tokenizer, model_path=str(model_dir))
        engine.load_weights(iter_safetensors(model_dir))
        return engine

    @property
    @abstractmethod
    def tp_size(self) -> int:
        """Tensor-parallel size t_g of this engine's process group (1 when not sharded)."""

    @property
    @abstractmethod
    def tp_rank(self) -> int:
        """This process's rank inside the tensor-parallel group."""

    @property
    def tp_group(self):
        """The tensor-parallel process group (None when not sharded). The agent loop keeps the
        group's ranks in lockstep over it (envs/agent/lockstep.py); a backend with
        t_g > 1 and a `turn_engine` must return its group here."""
        return None

    def shard_dim(self, name: str) -> int | None:
        """Dimension along which the engine splits HF parameter `name` (None: replicated)."""
        return tp_shard_dim(name)

    @abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], *, sharded: bool = False) -> None:
        """Copy (HF name, tensor) pairs into the engine; `sharded`: tensors are this rank's piece."""

    @abstractmethod
    def generate(
        self, prompts: DataProto, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None
    ) -> DataProto:
        """Generate for every prompt row; None takes the sampling settings from prompts.meta_info."""

    def turn_engine(self, slots: int):
        """A multi-turn generator over this backend (`open` / `step` / `extend` / `close`,
        engines/rollout/turns.py) for the agent loop; `slots`: sequences at once. Backends
        that cannot run multi-turn rollouts keep this default."""
        raise NotImplementedError(f"the {type(self).__name__} rollout backend cannot run multi-turn rollouts "
                                  "(rollout.agent.enable); use rollout.name=native or hf")

    @abstractmethod
    def release_memory(self, *, keep_weights: bool = False) -> None:
        """Free the KV cache and, unless keep_weights, the weights (reload them after resume).

        keep_weights=True moves the weights off the accelerator instead, and resume_memory
        brings them back.
        """

    @abstractmethod
    def resume_memory(self) -> None:
        """Re-acquire what release_memory gave back; generation works again afterwards."""

    @abstractmethod
    def weight_storage_bytes(self) -> int:
        """Bytes of weight storage held right now (tied weights once; 0 after release_memory())."""
