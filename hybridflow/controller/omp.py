"""How the OpenMP threads of a run's processes wait at a barrier (resources.omp_wait_policy)."""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POLICIES = ("auto", "short_spin", "passive", "inherit")
SHORT_SPIN = 1000  # turns; beside a job 2.67x vs passive 2.17x in a later quiet A/B (contention_grpo_quiet_stop30.json)
VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
# What the environment held before any run of this process changed it ("inherit" restores it).
_STARTING_ENV = {name: os.environ.get(name) for name in VARIABLES}


AUTO_SAMPLE_S = 0.3  # how long "auto" watches the cores before the run starts
AUTO_BUSY_CORES = 0.5  # other work on at least this many cores: the machine is shared
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # /proc/stat: user nice system irq softirq steal (not idle, iowait)


@dataclass(frozen=True)
class AutoChoice:
    """What "auto" chose and what it saw: other work's busy cores (None: not measurable
    here); `threads`: the torch threads per rank it gave a shared machine's run (None: the
    usual cores / ranks)."""

    policy: str
    busy_cores: float | None
    cores: int
    threads: int | None = None

    @property
    def reason(self) -> str:
        if self.busy_cores is None:
            return "auto: the cores' load is not readable here (no /proc/stat), so the runtime's spin"
        seen = f"other work kept {self.busy_cores:.1f} of {self.cores} cores busy at the start"
        if self.policy != "passive":
            return f"auto: {seen}, so the runtime spin"
        threads = "" if self.threads is None else \
            f" and {self.threads} torch thread{'s' if self.threads > 1 else ''} per rank (the cores left free)"
        return f"auto: {seen}, so passive{threads}"

    def free_core_threads(self, world_size: int) -> int:
        """Torch threads per rank that fit the cores other work left free (at least 1)."""
        free = self.cores - (self.busy_cores or 0.0)
        return max(1, min(self.cores // world_size, int(free / world_size + 0.5)))


def _cpu_times(cpus: set[int]) -> tuple[float, float] | None:
    """(busy, total) jiffies of `cpus` from /proc/stat; None where it cannot be read."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    busy = total = 0.0
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            values = [float(v) for v in fields[:8]]
            busy += sum(values[i] for i in _BUSY_FIELDS)
            total += sum(values)
    return (busy, total) if total else None


def busy_cores(seconds: float = AUTO_SAMPLE_S) -> tuple[float | None, int]:
    """Cores kept busy by other work over `seconds` (this process sleeps meanwhile), among
    the cores this process may run on, and their number. (None, n) where not measurable."""
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    before = _cpu_times(cpus)
    time.sleep(seconds)
    after = _cpu_times(cpus)
    if before is None or after is None or after[1] <= before[1]:
        return None, len(cpus)
    share = (after[0] - before[0]) / (after[1] - before[1])
    return round(share * len(cpus), 2), len(cpus)


def choose_auto(measure=busy_cores) -> AutoChoice:
    """passive where other work already shares the cores, else inherit (module docstring)."""
    busy, cores = measure()
    shared = busy is not None and busy >= AUTO_BUSY_CORES
    return AutoChoice("passive" if shared else "inherit", busy, cores)


_last_auto: AutoChoice | None = None  # what `resolve` chose for "auto" in this process


def resolve(policy: str, measure=None) -> str:
    """The policy a run uses for config value `policy`: "auto" measured (`choose_auto`) at
    the first run this process starts and kept for its later ones, so that runs of one
    script (or test session) compare at the same thread count; any other as it is.
    `measure` replaces `busy_cores` (tests), always measuring."""
    global _last_auto
    if policy != "auto":
        return policy
    if measure is not None or _last_auto is None:
        _last_auto = choose_auto(measure or busy_cores)
    return _last_auto.policy


def resolve_for_load(asked: Any, resolved: Any) -> Any:
    """`resolved` (the resources section with world size and threads filled in from
    `asked`) with omp_wait_policy resolved; when "auto" found the machine shared and
    `asked` left threads_per_rank to the run on an embedded CPU Ray, the threads are cut to
    the cores other work leaves free: beside one competing 2-thread job, the demo's SFT
    step took 0.19-0.21 s on 1 thread and 0.30-0.34 s on 2 passive ones (0.09 s alone;
    bench_contention.py, in git history at 01a3bd7). Both choices are in `last_auto()`."""
    global _last_auto
    policy = resolve(asked.omp_wait_policy)
    threads = resolved.threads_per_rank
    adapt = (asked.omp_wait_policy == "auto" and policy == "passive" and asked.threads_per_rank is None
             and not asked.use_gpu and asked.ray_address is None)
    if adapt and _last_auto is not None:
        threads = _last_auto.free_core_threads(resolved.world_size)
        if threads != resolved.threads_per_rank:
            _last_auto = dataclasses.replace(_last_auto, threads=threads)
    return dataclasses.replace(resolved, omp_wait_policy=policy, threads_per_rank=threads)


def last_auto() -> AutoChoice | None:
    """The choice `resolve("auto")` made in this process (None: none yet)."""
    return _last_auto


def policy_env(policy: str) -> dict[str, str]:
    """The variables `policy` sets: short_spin spins SHORT_SPIN turns, then sleeps (libgomp
    prefers GOMP_SPINCOUNT to OMP_WAIT_POLICY); passive sleeps at once (GOMP_SPINCOUNT 0
    too); inherit keeps what the environment had."""
    if policy == "short_spin":
        return {"GOMP_SPINCOUNT": str(SHORT_SPIN)}
    if policy == "passive":
        return {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0"}
    if policy == "inherit":
        return {name: value for name, value in _STARTING_ENV.items() if value is not None}
    raise ValueError(f"unknown OpenMP wait policy {policy!r}; choose from {list(POLICIES)}")


def export_policy(policy: str) -> None:
    """Set this process's environment for `policy`, so processes it starts from now on
    (an embedded Ray and its workers, the reward pool) load OpenMP with it."""
    wanted = policy_env(policy)
    for name in VARIABLES:
        if name in wanted:
            os.environ[name] = wanted[name]
        else:
            os.environ.pop(name, None)


def worker_env() -> dict[str, str]:
    """The OpenMP wait variables of this process's environment, for a worker's runtime env."""
    return {name: os.environ[name] for name in VARIABLES if name in os.environ}


def describe(policy: str, auto: AutoChoice | None = None) -> str:
    """The line a run prints at its start (`auto`: why "auto" chose `policy`)."""
    if auto is not None:
        return f"{describe(policy)} ({auto.reason})"
    if policy == "short_spin":
        return f"OpenMP threads: short spin ({SHORT_SPIN} turns) then sleep at barriers (resources.omp_wait_policy)"
    if policy == "passive":
        return "OpenMP threads: passive wait (sleep at barriers; resources.omp_wait_policy)"
    env = ", ".join(f"{k}={v}" for k, v in policy_env(policy).items()) or "the OpenMP runtime's default"
    return f"OpenMP threads: inherited wait ({env}; resources.omp_wait_policy)"
