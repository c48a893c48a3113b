"""The torch.distributed rendezvous store of a worker group listens only on the group's
address (loopback for a local run), not on every interface as torch's default does."""

from __future__ import annotations

import socket

import pytest

from hybridflow.controller import Dispatch, ResourcePool, Worker, WorkerGroup, register


class Joiner(Worker):
    @register(dispatch=Dispatch.ONE_TO_ALL)
    def join(self) -> tuple[str, int, int]:
        import torch
        import torch.distributed as dist

        self.init_process_group()
        value = torch.ones(1)
        dist.all_reduce(value)
        return self.master_addr, self.master_port, int(value.item())


def listening_addresses(port: int) -> list[str]:
    """Local addresses of the sockets listening on `port` (from /proc/net/tcp and tcp6)."""
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    raw = bytes.fromhex(address)
                    # /proc prints each 32-bit word in host (little-endian) order.
                    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                    family = socket.AF_INET if width == 8 else socket.AF_INET6
                    found.append(socket.inet_ntop(family, words))
    return found


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
