"""Run untrusted Python (a model's code) in a separate, locked-down process.

    result = run_python("print(2**10)", SandboxLimits(time_s=5))
    result.stdout, result.status, result.protections   # "1024\\n", "ok", {...}

Each call makes a fresh temporary directory, starts `python -I` on _sandbox_child.py with
a cleared environment (HOME and TMPDIR point into the temp dir), and the child restricts
itself before the code runs. The temp dir is deleted afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hybridflow.envs.agent._sandbox_child import MARKER

_CHILD = str(Path(__file__).with_name("_sandbox_child.py"))


@dataclass(frozen=True)
class SandboxLimits:
    """time_s: wall clock (CPU limit = ceil of it); memory_bytes: address space; output_chars: kept of stdout/stderr."""

    time_s: float = 5.0
    memory_bytes: int = 1 << 30
    file_bytes: int = 16 << 20
    output_chars: int = 4000
    require_isolation: bool = True

    def __post_init__(self) -> None:
        if self.time_s <= 0 or self.memory_bytes < (64 << 20) or self.file_bytes < 0 or self.output_chars < 1:
            raise ValueError(f"invalid sandbox limits {self}: time_s > 0, memory_bytes >= 64 MiB, "
                             "file_bytes >= 0, output_chars >= 1")


@dataclass
class SandboxResult:
    status: str  # "ok", "error" (nonzero exit), "timeout", "refused" (isolation unavailable)
    stdout: str
    stderr: str
    returncode: int | None
    protections: dict = field(default_factory=dict)


def readable_trees() -> list[str]:
    """Directories the code may read: the Python installation and system libraries."""
    trees = {sys.prefix, sys.base_prefix, "/usr", "/lib", "/lib64", "/dev/null", "/dev/urandom"}
    return sorted(trees)


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    with tempfile.TemporaryDirectory(prefix="hf-sandbox-") as workdir:
        spec = {"workdir": workdir, "readable": readable_trees(), "cpu_s": int(-(-limits.time_s // 1)),
                "memory_bytes": limits.memory_bytes, "file_bytes": limits.file_bytes}
        env = {"HOME": workdir, "TMPDIR": workdir, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
        proc = subprocess.Popen([sys.executable, "-I", _CHILD, json.dumps(spec)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=workdir, env=env,
                                text=True, start_new_session=True)
        try:
            out, err = proc.communicate(code, timeout=limits.time_s + 2.0)  # + interpreter start-up
            # Busy code ends at RLIMIT_CPU (the child reports it as 128 + SIGXCPU, or the kernel's
            # signal where there is no PID namespace): a time limit like the wall-clock one, and
            # which of the two comes first depends on the machine's load.
            cpu_limit = (128 + signal.SIGXCPU, -signal.SIGXCPU, -signal.SIGKILL)
            status = "ok" if proc.returncode == 0 else "timeout" if proc.returncode in cpu_limit else "error"
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            out, err = proc.communicate()
            status = "timeout"
        _kill_group(proc.pid)  # anything the code left behind in its process group
    protections, err = _split_marker(err)
    if limits.require_isolation and protections and not (protections["landlock_abi"] and protections["net_namespace"]):
        status = "refused"  # should not happen after a successful preflight; recorded, never silent
    return SandboxResult(status, out[: limits.output_chars], err[-limits.output_chars:], proc.returncode, protections)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _split_marker(stderr: str) -> tuple[dict, str]:
    head, sep, rest = stderr.partition(MARKER)
    if not sep:
        return {}, stderr
    line, _, tail = rest.partition("\n")
    return json.loads(line), head + tail


def isolation_available() -> dict:
    """Which layers this machine supports (runs an empty program): {landlock_abi, net_namespace}."""
    return run_python("", SandboxLimits(require_isolation=False)).protections


def check_isolation(limits: SandboxLimits) -> None:
    """Raise when `require_isolation` is set and this machine cannot give every layer."""
    if not limits.require_isolation:
        return
    got = isolation_available()
    if not (got.get("landlock_abi") and got.get("net_namespace")):
        raise RuntimeError(
            f"the Python sandbox needs Landlock and unprivileged user namespaces; this machine gives {got}. "
            "Use a newer kernel / enable user namespaces, or set require_isolation: false to run with "
            "rlimits only (no file or network isolation).")


if os.name != "posix":  # the whole module relies on Linux facilities
    raise ImportError("hybridflow.envs.agent.sandbox runs on Linux only")
