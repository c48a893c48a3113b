"""What runs inside a reward worker process (and in-process in debug mode).

Only the standard library is imported here: each worker process imports this module at
start-up, and importing torch there would cost seconds per worker.

A call is guarded by a SIGALRM timer (main thread only), which interrupts Python code
that runs too long and keeps the worker alive. Code that blocks the signal or swallows
the exception is caught by the parent instead, which kills the worker (see pool.py).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

# Set in each worker by `init_worker`: the reward function and the queue on which a
# worker announces (task id, pid) when it starts a task, so the parent knows which
# process to kill when that task hangs.
_FN: Callable[..., Any] | None = None
_STARTS: Any = None


class SampleTimeout(BaseException):
    """Raised by the alarm. A BaseException so `except Exception` in user code cannot swallow it."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise SampleTimeout()


def _describe(err: BaseException) -> str:
    # The exception line plus the innermost frame: enough to find the bug, short enough to log.
    frames = traceback.extract_tb(err.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(err).__name__}: {err}{where}"


def _restore_timer(previous: tuple[float, float], elapsed: float) -> None:
    delay, interval = previous
    if delay > 0:
        # A timer that would have expired meanwhile fires right away instead of never.
        signal.setitimer(signal.ITIMER_REAL, max(delay - elapsed, 1e-6), interval)


def call_with_timeout(fn: Callable[..., Any], kwargs: dict[str, Any], timeout_s: float | None) -> tuple[str, Any]:
    """("ok", value) | ("error", message) | ("timeout", message) for fn(**kwargs)."""
    use_alarm = timeout_s is not None and threading.current_thread() is threading.main_thread()
    previous_handler, previous_timer, started = None, (0.0, 0.0), time.monotonic()
    try:
        if use_alarm:
            # Someone else's alarm (e.g. pytest-timeout in-process) is put back afterwards.
            previous_timer = signal.getitimer(signal.ITIMER_REAL)
            previous_handler = signal.signal(signal.SIGALRM, _on_alarm)
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            return "ok", fn(**kwargs)
        finally:
            if use_alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous_handler)
                _restore_timer(previous_timer, time.monotonic() - started)
    except SampleTimeout:
        return "timeout", f"reward function ran longer than {timeout_s} s and was interrupted"
    except Exception as err:  # noqa: BLE001 - any user error becomes this sample's error
        return "error", _describe(err)
    except SystemExit as err:
        return "error", f"reward function called exit({err.code})"


def init_worker(fn: Callable[..., Any], starts: Any) -> None:
    """ProcessPoolExecutor initializer: keep the function and the start queue."""
    global _FN, _STARTS
    _FN, _STARTS = fn, starts
    # A worker must not die on Ctrl-C meant for the controller; the parent shuts it down.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def score_task(task_id: int, kwargs: dict[str, Any], timeout_s: float | None) -> tuple[str, Any]:
    """Run one sample in a worker process, announcing its start first."""
    if _FN is None:
        raise RuntimeError("reward worker was not initialised (init_worker did not run)")
    _STARTS.put((task_id, os.getpid()))
    return call_with_timeout(_FN, kwargs, timeout_s)


def score_chunk(tasks: list[tuple[int, dict[str, Any]]], timeout_s: float | None) -> list[tuple[str, Any]]:
    """Run several samples one after another in a worker (one round trip for all of them);
    each still announces its start and has its own timeout."""
    return [score_task(task_id, kwargs, timeout_s) for task_id, kwargs in tasks]
