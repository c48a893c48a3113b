"""The matmul floor of a GRPO step: how fast the step could be if it did nothing but its
weight matmuls, each at the speed this machine reaches for that matmul's own shape.

Issue 28 asks for a step <= 0.6x TRL's (tiny workload) and <= 0.45x (SmolLM2). Both
systems must do the same weight matmuls (generation: prefill + one decode step per new
token; update: forward, then gradient of the input and of the weight), so the sum of
those matmuls' best times is a lower bound of either system's step. This script times
each one in isolation and compares the sum with the goal, using the TRL step time and
token counts measured by bench_vs_trl.py.

Run (1-3 min). Each matmul runs on one thread and is timed in that thread's CPU time
(best of `--repeats` rounds), then divided by --threads: a lower bound of its time on
--threads cores (perfect scaling), and one that other jobs on the shared cores do not
inflate, since they lengthen wall-clock time but not the CPU time a matmul needs:

    .venv/bin/python benchmarks/rl/bench_step_floor.py --workloads tiny,smollm2_32

What is counted, per workload (B samples of p prompt + c completion tokens, from the TRL
runs in --vs-trl JSONs): every nn.Linear of the decoder layers (q, k, v, o, gate, up,
down) and the lm_head. Generation: prefill over B*p tokens (lm_head on the last prompt
token only) and c decode steps of B rows. Update: forward over B*(p+c) tokens (lm_head
over the B*c completion tokens only, as both systems do), then dX and dW of the same
sizes. Not counted (so the floor is lower than any real step): attention score/value
matmuls, norms, activations, embedding, softmax, the optimizer, sampling, framework
work. The square-matmul ceiling (the one bench_vs_trl reports fractions of) is measured
in the same run. Prints a table; writes benchmarks/rl/results/step_floor.json with the
machine description.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import sys
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Gemm:
    """An (m, k) @ (k, n) fp32 matmul done `count` times per step, in `phase`."""

    phase: str
    name: str
    m: int
    k: int
    n: int
    count: int

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.k * self.n * self.count


def step_gemms(config, samples: int, prompt: int, completion: int) -> list[Gemm]:
    """The weight matmuls of one GRPO step (module docstring) for an HF decoder config."""
    d, f, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    heads, kv = config.num_attention_heads, getattr(config, "num_key_value_heads", config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or d // heads
    linears = [("q", d, heads * head_dim), ("kv", d, 2 * kv * head_dim), ("o", heads * head_dim, d),
               ("gate_up", d, 2 * f), ("down", f, d)]
    vocab = config.vocab_size
    tokens, prompt_tokens = samples * (prompt + completion), samples * prompt
    gemms: list[Gemm] = []
    for name, k, n in linears:
        gemms.append(Gemm("gen", f"prefill {name}", prompt_tokens, k, n, layers))
        gemms.append(Gemm("gen", f"decode {name}", samples, k, n, layers * completion))
        gemms.append(Gemm("update", f"fwd {name}", tokens, k, n, layers))
        gemms.append(Gemm("update", f"dX {name}", tokens, n, k, layers))
        gemms.append(Gemm("update", f"dW {name}", k, tokens, n, layers))
    gemms.append(Gemm("gen", "prefill+decode lm_head", samples, d, vocab, 1 + completion))
    head_tokens = samples * completion
    gemms.append(Gemm("update", "fwd lm_head", head_tokens, d, vocab, 1))
    gemms.append(Gemm("update", "dX lm_head", head_tokens, vocab, d, 1))
    gemms.append(Gemm("update", "dW lm_head", d, head_tokens, vocab, 1))
    return gemms


def best_seconds(m: int, k: int, n: int, repeats: int, threads: int) -> float:
    """A lower bound of one (m, k) @ (k, n) fp32 matmul's time on `threads` cores: its best
    CPU time on one thread over `repeats` rounds, divided by `threads` (perfect scaling).

    CPU time of the calling thread, not wall time: other jobs on the cores lengthen the
    wall clock of a matmul but not the CPU time it needs (module docstring).
    """
    a, b = torch.randn(m, k), torch.randn(k, n)
    out = torch.empty(m, n)
    torch.mm(a, b, out=out)  # warm-up: packing buffers
    single = time.thread_time()
    torch.mm(a, b, out=out)
    single = max(time.thread_time() - single, 1e-7)
    inner = max(1, int(0.005 / single))  # rounds of >= 5 ms of CPU time
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time()
        for _ in range(inner):
            torch.mm(a, b, out=out)
        best = min(best, (time.thread_time() - start) / inner)
    return best / threads


def square_ceiling(repeats: int, threads: int) -> float:
    """FLOP/s of a 1024^3 fp32 matmul on `threads` cores at perfect scaling (best_seconds)."""
    return 2.0 * 1024**3 / best_seconds(1024, 1024, 1024, repeats, threads)


def trl_measurements(paths: list[Path], workload: str) -> dict:
    """Median TRL step time and tokens of `workload` over the TRL runs in the JSONs (fp32
    runs only: the floor is of fp32 matmuls)."""
    rows = []
    for path in paths:
        rows += [r for r in json.loads(path.read_text())["runs"]
                 if r["workload"] == workload and r["system"] == "trl" and r.get("dtype", "fp32") == "fp32"]
    if not rows:
        raise SystemExit(f"no TRL run of {workload} in {[str(p) for p in paths]}; run bench_vs_trl.py first")
    s = [r["summary"] for r in rows]
    return {
        "runs": len(rows), "sources": sorted({str(p) for p in paths}),
        "step_s": statistics.median(x["median_step_s"] for x in s),
        "gen_s": statistics.median(x["phases_median_s"]["gen"] for x in s),
        "update_s": statistics.median(x["phases_median_s"]["update"] for x in s),
        "prompt_tokens": round(statistics.median(x["prompt_tokens_per_sample"] for x in s)),
        "completion_tokens": round(statistics.median(x["completion_tokens_per_sample"] for x in s)),
    }


def floor_of(workload: str, trl: dict, repeats: int, threads: int, ceiling: float) -> dict:
    from transformers import AutoConfig

    from benchmarks.rl.bench_vs_trl import GOALS, WORKLOADS, model_dir

    w = WORKLOADS[workload]
    work = Path(os.environ.get("HF_BENCH_WORK", "/tmp/hybridflow_bench_floor"))
    config = AutoConfig.from_pretrained(model_dir(w, work), trust_remote_code=False)
    samples = w.prompts_per_step * w.n
    phases: dict[str, dict[str, float]] = {}
    for g in step_gemms(config, samples, trl["prompt_tokens"], trl["completion_tokens"]):
        seconds = best_seconds(g.m, g.k, g.n, repeats, threads) * g.count
        p = phases.setdefault(g.phase, {"flops": 0.0, "floor_s": 0.0})
        p["flops"] += g.flops
        p["floor_s"] += seconds
    for p in phases.values():
        p["at_square_ceiling_s"] = p["flops"] / ceiling
        p["shape_efficiency"] = p["at_square_ceiling_s"] / p["floor_s"]
    floor = sum(p["floor_s"] for p in phases.values())
    goal = GOALS[workload][0] * trl["step_s"]
    return {"workload": workload, "samples": samples, "trl": trl, "phases": phases, "floor_s": floor,
            "goal_ratio": GOALS[workload][0], "goal_s": goal, "floor_over_goal": floor / goal,
            "floor_over_trl_step": floor / trl["step_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="tiny,smollm2_32")
    parser.add_argument("--vs-trl", default=f"{HERE / 'results' / 'vs_trl.json'},"
                                            f"{HERE / 'results' / 'vs_trl_smollm2.json'}",
                        help="comma-separated bench_vs_trl JSONs with the TRL runs (step time, token counts)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30, help="rounds per matmul shape (best one counts)")
    parser.add_argument("--out", default=str(HERE / "results" / "step_floor.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)  # one thread, timed in CPU time, scaled to --threads (best_seconds)
    from benchmarks.controller.bench_controller import machine

    load_before = os.getloadavg()
    ceiling = square_ceiling(args.repeats, args.threads)
    paths = [Path(p) for p in args.vs_trl.split(",") if p]
    results = [floor_of(name, trl_measurements(paths, name), args.repeats, args.threads, ceiling)
               for name in args.workloads.split(",")]
    ceiling = max(ceiling, square_ceiling(args.repeats, args.threads))
    print(f"square fp32 matmul ceiling on {args.threads} threads (1 thread's CPU time x {args.threads}): "
          f"{ceiling / 1e9:.1f} GFLOP/s "
          f"(load {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f})")
    print("| workload | phase | GFLOP | at square ceiling s | at its own shapes s | shape efficiency |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in results:
        for name, p in r["phases"].items():
            print(f"| {r['workload']} | {name} | {p['flops'] / 1e9:.2f} | {p['at_square_ceiling_s']:.4f} | "
                  f"{p['floor_s']:.4f} | {p['shape_efficiency']:.0%} |")
    print()
    print("| workload | TRL step s | goal (ratio x TRL) s | matmul floor s | floor / goal |")
    print("| --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['workload']} | {r['trl']['step_s']:.3f} | {r['goal_ratio']:.2f} x = {r['goal_s']:.3f} | "
              f"{r['floor_s']:.3f} | {r['floor_over_goal']:.2f} |")
    out = {"benchmark": "bench_step_floor", "command": "python benchmarks/rl/bench_step_floor.py " +
           " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
           "square_ceiling_gflops": ceiling / 1e9, "load_avg_before": list(load_before),
           "load_avg_after": list(os.getloadavg()), "results": results, "machine": machine()}
    Path(args.out).write_text(json.dumps(stamp(out), indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
