"""Errors raised by the controller runtime.

`WorkerError` is what the controller sees when something went wrong inside a worker
process (an exception or the process dying); `DispatchError` is raised on the controller
before any worker runs, when a call's input cannot be split the way its dispatch mode asks.
"""

from __future__ import annotations


class DispatchError(ValueError):
    """A call's arguments do not fit its dispatch mode; nothing was sent to any worker."""


class WorkerError(RuntimeError):
    """A worker failed while running a call: it raised, or its process died.

    Attributes name the failing worker (``role``, ``rank``, ``node``, ``pid``), the call
    (``method``) and, for exceptions, the worker-side traceback (``remote_traceback``; for
    a dead process, what Ray said about it).
    """

    def __init__(self, message: str, *, role: str, rank: int, node: str, pid: int | None,
                 method: str, died: bool, remote_traceback: str = "") -> None:
        super().__init__(message)
        self.role = role
        self.rank = rank
        self.node = node
        self.pid = pid
        self.method = method
        self.died = died
        self.remote_traceback = remote_traceback


class CallTimeoutError(WorkerError, TimeoutError):
    """A call did not finish within its time limit (a hang, e.g. a rank stuck in a
    collective its peers never reach). ``rank`` is the lowest rank still running;
    ``late_ranks`` lists all of them. The group's processes may still be running the
    call: shut the group down (which kills them) before building a new one."""

    def __init__(self, message: str, *, role: str, late_ranks: list[int], node: str, pid: int | None,
                 method: str, timeout_s: float) -> None:
        super().__init__(message, role=role, rank=late_ranks[0], node=node, pid=pid, method=method, died=False)
        self.late_ranks = late_ranks
        self.timeout_s = timeout_s
