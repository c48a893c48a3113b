"""sync vs one_step_off vs async at GPU-cluster scale, predicted by the planner's simulator.

Run from the repository root (a second or two; no GPU needed):

    PYTHONPATH=. .venv/bin/python benchmarks/rl/bench_async_sim.py

1. Check of the overlap rule on this machine's measured phases
   (benchmarks/rl/results/async.json, written by bench_async.py): the one-step-off step
   predicted from the single-rank sync run's phases, max(generation, rest of the step) +
   weight sync, against the measured one-step-off step.
2. The stated cluster and workload (CLUSTER, WORKLOAD below): GRPO on Llama-2 7B shapes,
   4 nodes x 8 H100 (the planner's data-sheet device, not calibrated on a GPU: none here),
   long-tailed response lengths with the tail ratio measured here (longest / mean =
   128 / 26, bench_async.py's workload), scaled to an 8192-token budget.
   hybridflow/planner/overlap.py: each mode at its best rollout / training split.
Writes benchmarks/rl/results/async_sim.json.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402
from benchmarks.controller.bench_controller import machine

from hybridflow.config.schema import load_run_config
from hybridflow.planner import LLAMA, Cluster
from hybridflow.planner.overlap import Lengths, compare_modes, overlapped_step
from hybridflow.planner.problem import problem_from_config

RESULTS = Path(__file__).parent / "results"
CLUSTER = {"nodes": 4, "devices_per_node": 8, "device": "h100"}
BUDGET = 8192
WORKLOAD = ["resources.world_size=1", "algorithm.name=grpo", "data.train_batch_size=256", "rollout.n=8",
            "data.prompt.max_prompt_length=512", f"rollout.response_length={BUDGET}", "rollout.max_num_seqs=16",
            f"model.builtin.max_position_embeddings={2 * BUDGET}"]


def measured_check() -> dict:
    runs = {r["mode"]: r for r in json.loads((RESULTS / "async.json").read_text())["runs"]}
    one = runs["sync_1rank"]
    gen, rest = one["gen_s_mean"], one["step_s_mean"] - one["gen_s_mean"]
    sync_s = runs["one_step_off"]["weight_sync_s_mean"]
    predicted = overlapped_step("one_step_off", gen, rest, sync_s)
    return {"generation_s": gen, "rest_of_step_s": rest, "weight_sync_s": sync_s, "predicted_step_s": predicted,
            "measured_step_s": runs["one_step_off"]["step_s_mean"],
            "tail": {"mean": one["response_length_mean"], "longest": one["response_length_max"]}}


def main() -> None:
    check = measured_check()
    print(f"overlap rule on measured phases: one_step_off predicted {check['predicted_step_s']:.3f} s, "
          f"measured {check['measured_step_s']:.3f} s")
    ratio = check["tail"]["longest"] / check["tail"]["mean"]
    lengths = Lengths(mean=round(BUDGET / ratio), longest=BUDGET)
    cfg = load_run_config(None, WORKLOAD)
    problem = problem_from_config(cfg, Cluster.of(**CLUSTER), model=LLAMA["llama-7b"])
    rows = compare_modes(problem, lengths)
    sync = rows[0].samples_per_s
    print(f"{CLUSTER['nodes']}x{CLUSTER['devices_per_node']} {CLUSTER['device']}, llama-7b GRPO, "
          f"{problem.workload.sequences} samples/step, lengths mean {lengths.mean} / longest {lengths.longest}")
    print(f"{'mode':13} {'gen dev':>7} {'train dev':>9} {'gen s':>8} {'train s':>8} {'sync s':>7} {'step s':>8} "
          f"{'samples/s':>10} {'x sync':>7}")
    for r in rows:
        print(f"{r.mode:13} {r.gen_devices:>7} {r.train_devices:>9} {r.generate_s:>8.1f} {r.train_s:>8.1f} "
              f"{r.sync_s:>7.2f} {r.step_s:>8.1f} {r.samples_per_s:>10.3f} {r.samples_per_s / sync:>7.2f}")
    out = RESULTS / "async_sim.json"
    out.write_text(json.dumps(stamp({"machine": machine(), "measured_check": check, "cluster": CLUSTER, "workload": WORKLOAD,
                               "model": "llama-7b", "lengths": asdict(lengths), "modes": [asdict(r) for r in rows]}),
                              indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
