"""Fault injection for tests of recovery: make one rank die, hang or raise in a call.

Set on the controller before the worker groups start (it is handed to every worker
process through Ray's runtime environment; nothing else reads it):

    HYBRIDFLOW_FAULT="ACTION:ROLE.METHOD:RANK:CALL[:ONCE_FILE]"
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Any

ENV_VAR = "HYBRIDFLOW_FAULT"
ACTIONS = ("kill", "hang", "raise")
HANG_S = 24 * 3600.0  # "forever" for a test: the controller's call timeout ends it first


@dataclass(frozen=True)
class Fault:
    """One injected fault, parsed from HYBRIDFLOW_FAULT."""

    action: str
    role: str
    method: str
    rank: int
    call: int
    once_file: str | None = None

    @classmethod
    def parse(cls, text: str) -> Fault:
        parts = text.split(":", 4)
        try:
            action, target, rank, call = parts[:4]
            role, method = target.split(".", 1)
            fault = cls(action, role, method, int(rank), int(call), parts[4] if len(parts) == 5 else None)
        except ValueError:
            fault = None
        if fault is None or fault.action not in ACTIONS or fault.call < 1 or fault.rank < 0:
            raise ValueError(f"{ENV_VAR}={text!r}: expected ACTION:ROLE.METHOD:RANK:CALL[:ONCE_FILE] with ACTION "
                             f"one of {list(ACTIONS)}, RANK >= 0 and CALL >= 1, e.g. kill:actor.update_actor:1:2")
        return fault


def fault_runtime_env() -> dict[str, Any]:
    """Actor options that hand the controller's HYBRIDFLOW_FAULT (and the trace request
    file, tracing.py) to a worker process (empty when unset, so worker processes start
    exactly as without the hooks)."""
    from hybridflow.controller.tracing import ENV_VAR as TRACE_VAR

    text = os.environ.get(ENV_VAR)
    if text:
        Fault.parse(text)  # a typo fails on the controller, not silently in every worker
    env = {name: os.environ[name] for name in (ENV_VAR, TRACE_VAR) if os.environ.get(name)}
    return {"runtime_env": {"env_vars": env}} if env else {}


class FaultInjector:
    """Counts one process's calls and fires the configured fault (WorkerHost owns one)."""

    def __init__(self, rank: int) -> None:
        text = os.environ.get(ENV_VAR)
        fault = Fault.parse(text) if text else None
        self.fault = fault if fault is not None and fault.rank == rank else None
        self.calls = 0

    def before_call(self, role: str, method: str) -> None:
        fault = self.fault
        if fault is None or (role, method) != (fault.role, fault.method):
            return
        self.calls += 1
        if self.calls != fault.call or not _claim(fault.once_file):
            return
        if fault.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault.action == "hang":
            time.sleep(HANG_S)
        raise RuntimeError(f"injected fault ({ENV_VAR}): {role}.{method} call {self.calls} on rank {fault.rank}")


def _claim(once_file: str | None) -> bool:
    """True when the fault may fire: always without a file, else only for the first
    process that creates it."""
    if once_file is None:
        return True
    try:
        os.close(os.open(once_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True
