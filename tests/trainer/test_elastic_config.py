"""Multi-node and elastic settings without a cluster: resources.nodes / ranks_per_node,
min/max_world_size, trainer.max_restarts / call_timeout_s; how ranks are cut over nodes
(setup.split_nodes, placement) and which world size an elastic restart picks
(elastic.fitting_config).

    .venv/bin/python -m pytest -q tests/trainer/test_elastic_config.py
"""

from __future__ import annotations

import pytest

from hybridflow.config import ConfigError
from hybridflow.trainer.run.elastic import fitting_config
from hybridflow.controller import RayHold
from hybridflow.trainer.run.setup import placement, split_nodes
from hybridflow.config.validation import validate_run_config
from trainer_helpers import tiny_run_config


# One sequence per micro-batch, so that up to 4 data-parallel ranks divide the batches.
MICRO = ("actor.micro_batch.micro_batch_size_per_device=1", "critic.micro_batch.micro_batch_size_per_device=1")


def config(*overrides: str):
    return tiny_run_config("/tmp/unused-runs", *MICRO, *overrides)


def test_nodes_and_ranks_per_node_give_the_world_size_and_the_pools(tmp_path):
    cfg = config("resources.world_size=null", "resources.nodes=2", "resources.ranks_per_node=2")
    assert cfg.resources.resolved_world_size() == 4 and cfg.resources.process_on_nodes() == [2, 2]
    layout = validate_run_config(cfg)
    assert placement(cfg, layout, ["actor"]).pools == {"global_pool": [2, 2]}
    cfg = config("resources.world_size=4", "resources.nodes=2")  # ranks_per_node = world_size / nodes
    assert cfg.resources.process_on_nodes() == [2, 2]
    split = config("algorithm.name=ppo", "resources.world_size=4", "resources.nodes=4", "resources.placement=split",
                   "resources.critic_ranks=2")
    spec = placement(split, validate_run_config(split), ["actor", "critic"])
    assert spec.pools == {"actor_pool": [1, 1], "critic_pool": [1, 1]}


def test_split_nodes_cuts_consecutive_ranks():
    assert split_nodes([2, 2], [3, 1]) == [[2, 1], [1]]
    assert split_nodes([4], [1, 3]) == [[1], [3]]
    assert split_nodes([1, 1, 1, 1], [2, 2]) == [[1, 1], [1, 1]]


@pytest.mark.parametrize("overrides, key", [
    (("resources.nodes=0",), "resources.nodes"),
    (("resources.ranks_per_node=0",), "resources.ranks_per_node"),
    (("resources.world_size=4", "resources.nodes=2", "resources.ranks_per_node=1"), "resources.ranks_per_node"),
    (("resources.world_size=3", "resources.nodes=2"), "resources.nodes"),
    (("resources.min_world_size=0",), "resources.min_world_size"),
    (("resources.min_world_size=4", "resources.max_world_size=2"), "resources.min_world_size"),
    (("trainer.max_restarts=-1",), "trainer.max_restarts"),
    (("trainer.call_timeout_s=0",), "trainer.call_timeout_s"),
])
def test_bad_resilience_settings_are_config_errors_keyed_by_the_setting(overrides, key):
    with pytest.raises(ConfigError) as info:
        config(*overrides)
    assert key in str(info.value)


def test_more_than_one_node_needs_a_cluster():
    import ray

    if ray.is_initialized():
        pytest.skip("a Ray is already running in this process (RayHold reuses it)")
    with pytest.raises(ConfigError, match="resources.ray_address"):
        RayHold(None, 4, 2)


def test_a_run_needing_more_cpus_than_the_running_ray_has_says_so(ray_local):
    # A second trainer in a process whose Ray an earlier one started with fewer CPUs failed at
    # its placement with "ResourcePool[4]: entry 0 needs 4 slots ... use fewer or smaller entries".
    import ray

    have = int(ray.cluster_resources()["CPU"])
    RayHold(None, have).close()  # it fits: reused (and, started by the tests, left running)
    assert ray.is_initialized()
    with pytest.raises(ConfigError, match=rf"^resources.world_size: this run's ranks reserve {have + 1} Ray CPUs "
                                          rf"but the Ray running in this process \(started outside hybridflow\) "
                                          rf"has {have}: close\(\)"):
        RayHold(None, have + 1)


def test_an_elastic_restart_takes_the_largest_world_size_the_cluster_holds():
    cfg = config("resources.world_size=null", "resources.nodes=2", "resources.ranks_per_node=1",
                 "resources.min_world_size=1")
    assert fitting_config(cfg, [2, 2]) is cfg  # both nodes still there: unchanged
    one = fitting_config(cfg, [2])  # a node lost: at most ranks_per_node=1 on the one left
    res = one.resources
    assert (res.world_size, res.nodes, res.ranks_per_node, res.max_world_size) == (1, 1, 1, 2)
    back = fitting_config(one, [2, 2])  # the node is back: grow to max_world_size again
    assert (back.resources.world_size, back.resources.nodes) == (2, 2)
    assert fitting_config(config("resources.world_size=2"), [1]).resources.world_size == 2  # not elastic
    with pytest.raises(ConfigError, match="resources.min_world_size"):
        fitting_config(config("resources.world_size=2", "resources.min_world_size=2"), [1])


def test_an_elastic_world_size_must_divide_the_batches():
    # Mini-batches of 4 sequences: 3 ranks do not divide them; 2 do.
    cfg = config("resources.world_size=4", "resources.min_world_size=1")
    assert fitting_config(cfg, [3]).resources.world_size == 2
