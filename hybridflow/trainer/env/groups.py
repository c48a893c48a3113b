"""The worker groups of an environment task: the env runners and the learner.

    groups = build_env_groups(cfg, collector_spec, learner_spec)
    groups["runners"].rollout(128).get(); groups["learner"].ppo_update(batch)
"""

from __future__ import annotations

import contextlib
import sys
import sysconfig
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ray
import ray.cloudpickle

from hybridflow.controller import IN_PROCESS, ResourcePool, RoleSpec, WorkerGroup, create_colocated_worker_groups
from hybridflow.errors import ConfigError
from hybridflow.workers import shutdown_role_groups
from hybridflow.workers.env_runner import EnvRunnerWorker
from hybridflow.workers.learner import LearnerSpec, LearnerWorker

CLOSE_ENVS_TIMEOUT_S = 30.0


def close_envs(runners: WorkerGroup) -> None:
    """Close the environments before their processes go. Bounded: a runner that died or
    hangs in a step must not keep the shutdown waiting (its environments go with its
    process); an env's own close() failing neither."""
    with contextlib.suppress(Exception):
        runners.submit("close_envs").get(timeout_s=CLOSE_ENVS_TIMEOUT_S)


def build_env_groups(cfg: Any, collector_spec: Any, learner_spec: LearnerSpec) -> dict[str, WorkerGroup]:
    """Start the env runners and the learner (on the Ray the caller started, or in-process
    when num_workers is 0)."""
    dist = cfg.distributed
    runners_role = {"runners": RoleSpec(EnvRunnerWorker, (collector_spec,))}
    learner_role = {"learner": RoleSpec(LearnerWorker, (learner_spec,))}
    if dist.num_workers == 0:
        groups = create_colocated_worker_groups(IN_PROCESS, learner_role)
        groups["learner"].init_model()
        return {**create_colocated_worker_groups(IN_PROCESS, runners_role), **groups}
    ship_by_value(collector_spec.source.factory)
    alive_nodes = sum(1 for node in ray.nodes() if node["Alive"])
    counts = runner_node_counts(dist.num_workers, dist.placement_strategy, alive_nodes)
    runner_cpus = dist.cpus_per_worker or _shared_cpus(ray.cluster_resources().get("CPU", 1.0), dist)
    runner_pool = ResourcePool(counts, cpus_per_slot=runner_cpus)
    learner_pool = ResourcePool([dist.num_learners], cpus_per_slot=dist.learner_cpus)
    groups: dict[str, WorkerGroup] = {}
    # The runners' processes start while the learner's do: each imports torch (seconds), and
    # one after the other the start-up was their sum (bench_vs_sb3.py's set-up column).
    with ThreadPoolExecutor(1, thread_name_prefix="hybridflow-env-runners") as starter:
        starting = starter.submit(_colocated, runner_pool, runners_role)
        try:
            groups.update(_colocated(learner_pool, learner_role))
            groups["learner"].init_model()
            groups.update(starting.result())
        except BaseException:
            groups.update(_started_or_none(starting))
            if "runners" in groups:
                close_envs(groups["runners"])
            shutdown_role_groups(groups)
            for pool in (runner_pool, learner_pool):
                pool.release()
            raise
    return {"runners": groups["runners"], "learner": groups["learner"]}


def _colocated(pool: ResourcePool, roles: dict[str, RoleSpec]) -> dict[str, WorkerGroup]:
    try:
        return create_colocated_worker_groups(pool, roles)
    except BaseException:
        pool.release()
        raise


def _started_or_none(starting: Future) -> dict[str, WorkerGroup]:
    """The groups `starting` made once it is done, or none where it failed (its error is the
    second one; the first is being raised)."""
    try:
        return starting.result()
    except BaseException:
        return {}


def ship_by_value(factory: Any) -> None:
    """Send a user's environment class to the env runners by value when it lives in the
    user's own module (not hybridflow, not an installed package). Ray pickles classes of
    importable modules by reference, and the runners may not import that module: a Ray
    started before the user's folder was on sys.path, a notebook, a remote cluster."""
    if factory is None:  # a Gymnasium id: the runners make it themselves
        return
    module = sys.modules.get(getattr(factory, "__module__", None) or "")
    file = getattr(module, "__file__", None)
    if module is None or module.__name__ == "__main__" or module.__name__.split(".")[0] == "hybridflow" or not file:
        return  # __main__ is pickled by value anyway
    installed = {sysconfig.get_paths()[key] for key in ("purelib", "platlib", "stdlib")}
    if any(Path(file).resolve().is_relative_to(Path(folder).resolve()) for folder in installed):
        return
    ray.cloudpickle.register_pickle_by_value(module)


def runner_node_counts(num_workers: int, strategy: str, num_nodes: int) -> list[int]:
    """Runners per node (one ResourcePool entry each) for a placement strategy."""
    if strategy == "pack":
        return [num_workers]
    if strategy == "strict_spread":
        if num_workers > num_nodes:
            raise ConfigError(
                f"strict_spread puts each of the {num_workers} env runners on its own node, but the Ray cluster has "
                f"{num_nodes} node(s); use placement_strategy: spread (a preference) or pack, or fewer num_workers",
                "distributed.placement_strategy")
        return [1] * num_workers
    nodes = max(1, min(num_nodes, num_workers))
    return [num_workers // nodes + (1 if i < num_workers % nodes else 0) for i in range(nodes)]


def _shared_cpus(cluster_cpus: float, dist: Any) -> float:
    """Ray CPUs per runner when not configured: what the learners leave, shared out, at most 1.
    (Fractions let 8 runners share a 2-core machine; the OS interleaves them.)"""
    left = cluster_cpus - dist.num_learners * dist.learner_cpus
    return round(max(0.05, min(1.0, left / dist.num_workers)), 4)
