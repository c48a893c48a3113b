"""hybridflow vs Stable-Baselines3 on environment tasks, side by side in one run (issue 15).

Run (CartPole ~10-20 s per run, Pendulum ~1-3 min per run on 2 cores):

    .venv/bin/pip install -e '.[bench-envs]'      # stable-baselines3, pinned; never a runtime dependency
    .venv/bin/python benchmarks/envs/bench_vs_sb3.py                                  # both tasks, seeds 0 1 2
    .venv/bin/python benchmarks/envs/bench_vs_sb3.py --tasks ppo_cartpole --seeds 0 --workers 0,2:sync,2:async
    .venv/bin/python benchmarks/envs/bench_vs_sb3.py --tasks sac_pendulum_64 --steps 3000 --rounds 2   # profile

Tasks and hyper-parameters: vs_sb3_runs.TASKS (rl-baselines3-zoo's PPO CartPole-v1 and SAC
Pendulum-v1 entries), the same for both systems. Every run is its own process
(vs_sb3_runs.py); for each task and seed the runs go SB3, hybridflow with 0 (in-process),
1, 2 env-runner workers, so load on the shared machine hits all alike. A run stops when the
mean return of its last 20 training episodes reaches the threshold (475 CartPole, -200
Pendulum) or at the step budget. Reported per system: runs that reached the threshold,
median environment steps and seconds to it (training time, workers already started;
start-up is reported apart), median environment steps per second over the run, and the
ratio of each to SB3's; CPU seconds of the process tree (per 1000 steps, and to the
threshold), since the machine is shared and wall time follows its load. Writes benchmarks/envs/results/vs_sb3.json (with the machine
description and load averages) and one learning-curve PNG per task beside it
(benchmarks/envs/results/vs_sb3_<task>.png; --out names both).

`--workers` entries are runner counts, `N:sync` or `N:async` to pick the sampling (plain N:
sync for 1, async for more). `--steps N` profiles instead: every run takes exactly N
environment steps (no threshold stop), `--rounds` times over, runs interleaved, and a second
table splits each system's time: the controller's wall seconds per phase and CPU seconds
per process role (vs_sb3_runs.py), per 1000 environment steps (medians over seeds and rounds).

`--baseline-tree DIR` adds, after each hybridflow run, the same run of the hybridflow in
another source tree (e.g. `git archive <commit> | tar -x -C DIR`), labelled "baseline":
a before/after comparison interleaved in one run, so both see the same load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402

from benchmarks.controller.bench_controller import machine  # noqa: E402
from benchmarks.envs.vs_sb3_runs import TASKS  # noqa: E402


def parse_workers(spec: str) -> list[tuple[int, str]]:
    """'0,1,2:sync,2:async' -> [(0, 'sync'), (1, 'sync'), (2, 'sync'), (2, 'async')]."""
    out = []
    for entry in spec.split(","):
        count, _, sampling = entry.partition(":")
        out.append((int(count), sampling or ("async" if int(count) > 1 else "sync")))
    return out


def run_one(system: str, task: str, seed: int, workers: tuple[int, str], tmp: Path, steps: int | None = None,
            round_: int = 0, tree: Path | None = None) -> dict[str, Any]:
    """One run in its own process; a run whose JSON is already in the work dir is reused.
    `tree`: run that source tree's hybridflow (its vs_sb3_runs.py, on its PYTHONPATH)."""
    count, sampling = workers
    budget = f"-{steps}steps-r{round_}" if steps else ""
    out = tmp / f"{system}{'-baseline' if tree else ''}-{task}-{seed}-{count}{'-' + sampling if count else ''}{budget}.json"
    if out.is_file():
        return json.loads(out.read_text())
    runs_py = (tree / HERE.relative_to(HERE.parents[1]) if tree else HERE) / "vs_sb3_runs.py"
    cmd = [sys.executable, str(runs_py), "--system", system, "--task", task, "--seed", str(seed),
           "--workers", str(count), "--sampling", sampling, "--run-dir", str(tmp / "runs"), "--out", str(out)]
    cmd += ["--steps", str(steps)] if steps else []
    env = {**os.environ, "PYTHONPATH": str(tree)} if tree else None
    load_before = os.getloadavg()[0]
    for attempt in (1, 2):  # a Ray start can fail now and then on a loaded machine; its log is kept
        log = out.with_suffix(f".try{attempt}.log")
        with log.open("w") as err:
            # cwd: Ray's workers put the driver's working directory on their path, so a baseline
            # run started from this tree would import this tree's hybridflow in its workers.
            done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env,
                                  cwd=str(tree) if tree else None).returncode == 0
        if done:
            break
        print(f"run failed ({log}); {'trying once more' if attempt == 1 else 'giving up'}", flush=True)
    if not done:
        raise RuntimeError(f"{' '.join(cmd)} failed twice; see {log}")
    result = json.loads(out.read_text())
    result["baseline"] = tree is not None
    result["load_avg_1min"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    out.write_text(json.dumps(result))
    return result


def label(run: dict[str, Any]) -> str:
    if run["system"] == "sb3":
        return "sb3"
    name = "hybridflow baseline" if run.get("baseline") else "hybridflow"
    if run["workers"] == 0:
        return f"{name} workers=0"
    sampling = run.get("sampling") or ("async" if run["workers"] > 1 else "sync")  # runs from before the option
    return f"{name} workers={run['workers']} {sampling}"


def split_table(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per task and system, per 1000 environment steps (median over runs): phase wall seconds
    (controller's view) and CPU seconds per process role."""
    table: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for run in runs:
        table.setdefault(run["task"], {}).setdefault(label(run), []).append(run)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for task, systems in table.items():
        for name, group in systems.items():
            row: dict[str, float] = {"wall_s": statistics.median(1000 * r["wall_s"] / r["env_steps"] for r in group),
                                     "cpu_s": statistics.median(1000 * r["cpu_s"] / r["env_steps"] for r in group)}
            for field in ("phases_s", "cpu_by_role"):
                keys = sorted({k for r in group for k in r.get(field, {})})
                for key in keys:
                    row[f"{'phase' if field == 'phases_s' else 'cpu'}:{key}"] = statistics.median(
                        1000 * r.get(field, {}).get(key, 0.0) / r["env_steps"] for r in group)
            out.setdefault(task, {})[name] = {k: round(v, 4) for k, v in row.items()}
    return out


def print_split(split: dict[str, dict[str, dict[str, float]]]) -> None:
    print("\nseconds per 1000 environment steps (median): wall, CPU of the process tree, "
          "controller wall per phase, CPU per process role")
    for task, rows in split.items():
        for name, row in rows.items():
            cells = " ".join(f"{k}={v:.3f}" for k, v in row.items())
            print(f"{task:14} {name:26} {cells}")


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per task and system: reached count, medians, and ratios to SB3."""
    table: dict[str, dict[str, Any]] = {}
    for run in runs:
        table.setdefault(run["task"], {}).setdefault(label(run), []).append(run)
    summary: dict[str, dict[str, Any]] = {}
    for task, systems in table.items():
        rows = {}
        for name, group in systems.items():
            reached = [r for r in group if r["reached_at_steps"] is not None]
            rows[name] = {
                "runs": len(group), "reached": len(reached),
                "median_steps_to_target": statistics.median(r["reached_at_steps"] for r in reached) if reached else None,
                "median_seconds_to_target": statistics.median(r["time_to_target_s"] for r in reached) if reached else None,
                "max_seconds_to_target": max(r["time_to_target_s"] for r in reached) if reached else None,
                "median_steps_per_s": statistics.median(r["steps_per_s"] for r in group),
                "median_cpu_s_per_1k_steps": statistics.median(1000 * r["cpu_s"] / r["env_steps"] for r in group),
                "median_cpu_s_to_target": statistics.median(r["cpu_s"] for r in reached) if reached else None,
                "median_setup_s": statistics.median(r["setup_s"] for r in group),
                # after the loop: plots, stopping the workers and Ray (hybridflow runs measured since it was kept)
                "median_teardown_s": statistics.median(r["teardown_s"] for r in group) if all(
                    "teardown_s" in r for r in group) else None,
            }
        base = rows.get("sb3")
        for row in rows.values():
            if base and base["median_steps_per_s"]:
                row["steps_per_s_vs_sb3"] = row["median_steps_per_s"] / base["median_steps_per_s"]
            if base and base["median_seconds_to_target"] and row["median_seconds_to_target"]:
                row["time_to_target_vs_sb3"] = row["median_seconds_to_target"] / base["median_seconds_to_target"]
            if base and base["median_cpu_s_to_target"] and row["median_cpu_s_to_target"]:
                row["cpu_to_target_vs_sb3"] = row["median_cpu_s_to_target"] / base["median_cpu_s_to_target"]
        summary[task] = rows
    return summary


def print_table(summary: dict[str, dict[str, Any]]) -> None:
    print(f"{'task':14} {'system':24} {'reached':>7} {'steps to target':>15} {'s to target':>11} "
          f"{'steps/s':>8} {'x SB3 steps/s':>13} {'x SB3 time':>10} {'cpu s/1k':>8} {'x SB3 cpu':>9} {'setup s':>7} {'teardown s':>10}")
    for task, rows in summary.items():
        for name, row in rows.items():
            def fmt(key: str, spec: str) -> str:
                return format(row[key], spec) if row.get(key) is not None else "-"

            print(f"{task:14} {name:24} {row['reached']:>3}/{row['runs']:<3} {fmt('median_steps_to_target', ',.0f'):>15} "
                  f"{fmt('median_seconds_to_target', '.1f'):>11} {fmt('median_steps_per_s', ',.0f'):>8} "
                  f"{fmt('steps_per_s_vs_sb3', '.2f'):>13} {fmt('time_to_target_vs_sb3', '.2f'):>10} "
                  f"{fmt('median_cpu_s_per_1k_steps', '.2f'):>8} {fmt('cpu_to_target_vs_sb3', '.2f'):>9} "
                  f"{fmt('median_setup_s', '.1f'):>7} {fmt('median_teardown_s', '.1f'):>10}")


def plot(runs: list[dict[str, Any]], out: Path) -> list[str]:
    """One learning-curve PNG per task beside the JSON: <json stem>[_<task>].png."""
    from hybridflow.trainer.observe.plots import plot_return_curves

    written = []
    tasks = sorted({r["task"] for r in runs})
    for task in tasks:
        curves = {f"{label(r)} seed {r['seed']}": r["curve"] for r in runs if r["task"] == task}
        name = f"{out.stem}.png" if len(tasks) == 1 else f"{out.stem}_{task}.png"
        path = plot_return_curves(curves, out.parent / name, f"{TASKS[task]['env']}: hybridflow vs SB3",
                                  threshold=TASKS[task]["threshold"])
        path = path.resolve()
        written.append(str(path.relative_to(HERE.parents[1])) if path.is_relative_to(HERE.parents[1]) else str(path))
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="ppo_cartpole,sac_pendulum")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--workers", default="0,1,2",
                        help="hybridflow env-runner counts (0: in-process), N:sync or N:async to pick the sampling")
    parser.add_argument("--steps", type=int, default=None, help="profile: exactly this many steps per run, no threshold")
    parser.add_argument("--rounds", type=int, default=1, help="with --steps: repeat every run this many times")
    parser.add_argument("--out", default=str(HERE / "results" / "vs_sb3.json"))
    parser.add_argument("--work-dir", default=None, help="keep each run's JSON here; runs already there are reused")
    parser.add_argument("--replot", action="store_true", help="only redraw the PNGs of an existing --out JSON")
    parser.add_argument("--baseline-tree", default=None,
                        help="also run every hybridflow run with the hybridflow of this source tree (before/after)")
    args = parser.parse_args()
    if args.replot:
        print(plot(json.loads(Path(args.out).read_text())["runs"], Path(args.out)))
        return
    tasks, seeds = args.tasks.split(","), [int(s) for s in args.seeds.split(",")]
    workers = parse_workers(args.workers)
    started = time.time()
    runs: list[dict[str, Any]] = []
    out = Path(args.out)
    with contextlib.ExitStack() as stack:
        work = Path(args.work_dir) if args.work_dir else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        work.mkdir(parents=True, exist_ok=True)
        trees = [None] + ([Path(args.baseline_tree).resolve()] if args.baseline_tree else [])
        for round_, task, seed in [(r, t, s) for r in range(args.rounds) for t in tasks for s in seeds]:
            for system, count, tree in [("sb3", (0, "sync"), None)] + [("hybridflow", w, t) for w in workers for t in trees]:
                run = run_one(system, task, seed, count, work, args.steps, round_, tree)
                runs.append(run)
                print(f"{task} seed {seed} {label(run)}: reached at {run['reached_at_steps']} steps, "
                      f"{run['time_to_target_s']} s, {run['steps_per_s']:.0f} steps/s, cpu {run['cpu_s']:.1f} s, "
                      f"load {run['load_avg_1min']}", flush=True)
                write(out, runs, {t: TASKS[t] for t in tasks}, time.time() - started)  # kept if cut off
    print_table(summarize(runs))
    print_split(split_table(runs))
    print(f"wrote {out}")


def cpu_figures(per_1k_steps: dict[str, dict[str, dict[str, float]]]) -> dict[str, float]:
    """The table's key figures (benchmarks/report.py): CPU seconds per 1000 steps, per task and system."""
    return {f"{task} {system} cpu_s/1k": row["cpu_s"] for task, systems in per_1k_steps.items()
            for system, row in systems.items()}


def write(out: Path, runs: list[dict[str, Any]], tasks: dict[str, Any], wall_s: float) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    plots = plot(runs, out)
    per_1k = split_table(runs)
    out.write_text(json.dumps(stamp({"machine": machine(), "wall_s": round(wall_s, 1), "tasks": tasks,
                               "key_figures": cpu_figures(per_1k) if per_1k else None,
                               "summary": summarize(runs), "per_1k_steps": per_1k, "plots": plots,
                               "runs": runs}), indent=1))


if __name__ == "__main__":
    main()
