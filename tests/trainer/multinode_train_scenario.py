"""RL runs on a simulated two-node Ray cluster (``ray.cluster_utils.Cluster``); prints a
JSON report on stdout as its last "REPORT " line.

    python tests/trainer/multinode_train_scenario.py span OUT_DIR     # `hybridflow train` on 2 nodes
    python tests/trainer/multinode_train_scenario.py elastic OUT_DIR  # lose a node mid-run, go on with 1

Run by test_multinode_train.py in a subprocess: a simulated cluster needs its own Ray,
apart from the test session's embedded one. Each node has 2 logical CPUs and runs one
rank of every role (resources.nodes=2, resources.ranks_per_node=1).

elastic: actor rank 1 (on the second node) hangs in its 2nd update (HYBRIDFLOW_FAULT), so
the run waits there; the scenario then kills that node's processes (raylet, workers)
without warning. Ray reports the rank dead, the trainer restarts from the step-1
checkpoint on what is left (resources.min_world_size=1: one rank on the head node) and
finishes.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

CPUS_PER_NODE = 2
TINY = [
    "trainer.console=plain", "trainer.test_freq=0", "trainer.save_final_model=false", "sft.steps=0",
    "trainer.val_before_train=false", "algorithm.name=grpo", "trainer.save_freq=1",
    "model.builtin.hidden_size=32", "model.builtin.intermediate_size=64", "model.builtin.num_hidden_layers=2",
    "data.train_batch_size=4", "rollout.n=2", "data.builtin.num_train=64", "data.builtin.num_val=8",
    "actor.micro_batch.mini_batch_size=4", "actor.micro_batch.micro_batch_size_per_device=2",
    "reward.manager.num_workers=1", "resources.nodes=2", "resources.ranks_per_node=1",
]


def span(out: Path, address: str) -> dict:
    from hybridflow.cli import main

    rc = main(["train", f"trainer.run_dir={out / 'run'}", f"resources.ray_address={address}",
               "trainer.total_steps=2", *TINY])
    return {"rc": rc}


def elastic(out: Path, address: str, cluster, worker_node) -> dict:
    from hybridflow import RLTrainer
    from hybridflow.config.schema import load_run_config
    from hybridflow.trainer.observe.live_status import read_status

    os.environ["HYBRIDFLOW_FAULT"] = f"hang:actor.update_actor:1:2:{out / 'fired'}"
    run_dir = out / "run"
    cfg = load_run_config(None, [f"trainer.run_dir={run_dir}", f"resources.ray_address={address}",
                                 "trainer.total_steps=3", "trainer.max_restarts=1", "resources.min_world_size=1",
                                 *TINY])

    def kill_node_when_hung() -> None:
        while True:
            status = read_status(run_dir) or {}
            if status.get("step") == 2 and status.get("phase") == "update_actor" and (out / "fired").exists():
                break
            time.sleep(0.2)
        time.sleep(1.0)  # rank 0 is now waiting in the update's collective
        cluster.remove_node(worker_node, allow_graceful=False)

    killer = threading.Thread(target=kill_node_when_hung, daemon=True)
    killer.start()
    with RLTrainer(cfg) as trainer:
        result = trainer.train()
    return {"steps": result.steps}


def main() -> dict:
    import ray
    from ray.cluster_utils import Cluster

    from hybridflow.controller import init_ray

    mode, out = sys.argv[1], Path(sys.argv[2])
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": CPUS_PER_NODE})
    worker_node = cluster.add_node(num_cpus=CPUS_PER_NODE)
    cluster.wait_for_nodes()
    try:
        report = {"head_node_id": cluster.head_node.node_id, "worker_node_id": worker_node.node_id}
        if mode == "span":  # `hybridflow train` joins the cluster itself (resources.ray_address)
            report.update(span(out, cluster.address))
        else:
            init_ray(address=cluster.address)
            report.update(elastic(out, cluster.address, cluster, worker_node))
        return report
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":  # the reward worker processes import this module again
    print("REPORT " + json.dumps(main()), flush=True)
