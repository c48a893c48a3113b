"""Equal learning: TRL's GRPOTrainer and hybridflow from the same warm-started model on the
tiny task, reward curves over 20 steps (issue 17: speed counts only at equal learning).

Run (~1 min of SFT, then ~15 s per run; 2 systems x --seeds runs, interleaved):

    .venv/bin/pip install -e '.[bench]'
    .venv/bin/python benchmarks/rl/bench_vs_trl_learning.py --seeds 0,1,2,3 --steps 20

The tiny workload of bench_vs_trl.py starts from random weights, whose rewards stay 0 for
both systems: a comparison of curves there says nothing. So the model is first warm-started
with `hybridflow sft` on the built-in arithmetic task (--sft-steps; the same 1.0M-parameter
Qwen2 and character tokenizer), and both systems run GRPO from that directory with the
tiny workload's settings (8 prompts x 8 samples, <= 8 new tokens, no KL, one optimizer step
per RL step, token-mean loss, clip 0.2, grad clip 1.0) except the learning rate (--lr, the
same for both), on the same prompts in the same order, both with the glibc settings
hybridflow's workers use (hybridflow/controller/malloc.py). Each seed is one run per
system; the two systems sample differently, so the comparison is over seeds: per system,
the mean reward of each step over the seeds, and per seed the mean over the last half of
the steps and the gain (last half minus first half). Seed s of both systems sees the same
prompts at the same steps, so the gains are compared in pairs: the mean of the per-seed
differences (hybridflow - TRL) with its 95 % confidence interval (Student t); "within
noise" means the interval holds 0, and its width is how close the two are shown to be.
Step times are reported beside it (hybridflow at 1 rank x --threads threads, what a run
picks).
Prints a table and writes benchmarks/rl/results/vs_trl_learning.json (curves, per-seed
numbers, machine description) and a plot next to it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402
from benchmarks.rl.bench_vs_trl import WORKLOADS, base_spec, machine, model_dir, prompt_rows, run_once  # noqa: E402

from hybridflow.controller.malloc import env_settings  # noqa: E402

HERE = Path(__file__).resolve().parent


def warm_start(work: Path, steps: int, threads: int, env: dict[str, str]) -> Path:
    """`hybridflow sft` of the tiny workload's model on the built-in task; its sft_model dir."""
    base = model_dir(WORKLOADS["tiny"], work)
    out = work / "sft_runs"
    done = sorted(out.glob("*/sft_model/config.json"))
    if done:
        return done[-1].parent
    cmd = [sys.executable, "-m", "hybridflow.cli", "sft", f"model.path={base}", f"sft.steps={steps}",
           f"trainer.output_dir={out}", "trainer.console=none", "resources.world_size=1",
           f"resources.threads_per_rank={threads}"]
    print(f"[{time.strftime('%H:%M:%S')}] warm start: {' '.join(cmd[2:])}", flush=True)
    subprocess.run(cmd, env=env, check=True, cwd=work)
    return sorted(out.glob("*/sft_model/config.json"))[-1].parent


def curve_stats(curves: dict[int, list[float]]) -> dict:
    """Per-step mean over seeds, and per seed the last-half mean and the gain."""
    steps = min(len(c) for c in curves.values())
    half = steps // 2
    per_seed = {s: {"first_half": statistics.fmean(c[:half]), "last_half": statistics.fmean(c[half:steps])}
                for s, c in curves.items()}
    for v in per_seed.values():
        v["gain"] = v["last_half"] - v["first_half"]
    gains = [v["gain"] for v in per_seed.values()]
    return {"mean_curve": [statistics.fmean(c[i] for c in curves.values()) for i in range(steps)],
            "per_seed": per_seed, "gain_mean": statistics.fmean(gains),
            "gain_sd": statistics.stdev(gains) if len(gains) > 1 else 0.0,
            "last_half_mean": statistics.fmean(v["last_half"] for v in per_seed.values())}


# Two-sided 95 % Student t quantiles by degrees of freedom (1..10; above: 2.0, slightly
# generous). No SciPy in the benchmark's dependencies.
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23}


def paired_gain_difference(a: dict, b: dict) -> tuple[float, float, float]:
    """Mean of the per-seed gain differences a - b and its 95 % interval (low, high)."""
    seeds = sorted(set(a["per_seed"]) & set(b["per_seed"]))
    diffs = [a["per_seed"][s]["gain"] - b["per_seed"][s]["gain"] for s in seeds]
    mean = statistics.fmean(diffs)
    if len(diffs) < 2:
        return mean, -math.inf, math.inf
    half = T95.get(len(diffs) - 1, 2.0) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return mean, mean - half, mean + half


def plot(curves: dict[str, dict[int, list[float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for (system, by_seed), color in zip(curves.items(), ("tab:blue", "tab:orange")):
        for c in by_seed.values():
            ax.plot(range(1, len(c) + 1), c, color=color, alpha=0.25, linewidth=1)
        mean = curve_stats(by_seed)["mean_curve"]
        ax.plot(range(1, len(mean) + 1), mean, color=color, linewidth=2, label=f"{system} (mean of {len(by_seed)} seeds)")
    ax.set_xlabel("RL step")
    ax.set_ylabel("mean reward of the step's samples")
    ax.set_title("GRPO on the tiny arithmetic task from the same SFT model")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="0,1,2,3")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=1e-4, help="learning rate of both systems")
    parser.add_argument("--sft-steps", type=int, default=400, help="warm-start SFT steps (hybridflow sft)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work-dir", default="/tmp/bench_vs_trl_learning")
    parser.add_argument("--note", default="")
    parser.add_argument("--out", default=str(HERE / "results" / "vs_trl_learning.json"))
    args = parser.parse_args()
    from transformers import AutoTokenizer

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.pop("OMP_NUM_THREADS", None)
    env.update(env_settings())
    if args.steps < 3:
        raise SystemExit("--steps must be >= 3 (step times are medians of the intervals after step 1)")
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    workload = replace(WORKLOADS["tiny"], lr=args.lr)
    model = warm_start(work, args.sft_steps, args.threads, env)
    prompts = work / "prompts.jsonl"
    tokenizer = AutoTokenizer.from_pretrained(model, trust_remote_code=False)
    rows = prompt_rows(workload, tokenizer, workload.prompts_per_step * args.steps)
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    seeds = [int(s) for s in args.seeds.split(",")]
    curves: dict[str, dict[int, list[float]]] = {"trl": {}, "hybridflow": {}}
    step_s: dict[str, list[float]] = {"trl": [], "hybridflow": []}
    for seed in seeds:
        for system in ("trl", "hybridflow"):
            run_dir = work / f"{system}_seed{seed}"
            run_dir.mkdir(parents=True, exist_ok=True)
            spec = {**base_spec(workload, "fp32", model, prompts, args.steps, seed), "system": system,
                    "work_dir": str(run_dir), "threads": args.threads, "ranks": 1, "threads_per_rank": args.threads}
            print(f"[{time.strftime('%H:%M:%S')}] {system} seed {seed} (load {os.getloadavg()[0]:.1f})", flush=True)
            result = run_once(spec, env, run_dir / "log.txt")
            records = sorted(result["records"], key=lambda r: r["step"])
            missing = [r["step"] for r in records if "reward_mean" not in r]
            if missing:
                raise RuntimeError(f"{system} seed {seed}: no reward recorded for steps {missing}")
            curves[system][seed] = [r["reward_mean"] for r in records]
            ends = [r["end_time"] for r in records]
            step_s[system].append(statistics.median(b - a for a, b in zip(ends[1:], ends[2:])))
    stats = {s: curve_stats(c) for s, c in curves.items()}
    diff, low, high = paired_gain_difference(stats["hybridflow"], stats["trl"])
    same = low <= 0.0 <= high
    print(f"\n{'system':11} {'first half':>10} {'last half':>10} {'gain':>14} {'step s':>7}   (mean over {len(seeds)} seeds)")
    for system, st in stats.items():
        first = statistics.fmean(v["first_half"] for v in st["per_seed"].values())
        print(f"{system:11} {first:10.3f} {st['last_half_mean']:10.3f} {st['gain_mean']:+8.3f} sd {st['gain_sd']:.3f}"
              f" {statistics.median(step_s[system]):7.3f}")
    print(f"gain difference (hybridflow - trl), paired by seed: {diff:+.3f}, 95 % interval [{low:+.3f}, {high:+.3f}]: "
          f"{'within noise' if same else 'NOT within noise'}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    plot(curves, out.with_suffix(".png"))
    out.write_text(json.dumps(stamp({
        "benchmark": "vs_trl_learning", "command": " ".join([Path(sys.executable).name, *sys.argv]), "note": args.note,
        "workload": {**base_spec(workload, "fp32", model, prompts, args.steps, 0), "sft_steps": args.sft_steps},
        "seeds": seeds, "curves": {s: {str(k): v for k, v in c.items()} for s, c in curves.items()},
        "stats": stats, "median_step_s": {s: statistics.median(v) for s, v in step_s.items()},
        "gain_difference": diff, "gain_difference_95": [low, high], "within_noise": same,
        "machine": machine(f"glibc malloc ({env_settings()})"),
    }), indent=1))
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
