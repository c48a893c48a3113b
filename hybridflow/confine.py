"""Confining the current process (Linux): Landlock file and TCP rules, new user + network
(+ PID) namespaces. Shared by the agent's Python sandbox (envs/agent/_sandbox_child.py)
and the reward workers (rewards/_worker.py).

    libc = load_libc()
    net = new_namespaces(libc, pid=False)          # before any thread starts
    abi = landlock(libc, readable=[sys.prefix, ...], writable=[])
    deny_sockets(libc)                             # no socket of any kind, every thread
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import select
import signal
import struct

CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWPID = 0x10000000, 0x40000000, 0x20000000
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
_SYS_CREATE, _SYS_ADD_RULE, _SYS_RESTRICT = 444, 445, 446  # same numbers on x86_64 and arm64
_EXECUTE = 1 << 0  # handled and never allowed: no program can be executed
_READ_FILE = 1 << 2
_READ = _READ_FILE | (1 << 3)  # read file, read dir
_WRITE_V1 = (1 << 1) | sum(1 << b for b in range(4, 13))  # write file, remove, make (char/dir/reg/sock/fifo/block/sym)
_REFER, _TRUNCATE = 1 << 13, 1 << 14
_NET_TCP = (1 << 0) | (1 << 1)  # bind, connect
_SCOPES = (1 << 0) | (1 << 1)  # abstract unix sockets, signals to processes outside the sandbox


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def load_libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def new_namespaces(libc: ctypes.CDLL, pid: bool) -> bool:
    """Unshare into a new user + network namespace (only an unconfigured loopback: no network),
    with `pid` a new PID namespace too (the next fork becomes its PID 1). The process must be
    single-threaded. False where the kernel does not allow it."""
    return libc.unshare(CLONE_NEWUSER | CLONE_NEWNET | (CLONE_NEWPID if pid else 0)) == 0


def landlock_abi(libc: ctypes.CDLL) -> int:
    """The kernel's Landlock ABI version (0: none)."""
    return max(0, libc.syscall(_SYS_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(1)))


def landlock(libc: ctypes.CDLL, readable: list[str], writable: list[str]) -> int:
    """Restrict file access and TCP (module docstring); returns the Landlock ABI used (0: kernel
    without it, nothing restricted). A path of `readable` that is a file grants reading that file."""
    abi = landlock_abi(libc)
    if abi < 1:
        return 0
    write = _WRITE_V1 | (_REFER if abi >= 2 else 0) | (_TRUNCATE if abi >= 3 else 0)
    attr = _RulesetAttr(fs=_EXECUTE | _READ | write, net=_NET_TCP if abi >= 4 else 0, scoped=_SCOPES if abi >= 6 else 0)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else (16 if abi >= 4 else 8)
    fd = libc.syscall(_SYS_CREATE, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    for path, allowed in [(p, _READ) for p in readable] + [(p, _READ | write) for p in writable]:
        try:
            pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue  # an allowed tree this machine lacks
        if not os.path.isdir(path):
            allowed = _READ_FILE  # a file (/dev/null) takes file rights only: read
        rule = _PathBeneath(allowed=allowed, parent_fd=pfd)
        if libc.syscall(_SYS_ADD_RULE, fd, 1, ctypes.byref(rule), 0) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
        os.close(pfd)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or libc.syscall(_SYS_RESTRICT, fd, 0) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    os.close(fd)
    return abi


# seccomp: (audit arch, socket, socketpair) of the architectures we know; offsets in seccomp_data.
_SECCOMP_ARCH = {"x86_64": (0xC000003E, 41, 53), "aarch64": (0xC00000B7, 198, 199)}
_X32_BIT = 0x40000000  # x86_64's x32 ABI numbers its syscalls with this bit under the same arch
_SYS_SECCOMP = {"x86_64": 317, "aarch64": 277}
_SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC = 1, 1
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_LD_W_ABS, _JEQ_K, _RET_K = 0x20, 0x15, 0x06


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _bpf(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def deny_sockets(libc: ctypes.CDLL) -> bool:
    """socket() and socketpair() fail with EACCES from now on, in every thread of this process
    (and every child); any syscall of a foreign ABI (32-bit on a 64-bit kernel) fails too.
    False where seccomp or this architecture is not supported."""
    machine = platform.machine()
    if machine not in _SECCOMP_ARCH:
        return False
    arch, socket_nr, socketpair_nr = _SECCOMP_ARCH[machine]
    denied = _RET_ERRNO | errno.EACCES
    program = b"".join([
        _bpf(_LD_W_ABS, 0, 0, 4),                       # A = seccomp_data.arch
        _bpf(_JEQ_K, 1, 0, arch),
        _bpf(_RET_K, 0, 0, denied),                     # another ABI: nothing
        _bpf(_LD_W_ABS, 0, 0, 0),                       # A = seccomp_data.nr
        _bpf(_JEQ_K, 4, 0, socket_nr),
        _bpf(_JEQ_K, 3, 0, socketpair_nr),
        _bpf(_JEQ_K, 2, 0, socket_nr | _X32_BIT),
        _bpf(_JEQ_K, 1, 0, socketpair_nr | _X32_BIT),
        _bpf(_RET_K, 0, 0, _RET_ALLOW),
        _bpf(_RET_K, 0, 0, denied),
    ])
    return _install_filter(libc, machine, program)


# fork, vfork (x86_64 only) and clone, clone3 by architecture; seccomp_data.args[0] (clone's
# flags, low word on little-endian) is at offset 16.
_PROCESS_CALLS = {"x86_64": {"fork": 57, "vfork": 58, "clone": 56, "clone3": 435},
                  "aarch64": {"clone": 220, "clone3": 435}}
CLONE_THREAD = 0x00010000
_JSET_K = 0x45


def deny_new_processes(libc: ctypes.CDLL) -> bool:
    """fork(), vfork() and clone() without CLONE_THREAD fail with EPERM from now on, in every
    thread of this process; clone3() fails with ENOSYS, on which the C library falls back to
    clone() (threads keep working); a foreign ABI's calls fail. False where seccomp or this
    architecture is not supported."""
    machine = platform.machine()
    if machine not in _PROCESS_CALLS:
        return False
    arch, calls = _SECCOMP_ARCH[machine][0], _PROCESS_CALLS[machine]
    program = _assemble([
        (_LD_W_ABS, 4, None, None),                       # A = seccomp_data.arch
        (_JEQ_K, arch, None, "deny"),                     # another ABI: nothing
        (_LD_W_ABS, 0, None, None),                       # A = seccomp_data.nr
        (_JSET_K, _X32_BIT, "deny", None),                # x32 numbering: nothing
        *((_JEQ_K, calls[name], "deny", None) for name in ("fork", "vfork") if name in calls),
        (_JEQ_K, calls["clone3"], "no_clone3", None),
        (_JEQ_K, calls["clone"], None, "allow"),
        (_LD_W_ABS, 16, None, None),                      # A = clone's flags
        (_JSET_K, CLONE_THREAD, "allow", "deny"),         # a thread, or a process
        ("no_clone3", _RET_K, _RET_ERRNO | errno.ENOSYS),
        ("allow", _RET_K, _RET_ALLOW),
        ("deny", _RET_K, _RET_ERRNO | errno.EPERM),
    ])
    return _install_filter(libc, machine, program)


def _assemble(lines: list[tuple]) -> bytes:
    """A BPF program from (code, k, label if true, label if false) jumps and loads, and
    (label, code, k) returns; None: the next instruction."""
    labels = {line[0]: i for i, line in enumerate(lines) if isinstance(line[0], str)}
    out = []
    for i, line in enumerate(lines):
        if isinstance(line[0], str):
            out.append(_bpf(line[1], 0, 0, line[2]))
            continue
        code, k, if_true, if_false = line
        offset = [0 if to is None else labels[to] - i - 1 for to in (if_true, if_false)]
        out.append(_bpf(code, offset[0], offset[1], k))
    return b"".join(out)


def _install_filter(libc: ctypes.CDLL, machine: str, program: bytes) -> bool:
    buffer = ctypes.create_string_buffer(program)
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False
    done = libc.syscall(_SYS_SECCOMP[machine], _SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC,
                        ctypes.byref(fprog))
    return done == 0


def new_pid_namespace(libc: ctypes.CDLL) -> int | None:
    """Fork into a new PID namespace: returns 0 in the child, which is its first process (PID
    1 there, where it can start threads and processes) and dies with this one
    (PR_SET_PDEATHSIG; the kernel then kills every process left in the namespace, a
    `setsid` grandchild included); the child's pid here; None where the kernel allows no
    PID namespace (a user namespace is tried where this process is not root). This process
    must be single-threaded, and can start no thread afterwards (it only supervises)."""
    if libc.unshare(CLONE_NEWPID) != 0 and libc.unshare(CLONE_NEWUSER | CLONE_NEWPID) != 0:
        return None
    # The child's parent lies outside its namespace (getppid() is 0 there): this process's
    # life is the write end of a pipe it keeps open, EOF once it is gone.
    alive_read, alive_write = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid:
        os.close(alive_read)
        _KEPT_OPEN.append(alive_write)
        return pid
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    os.close(alive_write)
    if select.select([alive_read], [], [], 0)[0]:  # EOF: the parent died before the line above
        os._exit(1)
    os.close(alive_read)
    return 0


_KEPT_OPEN: list[int] = []  # the write end of new_pid_namespace's pipe, open for this process's life
