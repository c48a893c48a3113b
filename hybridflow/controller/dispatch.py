"""Split and collect functions of the built-in dispatch modes, and their input checks.

A dispatch mode turns one controller call ``wg.method(*args, **kwargs)`` into one
``(args, kwargs)`` per target rank (``split``), chooses whose outputs come back
(``select``) and combines them (``collect``). Everything here runs on the controller;
input that cannot be split raises `DispatchError` before any worker is called.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray

from hybridflow.controller.errors import DispatchError
from hybridflow.controller.futures import CallFuture, regroup
from hybridflow.controller.worker import MeshCoord
from hybridflow.protocol import DataProto

RankArgs = tuple[tuple, dict]


@dataclass(frozen=True)
class DispatchContext:
    """What a split/collect function knows about the call it serves."""

    label: str  # "role.method", for messages
    mode: str
    world_size: int  # number of ranks that run the call
    mesh: tuple[MeshCoord, ...] | None = None  # per rank, for mesh modes
    pad_size: int = 0  # set for collect: padding samples appended by the split


@dataclass
class Split:
    """Per-rank arguments of one call, and the padding the split appended (int or ref)."""

    per_rank: list[RankArgs]
    pad_size: int | ray.ObjectRef = 0


# ------------------------------------------------------------------------ whole values

def _whole(value: Any) -> Any:
    return value.whole_ref() if isinstance(value, CallFuture) else value


def _shared(value: Any, copies: int) -> Any:
    # The same DataProto sent to several ranks is put into the object store once and
    # passed by ref; otherwise Ray would serialize it again for every rank.
    value = _whole(value)
    if copies > 1 and isinstance(value, DataProto):
        return ray.put(value)
    return value


def split_one_to_all(ctx: DispatchContext, args: tuple, kwargs: dict) -> Split:
    """Every rank gets the same arguments."""
    shared_args = tuple(_shared(a, ctx.world_size) for a in args)
    shared_kwargs = {k: _shared(v, ctx.world_size) for k, v in kwargs.items()}
    return Split([(shared_args, shared_kwargs)] * ctx.world_size)


def split_per_rank(ctx: DispatchContext, args: tuple, kwargs: dict) -> Split:
    """Every argument is a list with one value per rank; rank i gets the i-th values."""
    named = [(f"argument {i}", a) for i, a in enumerate(args)] + [(f"argument {k!r}", v) for k, v in kwargs.items()]
    for what, value in named:
        if not isinstance(value, (list, tuple)):
            raise DispatchError(f"{ctx.label} ({ctx.mode}): {what} must be a list with one value per rank "
                                f"({ctx.world_size} ranks), got a {type(value).__name__}")
        if len(value) != ctx.world_size:
            raise DispatchError(f"{ctx.label} ({ctx.mode}): {what} has {len(value)} values but the group "
                                f"has {ctx.world_size} ranks; pass exactly one value per rank")
    return Split([
        (tuple(_whole(a[r]) for a in args), {k: _whole(v[r]) for k, v in kwargs.items()})
        for r in range(ctx.world_size)
    ])


def collect_list(ctx: DispatchContext, outputs: list) -> list:
    """All collected outputs, in rank order."""
    return list(outputs)


def collect_first(ctx: DispatchContext, outputs: list) -> Any:
    """The only collected output (rank zero's)."""
    return outputs[0]


# ------------------------------------------------------------------ data-parallel split

def split_dp_proto(ctx: DispatchContext, args: tuple, kwargs: dict, *, pad: bool) -> Split:
    """DataProto arguments are cut into one part per rank; other arguments go to all."""
    parts = _dp_parts(ctx, args, kwargs, ctx.world_size, pad)
    return Split([_for_dp_rank(parts, r) for r in range(ctx.world_size)], pad_size=parts.pad_size)


def split_mesh(ctx: DispatchContext, args: tuple, kwargs: dict, *, pad: bool) -> Split:
    """DataProto arguments are cut into one part per data-parallel rank of the mesh; each
    rank gets the part of the dp rank it registered (tp/pp peers get the same part)."""
    assert ctx.mesh is not None, "mesh dispatch without mesh coordinates"
    parts = _dp_parts(ctx, args, kwargs, ctx.mesh[0].dp_size, pad)
    return Split([_for_dp_rank(parts, coord.dp_rank) for coord in ctx.mesh], pad_size=parts.pad_size)


def select_mesh(ctx: DispatchContext) -> list[int]:
    """Ranks whose outputs are collected: the collecting rank of each dp rank, by dp rank."""
    assert ctx.mesh is not None
    collecting = [r for r, coord in enumerate(ctx.mesh) if coord.is_collect]
    return sorted(collecting, key=lambda r: ctx.mesh[r].dp_rank)


def collect_dp_proto(ctx: DispatchContext, outputs: list) -> Any:
    """DataProto outputs are concatenated in dp order and the split's padding is removed;
    other outputs come back as a list in dp order (padding ranks' values included)."""
    if outputs and all(isinstance(o, DataProto) for o in outputs):
        merged = DataProto.concat(outputs)
        return merged.unpad(ctx.pad_size) if ctx.pad_size else merged
    return list(outputs)


@dataclass
class _DpParts:
    args: list[Any]  # a list of n parts, or the value itself for arguments sent whole
    kwargs: dict[str, Any]
    split_args: list[bool]
    split_kwargs: dict[str, bool]
    pad_size: int | ray.ObjectRef


def _for_dp_rank(parts: _DpParts, dp_rank: int) -> RankArgs:
    args = tuple(a[dp_rank] if s else a for a, s in zip(parts.args, parts.split_args))
    kwargs = {k: (v[dp_rank] if parts.split_kwargs[k] else v) for k, v in parts.kwargs.items()}
    return args, kwargs


def _dp_parts(ctx: DispatchContext, args: tuple, kwargs: dict, n: int, pad: bool) -> _DpParts:
    named = [(f"argument {i}", a) for i, a in enumerate(args)] + [(f"argument {k!r}", v) for k, v in kwargs.items()]
    _check_proto_lengths(ctx, named, n, pad)
    if not any(isinstance(v, (DataProto, CallFuture)) for _, v in named):
        raise DispatchError(f"{ctx.label} ({ctx.mode}): no DataProto (or future of one) among the arguments; "
                            f"this mode splits DataProtos by data-parallel rank. Use ONE_TO_ALL to send plain values")
    pads: list[int | ray.ObjectRef] = []

    def cut(value: Any) -> tuple[Any, bool]:
        if isinstance(value, DataProto):
            padded, pad_size = value.pad_to_divisor(n)
            pads.append(pad_size)
            return padded.chunk(n), True
        if isinstance(value, CallFuture):
            refs, pad_size = regroup(value, n, pad, ctx.label)
            pads.append(pad_size)
            return refs, True
        return _shared(value, n), False

    cut_args = [cut(a) for a in args]
    cut_kwargs = {k: cut(v) for k, v in kwargs.items()}
    return _DpParts(
        args=[c for c, _ in cut_args], kwargs={k: c for k, (c, _) in cut_kwargs.items()},
        split_args=[s for _, s in cut_args], split_kwargs={k: s for k, (_, s) in cut_kwargs.items()},
        pad_size=pads[0],
    )


def _check_proto_lengths(ctx: DispatchContext, named: Sequence[tuple[str, Any]], n: int, pad: bool) -> None:
    lengths = {what: len(v) for what, v in named if isinstance(v, DataProto)}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{what} has {size}" for what, size in lengths.items())
        raise DispatchError(f"{ctx.label} ({ctx.mode}): DataProto arguments have different batch sizes ({listed}); "
                            f"they are split row by row, so they must have the same number of samples")
    for what, size in lengths.items():
        if size % n and not pad:
            raise DispatchError(f"{ctx.label} ({ctx.mode}): {what} has {size} samples, not divisible by the "
                                f"{n} data-parallel ranks, and padding is off; send a multiple of {n} samples "
                                f"or use a padding mode")
        if size == 0:
            raise DispatchError(f"{ctx.label} ({ctx.mode}): {what} is an empty DataProto; nothing to split")


# ----------------------------------------------------------------------- mesh checks

def check_mesh(label: str, name: str, coords: Sequence[MeshCoord | None]) -> tuple[MeshCoord, ...]:
    """Every rank registered mesh ``name`` consistently, one collecting rank per dp rank."""
    missing = [r for r, c in enumerate(coords) if c is None]
    if missing:
        raise DispatchError(f"{label}: ranks {missing} did not register dispatch mesh {name!r}; call "
                            f"self.register_dispatch_mesh({name!r}, dp_rank=..., dp_size=..., is_collect=...) "
                            f"on every rank (e.g. in __init__)")
    full = [c for c in coords if c is not None]
    sizes = sorted({c.dp_size for c in full})
    if len(sizes) != 1:
        raise DispatchError(f"{label}: ranks disagree on the dp size of mesh {name!r}: {sizes}")
    dp_size = sizes[0]
    served = {c.dp_rank for c in full}
    if served != set(range(dp_size)):
        raise DispatchError(f"{label}: mesh {name!r} has dp_size {dp_size} but no rank serves dp ranks "
                            f"{sorted(set(range(dp_size)) - served)}")
    for dp_rank in range(dp_size):
        collecting = [r for r, c in enumerate(full) if c.dp_rank == dp_rank and c.is_collect]
        if len(collecting) != 1:
            raise DispatchError(f"{label}: mesh {name!r} needs exactly one collecting rank per dp rank; "
                                f"dp rank {dp_rank} has {len(collecting)} (ranks {collecting})")
    return tuple(full)
