"""Failures surface as errors, never as hangs: a worker __init__ that raises, and a worker
process that dies while its peer waits for it inside a gloo all-reduce."""

from __future__ import annotations

import os

import pytest
import torch

from hybridflow.controller import Dispatch, ResourcePool, Worker, WorkerError, WorkerGroup, register


class Fragile(Worker):
    def __init__(self, fail_rank: int) -> None:
        if self.rank == fail_rank:
            raise RuntimeError(f"cannot build rank {self.rank} on purpose")


class Mortal(Worker):
    @register(dispatch=Dispatch.ONE_TO_ALL)
    def all_reduce_or_die(self, dying_rank: int) -> float:
        import torch.distributed as dist

        self.init_process_group()
        if self.rank == dying_rank:
            os._exit(3)  # the process vanishes without an exception
        value = torch.ones(1)
        dist.all_reduce(value)  # waits for the dead peer
        return value.item()

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def ping(self) -> int:
        return self.rank


@pytest.fixture
def pool(ray_local):
    pool = ResourcePool([2])
    yield pool
    pool.release()


@pytest.mark.timeout(300)
def test_an_exception_in_worker_init_names_role_and_rank(pool):
    with pytest.raises(WorkerError) as caught:
        WorkerGroup(pool, Fragile, 1)
    err = caught.value
    assert (err.role, err.rank, err.died) == ("Fragile", 1, False)
    assert "Fragile.__init__" in err.method
    assert "cannot build rank 1 on purpose" in str(err) and "in __init__" in err.remote_traceback


@pytest.mark.timeout(300)
def test_a_dying_worker_fails_the_pending_call_instead_of_hanging(pool):
    group = WorkerGroup(pool, Mortal)
    try:
        pids = [info["pid"] for info in group.worker_info]
        # Rank 0 is blocked in all_reduce waiting for rank 1, which exits: the call must
        # still return (with an error naming rank 1) rather than wait for rank 0.
        with pytest.raises(WorkerError) as caught:
            group.all_reduce_or_die(1)
        err = caught.value
        assert (err.role, err.rank, err.died, err.pid) == ("Mortal", 1, True, pids[1])
        assert "Mortal rank 1" in str(err) and "died during Mortal.all_reduce_or_die" in str(err)
        # One paragraph naming the pid and what to do, without Ray's generic out-of-memory hint.
        first, *rest = str(err).splitlines()  # the paragraph; then the peers that failed after it
        assert f"pid {pids[1]}" in first and "--resume" in first and all(r.startswith("Also failed") for r in rest)
        assert "Ray:" not in str(err) and err.remote_traceback.startswith("Ray: ")
        # Later calls fail at once too: the dead rank is not restarted.
        with pytest.raises(WorkerError, match="Mortal rank 1") as again:
            group.ping()
        assert again.value.died
    finally:
        group.shutdown()
