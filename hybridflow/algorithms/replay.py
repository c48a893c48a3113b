"""A replay buffer of transitions for off-policy learning (SAC): a ring of fixed capacity.

    buffer = ReplayBuffer(capacity=100_000, fields={"observations": (3,), "actions": (1,), ...})
    buffer.add({"observations": obs [n, 3], "actions": act [n, 1], ...})
    batch = buffer.sample(256, generator)          # uniform, with replacement
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

Tensor = torch.Tensor


class ReplayBuffer:
    """Transitions of named fields, each of a fixed per-row shape (float32 unless given)."""

    def __init__(self, capacity: int, fields: Mapping[str, tuple[int, ...]],
                 dtypes: Mapping[str, torch.dtype] | None = None) -> None:
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"ReplayBuffer: capacity must be a positive int, got {capacity!r}")
        if not fields:
            raise ValueError("ReplayBuffer: give at least one field")
        dtypes = dict(dtypes or {})
        self.capacity = capacity
        self.storage = {name: torch.zeros((capacity, *shape), dtype=dtypes.get(name, torch.float32))
                        for name, shape in fields.items()}
        self.position = 0  # next row to write
        self.size = 0  # rows holding a transition

    def __len__(self) -> int:
        return self.size

    def add(self, batch: Mapping[str, Tensor]) -> None:
        """Append n transitions (every field, n rows each), overwriting the oldest when full."""
        if set(batch) != set(self.storage):
            raise KeyError(f"ReplayBuffer.add: got fields {sorted(batch)}, the buffer stores {sorted(self.storage)}")
        sizes = {name: len(t) for name, t in batch.items()}
        n = next(iter(sizes.values()))
        if any(size != n for size in sizes.values()):
            raise ValueError(f"ReplayBuffer.add: fields have different numbers of rows: {sizes}")
        if n > self.capacity:  # only the newest `capacity` rows would survive anyway
            batch = {name: t[n - self.capacity:] for name, t in batch.items()}
            n = self.capacity
        rows = (self.position + torch.arange(n)) % self.capacity
        for name, t in batch.items():
            store = self.storage[name]
            if t.shape[1:] != store.shape[1:]:
                raise ValueError(f"ReplayBuffer.add: {name} rows have shape {tuple(t.shape[1:])}, "
                                 f"the buffer stores {tuple(store.shape[1:])}")
            store[rows] = t.to(store.dtype)
        self.position = (self.position + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int, generator: torch.Generator) -> dict[str, Tensor]:
        """`batch_size` stored transitions drawn uniformly with replacement."""
        if self.size == 0:
            raise RuntimeError("ReplayBuffer.sample: the buffer is empty; add transitions first")
        index = torch.randint(0, self.size, (batch_size,), generator=generator)
        return {name: store[index] for name, store in self.storage.items()}

    def state_dict(self) -> dict[str, Any]:
        """The stored rows (only the filled part) and the write position."""
        return {"capacity": self.capacity, "position": self.position, "size": self.size,
                "storage": {name: store[:self.size].clone() for name, store in self.storage.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state["capacity"] != self.capacity:
            raise ValueError(f"ReplayBuffer.load_state_dict: saved capacity {state['capacity']} != {self.capacity}")
        for name, rows in state["storage"].items():
            self.storage[name][:len(rows)] = rows
        self.position, self.size = int(state["position"]), int(state["size"])
