"""Where each training rank's shard of every parameter sits in the full tensor.

The resharder only needs one fact per (parameter, rank): which contiguous chunk along
which dim the rank holds. FSDP2 (optionally on top of tensor parallelism) gives exactly
that when every shard placement of a parameter is on the same dim: each rank then holds
chunk `i` of `K` equal chunks along that dim (FSDP x TP nests the chunks, a
`_StridedShard`, and the chunk index comes out as tp_rank * dp + dp_rank). A parameter
sharded on two dims (FSDP's default dim 0 over a TP-split dim 1) cannot be gathered into a
generation shard without extra copies; `TrainingLayout` refuses it with a pointer to
`aligned_placement_fn`.

`TrainingLayout.from_named_parameters` is collective: every rank computes its own chunk
index from its DTensor and one small all-gather shares them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset


@dataclass(frozen=True)
class ParamLayout:
    """Training layout of one parameter over all ranks of the world.

    dim: the tensor dim split into chunks (None: every rank holds the whole tensor).
    num_chunks: K, the number of equal chunks along `dim` (1 when dim is None).
    chunks: chunks[r] is the chunk index held by global rank r; with K < world size
        several ranks hold the same chunk (e.g. norms under tensor parallelism).
    """

    name: str
    shape: tuple[int, ...]
    dim: int | None
    num_chunks: int
    chunks: tuple[int, ...]
    train_dtype: torch.dtype

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def chunk_numel(self) -> int:
        return self.numel // self.num_chunks

    def holders(self, chunk: int) -> list[int]:
        """Ranks holding `chunk`, in rank order."""
        return [r for r, c in enumerate(self.chunks) if c == chunk]


@dataclass(frozen=True)
class TrainingLayout:
    """ParamLayout of every parameter, in the training engine's parameter order."""

    params: tuple[ParamLayout, ...]
    world_size: int

    def __post_init__(self) -> None:
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise ValueError("TrainingLayout has duplicate parameter names")

    def by_name(self) -> dict[str, ParamLayout]:
        return {p.name: p for p in self.params}

    @classmethod
    def from_named_parameters(cls, named: Iterable[tuple[str, torch.Tensor]]) -> "TrainingLayout":
        """Collective over the default group (the training world): describe every parameter.

        Chunk lists are indexed by global rank, which the grouping and the process
        groups use too.
        """
        named = list(named)
        world = dist.get_world_size()
        local = torch.tensor([_local_chunk(name, p) for name, p in named], dtype=torch.int64).reshape(-1, 3)
        everyone = torch.empty((world, *local.shape), dtype=torch.int64)
        dist.all_gather(list(everyone.unbind(0)), local)
        params = []
        for i, (name, p) in enumerate(named):
            _check_agreement(name, p, everyone[:, i])
            dim, count = int(everyone[0, i, 0]), int(everyone[0, i, 1])
            params.append(ParamLayout(
                name=name,
                shape=tuple(p.shape),
                dim=None if dim < 0 else dim,
                num_chunks=count,
                chunks=tuple(int(c) for c in everyone[:, i, 2]),
                train_dtype=p.dtype,
            ))
        return cls(tuple(params), world)


def local_shard(param: torch.Tensor) -> torch.Tensor:
    """This rank's piece of a (possibly DTensor) parameter, as a plain tensor."""
    return param.to_local() if isinstance(param, DTensor) else param


# Codes a rank reports instead of a shard dim, so that every rank raises the same error
# after the all-gather rather than one rank raising and the others hanging in it.
_REPLICATED, _MULTI_DIM, _UNEVEN = -1, -2, -3


def _local_chunk(name: str, param: torch.Tensor) -> tuple[int, int, int]:
    """(shard dim or an error code, chunk count, this rank's chunk index) of one parameter."""
    if not isinstance(param, DTensor):
        return _REPLICATED, 1, 0
    shape = tuple(param.shape)
    local_shape, offset = compute_local_shape_and_global_offset(shape, param.device_mesh, param.placements)
    split = [d for d in range(len(shape)) if local_shape[d] != shape[d]]
    if not split:
        return _REPLICATED, 1, 0
    if len(split) > 1:
        return _MULTI_DIM, 0, 0
    d = split[0]
    size = local_shape[d]
    if size == 0 or shape[d] % size or offset[d] % size:
        return _UNEVEN, 0, 0
    return d, shape[d] // size, offset[d] // size


def _check_agreement(name: str, param: torch.Tensor, rows: torch.Tensor) -> None:
    """Raise (on every rank alike) unless all ranks hold equal chunks along one dim."""
    codes = set(rows[:, 0].tolist())
    placements = getattr(param, "placements", None)
    if _MULTI_DIM in codes:
        raise ValueError(
            f"{name}: the training shard is split on more than one dim ({placements}); the "
            "resharder needs one shard dim per parameter. Shard FSDP on the tensor-parallel "
            "dim (hybridflow.engines.reshard.aligned_placement_fn)."
        )
    if _UNEVEN in codes or len(codes) != 1 or len(set(rows[:, 1].tolist())) != 1:
        raise ValueError(
            f"{name}: shape {tuple(param.shape)} is sharded unevenly over the training ranks "
            f"({placements}); pick model sizes divisible by the number of training ranks"
        )
    count = int(rows[0, 1])
    held = set(rows[:, 2].tolist())
    if held != set(range(count)):
        raise ValueError(f"{name}: the training ranks hold chunks {sorted(held)} of {count}, not all of them")
