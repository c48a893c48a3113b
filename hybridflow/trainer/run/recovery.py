"""Automatic recovery: restart the workers from the newest checkpoint when one fails.

    metrics = supervise(run_steps, restart, describe, max_restarts=cfg.trainer.max_restarts,
                        report=display.message)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from hybridflow.controller import CallTimeoutError, WorkerError

T = TypeVar("T")

RESTART_PHASE = "restart"  # the metrics.jsonl phase of a restart record


class CannotRestart(RuntimeError):
    """Raised by a restart function when the run cannot go on (e.g. no checkpoint yet)."""


@dataclass(frozen=True)
class Failure:
    """One worker failure, as the controller saw it."""

    step: int  # the RL step in flight
    phase: str | None  # the step's phase in flight (programs/phases.py), None outside a step
    role: str
    rank: int
    node: str
    pid: int | None
    method: str  # the worker-group call, e.g. actor.update_actor
    cause: str  # "died" (process or node lost), "timeout" (call_timeout_s) or "raised"
    error: str  # the error's first line

    @classmethod
    def of(cls, err: WorkerError, step: int, phase: str | None) -> Failure:
        cause = "timeout" if isinstance(err, CallTimeoutError) else "died" if err.died else "raised"
        return cls(step, phase, err.role, err.rank, err.node, err.pid, err.method, cause, _error_line(err, cause))

    def summary(self) -> str:
        what = {"died": "died (its process or node was lost)", "timeout": "did not finish in time",
                "raised": "raised"}[self.cause]
        return (f"worker failure at step {self.step}, phase {self.phase or '-'}: {self.role} rank {self.rank} "
                f"(node {self.node}, pid {self.pid}) {what} in {self.method}: {self.error}")

    def record(self, restarts: int, resumed_step: int) -> dict[str, Any]:
        """The metrics.jsonl record of the restart that followed this failure."""
        return {"restart/count": restarts, "restart/failed_step": self.step, "restart/resumed_step": resumed_step,
                "restart/role": self.role, "restart/rank": self.rank, "restart/node": self.node,
                "restart/cause": self.cause, "restart/phase": self.phase, "restart/method": self.method,
                "restart/error": self.error}


def supervise(run: Callable[[], T], restart: Callable[[Failure, int], None],
              describe: Callable[[WorkerError], Failure], max_restarts: int,
              report: Callable[[str], None]) -> T:
    """`run()`, restarted through `restart(failure, n)` (n: restarts of the run so far)
    after each worker failure; at most `max_restarts` restarts for failures that do not
    get past the step of the previous one (module docstring). A failure while restarting
    counts like any other."""
    restarts = 0  # in the run
    repeats = 0  # restarts since a failure got past the previous failure's step
    last: tuple[WorkerError, Failure] | None = None
    while True:
        try:
            if last is not None:
                restart(last[1], restarts)
            return run()
        except WorkerError as err:
            failure = describe(err)
            report(failure.summary())
            if last is not None and failure.step > last[1].step:
                repeats = 0  # the restart got further than the last failure: a fresh budget
            if repeats >= max_restarts:
                err.add_note(f"hybridflow: the failure was in step {failure.step}, phase {failure.phase or '-'}; "
                             f"stopped after {repeats} restart(s) at that step (trainer.max_restarts={max_restarts}: "
                             "a failure that does not get past the step of the previous one counts toward it)")
                raise
            restarts += 1
            repeats += 1
            report(f"restarting the workers ({repeats} of trainer.max_restarts={max_restarts} at step "
                   f"{failure.step}; {restarts} in the run)")
            last = (err, failure)
        except CannotRestart as why:
            assert last is not None, "restart() only runs after a failure"
            err = last[0]  # the worker failure is what the user must see, with why it stopped
            err.add_note(f"hybridflow: not restarted: {why}")
            raise err from None


def _error_line(err: WorkerError, cause: str) -> str:
    """One line that says what went wrong: the worker's exception for a raise (the last
    line of its traceback), the late ranks for a timeout."""
    if cause == "died":
        return "the process exited or was killed (kill -9, the kernel's out-of-memory killer, or its node was lost)"
    text = err.remote_traceback if cause == "raised" else str(err)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return type(err).__name__
    return lines[-1] if cause == "raised" else lines[0]
