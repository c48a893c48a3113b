"""Elastic restarts: the world size a run continues with after it lost (or gained) nodes.

    wait_for_lost_node(node_id)          # a dead rank's node: alive, or declared dead by Ray
    cfg = fitting_config(cfg, slots)     # resources.* for the slots per node the cluster holds now
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from hybridflow.config import ConfigError
from hybridflow.config.schema import RunConfig
from hybridflow.config.validation import validate_run_config

# How long a lost node's fate may take to settle: a probe task on it, then Ray's own
# verdict (its health checks declare an unreachable node dead after ~15-30 s by default).
PROBE_TIMEOUT_S = 30.0
DEATH_VERDICT_S = 90.0


@ray.remote(num_cpus=0)
def _probe() -> bool:
    return True


def node_alive(node_id: str) -> bool:
    """Whether Ray still lists `node_id` as alive."""
    return any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes())


def wait_for_lost_node(node_id: str) -> bool:
    """After a rank on `node_id` died: True when the node still runs tasks (only the
    process was lost), False once Ray declared it dead (waiting for that verdict, so that
    the restart's placement does not aim at a node that is gone but still listed)."""
    if not node_alive(node_id):
        return False
    probe = _probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()
    try:
        ray.get(probe, timeout=PROBE_TIMEOUT_S)
        return True
    except Exception:  # noqa: BLE001 - unreachable, timed out or infeasible: the node is going away
        ray.cancel(probe, force=True)
    deadline = time.monotonic() + DEATH_VERDICT_S
    while time.monotonic() < deadline and node_alive(node_id):
        time.sleep(1.0)
    return node_alive(node_id)


def slots_per_node(use_gpu: bool, cpus_per_slot: float = 1.0) -> list[int]:
    """Process slots each alive node holds in all (a GPU each, or cpus_per_slot CPUs),
    largest first. Called with no worker group running, so all of them are free."""
    key, size = ("GPU", 1.0) if use_gpu else ("CPU", cpus_per_slot)
    counts = [int(n["Resources"].get(key, 0.0) // size + 1e-9) for n in ray.nodes() if n["Alive"]]
    return sorted((c for c in counts if c > 0), reverse=True)


def fitting_config(cfg: RunConfig, slots: list[int],
                   validate: Callable[[RunConfig], Any] = validate_run_config) -> RunConfig:
    """`cfg` with resources.world_size / nodes / ranks_per_node for a cluster of `slots`
    (per node, largest first); `cfg` itself when it fits or the run is not elastic.
    `validate`: the kind's cross-section checks (a ConfigError: that size does not fit).
    Raises ConfigError when nothing in min_world_size..max_world_size fits."""
    res = cfg.resources
    if res.min_world_size is None:
        return cfg
    world = res.resolved_world_size()
    per_node_cap = res.ranks_per_node if res.ranks_per_node is not None else max(slots, default=0)
    top = res.max_world_size if res.max_world_size is not None else world
    for size in range(top, res.min_world_size - 1, -1):
        for per_node in sorted((d for d in range(1, size + 1) if size % d == 0), reverse=True):
            nodes = size // per_node
            if per_node > per_node_cap or sum(1 for s in slots if s >= per_node) < nodes:
                continue
            resources = dataclasses.replace(res, world_size=size, nodes=nodes, ranks_per_node=per_node,
                                            max_world_size=top)  # keeps the way back to the first size
            candidate = dataclasses.replace(cfg, resources=resources)
            try:
                validate(candidate)
            except ConfigError:
                continue  # e.g. the batch sizes do not divide by this data-parallel size
            return candidate if (size, nodes, per_node) != (world, res.nodes, res.process_on_nodes()[0]) else cfg
    raise ConfigError(
        f"after the failure the cluster holds {sum(slots)} slot(s) on {len(slots)} node(s) ({slots}); no world "
        f"size in min_world_size={res.min_world_size}..{top} fits it with at most {per_node_cap} rank(s) per node "
        "and batch sizes that divide; add nodes, or lower resources.min_world_size", "resources.min_world_size")


def restart_config(cfg: RunConfig, lost_node: str | None,
                   validate: Callable[[RunConfig], Any] = validate_run_config) -> RunConfig:
    """The config a restart continues with: `cfg`, or for an elastic run (min_world_size
    set) the world size the cluster holds once the fate of `lost_node` (the node of a rank
    that died, if any) is settled (`validate`: as in `fitting_config`)."""
    if cfg.resources.min_world_size is None:
        return cfg
    if lost_node is not None:
        wait_for_lost_node(lost_node)
    return fitting_config(cfg, slots_per_node(cfg.resources.use_gpu), validate)
