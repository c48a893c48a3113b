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
# worker announces (task id, pid) when it starts a task, so the parent knows which
# process to kill when that task hangs.
_FN: Callable[..., Any] | None = None
_STARTS: Any = None
_CPU_LIMIT_S: int | None = None
_CONFINEMENT_FAILED: str | None = None  # why the sandbox could not be set up (every sample then fails)
_CONFINED = False  # files, network or processes restricted: a permission error gets the hint
_ANNOUNCED_PID: int | None = None  # the pid the pool kills for this worker: its supervisor's, in a PID namespace


@dataclass(frozen=True)
class WorkerLimits:
    """What a reward worker process may use (pool.py builds it from `reward.manager.*`).

    memory_bytes: RLIMIT_AS; cpu_s: CPU seconds per sample; file_bytes: RLIMIT_FSIZE (None:
    no limit, each). sandbox: confine the worker (module docstring); readable: the paths it
    may read when confined. allow_subprocess: the reward may start processes (in a PID
    namespace of the worker's); environment: the worker's variables (None: inherited)."""

    memory_bytes: int | None = None
    cpu_s: int | None = None
    file_bytes: int | None = None
    sandbox: bool = False
    readable: tuple[str, ...] = ()
    allow_subprocess: bool = False
    environment: tuple[tuple[str, str], ...] | None = None


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
    return ("; reward workers are confined (read-only files, no network, no programs, no new processes): add the "
            "path to reward.manager.readable_paths, set reward.manager.allow_subprocess=true for a reward that starts "
            "processes, or reward.manager.sandbox=false for one that must write files or call a service")


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
    global _FN, _STARTS, _CPU_LIMIT_S, _CONFINEMENT_FAILED, _CONFINED, _ANNOUNCED_PID
    _FN, _STARTS, _CPU_LIMIT_S = fn, starts, limits.cpu_s
    # A worker must not die on Ctrl-C meant for the controller; the parent shuts it down.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Over the file-size limit a write fails with EFBIG instead of the signal killing the worker.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.signal(signal.SIGXCPU, _on_cpu_limit)
    if limits.environment is not None:
        _replace_environment(dict(limits.environment))
    # Before the watcher thread starts: a PID namespace needs a single-threaded process, and
    # Landlock confines the calling thread and the threads it starts later (the watcher
    # reads the controller's stat file).
    supervisor = os.getpid()
    if limits.allow_subprocess:
        _CONFINEMENT_FAILED = _enter_process_namespace(owner_pid)  # the supervisor never returns
        if _CONFINEMENT_FAILED is None:
            _ANNOUNCED_PID = supervisor
            owner_pid = None  # its pid means nothing in the namespace: the supervisor watches it
    if limits.sandbox and _CONFINEMENT_FAILED is None:
        readable = [*limits.readable, *([f"/proc/{owner_pid}/stat"] if owner_pid is not None else [])]
        _CONFINEMENT_FAILED = _confine(readable)
    if _CONFINEMENT_FAILED is None and not limits.allow_subprocess:
        _CONFINEMENT_FAILED = _deny_processes()
    _CONFINED = _CONFINEMENT_FAILED is None and (limits.sandbox or not limits.allow_subprocess)
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


def _enter_process_namespace(owner_pid: int | None) -> str | None:
    """Continue as the first process of a new PID namespace (hybridflow/confine.py); this
    process stays outside as the supervisor (module docstring) and never returns. Why it
    could not, or None."""
    from hybridflow.confine import load_libc, new_pid_namespace

    child = new_pid_namespace(load_libc())
    if child is None:
        return ("reward.manager.allow_subprocess=true needs a PID namespace (so that every process a reward starts "
                "dies with its worker), and this machine allows none to this user (unprivileged user namespaces "
                "are off); keep reward.manager.allow_subprocess=false, or run as a user that may create them")
    if child:
        _supervise(child, owner_pid)
    return None


def _supervise(worker: int, owner_pid: int | None) -> None:
    """The supervisor's life: exit with the worker's status, or kill it (and so its
    namespace) once the controller or this process's parent is gone. No thread can be
    started here (a process that unshared a PID namespace cannot), hence a loop."""
    parent = os.getppid()
    while True:
        done, status = os.waitpid(worker, os.WNOHANG)
        if done:
            os._exit(max(0, os.waitstatus_to_exitcode(status)))
        if (owner_pid is not None and not _alive(owner_pid)) or os.getppid() != parent:
            _say_gone(owner_pid, parent)
            os.kill(worker, signal.SIGKILL)
            os._exit(1)
        time.sleep(WATCH_INTERVAL_S)


def _deny_processes() -> str | None:
    from hybridflow.confine import deny_new_processes, load_libc

    if deny_new_processes(load_libc()):
        return None
    return ("reward workers start no processes (reward.manager.allow_subprocess=false), which needs seccomp filters, "
            "and this machine does not give them; set reward.manager.allow_subprocess=true to run the reward "
            "unconfined in that respect")


# Where the C runtime's environment block lies in /proc/self/stat (fields 50 and 51, proc(5)).
_ENV_START_FIELD, _ENV_END_FIELD = 50, 51


def _replace_environment(kept: dict[str, str]) -> None:
    """os.environ (and the C environ) becomes `kept`; the values dropped and the block of
    variables the process started with are zeroed, so that neither this process's memory
    layout nor /proc/self/environ holds them."""
    import ctypes

    data = os.environ._data  # the bytes behind os.environ (posix.environ): zeroed before release
    for key in [k for k in os.environ if k not in kept]:
        value = data.get(os.environ.encodekey(key))
        del os.environ[key]  # unsetenv too
        if isinstance(value, bytes) and len(value) > 1:  # 0 and 1-byte objects are shared singletons
            ctypes.memset(ctypes.cast(ctypes.c_char_p(value), ctypes.c_void_p), 0, len(value))
    for key, value in kept.items():
        os.environ[key] = value  # putenv: a copy on the heap; nothing points into the block below
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        # fields[0] is field 3 (state)
        start, end = int(fields[_ENV_START_FIELD - 3]), int(fields[_ENV_END_FIELD - 3])
    except (OSError, IndexError, ValueError):
        return  # no /proc (macOS): os.environ is what reward code reads
    if 0 < start < end:
        ctypes.memset(start, 0, end - start)


def _exit_with_owner(owner_pid: int, parent_pid: int) -> None:
    """Exit as soon as the controller or this worker's parent is gone. A worker blocked in
    the reward function still exits: this thread runs whenever the function releases the
    GIL (every few milliseconds in Python code)."""
    while _alive(owner_pid) and os.getppid() == parent_pid:
        time.sleep(WATCH_INTERVAL_S)
    _say_gone(owner_pid, parent_pid)
    os._exit(1)


def _say_gone(owner_pid: int | None, parent_pid: int) -> None:
    gone = (f"the controller (pid {owner_pid})" if owner_pid is not None and not _alive(owner_pid)
            else f"its parent (pid {parent_pid})")
    print(f"hybridflow reward worker {os.getpid()}: {gone} is gone; exiting", file=sys.stderr, flush=True)


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
    """Run one sample in a worker process, announcing its start."""
    if _FN is None:
        raise RuntimeError("reward worker was not initialised (init_worker did not run)")
    _STARTS.put((task_id, _ANNOUNCED_PID or os.getpid()))
    if _CONFINEMENT_FAILED is not None:
        return "error", _CONFINEMENT_FAILED
    return call_with_timeout(_FN, kwargs, timeout_s, _CPU_LIMIT_S)


def check_function() -> str | None:
    """In a worker: import the reward function (a file's, `resolve`) as a sample would, and
    say what is wrong with it (None: nothing)."""
    if _CONFINEMENT_FAILED is not None:
        return _CONFINEMENT_FAILED
    resolve = getattr(_FN, "resolve", None)
    if resolve is None:
        return None
    try:
        resolve()
    except (Exception, SystemExit) as err:  # noqa: BLE001 - a broken file, whatever it raises
        return f"{err}{_confinement_hint(err.__cause__ or err)}"
    return None


def score_chunk(tasks: list[tuple[int, dict[str, Any]]], timeout_s: float | None) -> list[tuple[str, Any]]:
    """Run several samples one after another in a worker (one round trip for all of them);
    each still announces its start and has its own timeout."""
    return [score_task(task_id, kwargs, timeout_s) for task_id, kwargs in tasks]
