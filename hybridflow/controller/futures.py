"""Results of worker-group calls: waiting for them and handing them on.

A call submits one Ray task per rank and gets one ObjectRef per rank. `gather` waits for
all of them but fails as soon as any one fails, so a dead or raising rank never leaves the
controller waiting on ranks that are stuck in a collective with it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import ray
import torch
from ray.exceptions import RayActorError, RayError, RayTaskError

from hybridflow.controller.errors import CallTimeoutError, DispatchError, WorkerError
from hybridflow.protocol import DataProto

if TYPE_CHECKING:
    from hybridflow.controller.decorator import DispatchMode
    from hybridflow.controller.dispatch import DispatchContext

@dataclass
class FetchLedger:
    """What the controller fetched from workers: values, and the bytes of the tensors and
    numpy arrays inside them (nested in DataProtos, dicts, lists and tuples)."""

    values: int = 0
    tensor_bytes: int = 0

    def add(self, value: Any) -> None:
        self.values += 1
        self.tensor_bytes += payload_bytes(value)


LEDGER = FetchLedger()


def payload_bytes(value: Any) -> int:
    """Bytes of the torch tensors and numpy arrays in `value` (0 for plain scalars and strings)."""
    if isinstance(value, torch.Tensor):
        return value.nelement() * value.element_size()
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, DataProto):
        return payload_bytes(value.batch) + payload_bytes(value.non_tensor_batch) + payload_bytes(value.meta_info)
    if isinstance(value, dict):
        return sum(payload_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(payload_bytes(v) for v in value)
    return 0


# What a call's label gets when the failure was in fetching its padding size (a ref).
PADDING_LABEL = " (padding size)"
# How often a pending call re-checks for a failed rank; it bounds how late a death is seen.
POLL_S = 0.2
# After a first failure, how long to wait for other ranks' failures (see _late_failures).
DEATH_GRACE_S = 3.0


@dataclass(frozen=True)
class RankInfo:
    """Who runs a task: used to name the worker in errors."""

    role: str
    rank: int
    node: str
    pid: int | None


def gather(refs: list[ray.ObjectRef], owners: list[RankInfo], method: str | Sequence[str],
           timeout_s: float | None = None, arrivals: list[float] | None = None) -> list[Any]:
    """Values of ``refs`` in order; a failure raises `WorkerError` within seconds.

    `method` names the call in errors: one label, or one per ref (refs of several calls
    gathered together, `gather_calls`). `arrivals`, when given, receives each value's
    arrival time (time.monotonic() when it was fetched), by position."""
    position = {ref: i for i, ref in enumerate(refs)}
    labels = [method] * len(refs) if isinstance(method, str) else list(method)
    results: list[Any] = [None] * len(refs)
    arrived = arrivals if arrivals is not None else []
    arrived[:] = [math.nan] * len(refs)
    pending = list(refs)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while pending:
        wait_s = POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic()))
        ready, pending = ray.wait(pending, num_returns=len(pending), timeout=wait_s)
        failures = _fetch(ready, position, results, arrived)
        if failures:
            failures += _late_failures(pending, position)
            raise _primary_error(failures, owners, labels)
        if pending and deadline is not None and time.monotonic() >= deadline:
            late = [position[r] for r in pending]
            raise _timeout_error([owners[i] for i in late], labels[late[0]], timeout_s)
    return results


def _fetch(ready: list[ray.ObjectRef], position: dict, results: list[Any],
           arrived: list[float]) -> list[tuple[int, RayError]]:
    """Store the values of ``ready`` refs (and when they came); return (index, error) of those that failed."""
    try:
        values = ray.get(ready)
    except RayError:
        values = None
    now = time.monotonic()
    if values is not None:
        for ref, value in zip(ready, values):
            results[position[ref]] = value
            arrived[position[ref]] = now
            LEDGER.add(value)
        return []
    failures = []
    for ref in ready:  # one failed: fetch one by one to know which
        try:
            results[position[ref]] = ray.get(ref)
            arrived[position[ref]] = now
            LEDGER.add(results[position[ref]])
        except RayError as err:
            failures.append((position[ref], err))
    return failures


def _late_failures(pending: list[ray.ObjectRef], position: dict) -> list[tuple[int, RayError]]:
    # A rank that dies makes its peers' collectives fail, often before Ray has noticed
    # the death. Give the other ranks a moment so the death, the cause, is what we report.
    if not pending:
        return []
    ready, _ = ray.wait(pending, num_returns=len(pending), timeout=DEATH_GRACE_S)
    return _fetch(ready, position, [None] * len(position), [math.nan] * len(position))


def _primary_error(failures: list[tuple[int, RayError]], owners: list[RankInfo], labels: list[str]) -> WorkerError:
    """The error to raise: a death before an exception, then the lowest rank, then the
    earliest ref (refs are in submission order); the others are listed in its message.

    The last key names the call a process actually failed in: a process runs its calls in
    submission order, and a call starts there only once the controller holds the result
    of the one before it (worker_group.HostSet.submit), so its later calls that failed too
    never ran (they fail with its death, or with its exception passed on)."""
    failures.sort(key=lambda f: (not isinstance(f[1], RayActorError), owners[f[0]].rank, f[0]))
    index, err = failures[0]
    primary = to_worker_error(err, owners[index], labels[index])
    others = [f"{owners[i].role} rank {owners[i].rank}: {type(e).__name__}" for i, e in failures[1:]]
    if others:
        primary.args = (f"{primary.args[0]}\nAlso failed: {'; '.join(others)}",)
    primary.__cause__ = err
    return primary


def _timeout_error(late: list[RankInfo], method: str, timeout_s: float) -> CallTimeoutError:
    late = sorted(late, key=lambda owner: owner.rank)
    where = ", ".join(f"rank {o.rank} (node {o.node}, pid {o.pid})" for o in late)
    message = (f"{method}: {late[0].role} {where} did not finish within {timeout_s:g} s (a hang, e.g. in a "
               "collective; raise the call's time limit if the work is only slow)")
    return CallTimeoutError(message, role=late[0].role, late_ranks=[o.rank for o in late], node=late[0].node,
                            pid=late[0].pid, method=method, timeout_s=timeout_s)


def to_worker_error(err: RayError, owner: RankInfo, method: str) -> WorkerError:
    """Name the worker, the call and the cause (with the worker's traceback)."""
    where = f"{owner.role} rank {owner.rank} (node {owner.node}, pid {owner.pid})"
    if isinstance(err, RayTaskError):
        # str() of Ray's task error is the worker-side traceback (the dual-class instance
        # that ray.get raises does not keep the traceback_str attribute). The message leads
        # with the exception itself, so a one-line report shows the cause.
        remote_tb = str(err)
        cause = getattr(err, "cause", None)
        headline = f"{type(cause).__name__}: {cause}" if cause is not None else remote_tb.strip().splitlines()[-1]
        message = f"{where} raised in {method}: {headline}\n{remote_tb}"
        return WorkerError(message, role=owner.role, rank=owner.rank, node=owner.node, pid=owner.pid,
                           method=method, died=False, remote_traceback=remote_tb)
    if isinstance(err, RayActorError):
        # One paragraph, without Ray's text (its generic out-of-memory hint misleads more
        # often than not); that text stays in `remote_traceback` for --debug.
        message = (f"{where} died during {method}: its process exited or was killed from outside (kill -9, "
                   "the kernel's out-of-memory killer, a crash in native code); nothing in it raised an exception. "
                   "Check the machine's memory (dmesg, free) and the worker's log (ray logs), then continue "
                   "from the newest checkpoint with `hybridflow train --resume RUN_DIR`. This worker group "
                   "cannot be used any more.")
        return WorkerError(message, role=owner.role, rank=owner.rank, node=owner.node, pid=owner.pid,
                           method=method, died=True, remote_traceback=f"Ray: {err}")
    message = f"{where} failed in {method}: {type(err).__name__}: {err}"
    return WorkerError(message, role=owner.role, rank=owner.rank, node=owner.node, pid=owner.pid,
                       method=method, died=False)


class CallFuture:
    """A call that may still be running: ``get()`` waits and collects like a blocking call."""

    def __init__(self, *, method: str, mode: DispatchMode, ctx: DispatchContext, refs: list[ray.ObjectRef],
                 owners: list[RankInfo], selected: list[int], pad_size: int | ray.ObjectRef = 0,
                 timeout_s: float | None = None) -> None:
        self.method = method
        self.timeout_s = timeout_s  # the limit `get()` applies when given none
        self._mode = mode
        self._ctx = ctx
        self._refs = refs
        self._owners = owners
        self._selected = selected
        self._pad_size = pad_size
        self._whole: ray.ObjectRef | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.method}, {len(self._refs)} ranks, collects {len(self._selected)})"

    @property
    def parts(self) -> list[ray.ObjectRef]:
        """Refs of the outputs the controller collects, in collect order."""
        return [self._refs[i] for i in self._selected]

    @property
    def pad_size(self) -> int | ray.ObjectRef:
        """Padding samples at the end of the parts (a ref when not known on the controller)."""
        return self._pad_size

    def done(self) -> bool:
        """True when every rank has finished (successfully or not)."""
        _, pending = ray.wait(self._refs, num_returns=len(self._refs), timeout=0)
        return not pending

    def get(self, timeout_s: float | None = None) -> Any:
        """Wait for all ranks, then collect; a failing rank raises `WorkerError`, and ranks
        still running after `timeout_s` (default: the group's call_timeout_s) raise
        `CallTimeoutError`."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        return gather_calls([self], timeout_s)[0][0]

    def _waits(self) -> tuple[list[ray.ObjectRef], list[RankInfo], list[str]]:
        """What `get` waits for: each rank's output, then the padding size where it is a ref."""
        refs, owners, labels = list(self._refs), list(self._owners), [self.method] * len(self._refs)
        if isinstance(self._pad_size, ray.ObjectRef):
            refs.append(self._pad_size)
            owners.append(self._owners[0])
            labels.append(f"{self.method}{PADDING_LABEL}")
        return refs, owners, labels

    def _collect(self, values: list[Any]) -> Any:
        """The call's value from what `_waits` fetched."""
        pad = values[len(self._refs)] if isinstance(self._pad_size, ray.ObjectRef) else self._pad_size
        ctx = dataclasses.replace(self._ctx, pad_size=pad)
        return self._mode.collect(ctx, [values[i] for i in self._selected])

    def whole_ref(self) -> ray.ObjectRef:
        """One ref to the collected value, built next to the data without the controller."""
        if self._whole is None:
            if self._mode.rank_zero:
                self._whole = self._refs[self._selected[0]]
            else:
                self._whole = _collect_task.remote(self._mode, self._ctx, self._pad_size, *self.parts)
        return self._whole


def gather_calls(futures: Sequence[CallFuture], timeout_s: float | None) -> list[tuple[Any, float]]:
    """Wait for several calls in flight together and collect each: (value, arrival) per
    future, in order, where arrival is the time.monotonic() its last output came in.

    One wait for all of them (`gather`): the first failure among them raises at once (a
    death before an exception, then the lowest rank, then the earliest of `futures`: on one
    process, the call it failed in), whichever call it belongs to, and `timeout_s` bounds
    the whole wait."""
    refs: list[ray.ObjectRef] = []
    owners: list[RankInfo] = []
    labels: list[str] = []
    bounds = []
    for future in futures:
        f_refs, f_owners, f_labels = future._waits()
        bounds.append((len(refs), len(refs) + len(f_refs)))
        refs, owners, labels = refs + f_refs, owners + f_owners, labels + f_labels
    arrivals: list[float] = []
    values = gather(refs, owners, labels, timeout_s, arrivals)
    return [(future._collect(values[lo:hi]), max(arrivals[lo:hi], default=time.monotonic()))
            for future, (lo, hi) in zip(futures, bounds)]


def failed_future(err: WorkerError, futures: Sequence[CallFuture]) -> int | None:
    """Which of `futures` (waited for together by `gather_calls`) the error it raised is
    about: the first whose label the error names (None: none of them)."""
    return next((i for i, f in enumerate(futures) if err.method in (f.method, f"{f.method}{PADDING_LABEL}")), None)


def value_future(ref: ray.ObjectRef, label: str, owner: RankInfo) -> CallFuture:
    """A future of the value behind `ref` (e.g. a Ray task's output, made outside any
    worker group): passed into a call it is split like any future, and `get()` names
    `owner` when it failed."""
    from hybridflow.controller.decorator import Dispatch
    from hybridflow.controller.dispatch import DispatchContext

    ctx = DispatchContext(label=label, mode=Dispatch.RANK_ZERO.name, world_size=1)
    return CallFuture(method=label, mode=Dispatch.RANK_ZERO, ctx=ctx, refs=[ref], owners=[owner], selected=[0])


class DataProtoFuture(CallFuture):
    """A future whose collected parts are one DataProto per data-parallel rank.

    Handed to a data-parallel call of a group with the same dp size, each rank receives
    its part's ref directly; ``get()`` gives the concatenated, unpadded DataProto.
    """


def regroup(value: CallFuture, n: int, pad: bool, label: str) -> tuple[list[ray.ObjectRef], ray.ObjectRef | int]:
    """``n`` data-parallel part refs (and their padding) for a future from another split."""
    if isinstance(value, DataProtoFuture):
        if len(value.parts) == n:
            return value.parts, value.pad_size
        sources, source_pad = value.parts, value.pad_size
    else:
        sources, source_pad = [value.whole_ref()], 0
    refs = _regroup_task.options(num_returns=n + 1).remote(n, pad, source_pad, label, *sources)
    return list(refs[:n]), refs[n]


# num_cpus=0: worker pools usually hold every CPU in placement groups, and a task that
# waits for a free CPU would wait forever.
@ray.remote(num_cpus=0)
def _collect_task(mode: DispatchMode, ctx: DispatchContext, pad_size: int, *outputs: Any) -> Any:
    return mode.collect(dataclasses.replace(ctx, pad_size=pad_size), list(outputs))


@ray.remote(num_cpus=0)
def _regroup_task(n: int, pad: bool, source_pad: int, label: str, *sources: Any) -> tuple:
    for source in sources:
        if not isinstance(source, DataProto):
            raise DispatchError(f"{label}: a future passed as data-parallel input holds a "
                                f"{type(source).__name__}, not a DataProto")
    whole = DataProto.concat(list(sources)) if len(sources) > 1 else sources[0]
    whole = whole.unpad(source_pad) if source_pad else whole
    if len(whole) % n and not pad:
        raise DispatchError(f"{label}: {len(whole)} samples do not split into {n} equal parts and padding is off")
    padded, pad_size = whole.pad_to_divisor(n)
    return (*padded.chunk(n), pad_size)
