"""Kill what a dead controller leaves behind: run as its own small process.

    start_reaper()      # in the controller, right after it started an embedded Ray
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

REFRESH_S = 1.0
LOG_NAME = "hybridflow_reaper.log"


def start_reaper(log_dir: str | None = None) -> subprocess.Popen | None:
    """Start the reaper of this process (once; None where /proc is missing); its report
    goes to `log_dir`/LOG_NAME (None: no report)."""
    global _REAPER, _LOG
    if _REAPER is not None or not os.path.isdir("/proc/self"):
        return _REAPER
    _LOG = os.path.join(log_dir, LOG_NAME) if log_dir is not None else None
    _REAPER = subprocess.Popen([sys.executable, "-S", os.path.abspath(__file__), str(os.getpid()), _LOG or ""],
                               stdin=subprocess.PIPE, start_new_session=True, close_fds=True)
    return _REAPER


def reaper_log() -> str | None:
    """The file the reaper of this process reports to (None: none started, or no report)."""
    return _LOG


_REAPER: subprocess.Popen | None = None
_LOG: str | None = None


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, start time, state) of `pid` from /proc, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), int(fields[19]), fields[0]


def descendants(root: int) -> dict[int, int]:
    """pid -> start time of every live descendant of `root`."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[2] != "Z":
                children.setdefault(stat[0], []).append(int(entry))
                starts[int(entry)] = stat[1]
    found: dict[int, int] = {}
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child != os.getpid():
                found[child] = starts[child]
                todo.append(child)
    return found


def _gone(pid: int) -> bool:
    stat = _stat(pid)
    return stat is None or stat[2] == "Z"


def reap(snapshot: dict[int, int]) -> list[int]:
    """SIGKILL every process of `snapshot` that still runs (same pid and start time); the
    pids it killed. The others had exited by themselves."""
    killed = []
    for pid, started in snapshot.items():
        stat = _stat(pid)
        if stat is not None and stat[1] == started and stat[2] != "Z":
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
    return killed


def _refresh(snapshot: dict[int, int], controller: int) -> dict[int, int]:
    """The snapshot's processes that still run, plus the controller's descendants now. Merged,
    not replaced: a listing taken while the controller dies sees only part of its tree (its
    children are re-parented as /proc is read), and must not drop the rest."""
    now = descendants(controller)
    alive = {pid: started for pid, started in snapshot.items()
             if (stat := _stat(pid)) is not None and stat[1] == started and stat[2] != "Z"}
    return alive | now


def main(controller: int, log: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    snapshot = descendants(controller)
    while not _gone(controller):
        readable, _, _ = select.select([sys.stdin], [], [], REFRESH_S)
        if readable and not os.read(sys.stdin.fileno(), 1024):
            # EOF: the controller closed its end (it exited, or was killed); it may take a
            # moment to become a zombie after an orderly exit.
            time.sleep(0.2)
            if not _gone(controller):
                return  # it closed the pipe on purpose and lives on: not ours to clean up
            break
        snapshot = _refresh(snapshot, controller)
    killed = reap(snapshot)
    if log:  # the one trace of a cleanup nobody else sees (written last: it also says the reaper is done)
        with open(log, "a", encoding="ascii") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} controller {controller} is gone; killed {len(killed)} of "
                    f"the {len(snapshot)} processes it left: {sorted(killed)}\n")


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
