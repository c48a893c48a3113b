"""Colocation: several roles in one set of processes.

``create_colocated_worker_groups(pool, {"actor": RoleSpec(Actor), "critic":
RoleSpec(Critic)})`` spawns one process per slot, builds every role in every process and
returns one `WorkerGroup` per role. The roles share devices and the torch.distributed
group; calls to them run one after another in each process. Shutting down any of the
returned groups stops the shared processes.

Split placement is the other arrangement: create each role's group on its own pool.
"""

from __future__ import annotations

from collections.abc import Mapping

from hybridflow.controller.host import RoleSpec
from hybridflow.controller.local_group import InProcess
from hybridflow.controller.resource_pool import ResourcePool
from hybridflow.controller.worker_group import HostSet, WorkerGroup


def create_colocated_worker_groups(resource_pool: ResourcePool | InProcess,
                                   roles: Mapping[str, RoleSpec]) -> dict[str, WorkerGroup]:
    """One `WorkerGroup` per role, all backed by the same processes."""
    for name, spec in roles.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"role names must be identifiers like 'actor' or 'critic', got {name!r}")
        if not isinstance(spec, RoleSpec):
            raise TypeError(f"role {name!r}: expected a RoleSpec(cls, args, kwargs), got {type(spec).__name__}")
    hosts = HostSet.spawn(resource_pool, roles)
    return {name: WorkerGroup._from_hosts(hosts, name, spec.cls) for name, spec in roles.items()}
