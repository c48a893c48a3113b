"""The weight-sync half of bench_cluster_link.py, run on the head node of its cluster: a
WeightBridge between a rank on the head and a rank on the other node (one_step_off's
cross-pool path: its store, its gloo group, its bucketed broadcast), timed on the sender.
Reads one line per measurement from stdin (a label), prints "RESULT {json}" for it.

    python benchmarks/cluster_sync_probe.py HEAD_IP:6379 1,8,32 3     # MiB payloads, repeats
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from hybridflow.controller import Dispatch, ResourcePool, Worker, WorkerGroup, init_ray, register
from hybridflow.engines.reshard.cross_pool import WeightBridge, free_port, manifest_of


def payload(mib: int) -> list[tuple[str, torch.Tensor]]:
    """`mib` MiB of fp32 weights as 1-MiB tensors (buckets of the default 64 MiB hold them all)."""
    return [(f"w{i}", torch.full((1 << 18,), float(i))) for i in range(mib)]


class Syncer(Worker):
    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes
        self.bridges: dict[int, WeightBridge] = {}

    @register(dispatch=Dispatch.RANK_ZERO)
    def endpoint(self) -> tuple[str, int]:
        return self.master_addr, free_port(self.master_addr)

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def connect(self, host: str, ports: list[int]) -> None:
        for mib, port in zip(self.sizes, ports):
            self.bridges[mib] = WeightBridge(host, port, self.rank, self.world_size, manifest_of(payload(mib)))

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def sync(self, mib: int, repeats: int) -> list[float]:
        """Seconds of each of `repeats` syncs as the sender saw them (the receiver's are the same
        broadcasts); the first sync of a size warms its connections up and is not counted."""
        bridge, named = self.bridges[mib], payload(mib)
        seconds = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            if self.rank == 0:
                bridge.send(iter(named), version=1)
            else:
                bridge.receive(lambda views: None)
            seconds.append(time.perf_counter() - start)
        return seconds[1:]


def main() -> None:
    address, sizes, repeats = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3])
    init_ray(address=address)
    pool = ResourcePool([1, 1])
    group = WorkerGroup(pool, Syncer, sizes)
    try:
        host = group.endpoint()[0]
        group.connect(host, [group.endpoint()[1] for _ in sizes])
        print("READY", flush=True)
        for label in sys.stdin:
            result = {}
            for mib in sizes:
                sender = group.sync(mib, repeats)[0]
                result[str(mib)] = {"bytes": mib << 20, "median_s": statistics.median(sender), "runs_s": sender}
            print("RESULT " + json.dumps({"label": label.strip(), "sizes": result}), flush=True)
    finally:
        group.shutdown()
        pool.release()


if __name__ == "__main__":
    main()
