"""Runs inside the sandbox process (see sandbox.py): lock this process down, then run the code.

    python -I -m hybridflow.envs.agent._sandbox_child LIMITS_JSON < code

Order matters: the network namespace first (needs an unshared, single-threaded process),
then Landlock (irreversible; after it the process can write only under the temp dir and
read only the allowed trees), then the rlimits (RLIMIT_AS last: ctypes itself needs
memory). The code runs only after every restriction is in place; what was applied is
printed to stderr on one line starting with the marker, for the parent to record.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys

MARKER = "\x00sandbox:"
_CLONE_NEWUSER, _CLONE_NEWNET, _CLONE_NEWPID = 0x10000000, 0x40000000, 0x20000000
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38
_SYS_CREATE, _SYS_ADD_RULE, _SYS_RESTRICT = 444, 445, 446  # same numbers on x86_64 and arm64
_EXECUTE = 1 << 0  # handled and never allowed: no program can be executed
_READ = (1 << 2) | (1 << 3)  # read file, read dir
_WRITE_V1 = (1 << 1) | sum(1 << b for b in range(4, 13))  # write file, remove, make (char/dir/reg/sock/fifo/block/sym)
_REFER, _TRUNCATE = 1 << 13, 1 << 14
_NET_TCP = (1 << 0) | (1 << 1)  # bind, connect
_SCOPES = (1 << 0) | (1 << 1)  # abstract unix sockets, signals to processes outside the sandbox


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _new_namespaces(libc) -> bool:
    """User + network + PID namespaces; the next fork becomes PID 1 of the new PID namespace."""
    return libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET | _CLONE_NEWPID) == 0


def _landlock(libc, workdir: str, readable: list[str]) -> int:
    """Restrict file access and TCP; returns the Landlock ABI used (0: kernel without it)."""
    abi = libc.syscall(_SYS_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 1:
        return 0
    write = _WRITE_V1 | (_REFER if abi >= 2 else 0) | (_TRUNCATE if abi >= 3 else 0)
    attr = _RulesetAttr(fs=_EXECUTE | _READ | write, net=_NET_TCP if abi >= 4 else 0, scoped=_SCOPES if abi >= 6 else 0)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else (16 if abi >= 4 else 8)
    fd = libc.syscall(_SYS_CREATE, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    for path, allowed in [(p, _READ) for p in readable] + [(workdir, _READ | write)]:
        try:
            pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue  # an allowed tree this machine lacks
        if not os.path.isdir(path):
            allowed = 1 << 2  # a file (/dev/null) takes file rights only: read
        rule = _PathBeneath(allowed=allowed, parent_fd=pfd)
        if libc.syscall(_SYS_ADD_RULE, fd, 1, ctypes.byref(rule), 0) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
        os.close(pfd)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or libc.syscall(_SYS_RESTRICT, fd, 0) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    os.close(fd)
    return abi


def _rlimits(limits: dict) -> None:
    cpu = int(limits["cpu_s"])
    for name, value in (("RLIMIT_CPU", cpu), ("RLIMIT_NPROC", 0), ("RLIMIT_FSIZE", limits["file_bytes"]),
                        ("RLIMIT_NOFILE", 64), ("RLIMIT_CORE", 0), ("RLIMIT_AS", limits["memory_bytes"])):
        resource.setrlimit(getattr(resource, name), (value, value))


# The exit status when the code was killed at its CPU-time limit (a shell's 128 + SIGXCPU).
CPU_LIMIT_EXIT = 128 + signal.SIGXCPU


def main() -> None:
    limits = json.loads(sys.argv[1])
    code = sys.stdin.read()
    libc = ctypes.CDLL(None, use_errno=True)
    namespaces = _new_namespaces(libc)
    if namespaces:
        # The code runs as PID 1 of a fresh PID namespace: when it ends (or this process is
        # killed, via the death signal), the kernel kills every process it forked, even
        # ones that left the process group.
        pid = os.fork()
        if pid:
            _, status, usage = os.wait4(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            cpu_s = usage.ru_utime + usage.ru_stime  # tick-granular: a kill at 2 s reads ~1.98
            if code in (-signal.SIGKILL, -signal.SIGXCPU) and cpu_s >= 0.9 * limits["cpu_s"]:
                os._exit(CPU_LIMIT_EXIT)  # killed at RLIMIT_CPU (the kernel sends SIGKILL at the hard limit)
            os._exit(code & 0xFF)
        libc.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)
    applied = {"net_namespace": namespaces, "pid_namespace": namespaces}
    applied["landlock_abi"] = _landlock(libc, limits["workdir"], limits["readable"])
    _rlimits(limits)
    sys.stderr.write(MARKER + json.dumps(applied) + "\n")
    sys.stderr.flush()
    os.chdir(limits["workdir"])
    sys.path[:] = [p for p in sys.path if p]  # no cwd entry: nothing importable from the temp dir by accident
    exec(compile(code, "<tool code>", "exec"), {"__name__": "__main__"})


if __name__ == "__main__":
    main()
