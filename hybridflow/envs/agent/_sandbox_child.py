"""Runs inside the sandbox process (see sandbox.py): lock this process down, then run the code.

    python -I -m hybridflow.envs.agent._sandbox_child LIMITS_JSON < code

Order matters: the network namespace first (needs an unshared, single-threaded process),
then Landlock (irreversible; after it the process can write only under the temp dir and
read only the allowed trees), then the rlimits (RLIMIT_AS last: ctypes itself needs
memory). The code runs only after every restriction is in place; what was applied is
printed to stderr on one line starting with the marker, for the parent to record.
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import signal
import sys
from pathlib import Path
from types import ModuleType

MARKER = "\x00sandbox:"


def _load_confine() -> ModuleType:
    """hybridflow/confine.py, loaded by path: under `python -I` the package may not be
    importable, or an installed copy other than this one would be."""
    path = Path(__file__).resolve().parents[2] / "confine.py"
    spec = importlib.util.spec_from_file_location("_hybridflow_confine", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    confine = _load_confine()
    libc = confine.load_libc()
    namespaces = confine.new_namespaces(libc, pid=True)
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
        libc.prctl(confine.PR_SET_PDEATHSIG, 9, 0, 0, 0)
    applied = {"net_namespace": namespaces, "pid_namespace": namespaces}
    applied["landlock_abi"] = confine.landlock(libc, limits["readable"], [limits["workdir"]])
    _rlimits(limits)
    sys.stderr.write(MARKER + json.dumps(applied) + "\n")
    sys.stderr.flush()
    os.chdir(limits["workdir"])
    sys.path[:] = [p for p in sys.path if p]  # no cwd entry: nothing importable from the temp dir by accident
    exec(compile(code, "<tool code>", "exec"), {"__name__": "__main__"})


if __name__ == "__main__":
    main()
