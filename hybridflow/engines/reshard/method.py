"""`ReshardMethod`: the names of `rollout.reshard_method` (grouping.py implements them).

Its own torch-free module so that config validation checks the name before torch is
imported.
"""

from __future__ import annotations

from enum import Enum


class ReshardMethod(str, Enum):
    """How training shards become generation shards (see module docstring)."""

    HYBRID = "hybrid"
    PLAIN = "plain"
    GATHER_ALL = "gather_all"

    @classmethod
    def parse(cls, value: "str | ReshardMethod") -> "ReshardMethod":
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"unknown reshard method {value!r}; choose one of {[m.value for m in cls]}") from None
