"""Start-up of `hybridflow train` (issue 17): seconds and CPU seconds to the first step.

Run (about a minute on a quiet 2-core machine; `--sft-steps 2` keeps the warm start short,
everything before its first step is the default run's):

    .venv/bin/python benchmarks/controller/bench_startup.py --repeats 3

Each repeat starts `hybridflow train` on the built-in default (tiny model, SFT warm start,
GRPO) with `trainer.total_steps=1` in a fresh subprocess and reads the run's metrics.jsonl
while a sampler sums the CPU time of the whole process tree (controller, Ray's daemons,
the workers, the reward pool). Reported: wall seconds and tree CPU seconds from the
spawn to the end of the first optimizer step (SFT step 1), and from the end of the SFT
phase (its last held-out evaluation) to the end of the first RL step (building the RL
actor, then one step); the load average and the CPU other processes took (foreign, in
cores) beside them, since the cores are shared. On a quiet machine the wall time of a
stage lies between its CPU seconds / cores and its CPU seconds (plus waits). Writes
benchmarks/controller/results/startup.json with the machine description.

`--env` measures environment runs instead (issue 28, goal 5; about 2 minutes on a quiet
2-core machine):

    .venv/bin/pip install -e '.[bench-envs]'      # stable-baselines3, pinned
    .venv/bin/python benchmarks/controller/bench_startup.py --env --repeats 3

Per repeat, each in a fresh process, interleaved: the floor of a start on Ray (importing
ray, `init_ray` alone, then one actor that imports torch: what any Ray env runner pays),
then PPO CartPole set-up as bench_vs_sb3.py times it (up to the first environment step:
SB3's model and environments; hybridflow's trainer, Ray and its workers) for SB3,
hybridflow in-process (0 workers) and with one Ray env runner. Writes
benchmarks/controller/results/startup_env.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402
from benchmarks.rl.bench_vs_trl import TreeSampler, _busy_cpu_seconds

HERE = Path(__file__).resolve().parent
HYBRIDFLOW = Path(sys.executable).with_name("hybridflow")


def records(run_root: Path) -> list[dict]:
    runs = sorted(run_root.glob("*/metrics.jsonl"))
    if not runs:
        return []
    out = []
    for line in runs[0].read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            break
    return out


def one_run(work: Path, sft_steps: int, extra: list[str]) -> dict:
    """Spawn one `hybridflow train`, sample its tree, return the stage times."""
    out_dir = work / "runs"
    cmd = [str(HYBRIDFLOW), "train", f"trainer.output_dir={out_dir}", "trainer.total_steps=1",
           f"sft.steps={sft_steps}", "trainer.save_final_model=false", "trainer.console=none", *extra]
    busy0, t0 = _busy_cpu_seconds(), time.time()
    load0 = os.getloadavg()
    log = open(work / "log.txt", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=work)
    sampler = TreeSampler(proc.pid, interval=0.1)
    sampler.start()
    marks: dict[str, tuple[float, float]] = {}  # stage -> (seconds since spawn, tree CPU s)
    while proc.poll() is None:
        recs = records(out_dir)
        cpu = sum(sampler.cpu_by_pid.values())
        if "first_step" not in marks and any(r["phase"] == "sft" for r in recs):
            marks["first_step"] = (next(r["time"] for r in recs if r["phase"] == "sft") - t0, cpu)
        sft_end = [r for r in recs if r["phase"] == "sft_eval" and r["step"] == sft_steps]
        if "sft_end" not in marks and sft_end:
            marks["sft_end"] = (sft_end[0]["time"] - t0, cpu)
        if "first_rl_step" not in marks and any(r["phase"] == "rl" for r in recs):
            marks["first_rl_step"] = (next(r["time"] for r in recs if r["phase"] == "rl") - t0, cpu)
        time.sleep(0.1)
    sampler.stop()
    log.close()
    wall = time.time() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"hybridflow train failed (exit {proc.returncode}); see {work / 'log.txt'}")
    own = sum(sampler.cpu_by_pid.values())
    first, sft_end, rl = marks["first_step"], marks["sft_end"], marks["first_rl_step"]
    return {
        "to_first_step_s": first[0], "to_first_step_cpu_s": first[1],
        "sft_end_to_first_rl_step_s": rl[0] - sft_end[0], "sft_end_to_first_rl_step_cpu_s": rl[1] - sft_end[1],
        "whole_run_s": wall, "whole_run_cpu_s": own,
        "load_avg_before": [round(x, 2) for x in load0], "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "foreign_cpu_cores": max(0.0, (_busy_cpu_seconds() - busy0 - own) / wall),
        "peak_processes": sampler.peak_processes,
    }


# A fresh process: import ray, start hybridflow's embedded Ray, then one actor that imports
# torch (an env runner's process does, and the learner's): the floor under a Ray runner's start.
RAY_FLOOR = """
import json, time
t0 = time.perf_counter()
import ray
from hybridflow.controller import init_ray
t1 = time.perf_counter()
init_ray()
t2 = time.perf_counter()

@ray.remote(num_cpus=1)
class Probe:
    def ready(self):
        import torch
        return torch.get_num_threads()

ray.get(Probe.remote().ready.remote())
t3 = time.perf_counter()
print(json.dumps({"import_ray_s": t1 - t0, "init_ray_s": t2 - t1, "actor_importing_torch_s": t3 - t2}))
"""


def env_startup(repeats: int) -> dict:
    """--env: the Ray floor and PPO CartPole set-up of SB3, hybridflow in-process and with
    one Ray env runner, `repeats` interleaved rounds (bench_vs_sb3.run_one, 512 steps)."""
    from benchmarks.envs.bench_vs_sb3 import run_one

    systems = [("sb3", (0, "sync")), ("hybridflow", (0, "sync")), ("hybridflow", (1, "sync"))]
    rows = []
    for repeat in range(repeats):
        load = os.getloadavg()[0]
        floor = json.loads(subprocess.run([sys.executable, "-c", RAY_FLOOR], capture_output=True, text=True,
                                          check=True).stdout.strip().splitlines()[-1])
        row = {"repeat": repeat, "load_avg_1min": round(load, 2), "ray_floor": floor, "setup_s": {}}
        with tempfile.TemporaryDirectory(prefix="hf_startup_env_") as tmp:
            for system, workers in systems:
                run = run_one(system, "ppo_cartpole", 0, workers, Path(tmp), steps=512, round_=repeat)
                name = "sb3" if system == "sb3" else f"hybridflow workers={workers[0]}"
                row["setup_s"][name] = run["setup_s"]
                if "teardown_s" in run:
                    row.setdefault("teardown_s", {})[name] = run["teardown_s"]
        rows.append(row)
        print(f"repeat {repeat} (load {load:.1f}): ray floor {json.dumps({k: round(v, 2) for k, v in floor.items()})}; "
              f"set-up " + ", ".join(f"{k} {v:.1f} s" for k, v in row["setup_s"].items()), flush=True)
    names = list(rows[0]["setup_s"])
    summary = {"setup_s": {n: statistics.median(r["setup_s"][n] for r in rows) for n in names},
               "ray_floor": {k: statistics.median(r["ray_floor"][k] for r in rows) for k in rows[0]["ray_floor"]}}
    print("medians: " + json.dumps({k: {n: round(v, 2) for n, v in d.items()} for k, d in summary.items()}))
    return {"summary": summary, "runs": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--env", action="store_true", help="environment runs: Ray floor and PPO set-up vs SB3")
    parser.add_argument("--sft-steps", type=int, default=2, help="warm-start steps (the default run has 400)")
    parser.add_argument("--note", default="")
    parser.add_argument("--out", default=str(HERE / "results" / "startup.json"))
    parser.add_argument("overrides", nargs="*", help="extra key=value settings for every run")
    args = parser.parse_args()
    from benchmarks.controller.bench_controller import machine

    if args.env:
        out_path = Path(args.out).with_name("startup_env.json") if args.out == parser.get_default("out") else Path(args.out)
        result = env_startup(args.repeats)
        out = {"benchmark": "bench_startup_env", "command": " ".join(["python", *sys.argv]), "note": args.note,
               **result, "machine": machine()}
        out_path.write_text(json.dumps(stamp(out), indent=2) + "\n")
        print(f"wrote {out_path}")
        return
    runs = []
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="hf_startup_") as tmp:
            run = one_run(Path(tmp), args.sft_steps, args.overrides)
        runs.append(run)
        print(f"repeat {repeat}: first step {run['to_first_step_s']:.1f} s ({run['to_first_step_cpu_s']:.1f} CPU s), "
              f"SFT end -> first RL step {run['sft_end_to_first_rl_step_s']:.1f} s "
              f"({run['sft_end_to_first_rl_step_cpu_s']:.1f} CPU s); load {run['load_avg_before'][0]:.1f}, "
              f"foreign {run['foreign_cpu_cores']:.2f} cores", flush=True)
    keys = ("to_first_step_s", "to_first_step_cpu_s", "sft_end_to_first_rl_step_s", "sft_end_to_first_rl_step_cpu_s")
    summary = {k: statistics.median(r[k] for r in runs) for k in keys}
    print("medians: " + ", ".join(f"{k} {v:.1f}" for k, v in summary.items()))
    out = {"benchmark": "bench_startup", "command": " ".join(["python", *sys.argv]), "note": args.note,
           "summary": summary, "runs": runs, "machine": machine()}
    Path(args.out).write_text(json.dumps(stamp(out), indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
