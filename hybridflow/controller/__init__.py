"""The controller runtime: worker groups on Ray, driven from one controller process.

    from hybridflow.controller import (Dispatch, ResourcePool, Worker, WorkerGroup,
                                       init_ray, register)
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
