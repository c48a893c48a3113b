"""How the OpenMP threads of a run's processes wait at a barrier (resources.omp_wait_policy).

torch's intra-op threads on Linux are GNU libgomp's. At the end of every parallel region
a thread that finishes first spins (~300000 turns by default) before it sleeps. On an
idle machine that saves a wake-up; when another job shares the cores, the thread a
spinner waits for is often descheduled, and the spinner burns its own process's share
of the CPU doing nothing until its time slice ends. Measured with one competing 2-thread
matmul job on 2 cores (benchmarks/bench_contention.py; README "Shared machine"): a
training step 3.7-4.2x slower with the default wait and 1.5-2.0x with passive waiting
(threads sleep at once), where a fair share of the cores is 2x; quiet, the two were
within the noise of each other (2 of 16 idle cores, benchmarks/results/contention_probe_h100_host.json).
On the tiny GRPO workload (many small parallel regions) passive was slower alone (0.255-0.317 s vs
0.174-0.233 s per step); a short spin of 1000 turns (the default, short_spin) was 0.212 s alone
and 0.387 s beside the job, passive 0.391 s (results/contention_grpo_spin1000.json); a later
quiet A/B of two rounds found no quiet cost for either and passive better beside the job (2.17x
vs 2.67x, results/contention_grpo_quiet_stop30.json): which default is right is still open.

libgomp reads OMP_WAIT_POLICY / GOMP_SPINCOUNT once, when a process loads it (torch's
import), so the policy travels as environment: `export_policy` puts it in the
controller's environment before Ray and the reward pool start (their processes inherit
it), and `worker_env` is what every worker actor gets in its runtime environment (for a
joined cluster or a Ray started earlier, whose processes did not inherit it). The
controller's own torch is loaded by then; it computes little while its workers run.
"""

from __future__ import annotations

import os

POLICIES = ("short_spin", "passive", "inherit")
SHORT_SPIN = 1000  # turns; beside a job 2.67x vs passive 2.17x in a later quiet A/B (contention_grpo_quiet_stop30.json)
VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
# What the environment held before any run of this process changed it ("inherit" restores it).
_STARTING_ENV = {name: os.environ.get(name) for name in VARIABLES}


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


def describe(policy: str) -> str:
    """The line a run prints at its start."""
    if policy == "short_spin":
        return f"OpenMP threads: short spin ({SHORT_SPIN} turns) then sleep at barriers (resources.omp_wait_policy)"
    if policy == "passive":
        return "OpenMP threads: passive wait (sleep at barriers; resources.omp_wait_policy)"
    env = ", ".join(f"{k}={v}" for k, v in policy_env(policy).items()) or "the OpenMP runtime's default"
    return f"OpenMP threads: inherited wait ({env}; resources.omp_wait_policy)"
