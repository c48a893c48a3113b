"""A controller killed with SIGKILL leaves nothing of its embedded Ray running: the
reaper (controller/reaper.py) kills its descendants at once. Without it Ray's agents
linger for about a minute (they try to report the raylet's death to the dead GCS)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from hybridflow.controller.reaper import descendants

CONTROLLER = textwrap.dedent(
    '''
    import time
    from hybridflow.controller import init_ray

    init_ray(num_cpus=1)
    print("up", flush=True)
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
        assert proc.stdout.readline().strip() == "up"
        time.sleep(2)  # Ray's agents start just after ray.init returns
        tree = descendants(proc.pid)
        names = {open(f"/proc/{pid}/comm").read().strip() for pid in tree if os.path.exists(f"/proc/{pid}/comm")}
        assert {"raylet", "gcs_server"} <= names, names
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 30  # Ray alone: ~60 s for its agents
        while _running(tree) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _running(tree) == [], f"still running after the controller died: {_running(tree)}"
    finally:
        proc.kill()
