"""Where each training rank's shard of every parameter sits in the full tensor.

The resharder only needs one fact per (parameter, rank): which contiguous chunk along
which dim the rank holds. FSDP2 (optionally on top of tensor parallelism) gives exactly
that when every shard placement of a parameter is on the same dim: each rank then holds
chunk `i` of `K` equal chunks along that dim (FSDP x TP nests the chunks, a
`_StridedShard`, and the chunk index comes out as tp_rank * dp + dp_rank). A parameter
sharded on two dims (FSDP's default dim 0 over a TP-split dim 1) cannot be gathered into a
generation shard without extra copies; `TrainingLayout` refuses it with a pointer to
`aligned_placement_fn`.

A dim the ranks do not divide (an odd vocabulary over 2 or 4 ranks) is split unevenly:
FSDP2 gives ceil-sized pieces and a shorter (or empty) last one, FSDP x TP nests two such
splits. Such a parameter is "ragged": its layout keeps each rank's (offset, length) and
the grouping gathers it whole (grouping.py), so no method needs equal chunks for it.

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
    # Uneven split only: (offset, length) along `dim` of each global rank's piece; chunk
    # indices then number the distinct pieces, and chunk_numel does not apply.
    ragged: tuple[tuple[int, int], ...] | None = None

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
        local = torch.tensor([_local_piece(p) for _, p in named], dtype=torch.int64).reshape(-1, 3)
        everyone = torch.empty((world, *local.shape), dtype=torch.int64)
        dist.all_gather(list(everyone.unbind(0)), local)
        params = [_param_layout(name, p, everyone[:, i]) for i, (name, p) in enumerate(named)]
        return cls(tuple(params), world)


def local_shard(param: torch.Tensor) -> torch.Tensor:
    """This rank's piece of a (possibly DTensor) parameter, as a plain tensor."""
    return param.to_local() if isinstance(param, DTensor) else param


# Codes a rank reports instead of a shard dim, so that every rank raises the same error
# after the all-gather rather than one rank raising and the others hanging in it.
_REPLICATED, _MULTI_DIM = -1, -2


def _local_piece(param: torch.Tensor) -> tuple[int, int, int]:
    """(shard dim or an error code, offset, length) of this rank's piece of one parameter."""
    if not isinstance(param, DTensor):
        return _REPLICATED, 0, 0
    shape = tuple(param.shape)
    local_shape, offset = compute_local_shape_and_global_offset(shape, param.device_mesh, param.placements)
    split = [d for d in range(len(shape)) if local_shape[d] != shape[d]]
    if not split:
        return _REPLICATED, 0, 0
    if len(split) > 1:
        return _MULTI_DIM, 0, 0
    d = split[0]
    return d, offset[d], local_shape[d]


def _param_layout(name: str, param: torch.Tensor, rows: torch.Tensor) -> ParamLayout:
    """Every rank's (code, offset, length) of one parameter -> its layout; raises alike on every rank."""
    shape, world = tuple(param.shape), rows.shape[0]
    codes = set(rows[:, 0].tolist())
    placements = getattr(param, "placements", None)
    if _MULTI_DIM in codes:
        raise ValueError(
            f"{name}: the training shard is split on more than one dim ({placements}); the "
            "resharder needs one shard dim per parameter. Shard FSDP on the tensor-parallel "
            "dim (hybridflow.engines.reshard.aligned_placement_fn)."
        )
    if len(codes) != 1:
        raise ValueError(f"{name}: the training ranks split shape {shape} on different dims ({placements})")
    dim = codes.pop()
    if dim == _REPLICATED:
        return ParamLayout(name, shape, None, 1, (0,) * world, param.dtype)
    pieces = [(int(offset), int(length)) for offset, length in rows[:, 1:].tolist()]
    distinct = sorted(set(pieces))
    _check_tiling(name, shape[dim], distinct)
    lengths = {length for _, length in distinct}
    if len(lengths) == 1:  # equal chunks tiling the dim: chunk i starts at i * length
        size = lengths.pop()
        return ParamLayout(name, shape, dim, shape[dim] // size, tuple(o // size for o, _ in pieces), param.dtype)
    return ParamLayout(name, shape, dim, len(distinct), tuple(distinct.index(piece) for piece in pieces),
                       param.dtype, ragged=tuple(pieces))


def _check_tiling(name: str, size: int, pieces: list[tuple[int, int]]) -> None:
    """The distinct non-empty pieces, by offset, must cover [0, size) once."""
    end = 0
    for offset, length in pieces:
        if length and offset != end:
            raise ValueError(f"{name}: the training ranks' pieces {pieces} do not cover its dim of {size} "
                             "exactly once")
        end += length
    if end != size:
        raise ValueError(f"{name}: the training ranks' pieces {pieces} cover {end} of its {size} rows")
