"""Does asynchrony hurt learning? The built-in task under sync and async (staleness 1 and 4).

Run from the repository root:

    PYTHONPATH=. .venv/bin/python benchmarks/async_learning.py                 # seed 0, 10 RL steps
    PYTHONPATH=. .venv/bin/python benchmarks/async_learning.py --seeds 0,1,2 --steps 30

Every run is the demo (`hybridflow train` on the built-in arithmetic task: SFT warm start,
then GRPO) with the same number of trained samples (steps x 16 prompts x 8 samples) and
two ranks in total: sync colocates actor and generation on 2 ranks; async runs 1 training
rank + 1 rollout rank with async_rl.max_staleness 1 or 4 (partial rollouts,
steps_per_call 4, chunk_prompts 8). The greedy held-out accuracy before and after RL is
read from each run's metrics.jsonl. Writes benchmarks/results/async_learning.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from bench_controller import machine

from hybridflow import RLTrainer
from hybridflow.config.schema import load_run_config

VARIANTS: dict[str, list[str]] = {
    "sync": ["resources.world_size=2"],
    "async_s1": ["resources.world_size=1", "trainer.mode=async", "async_rl.rollout_ranks=1",
                 "async_rl.max_staleness=1", "async_rl.steps_per_call=4", "async_rl.chunk_prompts=8"],
    "async_s4": ["resources.world_size=1", "trainer.mode=async", "async_rl.rollout_ranks=1",
                 "async_rl.max_staleness=4", "async_rl.steps_per_call=4", "async_rl.chunk_prompts=8"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--variants", default="sync,async_s1,async_s4")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "async_learning.json")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in [int(s) for s in args.seeds.split(",")]:
            for name in args.variants.split(","):
                cfg = load_run_config(None, [f"trainer.output_dir={tmp}", "trainer.console=none",
                                             "trainer.save_final_model=false", "trainer.loggers=[jsonl]",
                                             f"seed={seed}", f"trainer.total_steps={args.steps}",
                                             "trainer.test_freq=0", "data.builtin.num_val=100", "resources.threads_per_rank=1",
                                             *VARIANTS[name]])
                with RLTrainer(cfg) as trainer:
                    result = trainer.train()
                runs.append({"variant": name, "seed": seed, "steps": args.steps,
                             "accuracy_before": result.accuracy_before, "accuracy_after": result.accuracy_after,
                             "staleness_mean_last": result.last_metrics.get("staleness/mean"),
                             "dropped_groups_total": result.last_metrics.get("async/dropped_groups_total")})
                print(json.dumps(runs[-1]), flush=True)
    print(f"{'variant':10} {'seeds':>6} {'acc before':>11} {'acc after':>10} {'after sd':>9}")
    for name in args.variants.split(","):
        after = [r["accuracy_after"] for r in runs if r["variant"] == name]
        before = [r["accuracy_before"] for r in runs if r["variant"] == name]
        sd = statistics.stdev(after) if len(after) > 1 else float("nan")
        print(f"{name:10} {len(after):>6} {statistics.fmean(before):>11.3f} {statistics.fmean(after):>10.3f} {sd:>9.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine(), "variants": VARIANTS, "runs": runs}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
