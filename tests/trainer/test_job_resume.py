"""Reward-model runs restart elastically: after losing a node they continue on the nodes
left (run/elastic.py: restart_config with the reward-model checks).

    .venv/bin/python -m pytest -q tests/trainer/test_job_resume.py
"""

from __future__ import annotations

from test_rm_training import TINY as RM_TINY

from hybridflow.config.rm_schema import load_rm_config, validate_rm_config
from hybridflow.trainer.jobs.rm import RewardModelPart

RM = [*RM_TINY, "resources.world_size=1", "rm.engine.dtype=fp32", "seed=0", "trainer.console=none"]


def test_an_rm_restart_continues_on_the_nodes_left(ray_local):
    # Two nodes of one rank each; one is lost (Ray no longer lists it): one rank on the node left.
    cfg = load_rm_config(None, [*RM, "rm.data.train_files=[pairs.jsonl]", "resources.world_size=null",
                                "resources.nodes=2", "resources.ranks_per_node=1", "resources.min_world_size=1"])
    assert validate_rm_config(cfg) == 2
    after = RewardModelPart().restart_config(cfg, lost_node="ff" * 28)
    res = after.resources
    assert (res.world_size, res.nodes, res.ranks_per_node, res.max_world_size) == (1, 1, 1, 2)
    assert validate_rm_config(after) == 1
