"""Does asynchrony hurt learning? sync vs async (staleness 1 and 4) from one SFT checkpoint.

Run from the repository root:

    PYTHONPATH=. .venv/bin/python benchmarks/rl/async_learning.py --seeds 0,1,2 --steps 10

One SFT warm start (`hybridflow sft` on the built-in arithmetic task, seed 0, 2 ranks)
is run first and exported; every RL variant then starts from that model directory
(model.path=<sft_model>, sft.steps=0), so they differ only in the trainer mode and the RL
seed. Each RL run does the same number of trained samples (steps x 16 prompts x 8
samples) on two ranks in total: sync colocates actor and generation on 2 ranks; async
runs 1 training rank + 1 rollout rank with async_rl.max_staleness 1 or 4 (partial
rollouts, steps_per_call 4, chunk_prompts 8). The greedy held-out accuracy (100 prompts)
before and after RL is read from each run's result. `--sft-model DIR` reuses an exported
SFT model instead of training one. Writes benchmarks/rl/results/async_learning.json (the
machine's load average is recorded per run: the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402
from benchmarks.controller.bench_controller import machine

from hybridflow import RLTrainer
from hybridflow.config.schema import load_run_config
from hybridflow.trainer.jobs.sft import run_sft_job

COMMON = ["trainer.console=none", "trainer.save_final_model=false", "trainer.loggers=[jsonl]",
          "data.builtin.num_val=100", "resources.threads_per_rank=1"]
ASYNC = ["resources.world_size=1", "trainer.mode=async", "async_rl.rollout_ranks=1", "async_rl.steps_per_call=4",
         "async_rl.chunk_prompts=8"]
VARIANTS: dict[str, list[str]] = {
    "sync": ["resources.world_size=2"],
    "async_s1": [*ASYNC, "async_rl.max_staleness=1"],
    "async_s4": [*ASYNC, "async_rl.max_staleness=4"],
}


def warm_start(tmp: str, steps: int) -> str:
    """Run the SFT warm start once (seed 0, 2 ranks); the exported model directory."""
    cfg = load_run_config(None, [f"trainer.output_dir={tmp}", *COMMON, "resources.world_size=2", "seed=0",
                                 f"sft.steps={steps}", "name=sft-warm-start"])
    result = run_sft_job(cfg)
    print(json.dumps({"sft_accuracy_before": result.accuracy_before, "sft_accuracy_after": result.accuracy_after}),
          flush=True)
    return str(result.model_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--sft-steps", type=int, default=400)
    parser.add_argument("--sft-model", default=None, help="an exported SFT model dir (skips the warm start)")
    parser.add_argument("--work", default=None, help="keep the runs (and the SFT model) here instead of a temp dir")
    parser.add_argument("--variants", default="sync,async_s1,async_s4")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "async_learning.json")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.work or scratch
        sft_model = args.sft_model or warm_start(tmp, args.sft_steps)
        for seed in [int(s) for s in args.seeds.split(",")]:
            for name in args.variants.split(","):
                cfg = load_run_config(None, [f"trainer.output_dir={tmp}", *COMMON, f"model.path={sft_model}",
                                             "sft.steps=0", f"seed={seed}", f"trainer.total_steps={args.steps}",
                                             "trainer.test_freq=0", *VARIANTS[name]])
                with RLTrainer(cfg) as trainer:
                    result = trainer.train()
                runs.append({"variant": name, "seed": seed, "steps": args.steps,
                             "accuracy_before": result.accuracy_before, "accuracy_after": result.accuracy_after,
                             "staleness_mean_last": result.last_metrics.get("staleness/mean"),
                             "staleness_max_last": result.last_metrics.get("staleness/max"),
                             "dropped_groups_total": result.last_metrics.get("async/dropped_groups_total"),
                             "load_avg_1_5_15": list(os.getloadavg())})
                print(json.dumps(runs[-1]), flush=True)
    print(f"{'variant':10} {'seeds':>6} {'acc before':>11} {'acc after':>10} {'after sd':>9}")
    for name in args.variants.split(","):
        after = [r["accuracy_after"] for r in runs if r["variant"] == name]
        before = [r["accuracy_before"] for r in runs if r["variant"] == name]
        sd = statistics.stdev(after) if len(after) > 1 else float("nan")
        print(f"{name:10} {len(after):>6} {statistics.fmean(before):>11.3f} {statistics.fmean(after):>10.3f} {sd:>9.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    key = {f"{name} accuracy_after (mean over seeds)": round(statistics.fmean(
        r["accuracy_after"] for r in runs if r["variant"] == name), 3) for name in args.variants.split(",")}
    record = {"machine": machine(), "sft_model": sft_model, "variants": VARIANTS, "runs": runs, "key_figures": key}
    args.out.write_text(json.dumps(stamp(record), indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
