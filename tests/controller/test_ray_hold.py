"""controller/ray_runtime.py RayHold: jobs in one process share the Ray a hold started.

Each case runs in its own Python process: it needs a Ray of its own (the test session's
Ray, started outside any hold, would count as the user's).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SHARED = """
import os, ray
from hybridflow.config import ConfigError
from hybridflow.controller import RayHold

cores = os.cpu_count() or 1
a = RayHold(None, 1)
a.use()                                      # a's workers are up
try:
    RayHold(None, cores + 2)
    raise SystemExit("a hold needing more CPUs was let in while another job's workers were up")
except ConfigError as err:
    assert str(err).startswith("resources.world_size: this run's ranks reserve"), err
    assert "in use by another trainer's workers" in str(err), err
assert ray.cluster_resources()["CPU"] == cores
a.idle()                                     # a's train() returned: nothing of it on Ray
b = RayHold(None, cores + 2)                 # started again, bigger
assert ray.cluster_resources()["CPU"] == cores + 2, ray.cluster_resources()
a.use()                                      # a's next train() runs on that Ray
a.close()
assert ray.is_initialized(), "closing one job stopped the Ray another job holds"
b.close()
assert not ray.is_initialized(), "the last hold left the Ray it started running"
print("ok")
"""

USERS = """
import ray
from hybridflow.config import ConfigError
from hybridflow.controller import RayHold, init_ray

init_ray(num_cpus=1)                         # the user's own Ray
hold = RayHold(None, 1)
hold.close()
assert ray.is_initialized(), "a hold stopped a Ray the user started"
try:
    RayHold(None, 64)
    raise SystemExit("a Ray the user started was restarted")
except ConfigError as err:
    assert "(started outside hybridflow) has 1: " in str(err), err
print("ok")
"""


@pytest.mark.parametrize("script", [SHARED, USERS], ids=["shared-and-restarted", "the-users-ray"])
def test_ray_holds(script):
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-2000:] + done.stderr[-4000:]
