"""A pool spanning two simulated nodes: ranks, rendezvous and gloo across nodes.

The cluster runs in a subprocess (multinode_scenario.py) because it needs its own Ray;
this keeps the session's embedded instance untouched whatever the test order.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCENARIO = Path(__file__).with_name("multinode_scenario.py")


@pytest.fixture(scope="module")
def report() -> dict:
    done = subprocess.run([sys.executable, str(SCENARIO)], capture_output=True, text=True, timeout=540)
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and lines, f"scenario failed (rc {done.returncode}):\n{done.stderr[-4000:]}"
    return json.loads(lines[-1].removeprefix("REPORT "))


@pytest.mark.timeout(600)
def test_one_pool_spans_both_nodes_in_stable_rank_order(report):
    assert report["nodes"] == 2
    places = report["places"]
    assert [p["rank"] for p in places] == [0, 1, 2, 3]
    node_of = [p["node_id"] for p in places]
    assert node_of[0] == node_of[1] != node_of[2] == node_of[3]
    assert node_of[0] == report["head_node_id"]  # head node first in the node order
    assert [(p["local_rank"], p["local_world_size"]) for p in places] == [(0, 2), (1, 2), (0, 2), (1, 2)]
    assert [slot[0] for slot in report["first_layout"]] == node_of
    assert report["second_layout"] == report["first_layout"]


@pytest.mark.timeout(600)
def test_gloo_and_dispatch_work_across_nodes(report):
    assert report["all_reduce"] == [10.0] * 4
    assert report["tagged"] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert report["doubled"] == [2 * i for i in range(8)]
