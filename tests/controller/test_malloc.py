"""controller/malloc.py: a worker process keeps what it frees (glibc), checked in fresh
processes through glibc's own accounting (mallinfo2: bytes free inside the heap)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hybridflow.controller.malloc import MMAP_THRESHOLD, env_settings, is_glibc

pytestmark = pytest.mark.skipif(not is_glibc(), reason="the settings are glibc's")

# Allocate and free a 16 MiB block in a fresh process; print the bytes glibc keeps free in
# its heap afterwards (fordblks). By default glibc maps a block that large on its own and
# unmaps it on free (nothing kept); with the settings it comes from the heap and stays.
PROBE = """
import ctypes, sys
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "keep":
    from hybridflow.controller.malloc import keep_freed_memory
    assert keep_freed_memory()
block = libc.malloc(16 << 20)
ctypes.memset(block, 1, 16 << 20)
libc.free(block)
print(libc.mallinfo2().fordblks)
"""


def _free_bytes_after(mode: str, env: dict[str, str] | None = None) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True,
                         env=env)
    return int(out.stdout.strip())


def test_freed_block_stays_in_the_process_with_the_settings_only():
    assert _free_bytes_after("default") < 16 << 20
    assert _free_bytes_after("keep") >= 16 << 20


def test_env_settings_match_what_the_workers_set():
    import os

    assert env_settings()["MALLOC_MMAP_THRESHOLD_"] == str(MMAP_THRESHOLD)
    assert _free_bytes_after("default", {**os.environ, **env_settings()}) >= 16 << 20
