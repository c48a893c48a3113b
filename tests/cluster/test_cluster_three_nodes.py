"""GRPO with one rank on each of three machines (three network namespaces, `ray start` in
each as docs/resilience.md says) computes what the same run computes on one machine at world
size 3. A cluster of its own, built for this module; `make test-extended` (root)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cluster_helpers import check_ok, cluster_train, comparable, grpo, local_train, rl_records, workers_by_role
from netns import NetnsCluster, unavailable

pytestmark = [pytest.mark.slow, pytest.mark.extended, pytest.mark.timeout(900)]

# 6 prompts x 2 responses: 4 sequences a rank; widths FSDP can split in three
WORLD_3 = ["data.train_batch_size=6", "actor.micro_batch.mini_batch_size=6", "model.builtin.hidden_size=48",
           "model.builtin.intermediate_size=96"]


@pytest.fixture(scope="module")
def three_nodes():
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"no namespace cluster: {reason}")
    built = NetnsCluster(Path(f"/tmp/hfcluster3-{os.getpid()}"), nodes=3, cpus_per_node=2, name="t")
    try:
        built.start()
        yield built
    finally:
        built.close()


def test_grpo_with_a_rank_on_each_of_three_nodes_equals_one_machine(three_nodes, tmp_path):
    check_ok(cluster_train(three_nodes, tmp_path / "cluster", *grpo(tmp_path), *WORLD_3, "resources.nodes=3",
                           "resources.ranks_per_node=1"))
    check_ok(local_train(tmp_path / "local", *grpo(tmp_path), *WORLD_3, "resources.world_size=3"))
    nodes = [node.ip for node in three_nodes.nodes]
    assert [(rank, ip) for rank, ip, _ in workers_by_role(tmp_path / "cluster")["actor"]] == list(enumerate(nodes))
    cluster_records, local_records = rl_records(tmp_path / "cluster"), rl_records(tmp_path / "local")
    assert [r["step"] for r in cluster_records] == [1, 2]
    assert [comparable(r) for r in cluster_records] == [comparable(r) for r in local_records]
