"""`WorkerGroup`: one Ray actor per slot of a pool, driven like a single object.

``WorkerGroup(pool, MyWorker, *args, **kwargs)`` starts one process per slot, builds
``MyWorker(*args, **kwargs)`` in each (rank, world size and rendezvous address set), and
binds every ``@register`` method: ``wg.method(batch)`` splits ``batch`` as the method's
dispatch mode says, runs the method on the ranks and collects the results. A
non-blocking method returns a `CallFuture` at once; it can be passed straight into another
group's call.
"""

from __future__ import annotations

import dataclasses
import functools
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from hybridflow.controller.decorator import MethodSpec, registered_methods
from hybridflow.controller.dispatch import DispatchContext, Split, check_mesh
from hybridflow.controller.errors import DispatchError
from hybridflow.controller.faults import fault_runtime_env
from hybridflow.controller import network
from hybridflow.controller.omp import worker_env
from hybridflow.controller.tracing import flush_traces
from hybridflow.controller.futures import CallFuture, DataProtoFuture, RankInfo, gather
from hybridflow.controller.host import RoleSpec, WorkerHost
from hybridflow.controller.local_group import InProcess, InProcessHosts
from hybridflow.controller.resource_pool import ResourcePool
from hybridflow.controller.worker import MeshCoord

_HostActor = ray.remote(WorkerHost)
# How long rank 0's process may take to start (scheduling + imports) before spawning
# fails with an error instead of waiting forever (e.g. for resources that never free up).
START_TIMEOUT_S = 600.0


def _runtime_env() -> dict[str, Any]:
    """Actor options with the environment a worker process needs from the controller: the
    fault and trace hooks (faults.py), the OpenMP wait policy (omp.py), which a worker's
    torch reads when it loads, and a network interface the run chose (network.py)."""
    env = {**fault_runtime_env().get("runtime_env", {}).get("env_vars", {}), **worker_env(), **network.worker_env()}
    return {"runtime_env": {"env_vars": env}} if env else {}


class HostSet:
    """The processes of a group (shared by colocated roles) and where they run."""

    def __init__(self, pool: ResourcePool | None, actors: list[Any], infos: list[dict[str, Any]]) -> None:
        self.pool = pool  # None in a copy sent to another process (WorkerGroup.__reduce__)
        self.actors = actors
        self.infos = infos
        self.alive = True
        self._last: dict[int, ray.ObjectRef] = {}  # per rank: the token of the newest call submitted (`submit`)

    in_process = False

    @classmethod
    def spawn(cls, pool: ResourcePool | InProcess, roles: Mapping[str, RoleSpec]) -> HostSet | InProcessHosts:
        """Start one host per slot, rendezvous, then build every role on every rank (the
        in-process placement: build them here)."""
        if not roles:
            raise ValueError("a worker group needs at least one role")
        if isinstance(pool, InProcess):
            return InProcessHosts(roles)
        slots = pool.claim()
        local = _local_ranks([s.node_id for s in slots])
        options = pool.actor_options()
        group = uuid.uuid4().hex[:12]
        actors = [
            _HostActor.options(
                num_cpus=options["num_cpus"], num_gpus=options["num_gpus"], max_restarts=0, max_task_retries=0,
                name=host_name("+".join(roles), rank, group), **_runtime_env(),
                scheduling_strategy=PlacementGroupSchedulingStrategy(slot.placement_group, slot.bundle_index),
            ).remote(rank, len(slots), local[rank][0], local[rank][1], options["num_cpus"])
            for rank, slot in enumerate(slots)
        ]
        hosts = cls(pool, actors, [{"pid": None, "ip": slot.node_ip, "node_id": slot.node_id} for slot in slots])
        try:
            first = next(iter(roles))
            addr, port = gather([actors[0].rendezvous_address.remote()], hosts.owners(first)[:1], "rendezvous",
                                timeout_s=START_TIMEOUT_S)[0]
            hosts.infos = gather([a.setup.remote(addr, port) for a in actors], hosts.owners(first), "setup")
            for role, spec in roles.items():
                gather([a.build_role.remote(role, spec) for a in actors], hosts.owners(role),
                       f"{role}.__init__ ({spec.cls.__qualname__})")
        except BaseException:
            hosts.kill()
            raise
        return hosts

    def submit(self, role: str, method: str, ranks: list[int],
               per_rank: list[tuple[tuple, dict]]) -> list[ray.ObjectRef]:
        """Run ``role.method`` on `ranks` (one (args, kwargs) each); the value refs, by rank.

        A process runs its calls one after another, in the order they were submitted. A
        call submitted while the one before it on the same process is still in flight is
        held back inside Ray until the controller holds that call's result: it waits for
        the earlier call's token (its second return, a top-level argument, which Ray resolves
        on the submitting side first). Otherwise the process could finish call A, start call
        B and die in B before A's reply reached the controller; Ray then fails A's ref too
        (its reply is lost with the process), and a block of concurrent calls could not tell
        which call the process died in (futures.gather names the earliest failed call). A
        call that raised passes its error on to the call held behind it, which then does
        not run; a call whose predecessor's result is already in is not held at all."""
        tokens = {rank: self._last[rank] for rank in ranks if rank in self._last}
        _, in_flight = ray.wait(list(tokens.values()), num_returns=len(tokens), timeout=0,
                                fetch_local=False) if tokens else ([], [])
        held = set(in_flight)
        refs = []
        for rank, (args, kwargs) in zip(ranks, per_rank):
            after = tokens[rank] if tokens.get(rank) in held else None
            value, self._last[rank] = self.actors[rank].execute.remote(role, method, after, *args, **kwargs)
            refs.append(value)
        return refs

    def owners(self, role: str) -> list[RankInfo]:
        return [RankInfo(role, rank, info["ip"], info["pid"]) for rank, info in enumerate(self.infos)]

    def kill(self) -> None:
        if self.pool is None:
            raise RuntimeError("a copy of a worker group in another process cannot shut it down; its owner does")
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        if self.alive:
            self.pool.unclaim()
        self.alive = False


# Ray actor names of the hosts: what `hybridflow monitor --address` reads roles and ranks from.
HOST_NAME_PREFIX = "hybridflow"


def host_name(roles: str, rank: int, group: str) -> str:
    """The Ray actor name of a group's rank: hybridflow:<roles joined by +>:<rank>:<group id>."""
    return f"{HOST_NAME_PREFIX}:{roles}:{rank}:{group}"


def _local_ranks(node_ids: list[str]) -> list[tuple[int, int]]:
    """(local rank, local world size) of every rank: its position among ranks on its node."""
    seen: dict[str, int] = {}
    positions = []
    for node in node_ids:
        positions.append(seen.get(node, 0))
        seen[node] = positions[-1] + 1
    return [(pos, seen[node]) for pos, node in zip(positions, node_ids)]


class WorkerGroup:
    """``world_size`` ranks of one role; registered methods are bound as attributes."""

    def __init__(self, resource_pool: ResourcePool | InProcess, worker_cls: type, *args: Any, **kwargs: Any) -> None:
        role = worker_cls.__name__
        hosts = HostSet.spawn(resource_pool, {role: RoleSpec(worker_cls, args, kwargs)})
        self._attach(hosts, role, worker_cls)

    @classmethod
    def _from_hosts(cls, hosts: HostSet | InProcessHosts, role: str, worker_cls: type) -> WorkerGroup:
        group = cls.__new__(cls)
        group._attach(hosts, role, worker_cls)
        return group

    def _attach(self, hosts: HostSet | InProcessHosts, role: str, worker_cls: type) -> None:
        self._hosts = hosts
        self.role = role
        self.worker_cls = worker_cls
        self.call_timeout_s: float | None = None
        self._meshes: dict[str, tuple[MeshCoord, ...]] = {}
        for name, spec in registered_methods(worker_cls).items():
            if hasattr(type(self), name) or name in self.__dict__:
                raise ValueError(f"{worker_cls.__qualname__}.{name} is registered but clashes with "
                                 f"WorkerGroup.{name}; rename the worker method")
            setattr(self, name, self._bind(name, spec, getattr(worker_cls, name)))

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled (to call the group from a Ray task, trainer/modes/stream_step.py): the same
        processes, without the pool, so that only the owner shuts them down."""
        if self._hosts.in_process:
            raise TypeError(f"{self!r} runs in the controller's process and cannot be sent to another one")
        hosts = HostSet(None, self._hosts.actors, self._hosts.infos)
        return _copy_of_group, (hosts, self.role, self.worker_cls, self.call_timeout_s, self._meshes)

    def __repr__(self) -> str:
        state = "" if self._hosts.alive else ", shut down"
        where = ", in process" if self._hosts.in_process else ""
        return f"WorkerGroup({self.role}, world_size={self.world_size}{where}{state})"

    @property
    def world_size(self) -> int:
        return len(self._hosts.infos)

    @property
    def resource_pool(self) -> ResourcePool | InProcess:
        return self._hosts.pool

    @property
    def workers(self) -> list[Any]:
        """The Ray actor handles, by rank (shared with colocated roles); in process, the worker itself."""
        if self._hosts.in_process:
            return [self._hosts.roles[self.role]]
        return list(self._hosts.actors)

    @property
    def worker_info(self) -> list[dict[str, Any]]:
        """Per rank: process id, node IP and Ray node id."""
        return [dict(info, rank=rank) for rank, info in enumerate(self._hosts.infos)]

    def dp_parts(self, method: str) -> int:
        """Into how many data-parallel parts a call of `method` cuts its DataProto arguments
        (contiguous, in dp-rank order): the mesh's dp size, or the world size."""
        spec = registered_methods(self.worker_cls).get(method)
        if spec is None or not spec.dispatch.proto_parts:
            raise ValueError(f"{self.role}.{method} is not a registered method that splits DataProtos by "
                             "data-parallel rank (DP_COMPUTE_PROTO or MESH dispatch)")
        if spec.dispatch.mesh is None:
            return self.world_size
        return self._mesh(spec.dispatch.mesh, f"{self.role}.{method}")[0].dp_size

    def shutdown(self) -> None:
        """Kill the group's processes (those of colocated roles too). Idempotent."""
        if self._hosts.alive:
            if not self._hosts.in_process:
                flush_traces(self._hosts.actors)  # only while `hybridflow monitor --trace` asks (tracing.py)
            self._hosts.kill()

    # -------------------------------------------------------------------------- calls

    def submit(self, method: str, *args: Any, **kwargs: Any) -> CallFuture:
        """Call registered `method` without waiting, whether or not it is registered as
        blocking: its future goes on into other calls (or `get()`)."""
        spec = registered_methods(self.worker_cls).get(method)
        if spec is None:
            raise ValueError(f"{self.role}.{method} is not a registered method of {self.worker_cls.__qualname__}")
        return self._call(method, dataclasses.replace(spec, blocking=False), args, kwargs)

    def _bind(self, name: str, spec: MethodSpec, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            return self._call(name, spec, args, kwargs)

        functools.update_wrapper(call, fn)  # keeps the worker method's name and docstring
        return call

    def _call(self, method: str, spec: MethodSpec, args: tuple, kwargs: dict) -> Any:
        label = f"{self.role}.{method}"
        if not self._hosts.alive:
            raise RuntimeError(f"{label}: the worker group was shut down")
        if self._hosts.in_process:
            return self._hosts.call(self.role, method, spec, args, kwargs)
        targets = [0] if spec.rank_zero else list(range(self.world_size))
        mode = spec.dispatch
        mesh = self._mesh(mode.mesh, label) if mode.mesh is not None else None
        ctx = DispatchContext(label=label, mode=mode.name, world_size=len(targets), mesh=mesh)
        split = _normalize(mode.split(ctx, args, kwargs), ctx)
        refs = self._hosts.submit(self.role, method, targets, split.per_rank)
        selected = mode.select(ctx) if mode.select is not None else list(range(len(targets)))
        owners = self._hosts.owners(self.role)
        future_cls = DataProtoFuture if mode.proto_parts else CallFuture
        future = future_cls(method=label, mode=mode, ctx=ctx, refs=refs, owners=[owners[r] for r in targets],
                            selected=selected, pad_size=split.pad_size, timeout_s=self.call_timeout_s)
        return future.get() if spec.blocking else future

    def _mesh(self, name: str, label: str) -> tuple[MeshCoord, ...]:
        # Coordinates do not change after the workers registered them: ask once per mesh.
        if name not in self._meshes and self._hosts.in_process:
            self._meshes[name] = check_mesh(label, name, list(self._hosts.mesh(self.role, name)))
        if name not in self._meshes:
            coords = gather([actor.mesh.remote(self.role, name) for actor in self._hosts.actors],
                            self._hosts.owners(self.role), f"{label} (mesh {name!r} lookup)", self.call_timeout_s)
            self._meshes[name] = check_mesh(label, name, coords)
        return self._meshes[name]


def _copy_of_group(hosts: HostSet, role: str, worker_cls: type, call_timeout_s: float | None,
                   meshes: dict[str, tuple[MeshCoord, ...]]) -> WorkerGroup:
    group = WorkerGroup._from_hosts(hosts, role, worker_cls)
    group.call_timeout_s, group._meshes = call_timeout_s, dict(meshes)
    return group


def _normalize(split: Split | list, ctx: DispatchContext) -> Split:
    """Accept a plain per-rank list from custom modes; check one entry per rank."""
    if not isinstance(split, Split):
        split = Split(list(split))
    if len(split.per_rank) != ctx.world_size:
        raise DispatchError(f"{ctx.label} ({ctx.mode}): the split produced {len(split.per_rank)} argument sets "
                            f"for {ctx.world_size} ranks")
    for entry in split.per_rank:
        if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], tuple)
                and isinstance(entry[1], dict)):
            raise DispatchError(f"{ctx.label} ({ctx.mode}): a split must give (args tuple, kwargs dict) per rank, "
                                f"got {type(entry).__name__}")
    return split
