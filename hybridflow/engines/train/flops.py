"""FLOP estimates and the device's peak rate, for tokens/s and MFU metrics.

Training FLOPs of one sequence of s tokens through a decoder with N matmul parameters
(every parameter except the input embedding table, which is a lookup), L layers and
hidden size d (Kaplan et al. 2020; Chowdhery et al. 2022, appendix B):

    forward + backward = 6 N s + 12 L d s^2
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

import torch
from torch import nn

# Dense bf16 tensor-core peak per GPU (vendor data sheets, no sparsity).
_GPU_PEAK_BF16 = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10": 125e12,
}


def matmul_parameter_count(model: nn.Module) -> int:
    """N of the module docstring: all parameters but input-embedding tables (full, unsharded sizes)."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    total = 0
    for p in model.parameters():
        if id(p) not in embeddings:
            total += p.numel()
    # A tied lm_head shares the embedding weight but is a real matmul.
    lm_head = getattr(model, "lm_head", None)
    if lm_head is not None and id(lm_head.weight) in embeddings:
        total += lm_head.weight.numel()
    return total


def training_flops(n_params: int, n_layers: int, hidden: int, seq_lens: Sequence[int]) -> float:
    """Forward + backward FLOPs for sequences of the given (valid) lengths."""
    tokens = sum(seq_lens)
    squares = sum(s * s for s in seq_lens)
    return 6.0 * n_params * tokens + 12.0 * n_layers * hidden * squares


def measure_matmul_flops(dtype: torch.dtype, size: int = 2048, seconds: float = 0.5) -> float:
    """Achieved FLOP/s of square `size` matmuls in `dtype` on the current device (the ceiling)."""
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)
    torch.matmul(a, b, out=out)  # warm-up: kernel selection, page faults
    _sync(device)
    iters, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        torch.matmul(a, b, out=out)
        iters += 1
        _sync(device)
    elapsed = time.perf_counter() - start
    return 2.0 * size**3 * iters / elapsed


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@lru_cache(maxsize=4)
def peak_flops(dtype: torch.dtype) -> float:
    """Peak FLOP/s per device: a known-GPU table, else a short matmul measurement (cached)."""
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        for key, value in _GPU_PEAK_BF16.items():
            if key in name:
                # fp32 matmuls run as TF32 on these GPUs: half the bf16 rate.
                return value if dtype == torch.bfloat16 else value / 2
    return measure_matmul_flops(dtype, size=1024, seconds=0.2)


@dataclass(frozen=True)
class FlopFacts:
    """What one rank reports for the MFU estimate: its model's N (matmul parameters, full
    unsharded size), L and d, and the peak FLOP/s of its device in the model's compute
    dtype (the configured peak_flops_per_device, else measured in the rank's own process)."""

    matmul_params: int
    layers: int
    hidden: int
    peak_flops: float

    def training_flops(self, seq_lens: Sequence[int]) -> float:
        """Forward + backward FLOPs of this model over sequences of the given lengths."""
        return training_flops(self.matmul_params, self.layers, self.hidden, seq_lens)


class _FlopSource(Protocol):
    # What a training engine offers (engine.py); a protocol keeps this module below it.
    def flops_config(self) -> tuple[int, int, int]: ...

    def peak_flops(self) -> float: ...


def engine_flop_facts(engine: _FlopSource) -> FlopFacts:
    """The FlopFacts of an engine in this process (the peak is measured here on first use,
    then cached for the process: the engine's own update metrics divide by the same one)."""
    params, layers, hidden = engine.flops_config()
    return FlopFacts(params, layers, hidden, engine.peak_flops())
