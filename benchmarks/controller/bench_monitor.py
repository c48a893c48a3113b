"""What watching a run costs the run: `hybridflow monitor` overhead, measured side by side.

    PYTHONPATH=. .venv/bin/python benchmarks/controller/bench_monitor.py [--steps 8] [--pairs 2] [--trace]

1. The trainer's own cost of being watchable: LiveStatus.phase per phase (a timeline.jsonl
   line; status.json at most once a second), timed over 2000 calls, and one forced
   status.json replace (what a state change costs).
2. The same tiny 2-rank GRPO run, alternately unwatched and watched by
   `hybridflow monitor RUN --profile cpu --interval 0.5` in a separate process (pairs
   alternate so that drifting load hits both): median seconds per step of each, their
   ratio, and the monitor's own CPU use (its report). The machine's load average is
   recorded before and after: on a shared machine the step-time ratio is noise-bound.

With --trace the watching monitor also has every worker record a torch profiler trace of
the whole run (`--trace`, controller/tracing.py): the cost of tracing.

Writes benchmarks/controller/results/bench_monitor.json (bench_monitor_trace.json with --trace) with
the machine description.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402
from benchmarks.controller.bench_controller import machine

from hybridflow import RLTrainer
from hybridflow.config.schema import load_run_config
from hybridflow.trainer.observe.live_status import LiveStatus, read_status
from hybridflow.trainer.run.run_dir import read_metrics

TINY = ["trainer.console=none", "trainer.test_freq=0", "trainer.save_final_model=false", "sft.steps=0",
        "trainer.val_before_train=false", "algorithm.name=grpo", "resources.world_size=2",
        "model.builtin.hidden_size=32", "model.builtin.intermediate_size=64", "model.builtin.num_hidden_layers=2",
        "data.train_batch_size=4", "rollout.n=2", "data.builtin.num_train=64", "data.builtin.num_val=8",
        "actor.micro_batch.mini_batch_size=4", "actor.micro_batch.micro_batch_size_per_device=2",
        "reward.manager.num_workers=1", "trainer.loggers=[jsonl]"]


def status_write_cost(calls: int = 2000) -> tuple[float, float]:
    """Seconds per LiveStatus.phase call, and per forced status.json replace."""
    with tempfile.TemporaryDirectory() as tmp:
        status = LiveStatus(Path(tmp))
        start = time.perf_counter()
        for i in range(calls):
            status.phase("update_actor", step=i)
        per_phase = (time.perf_counter() - start) / calls
        start = time.perf_counter()
        for i in range(200):
            status.update(state="training" if i % 2 else "restarting")
        forced = (time.perf_counter() - start) / 200
        status.close()
        return per_phase, forced


def one_run(root: Path, steps: int, watched: bool, trace: bool = False) -> dict:
    run_dir = root / f"run-{time.monotonic_ns()}"
    cfg = load_run_config(None, [f"trainer.run_dir={run_dir}", f"trainer.total_steps={steps}", *TINY])
    monitor: dict = {}

    def watch() -> None:
        while not (read_status(run_dir) or {}).get("phase"):
            time.sleep(0.05)
        out = run_dir / "profile"
        done = subprocess.run([sys.executable, "-m", "hybridflow.cli", "monitor", str(run_dir), "--profile", "cpu",
                               "--interval", "0.5", "--duration", "3600", "--out", str(out),
                               *(["--trace"] if trace else [])],
                              capture_output=True, text=True, timeout=3600, check=False)
        monitor["rc"] = done.returncode

    with RLTrainer(cfg) as trainer:
        if watched:
            thread = threading.Thread(target=watch, daemon=True)
            thread.start()
        trainer.train()
    if watched:
        thread.join(timeout=120)
        report = json.loads((run_dir / "profile" / "report.json").read_text())
        monitor.update(report["overhead"], traces=len(report["traces"]))
    step_s = [r["timing_s/step"] for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "rl"]
    return {"watched": watched, "median_step_s": statistics.median(step_s[1:]), "steps": len(step_s),
            "monitor": monitor}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--trace", action="store_true", help="the monitor also records torch profiler traces")
    args = parser.parse_args()
    load_before = machine()["load_avg_1_5_15"]
    write_s, forced_s = status_write_cost()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.pairs):
            for watched in (False, True):
                runs.append(one_run(Path(tmp), args.steps, watched, args.trace))
    off = statistics.median(r["median_step_s"] for r in runs if not r["watched"])
    on = statistics.median(r["median_step_s"] for r in runs if r["watched"])
    result = {"machine": machine(), "load_avg_before": load_before, "trace": args.trace, "phase_mark_us": write_s * 1e6,
              "forced_status_write_us": forced_s * 1e6,
              "phases_per_grpo_step": 5, "status_share_of_step": 5 * write_s / off, "runs": runs,
              "median_step_s_unwatched": off, "median_step_s_watched": on, "watched_over_unwatched": on / off}
    print(f"per phase: {write_s * 1e6:.0f} us ({result['status_share_of_step']:.3%} of a {off:.2f} s step at 5 "
          f"phases); a forced status.json replace: {forced_s * 1e6:.0f} us")
    print(f"median s/step: unwatched {off:.3f}, watched {on:.3f}, ratio {on / off:.3f} "
          f"(load avg before {load_before}, after {result['machine']['load_avg_1_5_15']})")
    out = Path(__file__).with_name("results") / ("bench_monitor_trace.json" if args.trace else "bench_monitor.json")
    out.write_text(json.dumps(stamp(result), indent=1))
    print(f"written {out}")


if __name__ == "__main__":
    main()
