"""`@register`, the dispatch modes (`Dispatch`) and execution modes (`Execute`)."""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from hybridflow.controller import dispatch as _d

SplitFn = Callable[[_d.DispatchContext, tuple, dict], "_d.Split | list[tuple[tuple, dict]]"]
CollectFn = Callable[[_d.DispatchContext, list], Any]
SelectFn = Callable[[_d.DispatchContext], list[int]]
F = TypeVar("F", bound=Callable[..., Any])

REGISTER_ATTR = "__hybridflow_register__"


class Execute(enum.Enum):
    """Which ranks run a registered method."""

    ALL = "all"
    RANK_ZERO = "rank_zero"


@dataclass(frozen=True)
class DispatchMode:
    """How one call is split across ranks (``split``) and collected (``select``, ``collect``).

    ``split(ctx, args, kwargs)`` returns one ``(args, kwargs)`` per rank (or a `Split`);
    ``collect(ctx, outputs)`` combines the selected outputs; ``select(ctx)`` lists the
    ranks whose outputs are collected (default: all, in rank order).
    """

    name: str
    split: SplitFn
    collect: CollectFn
    select: SelectFn | None = None
    mesh: str | None = None  # mesh name whose coordinates the split needs
    rank_zero: bool = False  # only rank 0 runs; its output is the result
    proto_parts: bool = False  # collected outputs are one DataProto part per dp rank


def _dp_proto_mode(name: str, pad: bool) -> DispatchMode:
    return DispatchMode(name, functools.partial(_d.split_dp_proto, pad=pad), _d.collect_dp_proto, proto_parts=True)


class Dispatch:
    """The built-in dispatch modes, and constructors for parameterized ones."""

    ONE_TO_ALL = DispatchMode("ONE_TO_ALL", _d.split_one_to_all, _d.collect_list)
    ALL_TO_ALL = DispatchMode("ALL_TO_ALL", _d.split_per_rank, _d.collect_list)
    RANK_ZERO = DispatchMode("RANK_ZERO", _d.split_one_to_all, _d.collect_first, rank_zero=True)
    DP_COMPUTE = DispatchMode("DP_COMPUTE", _d.split_per_rank, _d.collect_list)
    DP_COMPUTE_PROTO = _dp_proto_mode("DP_COMPUTE_PROTO", pad=True)

    @staticmethod
    def dp_compute_proto(pad: bool) -> DispatchMode:
        """DP_COMPUTE_PROTO; with ``pad=False`` a batch that does not divide is refused."""
        return Dispatch.DP_COMPUTE_PROTO if pad else _dp_proto_mode("DP_COMPUTE_PROTO(pad=False)", pad=False)

    @staticmethod
    def MESH(name: str, pad: bool = True) -> DispatchMode:  # noqa: N802 - reads like the constants
        """Split by the data-parallel coordinates registered under mesh ``name``."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"Dispatch.MESH needs a mesh name (a non-empty str), got {name!r}")
        return DispatchMode(f"MESH({name!r})", functools.partial(_d.split_mesh, pad=pad), _d.collect_dp_proto,
                            select=_d.select_mesh, mesh=name, proto_parts=True)

    @staticmethod
    def get(name: str) -> DispatchMode:
        """A built-in (by constant name) or registered custom mode; unknown names raise."""
        builtin = getattr(Dispatch, name, None) if name.isupper() else None
        if isinstance(builtin, DispatchMode):
            return builtin
        if name in _CUSTOM:
            return _CUSTOM[name]
        known = [n for n, v in vars(Dispatch).items() if isinstance(v, DispatchMode)] + sorted(_CUSTOM)
        raise ValueError(f"unknown dispatch mode {name!r}; known modes: {known}. Register custom modes with "
                         f"register_dispatch_mode(name, split, collect) before using them")


_CUSTOM: dict[str, DispatchMode] = {}


def register_dispatch_mode(name: str, split: SplitFn, collect: CollectFn,
                           select: SelectFn | None = None) -> DispatchMode:
    """Add a custom mode usable as ``@register(dispatch=name)`` (or with the returned mode).

    Registering the same name again with the same functions is allowed (module reloads);
    with other functions it raises.
    """
    if not isinstance(name, str) or not name or (name.isupper() and hasattr(Dispatch, name)):
        raise ValueError(f"register_dispatch_mode: {name!r} is empty or the name of a built-in mode")
    mode = DispatchMode(name, split, collect, select=select)
    existing = _CUSTOM.get(name)
    if existing is not None and _fn_names(existing) != _fn_names(mode):
        raise ValueError(f"register_dispatch_mode: a different mode is already registered as {name!r}")
    _CUSTOM[name] = mode
    return mode


def _fn_names(mode: DispatchMode) -> list[str]:
    # Functions are compared by where they are defined: a re-imported module makes new
    # function objects for the same mode.
    fns = [mode.split, mode.collect, mode.select]
    return [f"{getattr(f, '__module__', '')}.{getattr(f, '__qualname__', repr(f))}" for f in fns]


@dataclass(frozen=True)
class MethodSpec:
    """What ``@register`` recorded on a worker method."""

    dispatch: DispatchMode
    execute: Execute
    blocking: bool

    @property
    def rank_zero(self) -> bool:
        return self.dispatch.rank_zero or self.execute is Execute.RANK_ZERO


def register(dispatch: DispatchMode | str = Dispatch.ONE_TO_ALL, execute: Execute = Execute.ALL,
             blocking: bool = True) -> Callable[[F], F]:
    """Mark a `Worker` method as callable through a `WorkerGroup`.

    ``blocking=False`` makes the group call return a future at once (see `CallFuture`).
    ``Dispatch.RANK_ZERO`` always runs on rank 0 alone, whatever ``execute`` says.
    """
    mode = Dispatch.get(dispatch) if isinstance(dispatch, str) else dispatch
    if not isinstance(mode, DispatchMode):
        raise TypeError(f"@register: dispatch must be a Dispatch mode or a registered mode name, got {dispatch!r}")
    if not isinstance(execute, Execute):
        raise TypeError(f"@register: execute must be Execute.ALL or Execute.RANK_ZERO, got {execute!r}")
    if not isinstance(blocking, bool):
        raise TypeError(f"@register: blocking must be True or False, got {blocking!r}")
    if mode.mesh is not None and execute is Execute.RANK_ZERO:
        raise ValueError(f"@register: {mode.name} runs on every rank of the mesh; it cannot use Execute.RANK_ZERO")
    spec = MethodSpec(dispatch=mode, execute=execute, blocking=blocking)

    def mark(fn: F) -> F:
        if not callable(fn):
            raise TypeError(f"@register decorates methods, got {fn!r}")
        setattr(fn, REGISTER_ATTR, spec)
        return fn

    return mark


def registered_methods(cls: type) -> dict[str, MethodSpec]:
    """``{method name: spec}`` for every ``@register`` method of ``cls`` and its bases."""
    found: dict[str, MethodSpec] = {}
    for klass in reversed(cls.__mro__):  # subclasses override their bases
        for name, member in vars(klass).items():
            spec = getattr(member, REGISTER_ATTR, None)
            if isinstance(spec, MethodSpec):
                found[name] = spec
            elif name in found:
                del found[name]  # overridden without @register: no longer remote-callable
    return found
