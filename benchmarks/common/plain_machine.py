"""The machine description of a benchmark's JSON, with no hybridflow import.

Scripts that must share no code with hybridflow (benchmarks/rl/eval_plain.py, the
independent evaluator) describe the machine with this; the fields follow the other
benchmarks' `machine()` (platform, CPU model and flags, cores, memory, versions, load).

    from benchmarks.common.plain_machine import machine, load_average
    record = {"machine": machine(), ...}
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


def load_average() -> list[float]:
    """The 1-, 5- and 15-minute load averages, rounded (the machine is shared: every
    measurement says how busy it was)."""
    return [round(x, 2) for x in os.getloadavg()]


def cpu_model_and_flags() -> tuple[str, list[str]]:
    """The CPU's model name and feature flags from /proc/cpuinfo (platform's guess elsewhere)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
        flags = next(line.split(":", 1)[1].split() for line in lines if line.startswith("flags"))
        return cpu, flags
    except (OSError, StopIteration):
        return platform.processor(), []


def machine() -> dict[str, Any]:
    """Platform, CPU, cores, memory, the torch / transformers versions and the load now."""
    import torch
    import transformers

    cpu, flags = cpu_model_and_flags()
    memory_gib = None
    try:
        memory_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        pass
    return {
        "platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count(), "memory_gib": memory_gib,
        "avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags,
        "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "load_avg_1_5_15": load_average(),
    }
