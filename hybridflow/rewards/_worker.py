"""What runs inside a reward worker process (and in-process in debug mode).

Only the standard library is imported here: each worker process imports this module at
start-up, and importing torch there would cost seconds per worker.
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Set in each worker by `init_worker`: the reward function and the queue on which a
# worker announces (task id, pid, None) when it starts a task, so the parent knows which
# process to kill when that task hangs, and (task id, pid, outcome) when it ends.
_FN: Callable[..., Any] | None = None
_STARTS: Any = None
_CPU_LIMIT_S: int | None = None
_CONFINEMENT_FAILED: str | None = None  # why the sandbox could not be set up (every sample then fails)
_CONFINED = False


@dataclass(frozen=True)
class WorkerLimits:
    """What a reward worker process may use (pool.py builds it from `reward.manager.*`).

    memory_bytes: RLIMIT_AS; cpu_s: CPU seconds per sample; file_bytes: RLIMIT_FSIZE (None:
    no limit, each). sandbox: confine the worker (module docstring); readable: the paths it
    may read when confined."""

    memory_bytes: int | None = None
    cpu_s: int | None = None
    file_bytes: int | None = None
    sandbox: bool = False
    readable: tuple[str, ...] = ()


class SampleTimeout(BaseException):
    """Raised by the alarm. A BaseException so `except Exception` in user code cannot swallow it."""


class SampleCpuLimit(BaseException):
    """Raised by SIGXCPU: the sample used its CPU seconds (a BaseException, like SampleTimeout)."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise SampleTimeout()


def _on_cpu_limit(signum: int, frame: Any) -> None:
    raise SampleCpuLimit()


def _set_cpu_soft_limit(seconds: int | None) -> None:
    """RLIMIT_CPU's soft limit at `seconds` more than this process has used (None: none).
    The limit counts the process's whole life, so it is moved before every sample."""
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if seconds is None:
        resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(usage.ru_utime + usage.ru_stime) + 1 + seconds
    resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))


def _describe(err: BaseException) -> str:
    # The exception line plus the innermost frame: enough to find the bug, short enough to log.
    # The innermost frame of the user's code, not of the library it called (pathlib, socket).
    frames = traceback.extract_tb(err.__traceback__)
    library = tuple(p + os.sep for p in {sys.prefix, sys.base_prefix})
    own = [f for f in frames if not f.filename.startswith(library)] or frames
    where = f" (at {own[-1].filename}:{own[-1].lineno} in {own[-1].name})" if own else ""
    return f"{type(err).__name__}: {err}{where}{_confinement_hint(err)}"


# What a confined worker sees when the sandbox stops it: no permission (files, programs, sockets).
_DENIED = (errno.EACCES, errno.EPERM, errno.EROFS)


def _confinement_hint(err: BaseException) -> str:
    if not _CONFINED or not isinstance(err, OSError) or err.errno not in _DENIED:
        return ""
    return ("; reward workers are confined (read-only files, no network, no programs): add the path to "
            "reward.manager.readable_paths, or set reward.manager.sandbox=false for a reward that must write "
            "files or call a service")


def _restore_timer(previous: tuple[float, float], elapsed: float) -> None:
    delay, interval = previous
    if delay > 0:
        # A timer that would have expired meanwhile fires right away instead of never.
        signal.setitimer(signal.ITIMER_REAL, max(delay - elapsed, 1e-6), interval)


def call_with_timeout(fn: Callable[..., Any], kwargs: dict[str, Any], timeout_s: float | None,
                      cpu_s: int | None = None) -> tuple[str, Any]:
    """("ok", value) | ("error", message) | ("timeout", message) for fn(**kwargs); `cpu_s`:
    a CPU-time limit for this call (worker processes only: it moves the process's RLIMIT_CPU)."""
    use_alarm = timeout_s is not None and threading.current_thread() is threading.main_thread()
    previous_handler, previous_timer, started = None, (0.0, 0.0), time.monotonic()
    try:
        if use_alarm:
            # Someone else's alarm (e.g. pytest-timeout in-process) is put back afterwards.
            previous_timer = signal.getitimer(signal.ITIMER_REAL)
            previous_handler = signal.signal(signal.SIGALRM, _on_alarm)
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
        if cpu_s is not None:
            _set_cpu_soft_limit(cpu_s)
        try:
            return "ok", fn(**kwargs)
        finally:
            if cpu_s is not None:
                _set_cpu_soft_limit(None)
            if use_alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous_handler)
                _restore_timer(previous_timer, time.monotonic() - started)
    except SampleTimeout:
        return "timeout", f"reward function ran longer than {timeout_s} s and was interrupted"
    except SampleCpuLimit:
        return "timeout", (f"reward function used more than {cpu_s} s of CPU time and was interrupted "
                           "(reward.manager.cpu_time_s)")
    except Exception as err:  # noqa: BLE001 - any user error becomes this sample's error
        return "error", _describe(err)
    except SystemExit as err:
        return "error", f"reward function called exit({err.code})"


def init_worker(fn: Callable[..., Any], starts: Any, limits: WorkerLimits = WorkerLimits(),
                owner_pid: int | None = None) -> None:
    """ProcessPoolExecutor initializer: keep the function and the start queue, confine and
    limit the worker, and make it exit when the controller (`owner_pid`) is gone."""
    global _FN, _STARTS, _CPU_LIMIT_S, _CONFINEMENT_FAILED, _CONFINED
    _FN, _STARTS, _CPU_LIMIT_S = fn, starts, limits.cpu_s
    # A worker must not die on Ctrl-C meant for the controller; the parent shuts it down.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Over the file-size limit a write fails with EFBIG instead of the signal killing the worker.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.signal(signal.SIGXCPU, _on_cpu_limit)
    if limits.sandbox:
        # Before the watcher thread starts: Landlock confines the calling thread and the
        # threads it starts later (the watcher reads the controller's stat file).
        readable = [*limits.readable, *([f"/proc/{owner_pid}/stat"] if owner_pid is not None else [])]
        _CONFINEMENT_FAILED = _confine(readable)
        _CONFINED = _CONFINEMENT_FAILED is None
    # The watcher thread starts before the memory limit: a thread's stack is address space,
    # and under a tight RLIMIT_AS (a worker forked from a server that preloaded torch is
    # already near it) starting it afterwards can block forever in Thread.start.
    if owner_pid is not None:
        threading.Thread(target=_exit_with_owner, args=(owner_pid, os.getppid()), daemon=True,
                         name="watch-controller").start()
    for name, value in (("RLIMIT_FSIZE", limits.file_bytes), ("RLIMIT_AS", limits.memory_bytes)):
        if value is not None:
            resource.setrlimit(getattr(resource, name), (value, value))


def _confine(readable: list[str]) -> str | None:
    """Confine this process (module docstring); the reason it could not, or None."""
    from hybridflow.confine import deny_sockets, landlock, load_libc

    libc = load_libc()
    try:
        abi = landlock(libc, readable, writable=[])
    except OSError as err:
        return f"the reward sandbox could not be set up ({err})"
    sockets = deny_sockets(libc)
    if not (abi and sockets):
        missing = [what for what, ok in (("Landlock (Linux >= 5.13)", abi), ("seccomp filters", sockets)) if not ok]
        return (f"the reward sandbox needs {' and '.join(missing)}, which this machine does not give; set "
                "reward.manager.sandbox=false to run reward code unconfined (time, CPU, memory and file-size "
                "limits stay)")
    return None


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
    """Run one sample in a worker process, announcing its start and its end."""
    if _FN is None:
        raise RuntimeError("reward worker was not initialised (init_worker did not run)")
    pid = os.getpid()
    _STARTS.put((task_id, pid, None))
    if _CONFINEMENT_FAILED is not None:
        outcome: tuple[str, Any] = ("error", _CONFINEMENT_FAILED)
    else:
        outcome = call_with_timeout(_FN, kwargs, timeout_s, _CPU_LIMIT_S)
    # The parent hears of each sample's end at once (its result comes back with the chunk):
    # a function that fails on every sample is then noticed after a few samples. A failure
    # travels whole (its message is short); a score comes back with the chunk only.
    _STARTS.put((task_id, pid, ("ok", None) if outcome[0] == "ok" else outcome))
    return outcome


def score_chunk(tasks: list[tuple[int, dict[str, Any]]], timeout_s: float | None) -> list[tuple[str, Any]]:
    """Run several samples one after another in a worker (one round trip for all of them);
    each still announces its start and has its own timeout."""
    return [score_task(task_id, kwargs, timeout_s) for task_id, kwargs in tasks]
