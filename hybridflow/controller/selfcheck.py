"""`run_selfcheck`: start Ray, spawn a small worker group, all-reduce over gloo, report.

Used by the ``hybridflow selfcheck`` command to show that the controller runtime works on
this machine (or cluster, with ``address``).
"""

from __future__ import annotations

import platform
import time
from typing import Any

import ray

from hybridflow.controller.decorator import Dispatch, register
from hybridflow.controller.ray_runtime import init_ray
from hybridflow.controller.resource_pool import ResourcePool
from hybridflow.controller.worker import Worker
from hybridflow.controller.worker_group import WorkerGroup


class SelfCheckWorker(Worker):
    """Joins the group's process group and all-reduces its rank number."""

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def all_reduce_ranks(self) -> dict[str, Any]:
        import torch
        import torch.distributed as dist

        self.init_process_group()
        value = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(value)
        return {"rank": self.rank, "backend": str(dist.get_backend()), "sum": value.item()}


def run_selfcheck(world_size: int = 4, address: str | None = None) -> dict[str, Any]:
    """Spawn ``world_size`` ranks, all-reduce 1 + 2 + ... + world_size, and report.

    Starts an embedded Ray when none is running (and stops it afterwards); each rank
    takes one logical CPU, so the embedded instance gets at least ``world_size`` of them.
    """
    started = time.perf_counter()
    owns_ray = not ray.is_initialized()
    runtime = init_ray(address=address, num_cpus=None if address else max(world_size, 1))
    ray_ready = time.perf_counter()
    pool = ResourcePool([world_size])
    group = None
    try:
        group = WorkerGroup(pool, SelfCheckWorker)
        spawned = time.perf_counter()
        results = group.all_reduce_ranks()
        finished = time.perf_counter()
    finally:
        if group is not None:
            group.shutdown()
        pool.release()
        if owns_ray:
            ray.shutdown()
    expected = world_size * (world_size + 1) / 2
    sums = [r["sum"] for r in results]
    return {
        "ok": all(s == expected for s in sums),
        "ray_version": ray.__version__,
        "python": platform.python_version(),
        "ray_address": runtime.address,
        "embedded_ray": runtime.embedded,
        "nodes": runtime.num_nodes,
        "world_size": world_size,
        "ranks": [dict(info, backend=r["backend"]) for info, r in zip(group.worker_info, results)],
        "all_reduce": {"result": sums, "expected": expected},
        "timings_s": {
            "ray_start": round(ray_ready - started, 3),
            "spawn_group": round(spawned - ray_ready, 3),
            "all_reduce_call": round(finished - spawned, 3),
            "total": round(time.perf_counter() - started, 3),
        },
    }
