"""The Python sandbox denies what its docstring says it denies (envs/agent/sandbox.py).

Each case runs real code in the sandbox and checks the outcome, and that nothing leaked
outside (the probe files do not exist afterwards). Skipped, with the reason, on a kernel
without Landlock or unprivileged user namespaces.
"""

from __future__ import annotations

import os

import pytest

from hybridflow.envs.agent.sandbox import SandboxLimits, isolation_available, run_python
from hybridflow.envs.agent.tools import python_tool

LIMITS = SandboxLimits(time_s=2.0, memory_bytes=256 << 20)
_AVAILABLE = isolation_available()
pytestmark = pytest.mark.skipif(not (_AVAILABLE.get("landlock_abi") and _AVAILABLE.get("net_namespace")),
                                reason=f"sandbox isolation unavailable here: {_AVAILABLE}")


def test_runs_code_and_writes_inside_its_temp_dir():
    r = run_python("open('f.txt', 'w').write('hi'); print(open('f.txt').read()); import math; print(math.pi > 3)",
                   LIMITS)
    assert r.status == "ok" and r.stdout == "hi\nTrue\n" and r.protections["landlock_abi"] >= 1


def test_denies_writes_outside_the_temp_dir(tmp_path):
    probe = tmp_path / "probe.txt"
    r = run_python(f"open({str(probe)!r}, 'w').write('x')", LIMITS)
    assert r.status == "error" and "PermissionError" in r.stderr and not probe.exists()
    r = run_python("import os; os.mkdir('/tmp/hf_sandbox_probe_dir')", LIMITS)
    assert r.status == "error" and not os.path.exists("/tmp/hf_sandbox_probe_dir")


def test_denies_reading_outside_the_allowed_trees(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    r = run_python(f"print(open({str(secret)!r}).read())", LIMITS)
    assert r.status == "error" and "s3cret" not in r.stdout and "PermissionError" in r.stderr


def test_denies_network():
    tcp = run_python("import socket; socket.create_connection(('127.0.0.1', 22), timeout=1)", LIMITS)
    udp = run_python("import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('1.1.1.1', 53))",
                     LIMITS)
    assert tcp.status == "error" and udp.status == "error"


def test_denies_running_programs_and_kills_forked_processes():
    r = run_python("import subprocess; subprocess.run(['/bin/echo', 'hi'])", LIMITS)
    assert r.status == "error" and "PermissionError" in r.stderr
    # a forked child that leaves the process group dies with the sandbox (PID namespace)
    r = run_python("import os, time\nif os.fork() == 0:\n    os.setsid(); time.sleep(60)\nprint(os.getpid())", LIMITS)
    assert r.status == "ok" and r.stdout.strip() == "1" and r.protections["pid_namespace"]


def test_time_and_memory_limits():
    assert run_python("import time; time.sleep(30)", LIMITS).status == "timeout"
    assert run_python("while True: pass", LIMITS).status == "timeout"
    r = run_python("x = bytearray(512 << 20)", LIMITS)
    assert r.status == "error" and "MemoryError" in r.stderr


def test_python_tool_answers_with_output_or_error():
    tool = python_tool(LIMITS)
    assert tool.call({"code": "print(6*7)"}) == "42\n"
    assert tool.call({"code": "1/0"}).startswith("error: ZeroDivisionError")
    assert "timed out" in tool.call({"code": "import time; time.sleep(30)"})
