"""The torch.distributed rendezvous store of a worker group listens only on the group's
address (loopback for a local run), not on every interface as torch's default does."""

from __future__ import annotations

import pytest

from hybridflow.controller import Dispatch, ResourcePool, Worker, WorkerGroup, register
from tests.processes import listening_addresses


class Joiner(Worker):
    @register(dispatch=Dispatch.ONE_TO_ALL)
    def join(self) -> tuple[str, int, int]:
        import torch
        import torch.distributed as dist

        self.init_process_group()
        value = torch.ones(1)
        dist.all_reduce(value)
        return self.master_addr, self.master_port, int(value.item())


@pytest.mark.timeout(300)
def test_the_store_listens_on_the_group_address_only(ray_local):
    pool = ResourcePool([2])
    group = WorkerGroup(pool, Joiner)
    try:
        results = group.join()
        (addr, port, total), = set(results)
        assert total == 2 and addr == "127.0.0.1"  # a local run rendezvous over loopback
        assert listening_addresses(port) == ["127.0.0.1"]  # not 0.0.0.0 or ::
    finally:
        group.shutdown()
        pool.release()
