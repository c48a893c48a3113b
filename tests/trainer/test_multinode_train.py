"""RL runs across two simulated Ray nodes (multinode_train_scenario.py, in a subprocess
because a simulated cluster needs its own Ray): `hybridflow train` with resources.nodes=2
places one rank of every role on each node; and an elastic run (resources.min_world_size=1)
that loses its second node mid-step goes on with one rank on the head node and finishes,
its checkpoint loaded resharded and its data position exact.

    .venv/bin/python -m pytest -q tests/trainer/test_multinode_train.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hybridflow.trainer.run.checkpointing import find_checkpoint, read_trainer_state
from hybridflow.trainer.observe.live_status import read_status
from hybridflow.trainer.run.run_dir import read_metrics

SCENARIO = Path(__file__).with_name("multinode_train_scenario.py")


def run_scenario(mode: str, out: Path) -> dict:
    done = subprocess.run([sys.executable, str(SCENARIO), mode, str(out)], capture_output=True, text=True,
                          timeout=540)
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and lines, f"scenario failed (rc {done.returncode}):\n{done.stderr[-4000:]}"
    return json.loads(lines[-1].removeprefix("REPORT "))


# Each starts a 2-node cluster and 2-rank GRPO workers (the elastic one twice): ~60-90 s.
@pytest.mark.slow
@pytest.mark.extended  # in make test: tests/cluster, on real network namespaces (root)
@pytest.mark.timeout(600)
def test_hybridflow_train_spans_two_nodes(tmp_path):
    report = run_scenario("span", tmp_path)
    assert report["rc"] == 0
    run_dir = tmp_path / "run"
    workers = read_status(run_dir)["workers"]
    assert [(w["role"], w["rank"], w["node_id"]) for w in workers] == [
        ("actor", 0, report["head_node_id"]), ("actor", 1, report["worker_node_id"])]
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "rl"] == [1, 2]
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())["resources"]
    assert (saved["world_size"], saved["nodes"], saved["ranks_per_node"]) == (2, 2, 1)


@pytest.mark.slow
@pytest.mark.extended  # in make test: tests/cluster, on real network namespaces (root)
@pytest.mark.timeout(600)
def test_losing_a_node_mid_run_continues_elastically_on_the_rest(tmp_path):
    report = run_scenario("elastic", tmp_path)
    assert report["steps"] == 3
    run_dir = tmp_path / "run"
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records if r["phase"] == "rl"] == [1, 2, 3]  # step 2 once: the failed try set aside
    (restart,) = [r for r in records if r["phase"] == "restart"]
    assert (restart["restart/role"], restart["restart/rank"], restart["restart/cause"]) == ("actor", 1, "died")
    assert (restart["restart/failed_step"], restart["restart/resumed_step"]) == (2, 1)
    assert (restart["restart/previous_world_size"], restart["restart/world_size"]) == (2, 1)
    assert (restart["restart/previous_nodes"], restart["restart/nodes"]) == (2, 1)
    # The run goes on with one rank on the head node; the config says so, the first one is kept.
    workers = read_status(run_dir)["workers"]
    assert [(w["rank"], w["node_id"]) for w in workers] == [(0, report["head_node_id"])]
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())["resources"]
    assert (saved["world_size"], saved["nodes"], saved["ranks_per_node"], saved["max_world_size"]) == (1, 1, 1, 2)
    assert (run_dir / "config.before-resume-step1.yaml").is_file()
    # Batch accounting is exact: 3 batches of 4 prompts taken from the loader in all.
    loader = read_trainer_state(find_checkpoint(run_dir))["loader"]
    assert (loader["epoch"], loader["offset"], loader["batch_size"]) == (0, 3, 4)
