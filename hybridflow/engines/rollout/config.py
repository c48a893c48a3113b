"""`RolloutConfig`: engine-wide settings shared by every rollout backend.

Per-request settings (temperature, stops, n, seed...) live in `SamplingParams`; this is
what a backend is built with. Every backend honours `dtype`, `device`, `max_model_len`,
`log_prob_mode`, `pad_token_id`, `seed` and `max_num_seqs` (rows generated at once); the
rest are knobs of the native engine that other backends ignore: `keep_kv_cache`,
`prefill_token_budget`, `matmul`, and the decode loop's `decode_loop`, `readback_every`,
`compile_decode`, `cuda_graphs` (device_loop.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridflow.engines.precision import resolve_dtype
from hybridflow.engines.rollout.gemm import resolve_matmul
from hybridflow.engines.rollout.sampling import LOG_PROB_MODES
from hybridflow.engines.rollout.settings import checked_decode_loop
from hybridflow.errors import ConfigError


@dataclass(frozen=True)
class RolloutConfig:
    """Engine-wide settings (per-request settings live in SamplingParams)."""

    # torch dtype, or "auto" / "bf16" / "fp32" (engines/precision.py): "auto" is bf16 on GPUs
    # and, on CPUs, the faster of the two in a cached matmul probe. A torch.dtype after construction.
    dtype: torch.dtype | str = "auto"
    device: str = "cpu"
    max_num_seqs: int = 256  # sequences decoded at once (native: KV-cache slots)
    max_model_len: int | None = None  # prompt + response cap; None: config.max_position_embeddings
    keep_kv_cache: bool = False  # keep the cache between generate calls instead of freeing it
    log_prob_mode: str = "scaled"
    # padded tokens per prefill forward (bounds activations); longer prompts go in pieces of this size
    prefill_token_budget: int = 8192
    pad_token_id: int | None = None  # None: the model config's pad id
    seed: int = 0
    # "native": torch's GEMM in `dtype`; "fp32_panels": bf16 weights multiplied by fp32 sgemm
    # one converted panel at a time, for CPUs without native bf16; "auto": the latter exactly
    # there (see gemm.py). A concrete mode after construction.
    matmul: str = "auto"
    # "host": every token read back, finished rows leave at once (the faster on CPUs:
    # benchmarks/engines/results/rollout_decode_loop.json); "device": fixed-shape steps with sampling
    # and stop ids on the device, state read back every `readback_every` steps
    # (device_loop.py); "auto": "device" on GPUs, "host" on CPUs. Concrete after construction.
    decode_loop: str = "auto"
    readback_every: int = 8
    compile_decode: bool = False  # device loop: torch.compile the decode step
    # device loop on CUDA: replay each (batch bucket, KV length) step as a captured CUDA
    # graph; keeps the KV cache between calls (until release_memory). Off until measured on a GPU.
    cuda_graphs: bool = False
    # model.trust_remote_code: whether transformers may run the model directory's own code
    # (a backend that builds a transformers model from the config passes it on)
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        device_type = torch.device(self.device).type
        if isinstance(self.dtype, str):
            object.__setattr__(self, "dtype", resolve_dtype(self.dtype, device_type))
        if self.log_prob_mode not in LOG_PROB_MODES:
            raise ConfigError(f"must be one of {LOG_PROB_MODES}, got {self.log_prob_mode!r}", "log_prob_mode")
        object.__setattr__(self, "matmul", resolve_matmul(self.matmul, self.dtype, device_type))
        if self.max_num_seqs < 1 or self.prefill_token_budget < 1:
            raise ValueError("max_num_seqs and prefill_token_budget must be >= 1")
        loop = checked_decode_loop(self.decode_loop, device_type, compile_decode=self.compile_decode,
                                   cuda_graphs=self.cuda_graphs)
        object.__setattr__(self, "decode_loop", loop)
        if self.readback_every < 1:
            raise ConfigError(f"must be >= 1, got {self.readback_every}", "readback_every")

