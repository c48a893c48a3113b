"""`WorkerGroup(IN_PROCESS, ...)`: one rank placed in the controller's process, the same group
(registered methods, dispatch/collect of one rank, non-blocking futures, shutdown)."""

from __future__ import annotations

import os

import pytest
import torch

from hybridflow.controller import IN_PROCESS, Dispatch, ReadyFuture, Worker, WorkerGroup, register
from hybridflow.protocol import DataProto


class Counter(Worker):
    def __init__(self, start: int) -> None:
        self.value = start
        self.seen_rank = (self.rank, self.world_size)

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def add(self, n: int) -> int:
        self.value += n
        return self.value

    @register(dispatch=Dispatch.ALL_TO_ALL)
    def per_rank(self, n: int) -> int:
        return n * 10

    @register(dispatch=Dispatch.RANK_ZERO, blocking=False)
    def snapshot(self) -> int:
        return self.value

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def double(self, batch: DataProto) -> DataProto:
        return DataProto.from_dict({"x": batch.batch["x"] * 2})


def test_one_rank_called_like_a_worker_group():
    group = WorkerGroup(IN_PROCESS, Counter, 5)
    assert group.world_size == 1 and group.workers[0].seen_rank == (0, 1)
    assert group.worker_info[0]["pid"] == os.getpid()
    assert group.add(2) == [7]  # ONE_TO_ALL collects a list, one entry per rank
    assert group.per_rank([3]) == [30]  # ALL_TO_ALL takes one argument per rank
    future = group.snapshot()
    assert isinstance(future, ReadyFuture) and future.get() == 7
    assert group.add(future) == [14]  # a future goes on into the next call, as on Ray
    out = group.double(DataProto.from_dict({"x": torch.arange(3.0)}))
    assert torch.equal(out.batch["x"], torch.tensor([0.0, 2.0, 4.0]))
    assert group.submit("add", 1).get() == [15]
    group.shutdown()
    with pytest.raises(RuntimeError, match="Counter.add: the worker group was shut down"):
        group.add(1)
    with pytest.raises(TypeError, match="runs in the controller's process"):
        group.__reduce__()
