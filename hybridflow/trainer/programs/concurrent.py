"""Phases of a step program that run at once: ``with P.concurrently(step): ...``.

    with P.concurrently(step):          # trainer/programs/algorithms.py: ppo
        log_probs(step, roles, cfg)     # the actor's old and reference log-probs
        P.compute_values(step, roles.critic)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hybridflow.controller.errors import WorkerError
from hybridflow.controller.futures import CallFuture, failed_future, gather_calls
from hybridflow.protocol import DataProto

if TYPE_CHECKING:
    from hybridflow.trainer.programs.phases import Step

ALL = "*"  # a read of every key (the mapping was iterated)
PARTS = ("batch", "non_tensor_batch", "meta_info")  # the dicts of a DataProto, tracked in a block
PROGRAM = "the program"  # who reads outside any phase (the program's own code in the block)
_DELETED = object()


class ConcurrencyError(RuntimeError):
    """A `concurrently` block whose phases depend on each other, or that breaks its rules."""


@dataclass
class _Phase:
    """One phase of a block: what it read, its calls, its time."""

    name: str
    work_s: float = 0.0  # running the phase function (selecting inputs, submitting)
    handle_s: float = 0.0  # running its results' `then`
    calls: list[_Call] = field(default_factory=list)
    metrics: _Tracked | None = None  # its view of step.metrics while it runs


@dataclass
class _Call:
    """One worker-group call of a block: its future, what handles its result, where it runs."""

    future: Any
    then: Callable[[Any], None]
    processes: frozenset
    submitted: float
    phase: _Phase
    value: Any = None
    arrived: float = 0.0
    started: float = 0.0  # when it could start (Block.finish)
    done: bool = False


@dataclass
class _Effect:
    """What the block applies at its end, in order: a phase's metric writes, a call's
    result, or a phase's end (its timing)."""

    phase: _Phase
    metrics: dict[str, Any] | None = None
    call: _Call | None = None
    end: bool = False


class _Tracked(dict):
    """A copy of step.batch's tensors / non-tensors or of step.metrics that tells its block
    what a phase reads and writes."""

    def __init__(self, data: dict, block: Block, where: str, phase: _Phase | None) -> None:
        super().__init__(data)
        self._block, self._where, self._phase = block, where, phase
        self.written: dict[str, None] = {}  # metrics: keys written since the last flush, in order
        self.own: set[str] = set()  # metrics: every key this phase wrote

    def _who(self) -> _Phase | None:
        # A phase's metrics view belongs to it; the batch's dicts to the phase running now.
        return self._phase if self._phase is not None else self._block.current

    def _read(self, key: Any) -> None:
        if key not in self.own:  # a phase reads its own writes as they are
            # (where, key, effects registered before the read, reader)
            self._block.reads.append((self._where, key, len(self._block.effects), self._who()))

    def _write(self, key: Any) -> None:
        self._block.write(self._where, key, self._who())
        self.own.add(key)
        self.written.setdefault(key, None)  # in first-write order, as the step's dict keeps them

    def __getitem__(self, key: Any) -> Any:
        self._read(key)
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        self._read(key)
        return super().get(key, default)

    def __contains__(self, key: Any) -> bool:
        self._read(key)
        return super().__contains__(key)

    def __iter__(self) -> Iterator:
        self._read(ALL)
        return super().__iter__()

    def keys(self) -> Any:
        self._read(ALL)
        return super().keys()

    def items(self) -> Any:
        self._read(ALL)
        return super().items()

    def values(self) -> Any:
        self._read(ALL)
        return super().values()

    def copy(self) -> dict:
        return dict(self.items())

    def __reduce__(self) -> Any:  # pickled (sent to a worker whole): a plain dict
        return dict, (self.copy(),)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._write(key)
        super().__setitem__(key, value)

    def __delitem__(self, key: Any) -> None:
        self._write(key)
        super().__delitem__(key)

    def pop(self, key: Any, *default: Any) -> Any:
        self._write(key)
        return super().pop(key, *default)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        self._write(key)
        return super().setdefault(key, default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def popitem(self) -> Any:
        raise ConcurrencyError("popitem() on step.batch or step.metrics inside a concurrently block: name the key")

    def clear(self) -> None:
        raise ConcurrencyError("clear() on step.batch or step.metrics inside a concurrently block")


class Block:
    """The state of one `concurrently` block (module docstring)."""

    def __init__(self, step: Step) -> None:
        self.step = step
        self.proto = step.batch
        # (a step whose batch is no DataProto, a test's stand-in, has nothing to track)
        self.saved = {where: getattr(step.batch, where) for where in PARTS} if isinstance(step.batch, DataProto) else {}
        self.metrics = step.metrics
        self.program_view = _Tracked(self.metrics, self, "metrics", None)  # step.metrics outside the phases
        self.effects: list[_Effect] = []
        self.reads: list[tuple[str, Any, int, _Phase | None]] = []  # what the phases read (_Tracked._read)
        self.current: _Phase | None = None

    # ------------------------------------------------------------------ while the block runs

    def open(self) -> None:
        for where, data in self.saved.items():
            setattr(self.proto, where, _Tracked(data, self, where, None))
        self.step.metrics = self.program_view

    def close(self) -> None:
        """Put the step's own dicts back (with nothing changed: writes were refused or deferred)."""
        self.step.batch = self.proto
        for where, data in self.saved.items():
            setattr(self.proto, where, data)
        self.step.metrics = self.metrics

    def write(self, where: str, key: Any, phase: _Phase | None) -> None:
        who = f"phase {phase.name!r}" if phase is not None else PROGRAM
        if where != "metrics":
            raise ConcurrencyError(
                f"{who} wrote step.batch ({where}) key {key!r} inside a concurrently block; there a phase changes "
                "the batch only through its worker calls' results (dp_call(..., then=...)): move the phase out of "
                "the block")
        if phase is None:
            raise ConcurrencyError(f"{PROGRAM} wrote step.metrics[{key!r}] inside a concurrently block outside any "
                                   "phase; record metrics in a phase (@phase), or after the block")

    def run_phase(self, name: str, run: Callable[[], Any]) -> Any:
        """Run the phase function `run` as a phase of this block (`phase` in phases.py)."""
        phase = _Phase(name)
        phase.metrics = _Tracked(self.metrics, self, "metrics", phase)
        self.current, self.step.metrics = phase, phase.metrics
        start = time.perf_counter()
        try:
            result = run()
        finally:
            phase.work_s = time.perf_counter() - start
            self.current, self.step.metrics = None, self.program_view
        if self.step.batch is not self.proto:
            raise ConcurrencyError(f"phase {name!r} replaced step.batch inside a concurrently block (as generate "
                                   "does); run it before or after the block")
        self._flush_metrics(phase)
        self.effects.append(_Effect(phase, end=True))
        return result

    def submit(self, group: Any, method: str, data: Any, then: Callable[[Any], None]) -> None:
        """Call `group.method(data)` without waiting; `then(result)` at the block's end."""
        phase = self.current
        if phase is None:
            raise ConcurrencyError(f"{getattr(group, 'role', group)}.{method} was called inside a concurrently block "
                                   "outside any phase; call it from a phase (@phase)")
        self._flush_metrics(phase)  # what the phase recorded before the call comes first
        future = group.submit(method, data)  # a CallFuture (Ray), a ReadyFuture (in process)
        call = _Call(future, then, frozenset(getattr(group, "workers", ())), time.monotonic(), phase)
        if not self.step.concurrent or not isinstance(future, CallFuture):
            # Waited for here (or computed already, an in-process group): the phase's own
            # running time holds the call's, so it counts as started when it came back.
            self._wait([call])
            call.submitted = call.arrived
        phase.calls.append(call)
        self.effects.append(_Effect(phase, call=call))

    def _flush_metrics(self, phase: _Phase) -> None:
        view = phase.metrics
        if view is not None and view.written:
            values = {key: dict.get(view, key, _DELETED) for key in view.written}
            view.written = {}
            self.effects.append(_Effect(phase, metrics=values))

    # ------------------------------------------------------------------ at the end

    def finish(self) -> None:
        """Wait for every call, then apply the effects in program order, checking that no
        phase read what an earlier phase of the block writes."""
        calls = [e.call for e in self.effects if e.call is not None]
        self._wait([c for c in calls if not c.done])
        for i, call in enumerate(calls):
            # Its submission, or the end of the last earlier call of the block on the same
            # processes (they run one after another there).
            call.started = max([call.submitted, *(c.arrived for c in calls[:i] if c.processes & call.processes)])
        for index, effect in enumerate(self.effects):
            self._check(index, effect.phase, self._apply(effect))

    def _wait(self, calls: list[_Call]) -> None:
        remote = [c for c in calls if isinstance(c.future, CallFuture)]
        limits = [c.future.timeout_s for c in remote]
        # Calls on one set of processes run one after another: the wait may take their sum.
        limit = None if None in limits else sum(limits)
        try:
            results = gather_calls([c.future for c in remote], limit) if remote else []
        except WorkerError as err:
            failed = failed_future(err, [c.future for c in remote])
            if failed is not None and self.step.on_phase is not None:
                # The live status (and a restart's record) name the phase whose call failed,
                # not the block's last phase.
                self.step.on_phase(remote[failed].phase.name)
            raise
        for call, (value, arrived) in zip(remote, results):
            call.value, call.arrived, call.done = value, arrived, True
        for call in calls:
            if not call.done:  # an in-process group's (already computed)
                call.value, call.arrived, call.done = call.future.get(), time.monotonic(), True

    def _apply(self, effect: _Effect) -> set[tuple[str, Any]]:
        step = self.step
        if effect.metrics is not None:
            for key, value in effect.metrics.items():
                step.metrics.pop(key, None) if value is _DELETED else step.metrics.__setitem__(key, value)
            return {("metrics", key) for key in effect.metrics}
        if effect.call is not None:
            before = _snapshot(step)
            start = time.perf_counter()
            effect.call.then(effect.call.value)
            effect.phase.handle_s += time.perf_counter() - start
            if step.batch is not self.proto:
                raise ConcurrencyError(f"phase {effect.phase.name!r}'s result replaced step.batch inside a "
                                       "concurrently block; run the phase after the block")
            return _changed(before, _snapshot(step))
        phase = effect.phase
        waited = sum(c.arrived - c.started for c in phase.calls)
        key = f"timing_s/{phase.name}"
        step.metrics[key] = step.metrics.get(key, 0.0) + phase.work_s + max(0.0, waited) + phase.handle_s
        return set()

    def _check(self, index: int, writer: _Phase, written: set[tuple[str, Any]]) -> None:
        """Refuse a read, made after effect `index` was registered, of a key it wrote."""
        if not written:
            return
        wheres = {where for where, _ in written}
        for where, key, seen, reader in self.reads:
            if seen > index and ((where, key) in written or (key == ALL and where in wheres)):
                what = "every key (it iterated)" if key == ALL else repr(key)
                who = f"phase {reader.name!r}" if reader is not None else PROGRAM
                same = " after its own call" if reader is writer else ""
                raise ConcurrencyError(
                    f"{who} read step.{where}[{what}]{same} in a concurrently block, and phase {writer.name!r} of "
                    f"the same block writes {sorted(k for w, k in written if w == where)}: a phase there must not "
                    "read what another writes (it would see the value from before the block); move the reading "
                    "phase after the block")


def _snapshot(step: Step) -> dict[str, dict]:
    parts = {"metrics": dict(step.metrics)}
    if isinstance(step.batch, DataProto):
        parts.update({where: dict(getattr(step.batch, where)) for where in PARTS})
    return parts


def _changed(before: dict[str, dict], after: dict[str, dict]) -> set[tuple[str, Any]]:
    """(where, key) of every key added, removed or given another object."""
    changed = set()
    for where, old in before.items():
        new = after[where]
        changed |= {(where, k) for k in old.keys() | new.keys() if old.get(k, _DELETED) is not new.get(k, _DELETED)}
    return changed


@contextlib.contextmanager
def concurrently(step: Step) -> Iterator[None]:
    """Run the phases in the block at once where their worker groups allow (module docstring)."""
    if step.block is not None:  # inside another block: part of it
        yield
        return
    block = Block(step)
    step.block = block
    block.open()
    try:
        yield
    except Exception as err:
        called = list(dict.fromkeys(e.phase.name for e in block.effects if e.call is not None))
        if called:  # a read of a result that is not in yet fails like this (a KeyError of a missing key)
            names = ", ".join(map(repr, called))
            err.add_note(f"(inside a concurrently block: the results of the calls of phase {names} are applied at "
                         "its end; a phase that reads them must come after the block)")
        raise
    finally:
        block.close()
        step.block = None
    block.finish()
