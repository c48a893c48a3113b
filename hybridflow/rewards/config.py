"""`RewardConfig`: the reward manager's settings (`reward.manager.*`), torch-free so that
the run config is validated before torch is imported; manager.py re-exports it.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from hybridflow.errors import ConfigError


@dataclasses.dataclass
class RewardConfig:
    """How rewards are computed.

    num_workers: worker processes (0 = score in this process, for debugging).
    timeout_s: per-sample limit; the function is interrupted after it.
    kill_grace_s: extra time before a worker that ignores the interruption is killed (by
        the parent, from outside: a function that blocks the alarm cannot escape it).
    error_score: reward of a sample whose function failed or timed out.
    mp_context: "forkserver" (fast worker start) or "spawn".
    memory_limit_mb: address-space limit of each worker process (RLIMIT_AS); a sample that
        allocates past it fails with MemoryError instead of exhausting the machine.
        "auto": a quarter of the machine's (or container's) memory shared by the workers, 1 to 8
        GiB each (rewards/limits.py); null: no limit. Not applied in-process (num_workers 0),
        nor are the three below.
    cpu_time_s: CPU seconds a sample may use (RLIMIT_CPU, moved before each sample); "auto":
        timeout_s rounded up; null: no limit.
    file_size_limit_mb: the largest file a worker may write (RLIMIT_FSIZE); null: no limit.
    sandbox: confine the workers (rewards/_worker.py): read-only access to the Python
        installation, the hybridflow package, the reward function's own directory and
        `readable_paths`; no writing, no network, no programs. false: unconfined, for a
        reward that must call a service (a reward-model server, a sandbox API) or write
        files; the time, CPU, memory and file-size limits stay.
    readable_paths: more files or directories the confined workers may read (a data set
        the reward function looks answers up in).
    allow_subprocess: let the reward function start processes (fork, subprocess,
        multiprocessing; with the sandbox still no program can be run). false (default): a
        seccomp filter refuses them, root included. true: they run in a PID namespace of the
        worker's, killed with the worker (and so with the run), a `setsid` one included.
    env_passthrough: names of environment variables the workers get besides the locale,
        path and thread-count ones (rewards/limits.py ENV_ALLOWED); every other variable of
        the controller (API keys: WANDB_API_KEY, HF_TOKEN, ...) is withheld.
    max_failed_share / max_failed_steps: the run stops with an error naming the first
        failure after `max_failed_steps` scoring calls in a row (training steps or held-out
        evaluations) in which more than `max_failed_share` of the samples failed (raised,
        timed out, killed their worker). A reward function that always fails then stops
        the run instead of training on error_score. max_failed_steps 0: never stop.
    """

    num_workers: int = 2
    timeout_s: float = 10.0
    kill_grace_s: float = 2.0
    error_score: float = 0.0
    mp_context: str = "forkserver"
    memory_limit_mb: int | Literal["auto"] | None = "auto"
    cpu_time_s: int | Literal["auto"] | None = "auto"
    file_size_limit_mb: int | None = 64
    sandbox: bool = True
    readable_paths: list[str] = dataclasses.field(default_factory=list)
    allow_subprocess: bool = False
    env_passthrough: list[str] = dataclasses.field(default_factory=list)
    max_failed_share: float = 0.5
    max_failed_steps: int = 3

    def __post_init__(self) -> None:
        if self.num_workers < 0:
            raise ConfigError(f"must be >= 0 (0 = in-process), got {self.num_workers}", "num_workers")
        if self.timeout_s <= 0:
            raise ConfigError(f"must be > 0, got {self.timeout_s}", "timeout_s")
        if self.kill_grace_s < 0:
            raise ConfigError(f"must be >= 0, got {self.kill_grace_s}", "kill_grace_s")
        if self.mp_context not in ("forkserver", "spawn"):
            raise ConfigError(f"must be 'forkserver' or 'spawn', got {self.mp_context!r}", "mp_context")
        if self.memory_limit_mb not in (None, "auto") and self.memory_limit_mb < 64:
            raise ConfigError(f"must be >= 64 (a Python process needs that much), auto or null, "
                              f"got {self.memory_limit_mb}", "memory_limit_mb")
        if self.cpu_time_s not in (None, "auto") and self.cpu_time_s < 1:
            raise ConfigError(f"must be >= 1 (whole CPU seconds), auto or null, got {self.cpu_time_s}", "cpu_time_s")
        if self.file_size_limit_mb is not None and self.file_size_limit_mb < 0:
            raise ConfigError(f"must be >= 0 or null, got {self.file_size_limit_mb}", "file_size_limit_mb")
        if not 0.0 <= self.max_failed_share < 1.0:
            raise ConfigError(f"must be in [0, 1), got {self.max_failed_share}", "max_failed_share")
        bad = [name for name in self.env_passthrough if not isinstance(name, str) or not name or "=" in name]
        if bad:
            raise ConfigError(f"must list environment variable names, got {bad}", "env_passthrough")
        if self.max_failed_steps < 0:
            raise ConfigError(f"must be >= 0 (0 = never stop), got {self.max_failed_steps}", "max_failed_steps")
