"""`ResourcePool`: process slots on nodes, reserved with Ray placement groups.

``ResourcePool([n0, n1])`` asks for n0 slots on one node and n1 on another. Each entry
becomes one placement group of STRICT_PACK bundles pinned to its own node. A slot is one
GPU (with ``cpus_per_slot`` CPUs) when ``use_gpu``, else a share of ``cpus_per_slot``
CPUs; ``max_colocate_count`` processes (separately spawned groups) may share a slot, each
taking that fraction of it. The CPU amount is Ray's logical count, so a test can run a
4-rank group on a 2-core machine by starting Ray with more logical CPUs.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

NODE_ID_LABEL = "ray.io/node-id"


@dataclass(frozen=True)
class Slot:
    """One process slot: a bundle of a placement group on a known node."""

    placement_group: PlacementGroup
    bundle_index: int
    node_id: str
    node_ip: str


class ResourcePool:
    """Process slots per node; reserved on first use (``slots()``), freed by ``release()``."""

    def __init__(self, process_on_nodes: Sequence[int], use_gpu: bool = False, max_colocate_count: int = 1,
                 cpus_per_slot: float = 1.0, ready_timeout_s: float = 60.0) -> None:
        counts = list(process_on_nodes)
        if not counts or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in counts):
            raise ValueError(f"ResourcePool: process_on_nodes must be a non-empty list of positive ints "
                             f"(slots per node), got {process_on_nodes!r}")
        if not isinstance(max_colocate_count, int) or max_colocate_count < 1:
            raise ValueError(f"ResourcePool: max_colocate_count must be a positive int, got {max_colocate_count!r}")
        if not cpus_per_slot > 0:
            raise ValueError(f"ResourcePool: cpus_per_slot must be > 0, got {cpus_per_slot!r}")
        self.process_on_nodes = counts
        self.use_gpu = bool(use_gpu)
        self.max_colocate_count = max_colocate_count
        self.cpus_per_slot = float(cpus_per_slot)
        self.ready_timeout_s = ready_timeout_s
        self._parent: ResourcePool | None = None
        self._range = (0, sum(counts))
        self._slots: list[Slot] | None = None
        self._groups: list[PlacementGroup] = []
        self._claims = [0] * sum(counts)  # processes placed in each slot (root pool only)

    def __repr__(self) -> str:
        kind = "gpu" if self.use_gpu else f"cpu x{self.cpus_per_slot:g}"
        return f"ResourcePool({self.process_on_nodes}, {kind}, max_colocate_count={self.max_colocate_count})"

    @property
    def world_size(self) -> int:
        return self._range[1] - self._range[0]

    def actor_options(self) -> dict[str, float]:
        """Ray resources each process takes from its slot."""
        share = 1.0 / self.max_colocate_count
        return {"num_cpus": self.cpus_per_slot * share, "num_gpus": share if self.use_gpu else 0.0}

    def slots(self) -> list[Slot]:
        """The pool's slots in rank order, reserving the placement groups on first use."""
        if self._parent is not None:
            start, stop = self._range
            return self._parent.slots()[start:stop]
        if self._slots is None:
            self._slots = self._reserve()
        return self._slots

    def claim(self) -> list[Slot]:
        """Reserve one process place in every slot of this pool (a worker group does this);
        more than ``max_colocate_count`` groups on the same slots is refused at once, where
        Ray would leave the extra processes waiting for resources forever."""
        root, (start, stop) = self._root(), self._range
        if any(root._claims[i] >= self.max_colocate_count for i in range(start, stop)):
            raise RuntimeError(
                f"{self!r}: its slots already host {self.max_colocate_count} worker group(s); raise "
                f"max_colocate_count, colocate the roles in one group (create_colocated_worker_groups), "
                f"or shut a group down first"
            )
        slots = self.slots()
        for i in range(start, stop):
            root._claims[i] += 1
        return slots

    def unclaim(self) -> None:
        """Give back the places taken by `claim` (when a group shuts down)."""
        root, (start, stop) = self._root(), self._range
        for i in range(start, stop):
            root._claims[i] = max(0, root._claims[i] - 1)

    def split(self, sizes: Sequence[int]) -> list[ResourcePool]:
        """Consecutive sub-pools of ``sizes`` slots (summing to the world size) that share
        this pool's reservation, e.g. ``ResourcePool([4]).split([2, 2])``."""
        sizes = list(sizes)
        if any(not isinstance(s, int) or s < 1 for s in sizes) or sum(sizes) != self.world_size:
            raise ValueError(f"ResourcePool.split: sizes {sizes} must be positive ints summing to the pool's "
                             f"{self.world_size} slots")
        node_of_slot = [i for i, n in enumerate(self._root_counts()) for _ in range(n)][self._range[0]:self._range[1]]
        pools, start = [], 0
        for size in sizes:
            nodes = node_of_slot[start:start + size]
            sub = ResourcePool([nodes.count(i) for i in dict.fromkeys(nodes)], use_gpu=self.use_gpu,
                               max_colocate_count=self.max_colocate_count, cpus_per_slot=self.cpus_per_slot,
                               ready_timeout_s=self.ready_timeout_s)
            sub._parent = self._root()
            sub._range = (self._range[0] + start, self._range[0] + start + size)
            pools.append(sub)
            start += size
        return pools

    def release(self) -> None:
        """Free the placement groups (of the whole pool, sub-pools included)."""
        root = self._root()
        for group in root._groups:
            remove_placement_group(group)
        root._groups, root._slots = [], None
        root._claims = [0] * len(root._claims)

    # ----------------------------------------------------------------------- internals

    def _root(self) -> ResourcePool:
        return self._parent._root() if self._parent is not None else self

    def _root_counts(self) -> list[int]:
        return self._root().process_on_nodes

    def _bundle(self) -> dict[str, float]:
        bundle = {"CPU": self.cpus_per_slot}
        if self.use_gpu:
            bundle["GPU"] = 1.0
        return bundle

    def _reserve(self) -> list[Slot]:
        bundle = self._bundle()
        nodes = _pick_nodes(self.process_on_nodes, bundle)
        for count, node in zip(self.process_on_nodes, nodes):
            self._groups.append(placement_group(
                [bundle] * count, strategy="STRICT_PACK",
                bundle_label_selector=[{NODE_ID_LABEL: node["NodeID"]}] * count,
            ))
        ready, _ = ray.wait([g.ready() for g in self._groups], num_returns=len(self._groups),
                            timeout=self.ready_timeout_s)
        if len(ready) < len(self._groups):
            self.release()
            raise RuntimeError(
                f"{self!r}: could not reserve {self.process_on_nodes} slots of {bundle} within "
                f"{self.ready_timeout_s} s; other pools or tasks hold the resources "
                f"(available now: {ray.available_resources()}). Release unused pools or ask for fewer slots"
            )
        return [Slot(group, index, node["NodeID"], node["NodeManagerAddress"])
                for group, count, node in zip(self._groups, self.process_on_nodes, nodes) for index in range(count)]


def _node_order(node: dict[str, Any]) -> tuple:
    try:
        ip = (0, int(ipaddress.ip_address(node["NodeManagerAddress"])))
    except ValueError:
        ip = (1, 0)
    head = 0 if "node:__internal_head__" in node["Resources"] else 1
    return ip, head, node["NodeID"]


def _fits(resources: dict[str, float], bundle: dict[str, float], count: int) -> bool:
    return all(resources.get(key, 0.0) + 1e-9 >= amount * count for key, amount in bundle.items())


def _pick_nodes(counts: list[int], bundle: dict[str, float]) -> list[dict[str, Any]]:
    """One distinct node per entry: the first (in stable order) with the room free now,
    else the first big enough (the reservation then waits for it)."""
    nodes = sorted((n for n in ray.nodes() if n["Alive"]), key=_node_order)
    free = _available_per_node()
    chosen: list[dict[str, Any]] = []
    for entry, count in enumerate(counts):
        unused = [n for n in nodes if all(n["NodeID"] != c["NodeID"] for c in chosen)]
        big_enough = [n for n in unused if _fits(n["Resources"], bundle, count)]
        if not big_enough:
            sizes = {n["NodeManagerAddress"] + "/" + n["NodeID"][:8]: {k: n["Resources"].get(k, 0) for k in bundle}
                     for n in nodes}
            raise ValueError(
                f"ResourcePool{counts}: entry {entry} needs {count} slots of {bundle} on one node, and no "
                f"other node of the cluster has that much (nodes: {sizes}). Each entry of process_on_nodes "
                f"is a separate node; use fewer or smaller entries"
            )
        roomy = [n for n in big_enough if _fits(free.get(n["NodeID"], {}), bundle, count)]
        chosen.append((roomy or big_enough)[0])
    return chosen


def _available_per_node() -> dict[str, dict[str, float]]:
    # Ray has no public per-node "available" query; without it we fall back to node
    # order alone, which is still correct, only less clever about busy nodes.
    try:
        from ray._private.state import available_resources_per_node

        return available_resources_per_node()
    except Exception:  # noqa: BLE001 - any change of the private API: use the fallback
        return {}


