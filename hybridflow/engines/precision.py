"""Compute dtype selection: bf16 where the hardware runs it fast, fp32 where it does not.

bf16 compute with fp32 master weights is the right choice on GPUs and on CPUs with native
bf16 dot products (AVX512_BF16 or AMX). On a CPU without them torch emulates bf16 matmul
and it runs about 4x *slower* than fp32 (measured on the Xeon these tests run on: 16 vs
62 GFLOP/s for 1024^3), so "auto" picks fp32 there.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # imported in resolve_dtype: the config check reads DTYPE_NAMES before torch is imported
    import torch

DtypeName = Literal["auto", "bf16", "fp32"]
DTYPE_NAMES: tuple[str, ...] = ("auto", "bf16", "fp32")
_FAST_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.lru_cache(maxsize=1)
def cpu_has_fast_bf16() -> bool:
    """True when /proc/cpuinfo lists a native bf16 dot-product instruction."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: no way to tell cheaply, stay on the safe (fp32) side
        return False
    return any(flag in flags for flag in _FAST_BF16_CPU_FLAGS)


def resolve_dtype(name: str, device_type: str) -> torch.dtype:
    """The compute dtype for config value `name` on a `device_type` ("cpu" or "cuda")."""
    import torch

    if name not in DTYPE_NAMES:
        raise ValueError(f"dtype must be one of {DTYPE_NAMES}, got {name!r}")
    if name == "bf16":
        return torch.bfloat16
    if name == "fp32":
        return torch.float32
    fast_bf16 = device_type == "cuda" or (device_type == "cpu" and cpu_has_fast_bf16())
    return torch.bfloat16 if fast_bf16 else torch.float32
