"""In-process placement: a `WorkerGroup` whose one rank runs in the controller's own process.

    group = WorkerGroup(IN_PROCESS, LearnerWorker, spec)    # no Ray, no placement group
    group.init_model(); weights = group.get_weights().get()  # the calls of every WorkerGroup
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from hybridflow.controller.decorator import MethodSpec
from hybridflow.controller.dispatch import DispatchContext, split_per_rank
from hybridflow.controller.host import RoleSpec
from hybridflow.controller.worker import MeshCoord, Worker, WorkerContext


class InProcess:
    """The placement of a one-rank group in the controller's process (`IN_PROCESS`)."""

    in_process = True
    world_size = 1

    def __repr__(self) -> str:
        return "IN_PROCESS"

    def release(self) -> None:
        """Nothing reserved, nothing to free (a ResourcePool's release)."""


IN_PROCESS = InProcess()


class ReadyFuture:
    """The result of a non-blocking call on an in-process group: already computed."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def get(self, timeout_s: float | None = None) -> Any:
        return self.value

    def done(self) -> bool:
        return True


class InProcessHosts:
    """The host set of an in-process group: every role's rank 0 of 1, built here."""

    in_process = True
    pool = IN_PROCESS

    def __init__(self, roles: Mapping[str, RoleSpec]) -> None:
        self.roles: dict[str, Worker] = {}
        self.infos = [{"pid": os.getpid(), "node_id": None, "ip": "127.0.0.1"}]
        self.alive = True
        for role, spec in roles.items():
            worker = spec.cls.__new__(spec.cls)
            worker._hf_ctx = WorkerContext(role=role, rank=0, world_size=1, local_rank=0, local_world_size=1,
                                           master_addr="127.0.0.1", master_port=0)
            worker.__init__(*spec.args, **spec.kwargs)
            self.roles[role] = worker

    def call(self, role: str, method: str, spec: MethodSpec, args: tuple, kwargs: dict) -> Any:
        """Run ``role.method`` as a one-rank group would (module docstring)."""
        per_rank = spec.dispatch.split is split_per_rank  # arguments are lists, one entry per rank
        args = tuple(_value(a[0] if per_rank else a) for a in args)
        kwargs = {k: _value(v[0] if per_rank else v) for k, v in kwargs.items()}
        out = getattr(self.roles[role], method)(*args, **kwargs)
        ctx = DispatchContext(label=f"{role}.{method}", mode=spec.dispatch.name, world_size=1)
        result = out if spec.rank_zero else spec.dispatch.collect(ctx, [out])
        return result if spec.blocking else ReadyFuture(result)

    def mesh(self, role: str, name: str) -> tuple[MeshCoord | None, ...]:
        return (self.roles[role].dispatch_mesh(name),)

    def kill(self) -> None:
        """Drop the workers (their state goes with them)."""
        self.alive = False


def _value(arg: Any) -> Any:
    return arg.get() if isinstance(arg, ReadyFuture) else arg
