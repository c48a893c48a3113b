"""Placing roles on resource pools: colocated by default, split on request.

    roles = {"actor": RoleSpec(ActorRolloutRefWorker, (actor_cfg,)),
             "critic": RoleSpec(CriticWorker, (critic_cfg,))}
    groups = build_role_groups(roles, PlacementSpec.colocated([8]))      # one pool, shared processes
    groups = build_role_groups(roles, PlacementSpec(
        pools={"actor_pool": [4], "critic_pool": [4]},
        mapping={"actor": "actor_pool", "critic": "critic_pool"}))       # split placement
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hybridflow.controller import ResourcePool, RoleSpec, WorkerGroup, create_colocated_worker_groups

DEFAULT_POOL = "global_pool"


@dataclass(frozen=True)
class PlacementSpec:
    """Named resource pools and which role runs on which (verl: resource_pool_spec + mapping).

    pools: pool name -> slots per node (one entry per node, as in `ResourcePool`).
    mapping: role -> pool name. May be empty when there is exactly one pool: every role
        then runs on it. Otherwise every role must be mapped, and every pool used.
    use_gpu / cpus_per_slot: what one slot is (a GPU, or a share of CPUs).
    parts_of: None, or the slots per node of one reservation that the pools cut into
        consecutive parts, in pool order (`ResourcePool.split`): split placement's actor
        ranks fill the first nodes and the critic's the next ones. Separate pools would each
        take the first node with room, and on a cluster put both roles on the head node.
    """

    pools: Mapping[str, Sequence[int]]
    mapping: Mapping[str, str] = field(default_factory=dict)
    use_gpu: bool = False
    cpus_per_slot: float = 1.0
    parts_of: Sequence[int] | None = None

    def __post_init__(self) -> None:
        if not self.pools:
            raise ValueError("PlacementSpec.pools is empty; name at least one pool, e.g. {'global_pool': [8]}")
        for name, counts in self.pools.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"pool names must be non-empty strings, got {name!r}")
            if not counts or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in counts):
                raise ValueError(f"pool {name!r}: slots per node must be a non-empty list of ints >= 1, got {counts!r}")
        unknown = sorted({p for p in self.mapping.values() if p not in self.pools})
        if unknown:
            raise ValueError(f"PlacementSpec.mapping names pools {unknown} that are not in pools {sorted(self.pools)}")
        if not self.cpus_per_slot > 0:
            raise ValueError(f"PlacementSpec.cpus_per_slot must be > 0, got {self.cpus_per_slot}")
        if self.parts_of is not None and sum(self.parts_of) != sum(sum(c) for c in self.pools.values()):
            raise ValueError(f"PlacementSpec.parts_of {list(self.parts_of)} must hold exactly the pools' slots "
                             f"{dict(self.pools)}")

    @classmethod
    def colocated(cls, process_on_nodes: Sequence[int], *, use_gpu: bool = False,
                  cpus_per_slot: float = 1.0) -> PlacementSpec:
        """Every role on one pool of ``process_on_nodes`` slots."""
        return cls(pools={DEFAULT_POOL: list(process_on_nodes)}, use_gpu=use_gpu, cpus_per_slot=cpus_per_slot)

    def assign(self, roles: Sequence[str]) -> dict[str, list[str]]:
        """pool name -> the roles it hosts (in role order); checks every role and pool is placed."""
        if not roles:
            raise ValueError("build_role_groups needs at least one role")
        if not self.mapping and len(self.pools) == 1:
            return {next(iter(self.pools)): list(roles)}
        unmapped = [r for r in roles if r not in self.mapping]
        if unmapped:
            raise ValueError(f"roles {unmapped} have no pool in PlacementSpec.mapping (pools: {sorted(self.pools)})")
        extra = sorted(set(self.mapping) - set(roles))
        if extra:
            raise ValueError(f"PlacementSpec.mapping places roles {extra} that were not given")
        by_pool: dict[str, list[str]] = {}
        for role in roles:
            by_pool.setdefault(self.mapping[role], []).append(role)
        idle = sorted(set(self.pools) - set(by_pool))
        if idle:
            raise ValueError(f"pools {idle} host no role; remove them or map a role onto them")
        return by_pool


def build_role_groups(roles: Mapping[str, RoleSpec], placement: PlacementSpec) -> dict[str, WorkerGroup]:
    """One `WorkerGroup` per role, colocated per pool as ``placement`` says (see module docstring).

    The workers are constructed but not initialised: call ``init_model()`` on each group.
    """
    by_pool = placement.assign(list(roles))
    pools = _pools(placement)
    groups: dict[str, WorkerGroup] = {}
    try:
        for pool_name, names in by_pool.items():
            pool = pools[pool_name]
            try:
                groups.update(create_colocated_worker_groups(pool, {name: roles[name] for name in names}))
            except BaseException:
                pool.release()
                raise
    except BaseException:
        shutdown_role_groups(groups)
        raise
    return {name: groups[name] for name in roles}


def _pools(placement: PlacementSpec) -> dict[str, ResourcePool]:
    """The resource pool of each pool name (parts of one reservation with `parts_of`)."""
    def pool(counts: Sequence[int]) -> ResourcePool:
        return ResourcePool(list(counts), use_gpu=placement.use_gpu, max_colocate_count=1,
                            cpus_per_slot=placement.cpus_per_slot)

    if placement.parts_of is None:
        return {name: pool(counts) for name, counts in placement.pools.items()}
    parts = pool(placement.parts_of).split([sum(counts) for counts in placement.pools.values()])
    return dict(zip(placement.pools, parts))


def shutdown_role_groups(groups: Mapping[str, WorkerGroup]) -> None:
    """Stop every group's processes and free their pools' reservations (idempotent)."""
    pools = {id(g.resource_pool): g.resource_pool for g in groups.values()}
    for group in groups.values():
        group.shutdown()
    for pool in pools.values():
        pool.release()
