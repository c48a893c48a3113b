"""What a rollout (generation) engine must offer to the workers.

Workers talk to generation only through `RolloutEngine`, so an adapter for vLLM or SGLang
is one new class here in engines/rollout, not a change to any worker:

- `load_weights(named_tensors, sharded=...)`: weights by Hugging Face parameter name,
  either full tensors (the engine cuts its tensor-parallel piece) or pieces the caller
  already cut along `shard_dim(name)`; may be called repeatedly (weight sync each step).
- `generate(prompts, sampling_params)`: left-padded prompts in a DataProto in; a DataProto
  with `prompts`, `responses`, `response_mask`, `input_ids`, `attention_mask`,
  `position_ids`, `rollout_log_probs` and non-tensor `finish_reason` out (see engine.py).
- `release_memory(keep_weights=...)` / `resume_memory()`: give the device memory back
  between rollouts (colocated training needs it) and take it again.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence

import torch

from hybridflow.engines.rollout.sampling import SamplingParams
from hybridflow.engines.rollout.weights import tp_shard_dim
from hybridflow.protocol import DataProto


class RolloutEngine(ABC):
    """Contract between rollout workers and any generation backend."""

    @property
    @abstractmethod
    def tp_size(self) -> int:
        """Tensor-parallel size t_g of this engine's process group (1 when not sharded)."""

    @property
    @abstractmethod
    def tp_rank(self) -> int:
        """This process's rank inside the tensor-parallel group."""

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

    @abstractmethod
    def release_memory(self, *, keep_weights: bool = False) -> None:
        """Free the KV cache and, unless keep_weights, the weights (reload them after resume).

        keep_weights=True moves the weights off the accelerator instead, and resume_memory
        brings them back.
        """

    @abstractmethod
    def resume_memory(self) -> None:
        """Re-acquire what release_memory gave back; generation works again afterwards."""
