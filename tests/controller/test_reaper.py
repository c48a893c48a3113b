"""A controller killed with SIGKILL leaves nothing of its embedded Ray running: the
reaper (controller/reaper.py) kills its descendants at once. Without it Ray's agents
linger for about a minute (they try to report the raylet's death to the dead GCS).

The test checks the mechanism, not a time: the reaper reports the pids it killed (one
line in its log, written when it is done); every other process of the controller's tree must have
exited by itself before that, and the killed ones then go (SIGKILL cannot be refused).
The pytest timeout only guards against a hang."""

from __future__ import annotations

import os
import subprocess
import sys
import re
import textwrap
import time
from pathlib import Path

import pytest

from hybridflow.controller.reaper import LOG_NAME, REFRESH_S, descendants

CONTROLLER = textwrap.dedent(
    '''
    import time
    from hybridflow.controller import init_ray
    from hybridflow.controller.reaper import reaper_log

    init_ray(num_cpus=1)
    print(reaper_log(), flush=True)
    time.sleep(600)
    '''
)


def _running(snapshot: dict[int, int]) -> list[int]:
    alive = []
    for pid, started in snapshot.items():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[19]) == started:
            alive.append(pid)
    return alive


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="the reaper reads /proc")
@pytest.mark.timeout(300)
def test_nothing_of_an_embedded_ray_outlives_a_killed_controller(tmp_path):
    script = tmp_path / "controller.py"
    script.write_text(CONTROLLER)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        log = Path(proc.stdout.readline().strip())
        assert log.name == LOG_NAME and not log.exists()
        time.sleep(2 + 2 * REFRESH_S)  # Ray's agents start just after ray.init; the reaper's snapshot catches up
        tree = descendants(proc.pid)
        names = {open(f"/proc/{pid}/comm").read().strip() for pid in tree if os.path.exists(f"/proc/{pid}/comm")}
        assert {"raylet", "gcs_server"} <= names, names
        proc.kill()
        proc.wait()
        while not log.exists() or not log.read_text().endswith("\n"):  # the reaper is done; pytest's timeout
            time.sleep(0.1)                                                  # guards a hang
        report = log.read_text().strip()
        killed = {int(pid) for pid in re.findall(r"\d+", report.rpartition(": ")[2])}
        assert killed, report
        # The reaper itself exits just after writing its report: it is waited for below.
        reaper = {pid for pid, line in _names(tree, width=None).items() if "controller/reaper.py" in line}
        left = _running({pid: tree[pid] for pid in tree if pid not in killed | reaper})
        assert left == [], f"not killed by the reaper and still running: {_names(left)}; {report}; tree {_names(tree)}"
        while _running(tree):  # what it killed goes (SIGKILL); only a hang could keep us here
            time.sleep(0.1)
    finally:
        proc.kill()


def _names(pids, width: int | None = 80) -> dict[int, str]:
    """Command lines by pid, cut to `width` for messages; matching needs them whole (a clone
    under a long path pushes "controller/reaper.py" past 80 characters)."""
    names = {}
    for pid in pids:
        try:
            names[pid] = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")[:width]
        except OSError:
            names[pid] = "?"
    return names
