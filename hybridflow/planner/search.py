"""The placement search (HybridFlow paper, Algorithm 1 in spirit): `search(problem)`."""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from hybridflow.planner.cost import Parallel, phase_cost
from hybridflow.planner.problem import Problem
from hybridflow.planner.simulate import (
    CONTROLLER,
    USABLE_MEMORY,
    Infeasible,
    Mapping,
    Pool,
    add_phase,
    columns,
    combine,
    memory_reason,
    role_phases,
    role_profile,
    simulate,
)


@dataclass
class Candidate:
    """One role unit's configuration on a pool size: its time vector (simulate.py: the
    stages, then the overlapped blocks) and memory."""

    parallel: dict[str, Parallel]
    stages: tuple[float, ...]
    memories: dict


@dataclass
class PlanResult:
    mappings: list[Mapping]
    rejected: dict[str, int] = field(default_factory=dict)  # reason -> how many mappings it removed
    placements: int = 0
    evaluated: int = 0
    seconds: float = 0.0


def set_partitions(items: list[str]) -> Iterator[list[list[str]]]:
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        yield [[first], *part]
        for i in range(len(part)):
            yield [*part[:i], [first, *part[i]], *part[i + 1:]]


def placements(problem: Problem) -> list[list[tuple[str, ...]]]:
    """Partitions of the roles the runtime allows, roles in problem order inside each pool."""
    roles = list(problem.roles)
    order = {r: i for i, r in enumerate(roles)}
    out = []
    for part in set_partitions(roles):
        block = {r: i for i, b in enumerate(part) for r in b}
        if all(len({block[r] for r in group if r in block}) <= 1 for group in problem.caps.together):
            out.append(sorted((tuple(sorted(b, key=order.get)) for b in part), key=lambda b: order[b[0]]))
    return out


def pool_sizes(total: int, per_node: int) -> list[int]:
    return [s for s in range(1, total + 1) if (s < per_node and s & (s - 1) == 0) or s % per_node == 0]


def splits(total: int, pools: int, sizes: list[int]) -> Iterator[tuple[int, ...]]:
    if pools == 1:
        if total in sizes:
            yield (total,)
        return
    for s in sizes:
        if s < total:
            for rest in splits(total - s, pools - 1, sizes):
                yield (s, *rest)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def parallel_options(problem: Problem, role: str, n: int) -> list[Parallel]:
    """Valid parallel sizes of `role` on `n` devices (engine and batch divisibility rules)."""
    load, work, per_node = problem.roles[role], problem.workload, problem.cluster.devices_per_node
    shape = load.shape
    heads_ok = lambda t: shape.heads % t == 0 and shape.kv_heads % t == 0  # noqa: E731
    out = []
    for tp in _divisors(n):
        if tp > per_node or not heads_ok(tp):
            continue
        for pp in _divisors(n // tp) if problem.caps.pipeline else [1]:
            if shape.layers % pp:
                continue
            dp = n // (tp * pp)
            if work.sequences % dp or (load.trainable and load.mini_batch % dp):
                continue
            if role != "actor":
                out.append(Parallel(dp, tp, pp))
                continue
            for t_g in _divisors(n):
                if t_g <= per_node and heads_ok(t_g) and work.prompts % (n // t_g) == 0:
                    out.append(Parallel(dp, tp, pp, t_g))
    return out


class Search:
    """Caches of step 3 and 4 for one problem (module docstring)."""

    def __init__(self, problem: Problem, top: int = 1) -> None:
        self.problem = problem
        self.top = top
        self.limit = problem.cluster.device.memory_bytes * USABLE_MEMORY
        self.owner = dict(problem.caps.shares_engine)
        self.rejected: dict[str, int] = {}
        self._units: dict[tuple[str, int], list[Candidate]] = {}
        self._fronts: dict[tuple[tuple[str, ...], int], list[Candidate]] = {}

    def reject(self, reason: str, count: int = 1) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + count

    def units(self, role: str, n: int) -> list[Candidate]:
        """Candidates of `role` (with the roles that share its engine) on n devices."""
        key = (role, n)
        if key not in self._units:
            shared = [r for r, o in self.owner.items() if o == role and r in self.problem.roles]
            cands = []
            for par in parallel_options(self.problem, role, n):
                pars = {role: par, **{r: Parallel(par.dp, par.tp, par.pp) for r in shared}}
                stages = [0.0] * columns(self.problem)
                memories = {}
                for r, p in pars.items():
                    costs, memories[r] = role_profile(self.problem, r, p)
                    for phase in role_phases(self.problem, r):
                        add_phase(stages, self.problem, phase, costs[phase.name].seconds)
                reason = memory_reason(Pool(tuple(pars), n), memories, self.limit)
                if reason:
                    self.reject(f"{role} {par.label()}: {reason}")
                    continue
                cands.append(Candidate(pars, tuple(stages), memories))
            self._units[key] = _pareto(cands, with_memory=True)
        return self._units[key]

    def front(self, roles: tuple[str, ...], n: int) -> list[Candidate]:
        """Pareto front of the pool's feasible combinations."""
        key = (roles, n)
        if key not in self._fronts:
            units = [r for r in roles if r not in self.owner]
            combos = []
            for choice in itertools.product(*(self.units(r, n) for r in units)):
                memories = {r: m for c in choice for r, m in c.memories.items()}
                reason = memory_reason(Pool(roles, n), memories, self.limit)
                if reason:
                    self.reject(reason)
                    continue
                pars = {r: p for c in choice for r, p in c.parallel.items()}
                stages = tuple(sum(c.stages[i] for c in choice) for i in range(columns(self.problem)))
                combos.append(Candidate(pars, stages, memories))
            # Only the pools' sum matters where nothing overlaps: then the front is its best.
            overlaps = self.problem.caps.overlap or bool(self.problem.overlapped_blocks)
            front = _pareto(combos, with_memory=False, overlap=overlaps)
            # Runners-up for the top-K list: the K fastest combinations by their own total too.
            extra = [c for c in sorted(combos, key=lambda c: sum(c.stages))[:self.top] if c not in front]
            self._fronts[key] = front + extra
        return self._fronts[key]

    def controller_stages(self) -> list[float]:
        stages = [0.0] * columns(self.problem)
        for phase in role_phases(self.problem, CONTROLLER):
            add_phase(stages, self.problem, phase,
                      phase_cost(phase, None, None, self.problem.workload, self.problem.cluster).seconds)
        return stages


def _dominates(a: Candidate, b: Candidate, with_memory: bool) -> bool:
    if any(x > y for x, y in zip(a.stages, b.stages)):
        return False
    if with_memory:
        for r in a.memories:
            if a.memories[r].resident > b.memories[r].resident or \
                    a.memories[r].peak_transient > b.memories[r].peak_transient:
                return False
    return True


def _pareto(cands: list[Candidate], *, with_memory: bool, overlap: bool = True) -> list[Candidate]:
    if not overlap and not with_memory:
        return sorted(cands, key=lambda c: sum(c.stages))[:1]
    cands = sorted(cands, key=lambda c: sum(c.stages))
    kept: list[Candidate] = []
    for c in cands:
        if not any(_dominates(k, c, with_memory) for k in kept):
            kept.append(c)
    return kept


def search(problem: Problem, top: int = 5, only: list[tuple[str, ...]] | None = None) -> PlanResult:
    """The best `top` mappings of `problem`, fastest first, each simulated (module docstring);
    `only`: search this one placement (pools as role tuples) instead of all."""
    start = time.perf_counter()
    s = Search(problem, top)
    total, per_node = problem.cluster.devices, problem.cluster.devices_per_node
    sizes = pool_sizes(total, per_node)
    ctrl = s.controller_stages()
    per_step = problem.cluster.efficiency.per_step_s
    best: list[tuple[float, int, Mapping]] = []  # max-heap by -step_s
    tie = itertools.count()
    result = PlanResult([])
    wanted = None if only is None else sorted(tuple(b) for b in only)
    for blocks in placements(problem):
        if wanted is not None and sorted(blocks) != wanted:
            continue
        result.placements += 1
        for split in splits(total, len(blocks), sizes):
            fronts = [s.front(b, n) for b, n in zip(blocks, split)]
            if any(not f for f in fronts):
                s.reject(f"placement {' | '.join('+'.join(b) for b in blocks)} on {split}: a pool has no mapping "
                         "that fits (see the pool's reasons)")
                continue
            for choice in itertools.product(*fronts):
                result.evaluated += 1
                step = combine([*(c.stages for c in choice), ctrl], problem.caps.overlap)[0] + per_step
                if len(best) == top and step >= -best[0][0]:
                    continue
                pars = {r: p for c in choice for r, p in c.parallel.items()}
                m = Mapping(tuple(Pool(b, n) for b, n in zip(blocks, split)), pars)
                heapq.heappush(best, (-step, next(tie), m))
                if len(best) > top:
                    heapq.heappop(best)
    mappings = []
    for _, _, m in sorted(best, key=lambda x: -x[0]):
        try:
            mappings.append(simulate(problem, m))
        except Infeasible as err:  # cannot happen: the search checked the same memory
            raise AssertionError(f"search kept an infeasible mapping: {err}") from err
    result.mappings = mappings
    result.rejected = s.rejected
    result.seconds = time.perf_counter() - start
    return result


def brute_force(problem: Problem) -> Mapping | None:
    """The fastest feasible mapping by simulating every combination (tests; small cases)."""
    best = None
    total, sizes = problem.cluster.devices, pool_sizes(problem.cluster.devices, problem.cluster.devices_per_node)
    owner = dict(problem.caps.shares_engine)
    for blocks in placements(problem):
        for split in splits(total, len(blocks), sizes):
            where = {r: n for b, n in zip(blocks, split) for r in b}
            free = [r for r in problem.roles if r not in owner]
            for pars in itertools.product(*(parallel_options(problem, r, where[r]) for r in free)):
                par = dict(zip(free, pars))
                for r, o in owner.items():
                    if r in problem.roles:
                        p = par[o]
                        par[r] = Parallel(p.dp, p.tp, p.pp)
                try:
                    m = simulate(problem, Mapping(tuple(Pool(b, n) for b, n in zip(blocks, split)), par))
                except Infeasible:
                    continue
                if best is None or m.step_s < best.step_s - 1e-12:
                    best = m
    return best
