"""Worker processes keep the memory they free (glibc malloc), so a step's activations reuse
pages instead of asking the kernel for fresh, zeroed ones every time.
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
