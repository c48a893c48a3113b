"""What a policy network needs to know about an action space, without Gymnasium."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ActionKind = Literal["discrete", "multi_discrete", "box"]


@dataclass(frozen=True)
class ActionSpec:
    kind: ActionKind
    nvec: tuple[int, ...] = ()  # options per dimension (discrete: one entry)
    low: tuple[float, ...] = ()  # box bounds, one per dimension
    high: tuple[float, ...] = ()
    start: tuple[int, ...] = ()  # discrete offsets the environment expects

    def __post_init__(self) -> None:
        if self.kind in ("discrete", "multi_discrete"):
            if not self.nvec or any(n < 1 for n in self.nvec):
                raise ValueError(f"{self.kind} action space needs positive option counts, got {self.nvec}")
            if self.kind == "discrete" and len(self.nvec) != 1:
                raise ValueError(f"a discrete action space has one dimension, got nvec {self.nvec}")
        elif self.kind == "box":
            if not self.low or len(self.low) != len(self.high):
                raise ValueError(f"box action space needs low and high of one length, got {self.low}, {self.high}")
            if any(not lo < hi for lo, hi in zip(self.low, self.high)):
                raise ValueError(f"box action space needs low < high in every dimension, got {self.low}, {self.high}")
        else:
            raise ValueError(f"unknown action kind {self.kind!r}; expected discrete, multi_discrete or box")

    @property
    def dim(self) -> int:
        """Numbers per action: 1 (discrete), len(nvec) (multi-discrete), len(low) (box)."""
        return len(self.low) if self.kind == "box" else len(self.nvec)

    @property
    def is_continuous(self) -> bool:
        return self.kind == "box"
