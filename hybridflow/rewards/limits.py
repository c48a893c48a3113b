"""The limits and confinement of reward worker processes, from `reward.manager.*`.

    limits = worker_limits(config, compute_score)     # -> ScoringPool(..., limits=limits)
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import os
import site
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hybridflow
from hybridflow.rewards._worker import WorkerLimits
from hybridflow.rewards.config import RewardConfig

AUTO_MEMORY_SHARE = 0.25  # of the machine's memory, for all reward workers together
AUTO_MEMORY_MIN_MB, AUTO_MEMORY_MAX_MB = 1024, 8192
# Machine facts libraries read at import (torch: cpuinfo; BLAS: the CPU topology); nothing private.
SYSTEM_READABLE = ("/usr", "/lib", "/lib64", "/etc/localtime", "/dev/null", "/dev/urandom", "/proc/cpuinfo",
                   "/sys/devices/system/cpu")
# What a reward worker's environment keeps of the controller's: how text, paths, time and
# thread pools behave; nothing that authenticates (reward.manager.env_passthrough adds names).
ENV_ALLOWED = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "PYTHONPATH", "PYTHONHASHSEED",
               "PYTHONIOENCODING", "PYTHONUTF8", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
               "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")
ENV_ALLOWED_PREFIXES = ("LC_",)


def machine_memory_mb(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """The memory this process may use: the machine's, or less where a container's cgroup
    limits it (a job in a 24 GiB container on a 512 GiB host has 24)."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return min([physical, *cgroup_memory_limits(cgroup_root)]) // 2**20


def cgroup_memory_limits(root: Path) -> list[int]:
    """The memory limits in bytes set on this process's cgroup (v2 `memory.max`, v1
    `memory/memory.limit_in_bytes`); none when unlimited or unreadable."""
    limits = []
    for file in (root / "memory.max", root / "memory" / "memory.limit_in_bytes"):
        try:
            text = file.read_text().strip()
        except OSError:
            continue
        if text.isdigit():  # "max" (v2) is no limit; v1 writes no limit as a huge number, which min() drops
            limits.append(int(text))
    return limits


def auto_memory_limit_mb(num_workers: int, machine_mb: int | None = None) -> int:
    """Each worker's share of AUTO_MEMORY_SHARE of the machine, clamped to [1, 8] GiB."""
    machine_mb = machine_memory_mb() if machine_mb is None else machine_mb
    share = int(machine_mb * AUTO_MEMORY_SHARE) // max(1, num_workers)
    return max(AUTO_MEMORY_MIN_MB, min(AUTO_MEMORY_MAX_MB, share))


def resolved_limits(config: RewardConfig) -> RewardConfig:
    """`config` with memory_limit_mb and cpu_time_s "auto" replaced by what they stand for on this machine."""
    memory = auto_memory_limit_mb(config.num_workers) if config.memory_limit_mb == "auto" else config.memory_limit_mb
    cpu = math.ceil(config.timeout_s) if config.cpu_time_s == "auto" else config.cpu_time_s
    return dataclasses.replace(config, memory_limit_mb=memory, cpu_time_s=cpu)


def worker_limits(config: RewardConfig, fn: Callable[..., Any]) -> WorkerLimits:
    config = resolved_limits(config)
    memory, cpu = config.memory_limit_mb, config.cpu_time_s
    return WorkerLimits(
        memory_bytes=None if memory is None else int(memory) * 2**20,
        cpu_s=cpu,
        file_bytes=None if config.file_size_limit_mb is None else config.file_size_limit_mb * 2**20,
        sandbox=config.sandbox,
        readable=tuple(readable_paths(fn, config.readable_paths)) if config.sandbox else (),
        allow_subprocess=config.allow_subprocess,
        environment=tuple(sorted(worker_environment(config.env_passthrough).items())),
    )


def worker_environment(passthrough: list[str], environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables a reward worker gets: those of `environ` (default: this process's) in
    ENV_ALLOWED or starting with ENV_ALLOWED_PREFIXES, and those named in `passthrough`."""
    environ = dict(os.environ if environ is None else environ)
    return {k: v for k, v in environ.items()
            if k in ENV_ALLOWED or k.startswith(ENV_ALLOWED_PREFIXES) or k in passthrough}


def readable_paths(fn: Callable[..., Any], extra: list[str]) -> list[str]:
    """What a confined worker may read (module docstring)."""
    trees = {sys.prefix, sys.base_prefix, *site.getsitepackages(), str(Path(hybridflow.__file__).parent),
             *SYSTEM_READABLE, *(str(Path(p).resolve()) for p in extra)}
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        trees.add(site.getusersitepackages())
    trees.update(str(Path(f).parent) for f in source_files(fn))
    return sorted(trees)


def source_files(obj: Any, depth: int = 3) -> set[str]:
    """The files the reward callable `obj` is defined in: a file-loaded function's path, a
    function's module file, and those of the callables a wrapper holds (templates, the
    built-in dispatch), `depth` levels deep."""
    files: set[str] = set()
    path = getattr(obj, "path", None)  # FileRewardFn
    if isinstance(path, (str, Path)) and str(path).endswith(".py"):
        files.add(str(Path(path).resolve()))
    target = inspect.unwrap(obj) if callable(obj) else obj
    if isinstance(target, functools.partial):
        return files | source_files(target.func, depth)
    if inspect.isfunction(target) or inspect.ismethod(target):
        file = inspect.getsourcefile(target)
        if file:
            files.add(str(Path(file).resolve()))
    elif depth > 0 and hasattr(target, "__dict__"):
        module = sys.modules.get(type(target).__module__)
        if module is not None and getattr(module, "__file__", None):
            files.add(str(Path(module.__file__).resolve()))
        for value in vars(target).values():
            items = (value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple))
                     else [value])
            for item in items:
                if callable(item):
                    files |= source_files(item, depth - 1)
    return files
