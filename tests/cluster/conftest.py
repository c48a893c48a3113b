"""The session's real two-node Ray cluster (netns.py): built once, shared by every cluster
test, torn down at the end (and at exit, if the session dies first). Skipped with the
reason where it cannot run (not root, no `ip`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cluster_helpers import check_ok, grpo, local_train
from netns import NetnsCluster, unavailable

CPUS_PER_NODE = 2  # one_step_off fills the head with 2 training ranks, so its rollout pool lands on node 1


@pytest.fixture(scope="session")
def cluster():
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"no namespace cluster: {reason}")
    built = NetnsCluster(Path(f"/tmp/hfcluster-{os.getpid()}"), nodes=2, cpus_per_node=CPUS_PER_NODE)
    try:
        built.start()
        yield built
    finally:
        built.close()


@pytest.fixture
def healthy(cluster):
    """The cluster with every node up and every cable plugged in (a fault test may have lost one)."""
    cluster.heal()
    return cluster


@pytest.fixture(scope="session")
def grpo_reference(tmp_path_factory) -> Path:
    """The single-machine GRPO run (2 ranks) that cluster runs of the same config must reproduce."""
    root = tmp_path_factory.mktemp("grpo_reference")
    check_ok(local_train(root / "run", *grpo(root), "resources.world_size=2"))
    return root / "run"
