"""What runs inside a reward worker process (and in-process in debug mode).

Only the standard library is imported here: each worker process imports this module at
start-up, and importing torch there would cost seconds per worker.

A call is guarded by a SIGALRM timer (main thread only), which interrupts Python code
that runs too long and keeps the worker alive. Code that blocks the signal or swallows
the exception is caught by the parent instead, which kills the worker (see pool.py).
"""

from __future__ import annotations

import os
import resource
import signal
import sys
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


def init_worker(fn: Callable[..., Any], starts: Any, memory_limit_mb: int | None = None,
                owner_pid: int | None = None) -> None:
    """ProcessPoolExecutor initializer: keep the function and the start queue, limit the
    worker's memory, and make it exit when the controller (`owner_pid`) is gone."""
    global _FN, _STARTS
    _FN, _STARTS = fn, starts
    # A worker must not die on Ctrl-C meant for the controller; the parent shuts it down.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The watcher thread starts before the memory limit: a thread's stack is address space,
    # and under a tight RLIMIT_AS (a worker forked from a server that preloaded torch is
    # already near it) starting it afterwards can block forever in Thread.start.
    if owner_pid is not None:
        threading.Thread(target=_exit_with_owner, args=(owner_pid, os.getppid()), daemon=True,
                         name="watch-controller").start()
    if memory_limit_mb is not None:
        limit = memory_limit_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _exit_with_owner(owner_pid: int, parent_pid: int) -> None:
    """Exit as soon as the controller or this worker's parent is gone. A worker blocked in
    the reward function still exits: this thread runs whenever the function releases the
    GIL (every few milliseconds in Python code)."""
    while _alive(owner_pid) and os.getppid() == parent_pid:
        time.sleep(WATCH_INTERVAL_S)
    gone = f"the controller (pid {owner_pid})" if not _alive(owner_pid) else f"its parent (pid {parent_pid})"
    print(f"hybridflow reward worker {os.getpid()}: {gone} is gone; exiting", file=sys.stderr, flush=True)
    os._exit(1)


WATCH_INTERVAL_S = 0.5


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: existence check only
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A killed process stays a zombie until its parent reaps it; it is gone all the same.
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc (macOS): existence is all we can tell


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
