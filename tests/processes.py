"""Process-tree helpers of the tests that check nothing outlives a run or a killed controller, and
what the processes listen on."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path


def descendants(pid: int) -> set[int]:
    """Every process below `pid` now (children, their children, ...)."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True, check=True).stdout
    children: dict[int, list[int]] = {}
    for line in out.splitlines():
        child, parent = map(int, line.split())
        children.setdefault(parent, []).append(child)
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pids: set[int]) -> set[int]:
    """Those of `pids` still running (a zombie, killed but not yet reaped, is gone)."""
    running = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] != "Z":
                    running.add(pid)
        except OSError:
            pass
    return running


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str
    ray_started: bool  # whether the command started a Ray instance (a session under its RAY_TMPDIR)


def run_cli(args: list[str], tmp: Path, stdin: str = "", env: dict[str, str] | None = None,
            timeout: float = 300) -> CliResult:
    """`hybridflow ARGS` in a fresh process with `stdin` as its input, and Ray's temporary
    directory a new one (a short path: Ray's socket names must fit 107 bytes), so that a
    start of Ray leaves a session there."""
    ray_tmp = Path(tempfile.mkdtemp(prefix="hf-ray-", dir="/tmp"))
    try:
        done = subprocess.run([sys.executable, "-m", "hybridflow.cli", *args], input=stdin, capture_output=True,
                              text=True, timeout=timeout, cwd=tmp,
                              env={**os.environ, "RAY_TMPDIR": str(ray_tmp), **(env or {})})
        return CliResult(done.returncode, done.stdout, done.stderr, any(ray_tmp.rglob("session_*")))
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def listening_addresses(port: int) -> list[str]:
    """Local addresses of the sockets listening on `port` (from /proc/net/tcp and tcp6)."""
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    raw = bytes.fromhex(address)
                    # /proc prints each 32-bit word in host (little-endian) order.
                    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                    family = socket.AF_INET if width == 8 else socket.AF_INET6
                    found.append(socket.inet_ntop(family, words))
    return found
