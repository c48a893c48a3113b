"""Where each training rank's shard of every parameter sits in the full tensor."""

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
    chunks: chunks[i] is the chunk index held by rank i of the parameter's stage (the
        global rank when there is one stage); with K < stage size several ranks hold the
        same chunk (e.g. norms under tensor parallelism).
    stage: the pipeline stage whose ranks hold the parameter (0 without pipelining).
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
    stage: int = 0

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
        """Stage-local ranks holding `chunk`, in rank order."""
        return [r for r, c in enumerate(self.chunks) if c == chunk]


@dataclass(frozen=True)
class TrainingLayout:
    """ParamLayout of every parameter: stage by stage, each in the training engine's order.

    num_stages: p, the pipeline stages; stage s is global ranks [s N/p, (s+1) N/p).
    """

    params: tuple[ParamLayout, ...]
    world_size: int
    num_stages: int = 1

    def __post_init__(self) -> None:
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise ValueError("TrainingLayout has duplicate parameter names")
        if self.num_stages < 1 or self.world_size % self.num_stages:
            raise ValueError(f"{self.num_stages} pipeline stages do not divide the {self.world_size} training ranks")
        for p in self.params:
            if not 0 <= p.stage < self.num_stages or len(p.chunks) != self.stage_size:
                raise ValueError(f"{p.name}: stage {p.stage} with {len(p.chunks)} chunk entries does not fit "
                                 f"{self.num_stages} stages of {self.stage_size} ranks")

    @property
    def stage_size(self) -> int:
        """N / p: the ranks of one pipeline stage."""
        return self.world_size // self.num_stages

    def stage_of(self, rank: int) -> int:
        return rank // self.stage_size

    def local_rank(self, rank: int) -> int:
        """The rank's position inside its stage."""
        return rank % self.stage_size

    def global_rank(self, stage: int, local: int) -> int:
        return stage * self.stage_size + local

    def stage_params(self, stage: int) -> list[ParamLayout]:
        return [p for p in self.params if p.stage == stage]

    def by_name(self) -> dict[str, ParamLayout]:
        return {p.name: p for p in self.params}

    @classmethod
    def from_named_parameters(cls, named: Iterable[tuple[str, torch.Tensor]]) -> "TrainingLayout":
        """Collective over the default group (the training world): describe every parameter.

        Ranks holding different parameter sets are pipeline stages (module docstring);
        chunk lists are indexed by the rank's position in its stage.
        """
        local = [(name, tuple(p.shape), p.dtype, str(getattr(p, "placements", None)), _local_piece(p))
                 for name, p in named]
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, local)
        return cls.from_rank_pieces(everyone)

    @classmethod
    def from_rank_pieces(cls, everyone: list[list[tuple]]) -> "TrainingLayout":
        """From every rank's [(name, shape, dtype, placements text, (code, offset, length))],
        indexed by global rank; the same on every rank, so any error is raised everywhere."""
        world = len(everyone)
        stages = _stage_blocks([[entry[0] for entry in entries] for entries in everyone])
        size = world // len(stages)
        params = []
        for s, names in enumerate(stages):
            block = everyone[s * size:(s + 1) * size]
            for i, (name, shape, dtype, placements, _) in enumerate(block[0]):
                rows = torch.tensor([entries[i][4] for entries in block], dtype=torch.int64)
                params.append(_layout_of(name, shape, dtype, placements, rows, s))
        return cls(tuple(params), world, len(stages))


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


def _stage_blocks(names_per_rank: list[list[str]]) -> list[list[str]]:
    """The parameter names of each pipeline stage: the ranks must form equal blocks of
    consecutive ranks holding one name list each, disjoint between blocks (one block
    without pipelining)."""
    world = len(names_per_rank)
    blocks: list[list[str]] = []
    for names in names_per_rank:
        if not blocks or names != blocks[-1]:
            blocks.append(names)
    seen: set[str] = set()
    for names in blocks:
        if seen & set(names):
            break
        seen |= set(names)
    else:
        size = world // len(blocks)
        if world % len(blocks) == 0 and all(names_per_rank[r] == blocks[r // size] for r in range(world)):
            return blocks
    raise ValueError(
        "the training ranks hold parameter sets that are neither one model nor pipeline stages "
        "(equal blocks of consecutive ranks with disjoint parameters): "
        f"{[len(n) for n in names_per_rank]} parameters per rank")


def _param_layout(name: str, param: torch.Tensor, rows: torch.Tensor) -> ParamLayout:
    """Every rank's (code, offset, length) of one parameter -> its layout; raises alike on every rank."""
    return _layout_of(name, tuple(param.shape), param.dtype, str(getattr(param, "placements", None)), rows, 0)


def _layout_of(name: str, shape: tuple[int, ...], dtype: torch.dtype, placements: str, rows: torch.Tensor,
               stage: int) -> ParamLayout:
    """The layout of one parameter from its stage's ranks' (code, offset, length) rows."""
    world = rows.shape[0]
    codes = set(rows[:, 0].tolist())
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
        return ParamLayout(name, shape, None, 1, (0,) * world, dtype, stage=stage)
    pieces = [(int(offset), int(length)) for offset, length in rows[:, 1:].tolist()]
    distinct = sorted(set(pieces))
    _check_tiling(name, shape[dim], distinct)
    lengths = {length for _, length in distinct}
    if len(lengths) == 1:  # equal chunks tiling the dim: chunk i starts at i * length
        size = lengths.pop()
        return ParamLayout(name, shape, dim, shape[dim] // size, tuple(o // size for o, _ in pieces), dtype,
                           stage=stage)
    return ParamLayout(name, shape, dim, len(distinct), tuple(distinct.index(piece) for piece in pieces),
                       dtype, ragged=tuple(pieces), stage=stage)


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
