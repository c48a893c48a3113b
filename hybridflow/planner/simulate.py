"""Play one RL step of a mapping: predicted step time, its phase breakdown, peak memory."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hybridflow.config.dataflow import FlowPhase
from hybridflow.planner.cost import Parallel, PhaseCost, phase_cost
from hybridflow.planner.memory import RoleMemory, role_memory
from hybridflow.planner.problem import Problem

USABLE_MEMORY = 0.9  # of a device's memory: allocator fragmentation, runtime context
CONTROLLER = "controller"
STAGES = 3  # generation, scoring, updates (FlowPhase.stage)
_GIB = 2**30


@dataclass(frozen=True)
class Pool:
    roles: tuple[str, ...]
    devices: int


@dataclass
class Mapping:
    """Pools (roles and device counts) and each model role's parallel sizes, with the
    prediction of `simulate` once it ran."""

    pools: tuple[Pool, ...]
    parallel: dict[str, Parallel]
    step_s: float = float("nan")
    phase_s: dict[str, float] = field(default_factory=dict)
    # Parts of phases the workers time on their own (timing_s/reshard_to_generation and
    # generate inside gen, update_<role>_in_worker): a phase less its call overhead.
    within_s: dict[str, float] = field(default_factory=dict)
    # The step's parts (`combine`): the three stages, then each overlapped block (Problem.overlapped_blocks).
    stage_s: list[float] = field(default_factory=list)
    peak_bytes: list[float] = field(default_factory=list)
    tokens_per_s: float = 0.0

    def placement(self) -> str:
        if len(self.pools) == 1:
            return "colocated"
        return " | ".join("+".join(p.roles) for p in self.pools)

    def to_dict(self) -> dict[str, Any]:
        return {"placement": self.placement(),
                "pools": [{"roles": list(p.roles), "devices": p.devices, "peak_gib": round(b / _GIB, 3)}
                          for p, b in zip(self.pools, self.peak_bytes)],
                "parallel": {r: {"dp": q.dp, "tp": q.tp, "pp": q.pp, **({"gen_tp": q.gen_tp} if q.gen_tp else {})}
                             for r, q in self.parallel.items()},
                "step_s": self.step_s, "tokens_per_s": self.tokens_per_s,
                "phase_s": self.phase_s, "within_s": self.within_s, "stage_s": self.stage_s}


class Infeasible(ValueError):
    """A mapping that does not fit; the message says where and by how much."""


def pool_of(mapping: Mapping) -> dict[str, int]:
    return {role: i for i, pool in enumerate(mapping.pools) for role in pool.roles}


def role_phases(problem: Problem, role: str) -> list:
    return [p for p in problem.phases if p.role == role]


def role_profile(problem: Problem, role: str, par: Parallel) -> tuple[dict[str, PhaseCost], RoleMemory]:
    """Costs of the role's phases and its memory on `par` (what search and simulate share)."""
    load = problem.roles[role]
    phases = role_phases(problem, role)
    costs = {p.name: phase_cost(p, load, par, problem.workload, problem.cluster, busy_devices(problem, p))
             for p in phases}
    return costs, role_memory(load, par, problem.workload, phases)


def worker_parts(phase: FlowPhase, cost: PhaseCost, call_s: float) -> dict[str, float]:
    """What the workers time inside `phase` (hybridflow/workers/actor_rollout_ref.py,
    trainer/observe/metrics.py): generation's reshard and sampling, an update without its call."""
    if phase.kind == "generate":
        reshard = cost.parts["reshard_s"]
        return {"reshard_to_generation": reshard, "generate": cost.seconds - reshard - call_s}
    if phase.kind == "train":
        return {f"{phase.name}_in_worker": cost.seconds - call_s}
    return {}


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def memory_reason(pool: Pool, memories: dict[str, RoleMemory], limit: float) -> str | None:
    """Why the pool does not fit (None: it fits)."""
    resident = sum(m.resident for m in memories.values())
    worst_role, worst = max(((r, m.peak_transient) for r, m in memories.items()), key=lambda x: x[1])
    peak = resident + worst
    if peak <= limit:
        return None
    phase = max(memories[worst_role].transient, key=memories[worst_role].transient.get, default="-")
    parts = ", ".join(f"{r} resident {fmt_bytes(m.resident)}" for r, m in memories.items())
    return (f"pool {'+'.join(pool.roles)} on {pool.devices} devices: peak {fmt_bytes(peak)} > "
            f"{fmt_bytes(limit)} usable at {worst_role}/{phase} (+{fmt_bytes(worst)}; {parts})")


def columns(problem: Problem) -> int:
    """Entries of a pool's time vector: the stages, then the overlapped blocks."""
    return STAGES + len(problem.overlapped_blocks)


def busy_devices(problem: Problem, phase: FlowPhase) -> int:
    """Devices computing while `phase` runs, where more than its own pool's: in an
    overlapped block the other pools' phases of the block run beside it, so it is costed
    with the share of a node whose devices all compute (cost.shared: 1 on GPUs; on a CPU
    the measured share, corrected by share_scale only where its own group shares the
    node). An upper bound where the other pools' share of the block ends first. 0: its
    own pool's."""
    return problem.cluster.devices_per_node if phase.block in problem.overlapped_blocks else 0


def add_phase(times: list[float], problem: Problem, phase: FlowPhase, seconds: float) -> None:
    """Add `phase`'s seconds to its pool's time vector `times` (module docstring): to its
    stage, or, in an overlapped block, to the block's entry."""
    blocks = problem.overlapped_blocks
    if phase.block is None or phase.block not in blocks:
        times[phase.stage] += seconds
    else:
        times[STAGES + blocks.index(phase.block)] += seconds


def combine(by_pool: list[list[float]], overlap: bool) -> tuple[float, list[float]]:
    """Step time from the pools' time vectors (module docstring rules): each stage summed
    over the pools (with `overlap`, its busiest pool), each block its busiest pool."""
    entries = list(zip(*by_pool))
    parts = [max(e) if overlap else sum(e) for e in entries[:STAGES]] + [max(e) for e in entries[STAGES:]]
    return sum(parts), parts


def simulate(problem: Problem, mapping: Mapping) -> Mapping:
    """Fill `mapping`'s prediction; raises Infeasible (with the reason) if it does not fit."""
    where = pool_of(mapping)
    limit = problem.cluster.device.memory_bytes * USABLE_MEMORY
    stage_by_pool = [[0.0] * columns(problem) for _ in range(len(mapping.pools) + 1)]  # last: controller
    phase_s: dict[str, float] = {}
    within: dict[str, float] = {}
    memories: list[dict[str, RoleMemory]] = [{} for _ in mapping.pools]
    for role in problem.roles:
        costs, mem = role_profile(problem, role, mapping.parallel[role])
        memories[where[role]][role] = mem
        for phase in role_phases(problem, role):
            add_phase(stage_by_pool[where[role]], problem, phase, costs[phase.name].seconds)
            phase_s[phase.name] = phase_s.get(phase.name, 0.0) + costs[phase.name].seconds
            for name, seconds in worker_parts(phase, costs[phase.name], problem.cluster.efficiency.call_s).items():
                within[name] = within.get(name, 0.0) + seconds
    for phase in role_phases(problem, CONTROLLER):
        cost = phase_cost(phase, None, None, problem.workload, problem.cluster)
        add_phase(stage_by_pool[-1], problem, phase, cost.seconds)
        phase_s[phase.name] = phase_s.get(phase.name, 0.0) + cost.seconds
    for pool, mems in zip(mapping.pools, memories):
        reason = memory_reason(pool, mems, limit)
        if reason:
            raise Infeasible(reason)
    step_s, mapping.stage_s = combine(stage_by_pool, problem.caps.overlap)
    mapping.step_s = step_s + problem.cluster.efficiency.per_step_s
    mapping.phase_s, mapping.within_s = phase_s, within
    mapping.peak_bytes = [sum(m.resident for m in mems.values()) + max(m.peak_transient for m in mems.values())
                          for mems in memories]
    work = problem.workload
    mapping.tokens_per_s = work.sequences * work.seq_len / mapping.step_s
    return mapping
