"""Exact accounting of a transition: bytes moved by our collectives and parameter memory.

Communication convention (as in the paper's Table 2): an all-gather over a group of g
ranks whose output holds O bytes costs each rank (g - 1) / g * O bytes, the bytes it
receives (a ring sends as many as it receives); a broadcast of O bytes costs each receiving
rank O and the sender nothing (pipeline stages, grouping.py). Only the collectives the resharder
issues are counted; there are no others in a transition.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass
class CommMeter:
    """Counts the per-rank volume and number of the all-gathers it issues."""

    bytes: int = 0
    calls: int = 0

    def all_gather(self, buffer: torch.Tensor, positions: tuple[int, ...], me: int,
                   group: dist.ProcessGroup | None) -> None:
        """Gather into `buffer` [g, ...]: group rank i's piece lands in buffer[positions[i]].

        `buffer[positions[me]]` already holds this rank's piece and is the input (an
        in-place gather: the local piece is not copied a second time). Pieces in group
        rank order take one all_gather_into_tensor; other orders take the list form.
        """
        g = buffer.shape[0]
        own = buffer[positions[me]]
        if list(positions) == list(range(g)):
            _all_gather_flat(buffer.view(-1), own.view(-1), group)
        else:
            dist.all_gather([buffer[p] for p in positions], own, group=group)
        self.bytes += (g - 1) * nbytes(own)
        self.calls += 1


    def broadcast(self, tensor: torch.Tensor, src: int, group: dist.ProcessGroup) -> None:
        """`src` (a global rank) sends `tensor` (contiguous) to the group; every other member receives it."""
        if not tensor.is_contiguous():
            raise ValueError("broadcast needs a contiguous tensor (its bytes go over the wire as laid out)")
        dist.broadcast(tensor, src=src, group=group)
        if dist.get_rank() != src:
            self.bytes += nbytes(tensor)
        self.calls += 1


def _all_gather_flat(output: torch.Tensor, own: torch.Tensor, group: dist.ProcessGroup | None) -> None:
    # torch 2.13 renamed all_gather_into_tensor to all_gather_single; keep older torch working.
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(output, own, group=group)


@dataclass
class MemoryLedger:
    """Live and peak parameter bytes, split into training / generation / buffers."""

    train: int = 0
    generation: int = 0
    buffers: int = 0
    peak: int = 0
    peak_buffers: int = 0

    @property
    def live(self) -> int:
        return self.train + self.generation + self.buffers

    def _update(self) -> None:
        self.peak = max(self.peak, self.live)
        self.peak_buffers = max(self.peak_buffers, self.buffers)

    def set_train(self, n: int) -> None:
        self.train = n
        self._update()

    def set_generation(self, n: int) -> None:
        self.generation = n
        self._update()

    def alloc(self, n: int) -> None:
        self.buffers += n
        self._update()

    def free(self, n: int) -> None:
        if n > self.buffers:
            raise RuntimeError(f"freeing {n} buffer bytes but only {self.buffers} are live")
        self.buffers -= n
