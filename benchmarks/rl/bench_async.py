"""Throughput of trainer.mode sync vs one_step_off vs async on long-tailed response lengths.

Run from the repository root (about 5 minutes on 2 cores):

    PYTHONPATH=. .venv/bin/python benchmarks/rl/bench_async.py                # 8 steps per mode
    PYTHONPATH=. .venv/bin/python benchmarks/rl/bench_async.py --steps 12 --rounds 2

Same model (the built-in tiny Llama, random init, no warm start), same total ranks (two:
sync runs actor+generation colocated on 2 ranks; the other modes run 1 training rank + 1
rollout rank), same trained samples (steps x data.train_batch_size x rollout.n); sync_1rank (sync on one
rank, the other core idle) is a reference that separates the gain of overlapping from the
cost of running FSDP over two ranks of a 2-core machine. The
workload is long-tailed like DAPO's budgets: sampling stops at any of a few token ids
(about 4% of the vocabulary), so lengths are roughly geometric with mean ~25 and a tail
that runs into the 128-token budget. Modes run one after another in this one process
(`--rounds` repeats the sequence, alternating), and the load average is recorded with
every run: the machine is shared.

Throughput = trained samples / the summed wall time of the steps after the first (the
first fills the pipeline). Also printed per mode: the mean time the trainer waited for
rollouts, generation / update time where the mode reports them, response length mean and
max, staleness, dropped groups, and bytes and seconds per weight sync. Writes JSON with
the machine description to benchmarks/rl/results/async.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402
from benchmarks.controller.bench_controller import machine

from hybridflow import RLTrainer
from hybridflow.config.schema import load_run_config
from hybridflow.trainer.run.run_dir import read_metrics

WORKLOAD = [
    "trainer.console=none", "trainer.test_freq=0", "trainer.save_final_model=false", "trainer.val_before_train=false",
    "trainer.loggers=[jsonl]", "sft.steps=0", "data.builtin.num_val=8", "resources.threads_per_rank=1",
    "model.builtin.max_position_embeddings=192", "rollout.response_length=128", "rollout.ignore_eos=false",
    "rollout.stop_token_ids=[10,11,12]", "data.train_batch_size=8", "rollout.n=4",
    "actor.micro_batch.mini_batch_size=32", "actor.micro_batch.micro_batch_size_per_device=16",
    "actor.micro_batch.forward_micro_batch_size_per_device=16", "reward.manager.num_workers=1",
]
MODES: dict[str, list[str]] = {
    "sync": ["resources.world_size=2"],
    # a reference, not a contender: sync on one of the two cores (no FSDP traffic, the other core idle)
    "sync_1rank": ["resources.world_size=1"],
    "one_step_off": ["resources.world_size=1", "trainer.mode=one_step_off", "async_rl.rollout_ranks=1"],
    "async": ["resources.world_size=1", "trainer.mode=async", "async_rl.rollout_ranks=1", "async_rl.max_staleness=2",
              "async_rl.chunk_prompts=2", "async_rl.steps_per_call=8", "async_rl.buffer_size=32"],
    # a bound loose enough to keep the long tail (the rollout pool may run 8 versions ahead)
    "async_s8": ["resources.world_size=1", "trainer.mode=async", "async_rl.rollout_ranks=1", "async_rl.max_staleness=8",
                 "async_rl.chunk_prompts=2", "async_rl.steps_per_call=8", "async_rl.buffer_size=96"],
}
SAMPLES_PER_STEP = 8 * 4


def run_mode(mode: str, steps: int, out_dir: Path, seed: int) -> dict[str, Any]:
    load_before = os.getloadavg()
    cfg = load_run_config(None, [f"trainer.output_dir={out_dir}", f"seed={seed}", *WORKLOAD, *MODES[mode]])
    start = time.perf_counter()
    with RLTrainer(cfg) as trainer:
        result = trainer.train(steps=steps)
    wall = time.perf_counter() - start
    rl = [r for r in read_metrics(result.run_dir / "metrics.jsonl") if r["phase"] == "rl"]
    timed = rl[1:]
    loop_s = sum(r["timing_s/step"] for r in timed)

    def mean(key: str) -> float | None:
        values = [r[key] for r in timed if r.get(key) is not None]
        return round(statistics.fmean(values), 4) if values else None

    return {
        "mode": mode, "steps": steps, "seed": seed, "trained_samples_timed": SAMPLES_PER_STEP * len(timed),
        "samples_per_s": round(SAMPLES_PER_STEP * len(timed) / loop_s, 3), "step_s_mean": round(loop_s / len(timed), 3),
        "wait_rollout_s_mean": mean("timing_s/wait_rollout"), "gen_s_mean": mean("timing_s/gen"),
        # both modes time the update phase where the program runs (the controller in sync,
        # the step task beside the data in the asynchronous modes, trainer/modes/stream_step.py)
        "update_actor_s_mean": mean("timing_s/update_actor"),
        "update_actor_in_worker_s_mean": mean("timing_s/update_actor_in_worker"),
        "response_length_mean": mean("response_length/mean"),
        "response_length_max": max(r["response_length/max"] for r in timed),
        "clip_ratio_mean": mean("response_length/clip_ratio"), "staleness_mean": mean("staleness/mean"),
        "dropped_groups": sum(r.get("async/dropped_groups", 0.0) for r in rl),
        "weight_sync_bytes": mean("weight_sync/bytes"), "weight_sync_s_mean": mean("weight_sync/seconds"),
        "score_mean": mean("score/mean"), "wall_s_with_startup": round(wall, 1),
        "load_avg_before": [round(x, 2) for x in load_before], "load_avg_after": [round(x, 2) for x in os.getloadavg()],
    }


def print_table(runs: list[dict[str, Any]]) -> None:
    base = {r["seed"]: r["samples_per_s"] for r in runs if r["mode"] == "sync"}
    cols = ("mode", "samples/s", "vs sync", "step s", "wait s", "gen s", "update s*", "len mean", "len max",
            "stale", "dropped", "sync MB", "sync s", "load")
    print(" ".join(f"{c:>10}" for c in cols))
    for r in runs:
        ratio = r["samples_per_s"] / base[r["seed"]] if r["seed"] in base else float("nan")
        cells = (r["mode"], r["samples_per_s"], f"{ratio:.2f}x", r["step_s_mean"], r["wait_rollout_s_mean"],
                 r["gen_s_mean"], r["update_actor_in_worker_s_mean"], r["response_length_mean"], r["response_length_max"],
                 r["staleness_mean"], r["dropped_groups"],
                 None if r["weight_sync_bytes"] is None else round(r["weight_sync_bytes"] / 2**20, 2),
                 r["weight_sync_s_mean"], r["load_avg_before"][0])
        print(" ".join(f"{'-' if c is None else c:>10}" for c in cells))
    print("update s*: the actor update timed inside the worker (every mode logs it)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--modes", default="sync,sync_1rank,one_step_off,async,async_s8")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "async.json")
    args = parser.parse_args()
    modes = args.modes.split(",")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            order = modes if round_ % 2 == 0 else modes[::-1]
            for mode in order:
                runs.append(run_mode(mode, args.steps, Path(tmp), seed=0))
                print(f"done: {mode} round {round_}: {runs[-1]['samples_per_s']} samples/s", flush=True)
    print_table(runs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(stamp({"machine": machine(), "workload": WORKLOAD, "modes": MODES, "runs": runs}),
                                   indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
