"""The controller runtime: worker groups on Ray, driven from one controller process.

    from hybridflow.controller import (Dispatch, ResourcePool, Worker, WorkerGroup,
                                       init_ray, register)

    class Doubler(Worker):
        @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
        def double(self, batch):
            batch.batch["x"] = batch.batch["x"] * 2
            return batch

    init_ray()                                    # embedded local Ray on 127.0.0.1
    group = WorkerGroup(ResourcePool([4]), Doubler)
    out = group.double(batch)                     # split by rank, run, concatenated back

See `decorator` for the dispatch modes, `colocate` for several roles in one set of
processes, `futures` for non-blocking calls (and `FETCHED`, the count of what the controller
fetched from workers), `errors` for what failures look like, and `local_group` for the
in-process placement (`WorkerGroup(IN_PROCESS, cls)`: one rank in this process, no Ray).
"""

from hybridflow.controller.colocate import create_colocated_worker_groups
from hybridflow.controller.decorator import (
    Dispatch,
    DispatchMode,
    Execute,
    MethodSpec,
    register,
    register_dispatch_mode,
    registered_methods,
)
from hybridflow.controller.dispatch import DispatchContext, Split
from hybridflow.controller.errors import CallTimeoutError, DispatchError, WorkerError
from hybridflow.controller.futures import LEDGER as FETCHED
from hybridflow.controller.futures import CallFuture, DataProtoFuture, FetchLedger, value_future
from hybridflow.controller.host import RoleSpec
from hybridflow.controller.local_group import IN_PROCESS, InProcess, ReadyFuture
from hybridflow.controller.ray_runtime import RayHold, RayRuntime, describe_ray, init_ray
from hybridflow.controller.resource_pool import ResourcePool, Slot
from hybridflow.controller.selfcheck import run_selfcheck
from hybridflow.controller.worker import MeshCoord, Worker, WorkerContext
from hybridflow.controller.worker_group import WorkerGroup

__all__ = [
    "CallFuture",
    "DataProtoFuture",
    "FETCHED",
    "FetchLedger",
    "IN_PROCESS",
    "InProcess",
    "ReadyFuture",
    "Dispatch",
    "DispatchContext",
    "CallTimeoutError",
    "DispatchError",
    "DispatchMode",
    "Execute",
    "MeshCoord",
    "MethodSpec",
    "RayRuntime",
    "ResourcePool",
    "RoleSpec",
    "Slot",
    "Split",
    "Worker",
    "WorkerContext",
    "WorkerError",
    "WorkerGroup",
    "create_colocated_worker_groups",
    "describe_ray",
    "init_ray",
    "RayHold",
    "register",
    "register_dispatch_mode",
    "registered_methods",
    "run_selfcheck",
    "value_future",
]
