"""Worker processes keep the memory they free (glibc malloc), so a step's activations reuse
pages instead of asking the kernel for fresh, zeroed ones every time.

glibc serves blocks above its mmap threshold (128 KiB at start, raised as such blocks are
freed) with their own mmap, unmapped on free, and gives the top of its heap back to the
kernel once more than its trim threshold is free. A training step frees and re-allocates
activations of tens of MB in sizes that change with every batch, so the heuristics keep
missing and the kernel zeroes new pages for most of them: on the SmolLM2 GRPO step
(benchmarks/rl/bench_vs_trl.py smollm2_32, 1 rank x 2 threads) the worker spent 19.8 CPU s
in the kernel over 5 steps. With the threshold fixed at its 64-bit maximum (32 MiB) and
trimming at 2 GiB it spent 11.6 s, and the steps ran ~8 % faster; RSS stays near the
step's peak (4.3 GB instead of 3.5 GB there; TRL's process peaks at 10 GB on the same
work). Blocks above 32 MiB are still mapped and unmapped by glibc.

Only CPU ranks set them (controller/host.py): a GPU rank's activations live on the
device, and its host memory (offload, pinned buffers) is better given back. The same
settings as environment variables, for a process that starts with them (bench_vs_trl.py
gives them to TRL's runs too): `env_settings()`.
"""

from __future__ import annotations

import ctypes
import platform

M_TRIM_THRESHOLD = -1  # mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2**20  # glibc's upper bound on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int: give memory back only above ~2 GiB free


def is_glibc() -> bool:
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def keep_freed_memory() -> bool:
    """Set this process's glibc mmap and trim thresholds (module docstring); False where
    the C library is not glibc (nothing changes there)."""
    if not is_glibc():
        return False
    libc = ctypes.CDLL("libc.so.6")
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def env_settings() -> dict[str, str]:
    """The same thresholds as glibc's environment variables (read when a process starts)."""
    return {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD)}
