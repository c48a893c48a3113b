"""Runs of the cluster tests: `hybridflow` commands in the head node's namespace (the
controller lives on the head, as docs/resilience.md says), the single-node reference
runs they are compared with, and what they leave behind (metrics, status, console)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hybridflow.trainer.observe.live_status import read_status
from hybridflow.trainer.run.run_dir import read_metrics
from tests.trainer.trainer_helpers import TINY as TRAINER_TINY

REPO = Path(__file__).resolve().parents[2]
HYBRIDFLOW = str(Path(sys.executable).parent / "hybridflow")

# The reward of the comparisons: it tells responses apart, so every update trains on something.
VARIED_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(sum(map(ord, solution_str)) % 7) / 6.0
'''

# The trainer tests' tiny runs (a 2-layer, 32-wide model, 4 prompts x 2 responses a step), printed,
# checkpointed every step, with one thread per rank as a cluster run resolves it
# (resources.threads_per_rank), so that the single-node reference computes the same. Ranks and
# steps are each test's.
TINY = [*(o for o in TRAINER_TINY if not o.startswith(("trainer.console=", "resources.world_size=",
                                                       "trainer.total_steps="))),
        "trainer.console=plain", "trainer.val_before_train=false", "trainer.save_freq=1",
        "resources.threads_per_rank=1"]
TWO_NODES = ["resources.nodes=2", "resources.ranks_per_node=1"]
# Keys that are not the computation: wall times, throughput, transfer statistics, fetch counters.
UNCOMPARABLE = ("time", "timing_s/", "perf/", "reshard/", "weight_sync/", "controller/", "agent_loop/")


def reward_file(root: Path) -> Path:
    path = root / "varied_reward.py"
    path.write_text(VARIED_REWARD)
    return path


def grpo(root: Path) -> list[str]:
    """The GRPO run of the comparisons (conftest.py's single-node `grpo_reference`)."""
    return ["algorithm.name=grpo", "trainer.total_steps=2", f"reward.custom_fn_path={reward_file(root)}"]


def cluster_train(cluster, run_dir: Path, *overrides: str, env: dict[str, str] | None = None,
                  timeout: float = 600.0) -> subprocess.CompletedProcess:
    """`hybridflow train` on the head node, joining the cluster by resources.ray_address;
    no network variable set (the docs' recipe)."""
    return cluster.run(0, [HYBRIDFLOW, "train", f"resources.ray_address={cluster.address}",
                           f"trainer.run_dir={run_dir}", *TINY, *overrides], env=env, timeout=timeout, cwd=REPO)


def local_train(run_dir: Path, *overrides: str, timeout: float = 600.0) -> subprocess.CompletedProcess:
    """The same run on one machine (an embedded Ray of its own, in this namespace)."""
    return subprocess.run([HYBRIDFLOW, "train", f"trainer.run_dir={run_dir}", *TINY, *overrides],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


def console(done: subprocess.CompletedProcess) -> str:
    return done.stdout + done.stderr


def check_ok(done: subprocess.CompletedProcess) -> str:
    text = console(done)
    assert done.returncode == 0, f"rc {done.returncode}:\n{text[-6000:]}"
    return text


def rl_records(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "rl"]


def comparable(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(UNCOMPARABLE) and not k.endswith("_per_s")}


def workers_by_role(run_dir: Path) -> dict[str, list[tuple[int, str, str | None]]]:
    """role -> [(rank, node IP, interface)] from the run's status.json."""
    out: dict[str, list] = {}
    for w in read_status(run_dir)["workers"]:
        out.setdefault(w["role"], []).append((w["rank"], w["node"], w.get("interface")))
    return out


def when(condition: Callable[[], bool], then: Callable[[], None], timeout_s: float = 600.0) -> threading.Thread:
    """In the background: wait until `condition()` holds, then run `then()` (a fault)."""
    def watch() -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if condition():
                then()
                return
            time.sleep(0.1)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def restart_records(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "restart"]


def json_report(done: subprocess.CompletedProcess) -> dict:
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and lines, f"rc {done.returncode}:\n{console(done)[-6000:]}"
    return json.loads(lines[-1].removeprefix("REPORT "))


def no_traceback(text: str) -> None:
    assert "Traceback" not in text, f"a traceback reached the console:\n{text[-6000:]}"
