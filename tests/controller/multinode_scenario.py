"""A two-node Ray cluster on this machine (``ray.cluster_utils.Cluster``) with one pool
spanning both nodes; prints a JSON report on stdout.

Run by test_controller_multinode.py in a subprocess: a simulated cluster needs its own Ray,
and a separate process keeps it apart from the test session's embedded instance whatever
order the tests run in. Run by hand: ``.venv/bin/python tests/controller/multinode_scenario.py``.
"""

from __future__ import annotations

import json
import os

import ray
import torch
from ray.cluster_utils import Cluster

from hybridflow.controller import Dispatch, ResourcePool, Worker, WorkerGroup, init_ray, register
from hybridflow.protocol import DataProto

# Each node could hold the whole pool: the pool spans both only because every entry of
# process_on_nodes is pinned to its own node.
CPUS_PER_NODE = 4


class NodeWorker(Worker):
    @register(dispatch=Dispatch.ONE_TO_ALL)
    def place(self) -> dict:
        return {"rank": self.rank, "local_rank": self.local_rank, "local_world_size": self.local_world_size,
                "node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def all_reduce(self) -> float:
        import torch.distributed as dist

        self.init_process_group()
        value = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(value)
        return value.item()

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def tag(self, batch: DataProto) -> DataProto:
        return DataProto.from_dict(tensors={"ids": batch.batch["ids"] * 2,
                                            "rank": torch.full((len(batch),), self.rank)})


def slot_layout(pool: ResourcePool) -> list[list]:
    return [[slot.node_id, slot.bundle_index] for slot in pool.slots()]


def main() -> dict:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": CPUS_PER_NODE})
    cluster.add_node(num_cpus=CPUS_PER_NODE)
    cluster.wait_for_nodes()
    try:
        runtime = init_ray(address=cluster.address)
        pool = ResourcePool([2, 2])
        first_layout = slot_layout(pool)
        group = WorkerGroup(pool, NodeWorker)
        batch = DataProto.from_dict(tensors={"ids": torch.arange(8)})
        report = {
            "nodes": runtime.num_nodes,
            "head_node_id": ray.get_runtime_context().get_node_id(),
            "places": group.place(),
            "all_reduce": group.all_reduce(),
            "tagged": group.tag(batch).batch["rank"].tolist(),
            "doubled": group.tag(batch).batch["ids"].tolist(),
            "first_layout": first_layout,
        }
        group.shutdown()
        pool.release()
        again = ResourcePool([2, 2])  # a new reservation: same node order, same ranks
        report["second_layout"] = slot_layout(again)
        again.release()
        return report
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    print("REPORT " + json.dumps(main()))
