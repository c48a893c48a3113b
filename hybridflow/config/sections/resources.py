"""The `resources` section: ranks, threads, machines and where the roles run (`ComputeSection` is the
part every job shares, `ResourceSection` adds RL placement and elastic sizes).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Literal

from hybridflow.config.loader import at_least
from hybridflow.errors import ConfigError


@dataclass
class ComputeSection:
    """Ranks and machines (the `resources` of every job; RL runs add the placement below).

    world_size: ranks in total (one per CPU slot or GPU); null = on GPUs one per local GPU,
        at most 8, rounded down to a power of two so batch sizes divide; on CPU with an
        embedded Ray 1 rank that gets every core as threads (on one machine, data-parallel
        ranks only add gloo traffic and model copies: 1 rank x 2 threads ran the GRPO step
        in half the time of 2 ranks x 1 thread on both the tiny and the SmolLM2 workload,
        README "GRPO step vs TRL"); on CPU joining a cluster one per local core as on GPUs.
    threads_per_rank: torch threads of each CPU rank (its Ray CPU share); null = the local
        cores divided by world_size (at least 1) with an embedded Ray (on a machine
        omp_wait_policy auto finds shared: the cores other work leaves free), else 1. GPU
        ranks reserve 1 CPU. Set it for bit-identical reruns of a big model on a machine
        whose load varies.
    omp_wait_policy: how the ranks' OpenMP (torch intra-op) threads wait at a barrier:
        "auto" looks at the cores for 0.3 s before the run starts and picks "passive" when
        other work keeps at least half a core busy, else "inherit" (the choice is printed
        and saved in config.yaml; controller/omp.py). "passive" sleeps at once, so that when
        another job shares the cores a waiting thread does not burn the run's CPU share;
        "short_spin" spins 1000 turns then sleeps; "inherit" keeps OMP_WAIT_POLICY /
        GOMP_SPINCOUNT as the environment sets them (unset: GNU OpenMP spins ~300000 turns
        first, the fastest on a quiet machine).
    use_gpu: one GPU per rank; false runs on CPU (gloo).
    ray_address: join this Ray cluster; null starts an embedded Ray on 127.0.0.1.
    nodes: machines the ranks are spread over (each its own node of the Ray cluster; more
        than 1 needs ray_address). Every role is placed on all of them, rank order filling
        one node after the other (docs/resilience.md, "Multi-node").
    ranks_per_node: ranks on each node; null = world_size / nodes (world_size null: one
        per local core or GPU on each node). world_size, when set too, must equal
        nodes * ranks_per_node.
    network_interface: the network interface (e.g. eth1) every rank's collectives (gloo,
        nccl) use on every node; null = on each node the interface that carries its Ray node
        IP, unless GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME are set there or here
        (controller/network.py).
    """

    world_size: int | None = None
    threads_per_rank: int | None = None
    omp_wait_policy: Literal["auto", "short_spin", "passive", "inherit"] = "auto"
    use_gpu: bool = False
    ray_address: str | None = None
    nodes: int = 1
    ranks_per_node: int | None = None
    network_interface: str | None = None

    def __post_init__(self) -> None:
        at_least(self, 1, "world_size", null="picked for the machine")
        at_least(self, 1, "threads_per_rank", null="local cores / world_size")
        at_least(self, 1, "nodes")
        at_least(self, 1, "ranks_per_node", null="world_size / nodes")
        if self.ranks_per_node is not None and self.world_size is not None \
                and self.world_size != self.nodes * self.ranks_per_node:
            raise ConfigError(f"{self.ranks_per_node} ranks on each of nodes={self.nodes} is "
                              f"{self.nodes * self.ranks_per_node} ranks, but world_size={self.world_size}; set "
                              "one of them (or make them agree)", "ranks_per_node")
        if self.ranks_per_node is None and self.world_size is not None and self.world_size % self.nodes:
            raise ConfigError(f"world_size={self.world_size} ranks do not split evenly over nodes={self.nodes}; "
                              "set ranks_per_node", "nodes")

    def process_on_nodes(self) -> list[int]:
        """Ranks per node, one entry per node (a `ResourcePool`'s process_on_nodes)."""
        return [self.resolved_world_size() // self.nodes] * self.nodes

    def resolved_world_size(self) -> int:
        if self.ranks_per_node is not None:
            return self.nodes * self.ranks_per_node
        if self.world_size is not None:
            return self.world_size
        return self.nodes * self._local_ranks()

    def _local_ranks(self) -> int:
        if self.use_gpu:
            import torch

            local = torch.cuda.device_count()
        elif self.ray_address is None:
            return 1
        else:
            local = local_cores()
        return 2 ** int(math.log2(max(1, min(local, 8))))

    def resolved_threads_per_rank(self, world_size: int) -> int:
        """Torch threads (= Ray CPUs) of each rank when the job has `world_size` ranks."""
        if self.threads_per_rank is not None:
            return self.threads_per_rank
        if self.use_gpu or self.ray_address is not None:
            return 1
        return max(1, local_cores() // world_size)


def local_cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@dataclass
class ResourceSection(ComputeSection):
    """Processes and where the roles run: ComputeSection's keys and

    placement: "colocated" (every role in the same processes, verl's default),
        "split" (actor and critic in separate processes; their log-prob/value calls and their updates
        overlap: trainer.concurrent_phases), or
        "auto" (the planner picks placement, critic_ranks and the tp sizes; docs/planner.md).
    critic_ranks: with split placement, ranks of the critic; the actor gets the rest.
    min_world_size / max_world_size: elastic restarts (trainer.max_restarts): when the
        cluster has fewer (or more) free slots after a failure, e.g. a lost node, the run
        continues on the largest world size in this range that the cluster holds and the
        batch sizes divide, loading its checkpoint resharded (null min: no elastic
        change, the run needs its world size back; null max: world_size).
    """

    placement: Literal["colocated", "split", "auto"] = "colocated"
    critic_ranks: int = 1
    min_world_size: int | None = None
    max_world_size: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "critic_ranks")
        at_least(self, 1, "min_world_size", "max_world_size", null="")
        if self.min_world_size is not None and self.max_world_size is not None \
                and self.min_world_size > self.max_world_size:
            raise ConfigError(f"{self.min_world_size} is above max_world_size={self.max_world_size}",
                              "min_world_size")

    def resolved_world_size(self) -> int:
        world = super().resolved_world_size()
        if self.world_size is None and self.placement == "split":
            return max(world, self.critic_ranks + 1)  # the actor keeps at least one rank
        return world
