"""`InProcessWorkerGroup`: one rank of a worker class in the controller's own process,
with the `WorkerGroup` API.

    group = InProcessWorkerGroup(LearnerWorker, spec)       # no Ray, no placement group
    group.init_model(); weights = group.get_weights().get()  # the same calls as on a WorkerGroup
    group.shutdown()

For runs small enough that a Ray actor costs more than it saves (an environment task with
`distributed.num_workers: 0`). The worker gets the context of rank 0 of 1 before its
`__init__` (as the Ray host gives it), and each registered method is bound the way a
one-rank WorkerGroup calls it: arguments of per-rank modes (ALL_TO_ALL, DP_COMPUTE) are
one-element lists, DataProtos and plain values go whole (no split: a split may put values
in Ray's object store), the output goes through the mode's collect, and a method
registered non-blocking returns an already resolved future. So a program does not know
which kind of group it drives.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

from hybridflow.controller.decorator import MethodSpec, registered_methods
from hybridflow.controller.dispatch import DispatchContext, split_per_rank
from hybridflow.controller.worker import WorkerContext


class ReadyFuture:
    """The result of a non-blocking call on an in-process group: already computed."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def get(self, timeout_s: float | None = None) -> Any:
        return self.value

    def done(self) -> bool:
        return True


class InProcessWorkerGroup:
    """Rank 0 of 1 of `worker_cls`, built in this process (module docstring)."""

    def __init__(self, worker_cls: type, *args: Any, **kwargs: Any) -> None:
        self.role = worker_cls.__name__
        self.worker_cls = worker_cls
        self.call_timeout_s: float | None = None  # the WorkerGroup attribute; a local call cannot hang apart
        worker = worker_cls.__new__(worker_cls)
        worker._hf_ctx = WorkerContext(role=self.role, rank=0, world_size=1, local_rank=0, local_world_size=1,
                                       master_addr="127.0.0.1", master_port=0)
        worker.__init__(*args, **kwargs)
        self.worker = worker
        self._alive = True
        for name, spec in registered_methods(worker_cls).items():
            if hasattr(type(self), name):
                raise ValueError(f"{worker_cls.__qualname__}.{name} is registered but clashes with "
                                 f"InProcessWorkerGroup.{name}; rename the worker method")
            setattr(self, name, self._bind(name, spec, getattr(worker, name)))

    def __repr__(self) -> str:
        return f"InProcessWorkerGroup({self.role}{'' if self._alive else ', shut down'})"

    @property
    def world_size(self) -> int:
        return 1

    @property
    def worker_info(self) -> list[dict[str, Any]]:
        """Rank 0: this process."""
        return [{"pid": os.getpid(), "node_id": None, "ip": "127.0.0.1", "rank": 0}]

    def shutdown(self) -> None:
        """Drop the worker (its state goes with it). Idempotent."""
        self._alive = False

    def submit(self, method: str, *args: Any, **kwargs: Any) -> ReadyFuture:
        """Call registered `method`; its (already computed) future, as WorkerGroup.submit."""
        value = getattr(self, method)(*args, **kwargs)
        return value if isinstance(value, ReadyFuture) else ReadyFuture(value)

    def _bind(self, name: str, spec: MethodSpec, method: Callable[..., Any]) -> Callable[..., Any]:
        per_rank = spec.dispatch.split is split_per_rank  # arguments are lists, one entry per rank
        label = f"{self.role}.{name}"

        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            if not self._alive:
                raise RuntimeError(f"{label}: the worker group was shut down")
            args = tuple(_value(a[0] if per_rank else a) for a in args)
            kwargs = {k: _value(v[0] if per_rank else v) for k, v in kwargs.items()}
            out = method(*args, **kwargs)
            ctx = DispatchContext(label=label, mode=spec.dispatch.name, world_size=1)
            result = out if spec.rank_zero else spec.dispatch.collect(ctx, [out])
            return result if spec.blocking else ReadyFuture(result)

        return call


def _value(arg: Any) -> Any:
    return arg.get() if isinstance(arg, ReadyFuture) else arg
