"""The process behind each rank: a Ray actor that hosts one or more role instances.

Every slot of a worker group runs one `WorkerHost` actor. The controller first asks rank 0
for a rendezvous address, then tells every host its place (exported as the
torch.distributed environment variables), then builds each role's `Worker` instance in
it. Colocated roles are several instances in the same host: they share the process, its
torch.distributed group and its devices, and since a Ray actor runs one call at a time,
their calls run one after another.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any

import ray

from hybridflow.controller.faults import FaultInjector
from hybridflow.controller.malloc import keep_freed_memory
from hybridflow.controller.network import bind_collectives
from hybridflow.controller.tracing import TraceRecorder
from hybridflow.controller.worker import MeshCoord, Worker, WorkerContext


@dataclass(frozen=True)
class RoleSpec:
    """A role to build in every process of a group: ``cls(*args, **kwargs)``."""

    cls: type
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (isinstance(self.cls, type) and issubclass(self.cls, Worker)):
            raise TypeError(f"RoleSpec: {self.cls!r} is not a subclass of hybridflow.controller.Worker")


class WorkerHost:
    """Body of the per-slot Ray actor (created by `WorkerGroup`, never by users)."""

    def __init__(self, rank: int, world_size: int, local_rank: int, local_world_size: int, cpus: float) -> None:
        self._place = (rank, world_size, local_rank, local_world_size)
        self._cpus = cpus
        self._master: tuple[str, int] | None = None
        self._roles: dict[str, Worker] = {}
        self._faults = FaultInjector(rank)  # off unless HYBRIDFLOW_FAULT is set (faults.py)
        self._traces = TraceRecorder(rank)  # off unless the controller names a request file (tracing.py)

    def __repr__(self) -> str:
        # Ray prints this in worker log prefixes and task errors.
        rank, world_size, _, _ = self._place
        return f"WorkerHost(rank {rank}/{world_size}, roles {sorted(self._roles)})"

    def rendezvous_address(self) -> tuple[str, int]:
        """This node's IP and a port that is free now (asked of rank 0 only)."""
        ip = ray.util.get_node_ip_address()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((ip, 0))
            return ip, sock.getsockname()[1]

    def setup(self, master_addr: str, master_port: int) -> dict[str, Any]:
        """Export the rank's environment before any role is built; return where it runs."""
        self._master = (master_addr, master_port)
        os.environ.update(self._context("").env())
        ip = ray.util.get_node_ip_address()
        # Before any process group: gloo / nccl bind the interface of the node's Ray IP, not
        # the hostname's address (network.py).
        network = bind_collectives(ip)
        threads = max(1, int(self._cpus))
        # Ray sets OMP_NUM_THREADS from the actor's CPU share; torch would otherwise start
        # one thread per core in every rank and oversubscribe the node.
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        import torch

        torch.set_num_threads(threads)
        if not ray.get_gpu_ids():  # CPU ranks: reuse freed pages, not fresh zeroed ones every step (malloc.py)
            keep_freed_memory()
        return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(), "ip": ip,
                "interface": network.interface, "network": network.describe()}

    def build_role(self, role: str, spec: RoleSpec) -> None:
        """Instantiate ``spec.cls`` for ``role`` with its context set before ``__init__``."""
        instance = spec.cls.__new__(spec.cls)
        instance._hf_ctx = self._context(role)
        instance.__init__(*spec.args, **spec.kwargs)
        self._roles[role] = instance

    @ray.method(num_returns=2)
    def execute(self, role: str, method: str, after: None, /, *args: Any, **kwargs: Any) -> tuple[Any, None]:
        """Run ``role.method``; ObjectRef arguments were already resolved by Ray. Returns the
        value and a token (None) that a later call on this process may wait for (`after`:
        the token of the call before it, already resolved; see HostSet.submit)."""
        self._faults.before_call(role, method)
        with self._traces.call(role, method):
            return getattr(self._roles[role], method)(*args, **kwargs), None

    def flush_trace(self) -> None:
        """Write the torch profiler trace being recorded, if any (tracing.py)."""
        self._traces.finish()

    def mesh(self, role: str, name: str) -> MeshCoord | None:
        """The coordinates ``role`` registered for mesh ``name`` on this rank."""
        return self._roles[role].dispatch_mesh(name)

    def _context(self, role: str) -> WorkerContext:
        assert self._master is not None, "setup() runs before any role is built"
        rank, world_size, local_rank, local_world_size = self._place
        return WorkerContext(role=role, rank=rank, world_size=world_size, local_rank=local_rank,
                             local_world_size=local_world_size, master_addr=self._master[0],
                             master_port=self._master[1])
