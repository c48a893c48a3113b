"""A run beside one competing job: how much slower than quiet (issue 28, goal 4).

Run (about 7 minutes on a quiet 2-core machine):

    .venv/bin/pip install -e '.[bench]'        # trl, pinned; never a runtime dependency
    .venv/bin/python benchmarks/controller/bench_contention.py
    .venv/bin/python benchmarks/controller/bench_contention.py --workloads sft_demo --policies inherit,passive --repeats 2

The competing job is what a shared machine or a CI runner has beside a run: one process
of 2 torch threads multiplying 512x512 fp32 matrices in a loop, at the same niceness,
started before the run and stopped after it. With 2 cores, a fair share is half the
machine, so a run that slows by 2x lost only what it had to give; more is waste.

Workloads:
- grpo_tiny: bench_vs_trl.py's tiny GRPO workload (1.0M-parameter Qwen2, 8 prompts x 8
  samples, 8 new tokens, fp32), run by vs_trl_runs.py for both systems: TRL's GRPOTrainer
  (torch threads = cores, as it runs by itself) and hybridflow's RLTrainer.
- sft_demo: `hybridflow train` on the built-in default (the demo run), its SFT warm-start
  phase: the steps' wall-clock intervals from metrics.jsonl.
- probe: no framework, one process of plain torch (PROBE: a 4-layer d=128 transformer,
  two forward/backward passes of 128 x 40 tokens, AdamW, 8 small no-grad forwards per
  step), once per `--probe-variants` entry (environment settings of OpenMP, or T=1 for
  one torch thread): what the wait policy does by itself. `--pin 2,3` runs the probe and
  the competitor on those cores only (a 2-core slice of a bigger, idle machine).

hybridflow runs once per `--policies` entry, its `resources.omp_wait_policy` (auto, the
default: passive and the free cores' threads when other work keeps the cores busy as the
run starts, else inherit; short_spin: OpenMP threads spin 1000 turns at a barrier, then
sleep; passive: they sleep at once; inherit: the OpenMP runtime's own wait, GNU libgomp's
spin of ~300000 turns before sleeping, as before that setting existed); each run's
resolved policy and threads per rank (its config.yaml) are recorded as `resolved_policy`
("passive x1"). TRL runs as a user starts it, with the OpenMP runtime's own wait.

Method. For each repeat, workload, system and policy: a quiet run, then the same run
beside the competitor (interleaved, so load from elsewhere hits both alike). Step time:
median interval between consecutive step ends over steps 2..N; slowdown = contended /
quiet. While a run lasts, a sampler sums the CPU time of the run's process tree (for
hybridflow: controller, Ray, workers, reward pool) and of the competitor, in cores (CPU
seconds / wall seconds), and the CPU other processes took (foreign) beside the load
average, since the cores are shared. Writes benchmarks/controller/results/contention.json with the
machine description.
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
from typing import Any

import psutil
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402

from benchmarks.rl.bench_vs_trl import (  # noqa: E402  (the tiny workload and its runner, shared)
    WORKLOADS,
    TreeSampler,
    _busy_cpu_seconds,
    base_spec,
    flop_facts,
    model_dir,
    prompt_rows,
    run_once,
    summarize,
)

HYBRIDFLOW = Path(sys.executable).with_name("hybridflow")
COMPETITOR = ("import torch\ntorch.set_num_threads(2)\na = torch.randn(512, 512)\nb = torch.randn(512, 512)\n"
              "while True:\n    a @ b\n")
PROBE = """
import os, statistics, time
import torch
torch.set_num_threads(int(os.environ.get("T", "2")))
torch.manual_seed(0)
layers = [torch.nn.TransformerEncoderLayer(128, 4, 512, batch_first=True, dropout=0.0) for _ in range(4)]
model = torch.nn.Sequential(torch.nn.Embedding(64, 128), *layers, torch.nn.Linear(128, 64))
opt = torch.optim.AdamW(model.parameters())
x = torch.randint(0, 64, (128, 40))
ends = []
for _ in range(int(os.environ.get("STEPS", "10"))):
    for _ in range(2):
        torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
    opt.step()
    opt.zero_grad()
    with torch.no_grad():
        for _ in range(8):
            model(x[:16, :20])
    ends.append(time.time())
print(ends)
"""
PROBE_VARIANTS = "default,OMP_WAIT_POLICY=PASSIVE,GOMP_SPINCOUNT=1000,T=1"
GOAL_SLOWDOWN = 2.2  # issue 28: at most this much slower beside one competing job, on 2 cores


def pinned(cmd: list[str], pin: str | None) -> list[str]:
    return ["taskset", "-c", pin, *cmd] if pin else cmd


class Competitor:
    """The competing 2-thread matmul loop in its own process; its CPU share while it ran."""

    def __init__(self, env: dict[str, str], pin: str | None = None) -> None:
        self.proc = subprocess.Popen(pinned([sys.executable, "-c", COMPETITOR], pin), env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(2.0)  # torch imported and the loop running before the run starts
        self.ps = psutil.Process(self.proc.pid)
        self.cpu0, self.wall0 = self._cpu(), time.time()

    def _cpu(self) -> float:
        times = self.ps.cpu_times()
        return times.user + times.system

    def stop(self) -> float:
        """Stop it; the cores it used on average since the run started."""
        cores = (self._cpu() - self.cpu0) / (time.time() - self.wall0)
        self.proc.kill()
        self.proc.wait()
        return cores


def step_summary(end_times: list[float]) -> dict[str, float]:
    """Median, p90 and max of the intervals between step ends, steps 2..N."""
    intervals = sorted(b - a for a, b in zip(end_times, end_times[1:]))
    if not intervals:
        raise RuntimeError(f"need >= 2 steps for an interval, got {len(end_times)}")
    return {"median_step_s": statistics.median(intervals), "p90_step_s": intervals[int(0.9 * (len(intervals) - 1))],
            "max_step_s": intervals[-1], "steps": len(end_times)}


def sft_records(run_root: Path) -> list[dict]:
    runs = sorted(run_root.glob("*/metrics.jsonl"))
    lines = runs[0].read_text().splitlines() if runs else []
    return [r for r in (json.loads(line) for line in lines) if r["phase"] == "sft"]


def run_sft_demo(work: Path, steps: int, policy: str, env: dict[str, str]) -> dict[str, Any]:
    """`hybridflow train` (built-in default), SFT phase of `steps` steps then 1 RL step; sampled."""
    out_dir = work / "runs"
    cmd = [str(HYBRIDFLOW), "train", f"trainer.output_dir={out_dir}", "trainer.total_steps=1",
           f"sft.steps={steps}", "trainer.save_final_model=false", "trainer.console=none"]
    if policy != "unset":
        cmd.append(f"resources.omp_wait_policy={policy}")
    busy0, self0, wall0 = _busy_cpu_seconds(), time.process_time(), time.time()
    load0 = os.getloadavg()
    with open(work / "log.txt", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=work, env=env)
        sampler = TreeSampler(proc.pid, interval=0.3)
        sampler.start()
        rc = proc.wait()
        sampler.stop()
    wall = time.time() - wall0
    if rc != 0:
        raise RuntimeError(f"hybridflow train failed (exit {rc}); log {work / 'log.txt'}:\n"
                           f"{(work / 'log.txt').read_text()[-3000:]}")
    own = sum(sampler.cpu_by_pid.values()) + (time.process_time() - self0)
    recs = sft_records(out_dir)
    return {**step_summary([r["time"] for r in recs]),
            "step_timer_median_s": statistics.median(r["timing_s/step"] for r in recs[1:]),
            "wall_s": wall, "own_cpu_cores": own / wall,
            "foreign_cpu_cores": max(0.0, (_busy_cpu_seconds() - busy0 - own) / wall),
            "load_avg_before": [round(x, 2) for x in load0],
            "load_avg_after": [round(x, 2) for x in os.getloadavg()], "niceness_seen": sorted(sampler.niceness)}


def run_probe(variant: str, env: dict[str, str], pin: str | None, steps: int) -> dict[str, Any]:
    """PROBE in a fresh process with `variant`'s settings ("A=1,B=2" or "default")."""
    settings = dict(item.split("=", 1) for item in variant.split("+") if "=" in item)
    busy0, wall0, load0 = _busy_cpu_seconds(), time.time(), os.getloadavg()
    proc = subprocess.Popen(pinned([sys.executable, "-c", PROBE], pin), env={**env, **settings, "STEPS": str(steps)},
                            stdout=subprocess.PIPE, text=True)
    ps = psutil.Process(proc.pid)
    cpu = 0.0
    while proc.poll() is None:
        try:
            times = ps.cpu_times()
            cpu = times.children_user + times.user + times.system
        except psutil.Error:
            pass
        time.sleep(0.2)
    out = proc.stdout.read() if proc.stdout else ""
    if proc.returncode != 0:
        raise RuntimeError(f"probe {variant} failed (exit {proc.returncode})")
    wall = time.time() - wall0
    ends = json.loads(out.strip().splitlines()[-1])
    return {**step_summary(ends), "wall_s": wall, "own_cpu_cores": cpu / wall,
            "foreign_cpu_cores": max(0.0, (_busy_cpu_seconds() - busy0 - cpu) / wall),
            "load_avg_before": [round(x, 2) for x in load0], "load_avg_after": [round(x, 2) for x in os.getloadavg()]}


def run_grpo_tiny(spec: dict, env: dict[str, str], log: Path) -> dict[str, Any]:
    """One tiny-GRPO run through bench_vs_trl's runner and summary."""
    result = run_once(spec, env, log)
    summary = summarize(result, tuple(spec["flop_facts"]))
    ends = [r["end_time"] for r in sorted(result["records"], key=lambda r: r["step"])]
    return {**step_summary(ends), "median_step_s": summary["median_step_s"], "wall_s": result["wall_s"],
            "own_cpu_cores": result["own_cpu_cores"], "foreign_cpu_cores": result["foreign_cpu_cores"],
            "load_avg_before": result["load_avg_before"], "load_avg_after": result["load_avg_after"],
            "niceness_seen": result["niceness_seen"]}


def grpo_inputs(work: Path, steps: int) -> dict[str, Any]:
    """Model directory, prompt file and FLOP facts of the tiny workload (as bench_vs_trl makes them)."""
    from transformers import AutoTokenizer

    w = WORKLOADS["tiny"]
    model = model_dir(w, work)
    prompts = work / "tiny_prompts.jsonl"
    rows = prompt_rows(w, AutoTokenizer.from_pretrained(model, trust_remote_code=False), w.prompts_per_step * steps)
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {**base_spec(w, "fp32", model, prompts, steps, 0), "flop_facts": list(flop_facts(model))}


def plan(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(workload, system, policy) in run order; TRL runs with its OpenMP runtime's own wait."""
    out = []
    for workload in args.workloads.split(","):
        if workload == "probe":
            out += [(workload, "torch", v) for v in args.probe_variants.split(",")]
            continue
        if workload == "grpo_tiny" and "trl" in args.systems.split(","):
            out.append((workload, "trl", "unset"))
        if "hybridflow" in args.systems.split(","):
            out += [(workload, "hybridflow", p) for p in args.policies.split(",")]
    return out


def one_pair(workload: str, system: str, policy: str, args: argparse.Namespace, work: Path, env: dict[str, str],
             grpo: dict[str, Any] | None, tag: str) -> dict[str, Any]:
    """A quiet run, then the same run beside the competitor."""
    row: dict[str, Any] = {"workload": workload, "system": system, "policy": policy}
    for mode in ("quiet", "contended"):
        run_dir = work / f"{tag}_{workload}_{system}_{policy}_{mode}"
        run_dir.mkdir(parents=True)
        print(f"[{time.strftime('%H:%M:%S')}] {workload} {system} {policy} {mode} (load {os.getloadavg()[0]:.1f})",
              flush=True)
        competitor = Competitor(env, args.pin) if mode == "contended" else None
        try:
            if workload == "probe":
                result = run_probe(policy, env, args.pin, args.steps)
            elif workload == "sft_demo":
                result = run_sft_demo(run_dir, args.sft_steps, policy, env)
            else:
                assert grpo is not None
                # hybridflow's threads per rank are the run's own choice, as a user starts it
                # (resources.threads_per_rank null: all cores alone, fewer on a shared machine)
                spec = {**grpo, "system": system, "work_dir": str(run_dir), "threads": os.cpu_count() or 1,
                        "ranks": 1, "threads_per_rank": None if system == "hybridflow" else os.cpu_count() or 1}
                if system == "hybridflow" and policy != "unset":
                    spec["resources_extra"] = {"omp_wait_policy": policy}
                result = run_grpo_tiny(spec, env, run_dir / "log.txt")
        finally:
            competitor_cores = competitor.stop() if competitor is not None else None
        result["competitor_cpu_cores"] = competitor_cores
        result["resolved_policy"] = resolved_policy(run_dir)
        row[mode] = result
    row["slowdown"] = row["contended"]["median_step_s"] / row["quiet"]["median_step_s"]
    return row


def resolved_policy(run_dir: Path) -> str | None:
    """resources.omp_wait_policy and threads_per_rank as the hybridflow run under `run_dir`
    saved them, e.g. "passive x1" (None: no run there)."""
    saved = sorted(run_dir.rglob("config.yaml"))
    if not saved:
        return None
    resources = yaml.safe_load(saved[0].read_text()).get("resources") or {}
    return f"{resources.get('omp_wait_policy')} x{resources.get('threads_per_rank')}"


def print_table(rows: list[dict[str, Any]]) -> None:
    head = ("workload", "system", "policy", "quiet step s", "contended step s", "slowdown", "contended max s",
            "run CPU cores", "competitor CPU cores", "load 1m", "foreign (quiet)")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for r in rows:
        q, c = r["quiet"], r["contended"]
        policy = r["policy"] if r["policy"] != "auto" else \
            f"auto ({q.get('resolved_policy')} / {c.get('resolved_policy')})"
        cells = (r["workload"], r["system"], policy, f"{q['median_step_s']:.3f}", f"{c['median_step_s']:.3f}",
                 f"{r['slowdown']:.2f}x", f"{c['max_step_s']:.2f}", f"{q['own_cpu_cores']:.2f} / {c['own_cpu_cores']:.2f}",
                 f"{c['competitor_cpu_cores']:.2f}", f"{q['load_avg_before'][0]:.1f}-{c['load_avg_after'][0]:.1f}",
                 f"{q['foreign_cpu_cores']:.2f}")
        print("| " + " | ".join(cells) + " |")


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median slowdown over repeats per (workload, system, policy), and issue 28's goal for ours."""
    keys = list(dict.fromkeys((r["workload"], r["system"], r["policy"]) for r in rows))
    out = []
    for key in keys:
        group = [r for r in rows if (r["workload"], r["system"], r["policy"]) == key]
        line = {"workload": key[0], "system": key[1], "policy": key[2], "repeats": len(group),
                "quiet_step_s": statistics.median(r["quiet"]["median_step_s"] for r in group),
                "contended_step_s": statistics.median(r["contended"]["median_step_s"] for r in group),
                "slowdown": statistics.median(r["slowdown"] for r in group)}
        if key[1] == "hybridflow":
            line["goal_slowdown"] = GOAL_SLOWDOWN
            line["goal_met"] = line["slowdown"] <= GOAL_SLOWDOWN
        out.append(line)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="grpo_tiny,sft_demo,probe", help="grpo_tiny, sft_demo and/or probe")
    parser.add_argument("--probe-variants", default=PROBE_VARIANTS,
                        help="probe runs: comma-separated settings, '+' joins several in one (e.g. T=1+OMP_WAIT_POLICY=PASSIVE)")
    parser.add_argument("--pin", default=None, help="probe only: run it and the competitor on these cores (taskset)")
    parser.add_argument("--systems", default="trl,hybridflow", help="trl and/or hybridflow (TRL: grpo_tiny only)")
    parser.add_argument("--policies", default="auto,short_spin,passive,inherit",
                        help="hybridflow's resources.omp_wait_policy values to run ('unset': the run's default, "
                             "for a tree without the setting)")
    parser.add_argument("--steps", type=int, default=10, help="grpo_tiny optimizer steps / probe steps per run")
    parser.add_argument("--sft-steps", type=int, default=40, help="sft_demo SFT steps per run (the demo has 400)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--omp-env", default="",
                        help="OpenMP variables for every run, e.g. GOMP_SPINCOUNT=1000 (what 'inherit' runs keep)")
    parser.add_argument("--note", default="")
    parser.add_argument("--out", default=str(HERE / "results" / "contention.json"))
    args = parser.parse_args()
    from benchmarks.controller.bench_controller import machine

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    for name in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        env.pop(name, None)  # every run and the competitor start as a user's would
    env.update(dict(item.split("=", 1) for item in args.omp_env.split(",") if item))
    described = machine()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench_contention_") as tmp:
        work = Path(tmp)
        grpo = grpo_inputs(work, args.steps) if "grpo_tiny" in args.workloads.split(",") else None
        for repeat in range(args.repeats):
            for workload, system, policy in plan(args):
                row = one_pair(workload, system, policy, args, work, env, grpo, f"r{repeat}")
                row["repeat"] = repeat
                rows.append(row)
                write(args, rows, described)  # kept if the invocation is cut off
    print_table(rows)
    for line in summary(rows):
        goal = f"  (goal <= {GOAL_SLOWDOWN}x: {'met' if line['goal_met'] else 'not met'})" if "goal_met" in line else ""
        print(f"  {line['workload']:9} {line['system']:10} {line['policy']:8} quiet {line['quiet_step_s']:.3f} s, "
              f"contended {line['contended_step_s']:.3f} s: {line['slowdown']:.2f}x{goal}")
    print(f"wrote {args.out}")


def write(args: argparse.Namespace, rows: list[dict[str, Any]], described: dict[str, Any]) -> None:
    out = {"benchmark": "contention", "command": "python benchmarks/controller/bench_contention.py " + " ".join(sys.argv[1:]),
           "method": __doc__.split("Method. ", 1)[1].strip(), "competitor": COMPETITOR, "note": args.note,
           "summary": summary(rows), "runs": rows,
           "machine": {**described, "load_avg_1_5_15_at_end": [round(x, 2) for x in os.getloadavg()]}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(stamp(out), indent=2) + "\n")


if __name__ == "__main__":
    main()
