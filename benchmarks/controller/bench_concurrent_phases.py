"""Step time of a tiny PPO run with the programs' `concurrently` blocks on and off.

`trainer.concurrent_phases=true` (the default) submits the actor's log-probs with the
critic's values, and the critic's update with the actor's, together
(hybridflow/trainer/programs/concurrent.py); false waits for each call before the next,
as the programs did before. They can only overlap where actor and critic have processes of
their own (resources.placement=split); colocated, the calls queue in the shared process.
Each layout and mode runs once per round with either setting, interleaved, `--steps`
steps; the step time is the median of timing_s/step over the steps after the first.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/controller/bench_concurrent_phases.py --rounds 2 --steps 6
    # the code before the blocks, for comparison (a checkout without trainer.concurrent_phases):
    PYTHONPATH=/path/to/old .venv/bin/python benchmarks/controller/bench_concurrent_phases.py --concurrent none

Prints a table and writes benchmarks/controller/results/concurrent_phases.json with the machine
description and the load average around each run (the machine is shared: compare rows of
one round, taken minutes apart).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path
import sys
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402
from benchmarks.controller.bench_controller import machine  # noqa: E402

HERE = Path(__file__).resolve().parent
# The tests' tiny model (tests/trainer/trainer_helpers.py: TINY), a few more samples per step.
TINY = [
    "trainer.console=none", "trainer.test_freq=0", "trainer.save_final_model=false", "trainer.val_before_train=false",
    "trainer.loggers=[jsonl]", "sft.steps=0", "algorithm.name=ppo",
    "model.builtin.hidden_size=32", "model.builtin.intermediate_size=64", "model.builtin.num_hidden_layers=2",
    "data.train_batch_size=8", "rollout.n=2", "data.builtin.num_train=256", "data.builtin.num_val=8",
    "actor.micro_batch.mini_batch_size=8", "actor.micro_batch.micro_batch_size_per_device=4",
    "critic.micro_batch.mini_batch_size=8", "critic.micro_batch.micro_batch_size_per_device=4",
    "reward.manager.num_workers=1",
]
LAYOUTS = {
    "colocated 1 rank": ["resources.world_size=1"],
    "split 1|1": ["resources.world_size=2", "resources.placement=split", "resources.critic_ranks=1"],
}
MODES = {
    "sync": [],
    "async": ["trainer.mode=async", "async_rl.rollout_ranks=1", "async_rl.max_staleness=1"],
}


def run(overrides: list[str], steps: int, out: Path) -> dict:
    from hybridflow import RLTrainer
    from hybridflow.config.schema import load_run_config
    from hybridflow.trainer.run.run_dir import read_metrics

    load_before = os.getloadavg()[0]
    cfg = load_run_config(None, [f"trainer.output_dir={out}", f"trainer.total_steps={steps}", *TINY, *overrides])
    with RLTrainer(cfg) as trainer:
        result = trainer.train()
    records = [r for r in read_metrics(result.run_dir / "metrics.jsonl") if r["phase"] == "rl"][1:]
    step_s = statistics.median(r["timing_s/step"] for r in records)
    return {"step_s": step_s, "steps": len(records), "load_before": load_before, "load_after": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--concurrent", default="true,false",
                        help="trainer.concurrent_phases values to run, comma-separated; 'none': do not set it")
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--out", default=str(HERE / "results" / "concurrent_phases.json"))
    args = parser.parse_args()
    settings = args.concurrent.split(",")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-concurrent-") as tmp:
        for round_ in range(1, args.rounds + 1):
            for layout in args.layouts.split(","):
                for mode in args.modes.split(","):
                    for setting in settings:
                        knob = [] if setting == "none" else [f"trainer.concurrent_phases={setting}"]
                        result = run([*LAYOUTS[layout], *MODES[mode], *knob], args.steps, Path(tmp))
                        rows.append({"round": round_, "layout": layout, "mode": mode, "concurrent": setting, **result})
                        print(f"round {round_} | {layout:16s} | {mode:5s} | concurrent={setting:5s} | "
                              f"step {result['step_s']:.3f} s | load {result['load_before']:.2f} -> "
                              f"{result['load_after']:.2f}", flush=True)
    variants = sorted({(r["layout"], r["mode"], r["concurrent"]) for r in rows})
    median = {f"{layout} | {mode} | concurrent_phases={setting} step_s": round(statistics.median(
        r["step_s"] for r in rows if (r["layout"], r["mode"], r["concurrent"]) == (layout, mode, setting)), 4)
        for layout, mode, setting in variants}
    Path(args.out).write_text(json.dumps(stamp({"machine": machine(), "args": vars(args), "rows": rows,
                                                "key_figures": median}), indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
