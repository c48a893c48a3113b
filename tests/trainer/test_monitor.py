"""`hybridflow monitor` (cli/monitor.py, trainer/observe/monitor.py) against a live 2-rank GRPO run:
the profile finds both actor ranks by the run's status.json, samples them while the run
trains, and writes report.md / report.json with the time per phase and a PNG timeline.
No timing is asserted, only that what was measured is there and consistent.

    .venv/bin/python -m pytest -q tests/trainer/test_monitor.py
"""

from __future__ import annotations

import json
import os
import threading
import time

import matplotlib.image
import pytest

from hybridflow import RLTrainer
from hybridflow.cli import main
from hybridflow.cli.monitor import main as monitor_main
from hybridflow.trainer.observe.live_status import TRACE_REQUEST_FILE, read_status, read_timeline
from hybridflow.trainer.observe.monitor import Sample, attach, phase_intervals, summarize

GRPO_PHASES = {"gen", "reward", "old_log_prob", "adv", "update_actor", "save_checkpoint"}


def test_monitor_usage_errors_exit_2(tmp_path, capsys):
    assert main(["monitor"]) == 2
    assert "give a run directory or --address" in capsys.readouterr().err
    assert main(["monitor", str(tmp_path)]) == 2  # no status.json: not a run (yet)
    assert "has no status.json" in capsys.readouterr().err
    # An environment run writes one as every kind does (was "environment runs write none").
    (tmp_path / "config.yaml").write_text("env: {id: CartPole-v1}\n")
    assert main(["monitor", str(tmp_path)]) == 2
    assert "or the run has not started yet" in capsys.readouterr().err
    (tmp_path / "config.yaml").unlink()
    assert main(["monitor", str(tmp_path), "--trace"]) == 2  # a trace is part of a profile
    assert "--trace goes with --profile" in capsys.readouterr().err
    # A run whose process has exited (finished, killed): its status.json still lists workers, which
    # were sampled as if alive ("TaskUnschedulableError: ... NodeAffinitySchedulingStrategy").
    import socket
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / "status.json").write_text(json.dumps({
        "pid": int(gone.stdout), "host": socket.gethostname(), "state": "training", "step": 3, "phase": "gen",
        "phase_start": 0.0, "started": 0.0, "steps_done": 3, "restarts": 0,
        "workers": [{"role": "actor", "rank": 0, "pid": 1, "node": "127.0.0.1", "node_id": "x"}]}))
    assert main(["monitor", str(tmp_path)]) == 2
    assert f"is not running: its process (pid {int(gone.stdout)}) has exited" in capsys.readouterr().err


def test_summary_splits_time_by_phase_and_idle_samples():
    events = [{"t": 0.0, "step": 1, "phase": "gen"}, {"t": 2.0, "step": 1, "phase": "update_actor"},
              {"t": 3.0, "step": 1, "phase": None, "state": "finished"}]
    assert phase_intervals(events, 1.0, 4.0) == [(1.0, 2.0, "gen"), (2.0, 3.0, "update_actor")]
    samples = [Sample(1.5, "actor/0", 90.0, 100.0), Sample(2.5, "actor/0", 2.0, 120.0),
               Sample(1.5, "critic/0", 1.0, 50.0)]
    report = summarize(samples, [], events, {"actor/0": "actor", "critic/0": "critic"}, 1.0, 4.0, 1.0)
    assert report.phases == {"gen": 1.0, "update_actor": 1.0} and report.steps == 1
    assert report.role_cpu["gen"] == {"actor": 90.0, "critic": 1.0}
    assert report.workers["actor/0"] == {"busy_s": 1.0, "idle_s": 1.0, "mean_cpu_percent": 46.0, "peak_rss_mb": 120.0}


def test_a_trace_request_makes_a_worker_process_record_its_calls(tmp_path, monkeypatch):
    import torch

    from hybridflow.controller.tracing import ENV_VAR, TraceRecorder, request_trace, trace_file

    request = tmp_path / TRACE_REQUEST_FILE
    monkeypatch.setenv(ENV_VAR, str(request))
    recorder = TraceRecorder(rank=1)
    with recorder.call("actor", "update_actor"):  # no request yet: nothing recorded
        pass
    assert recorder._profiler is None
    request_trace(request, until=time.time() + 1.0, out_dir=tmp_path / "traces")
    with recorder.call("actor", "update_actor"):
        torch.ones(8, 8) @ torch.ones(8, 8)
    assert recorder._profiler is not None
    while time.time() < 1.0 + request.stat().st_mtime:  # past the window (no time is asserted)
        time.sleep(0.1)
    with recorder.call("actor", "generate_sequences"):  # the first call after the window writes the trace
        pass
    assert recorder._profiler is None
    events = json.loads(trace_file(tmp_path / "traces", 1, os.getpid()).read_text())["traceEvents"]
    assert "actor.update_actor" in {e.get("name") for e in events}
    with recorder.call("actor", "update_actor"):  # the same request is not taken up again
        pass
    assert recorder._profiler is None


# Starts 2-rank GRPO workers once and trains while the monitor samples (~40-60 s here).
@pytest.mark.slow
def test_monitor_profiles_a_live_two_rank_run(ray_local, tiny_config, tmp_path):
    run_dir, out = tmp_path / "run", tmp_path / "profile"
    trainer = RLTrainer(tiny_config("algorithm.name=grpo", "trainer.val_before_train=false",
                                    "trainer.total_steps=10", f"trainer.run_dir={run_dir}"))
    result: dict = {}

    def watch() -> None:
        while not (read_status(run_dir) or {}).get("phase"):  # the workers exist and a step is under way
            time.sleep(0.1)
        # --address: the same workers, found in Ray's actor table (this process is the driver).
        result["by_address"] = {(w.role, w.rank, w.pid) for w in attach(address=ray_local.address)}
        result["rc"] = monitor_main([str(run_dir), "--profile", "cpu", "--duration", "6", "--interval", "0.2",
                                     "--out", str(out), "--trace"])

    watcher = threading.Thread(target=watch, daemon=True)
    with trainer:
        watcher.start()
        trainer.train()
    watcher.join(timeout=120)
    assert result.get("rc") == 0
    status_workers = {(w["role"], w["rank"], w["pid"]) for w in read_status(run_dir)["workers"]}
    assert status_workers <= result["by_address"]
    report = json.loads((out / "report.json").read_text())
    assert sorted(report["workers"]) == ["actor/0", "actor/1"]
    for worker in report["workers"].values():
        assert worker["busy_s"] + worker["idle_s"] > 0 and worker["peak_rss_mb"] > 0
    # Which phases the window saw depends on the machine's speed; each is one of GRPO's.
    assert report["phases"] and set(report["phases"]) <= GRPO_PHASES and report["steps"] >= 1
    assert sum(report["phases"].values()) <= report["end"] - report["start"] + 1e-6
    assert report["role_cpu"] and report["overhead"]["monitor_cpu_s"] >= 0
    text = (out / "report.md").read_text()
    assert all(f"| {name} |" in text for name in report["phases"]) and "| actor/1 |" in text
    assert report["dtype"].startswith("actor fp32, rollout fp32") and f"dtype: {report['dtype']}" in text
    # --trace: each actor process recorded a torch profiler trace of the window, with its calls.
    assert sorted(report["traces"]) == ["actor/0", "actor/1"] and not (run_dir / TRACE_REQUEST_FILE).exists()
    for path in report["traces"].values():
        names = {e.get("name") for e in json.loads((out / path).read_text())["traceEvents"]}
        assert names & {f"actor.{m}" for m in ("generate_sequences", "compute_log_prob", "update_actor")}, path
    assert "## Torch profiler traces" in text
    image = matplotlib.image.imread(out / "timeline.png")
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    # The trainer's timeline covers every step it ran, each ending with the run's state.
    events = read_timeline(run_dir)
    assert {e["step"] for e in events if e["phase"] == "update_actor"} == set(range(1, 11))
    assert events[-1]["state"] == "finished"
