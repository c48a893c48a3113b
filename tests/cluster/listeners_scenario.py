"""What a worker group's processes listen on, on a real cluster: one rank per node joins the
group's gloo process group and a weight bridge (the cross-pool store and gloo group of
trainer.mode one_step_off), then reports its node, the interface variables it runs with
and the addresses its process listens on since it joined them (Ray's own worker server,
there before, binds every interface in a cluster: Ray's choice). Prints "REPORT {json}" last.

    python tests/cluster/listeners_scenario.py HEAD_IP:6379     # on the head node
"""

from __future__ import annotations

import json
import os
import sys

import torch

from hybridflow.controller import Dispatch, ResourcePool, Worker, WorkerGroup, init_ray, network, register
from hybridflow.engines.reshard.cross_pool import WeightBridge, free_port, manifest_of


class Probe(Worker):
    @register(dispatch=Dispatch.RANK_ZERO)
    def bridge_endpoint(self) -> tuple[str, int]:
        return self.master_addr, free_port(self.master_addr)

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def probe(self, host: str, port: int) -> dict:
        import psutil
        import ray
        import torch.distributed as dist

        def listening() -> set[tuple[str, int]]:
            return {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections(kind="inet")
                    if c.status == psutil.CONN_LISTEN}

        before = listening()
        self.init_process_group()
        value = torch.ones(1)
        dist.all_reduce(value)
        named = [("w", torch.arange(4.0))]
        bridge = WeightBridge(host, port, self.rank, self.world_size, manifest_of(named))
        got: list = []
        if self.rank == 0:
            bridge.send(iter(named), version=1)
        else:
            bridge.receive(got.extend)
        ours = sorted({ip for ip, _ in listening() - before})
        return {"node": ray.util.get_node_ip_address(), "sum": value.item(), "listening": ours,
                "received": [t.tolist() for _, t in got], "bridge_port": port,
                "env": {name: os.environ.get(name) for name in network.VARIABLES}}


def main() -> dict:
    init_ray(address=sys.argv[1])
    pool = ResourcePool([1, 1])
    group = WorkerGroup(pool, Probe)
    try:
        host, port = group.bridge_endpoint()
        return {"ranks": group.probe(host, port), "bridge_host": host}
    finally:
        group.shutdown()
        pool.release()


if __name__ == "__main__":
    print("REPORT " + json.dumps(main()), flush=True)
