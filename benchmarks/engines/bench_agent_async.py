"""Asynchronous vs synchronous environment interaction, side by side in one run.

Run from the repository root:

    .venv/bin/python benchmarks/engines/bench_agent_async.py                  # 64 trajectories, 4 turns, 3 rounds
    .venv/bin/python benchmarks/engines/bench_agent_async.py --trajectories 32 --median-ms 20

Workload: 64 trajectories of the built-in `latency` environment (envs/agent/demo.py): 4
model turns each; every environment step sleeps a latency drawn from a log-normal
distribution, exp(N(log(median), sigma)) with median 100 ms and sigma 1.0 (mean 165 ms,
p99 ~1 s: a long-tailed tool or API), seeded per (trajectory, turn) so both modes wait
exactly the same times. The model is the built-in character model (`--model tiny`: 2
layers x 32 wide, or `default`: 4 x 128) with its eos logit raised so turns end after a
few tokens; greedy, so both modes produce the same tokens (checked). Modes alternate within each round (sync first in
even rounds). Throughput: trajectories/s and model tokens/s over the rollout wall time.

Prints a table and writes benchmarks/engines/results/agent_async.json with the machine description.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402
from benchmarks.controller.bench_controller import machine  # noqa: E402

from hybridflow.data.rl_dataset import collate_prompts  # noqa: E402
from hybridflow.data.tokenizer import load_tokenizer  # noqa: E402
from hybridflow.engines.rollout import NativeRolloutEngine, RolloutConfig, SamplingParams  # noqa: E402
from hybridflow.envs.agent import AgentConfig  # noqa: E402
from hybridflow.envs.agent.demo import make_turn_model_dir  # noqa: E402
from hybridflow.envs.agent.loop import AgentLoop  # noqa: E402


def batch_of(tokenizer, n: int, env_kwargs: dict):
    samples = []
    for i in range(n):
        prompt = f"{i}+{i}="
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        samples.append({"input_ids": tokenizer(text, add_special_tokens=False)["input_ids"], "raw_prompt": prompt,
                        "data_source": "arithmetic", "ground_truth": "0", "index": i,
                        "extra_info": {"env": "latency", "env_kwargs": env_kwargs}})
    return collate_prompts(samples, tokenizer.pad_token_id)


def run_mode(engine, tokenizer, batch, mode: str, response_length: int, turns: int) -> dict:
    config = AgentConfig(enable=True, mode=mode, max_turns=turns, env_timeout_s=60.0)
    loop = AgentLoop(engine, tokenizer, config, response_length, tokenizer.pad_token_id)
    start = time.perf_counter()
    out = loop.run(batch, SamplingParams(temperature=0.0, max_new_tokens=response_length))
    wall = time.perf_counter() - start
    model_tokens = int(out.batch["response_mask"].sum())
    return {"wall_s": wall, "traj_per_s": len(out) / wall, "model_tok_per_s": model_tokens / wall,
            "model_tokens": model_tokens, "env_wait_s": loop.stats["env_wait_s"],
            "turns_mean": float(sum(out.non_tensor_batch["num_turns"]) / len(out)),
            "stops": sorted(set(out.non_tensor_batch["agent_stop"])), "responses": out.batch["responses"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trajectories", type=int, default=64)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--median-ms", type=float, default=100.0)
    ap.add_argument("--sigma", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--response-length", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", choices=("tiny", "default"), default="tiny",
                    help="tiny: 2 layers x 32 (turns of ~2 tokens, env-bound); default: the built-in 4 x 128")
    ap.add_argument("--out", default="benchmarks/engines/results/agent_async.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sizes = {} if args.model == "tiny" else dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4,
                                                  num_attention_heads=4, num_key_value_heads=2)
    path = make_turn_model_dir(Path(tempfile.mkdtemp()) / "model", eos_boost=5.0, **sizes)
    tokenizer = load_tokenizer(path)
    engine = NativeRolloutEngine.from_pretrained(path, RolloutConfig(dtype=torch.float32), tokenizer=tokenizer)
    env_kwargs = {"turns": args.turns, "median_s": args.median_ms / 1e3, "sigma": args.sigma}
    batch = batch_of(tokenizer, args.trajectories, env_kwargs)
    results: dict[str, list[dict]] = {"sync": [], "async": []}
    for r in range(args.rounds):
        for mode in (("sync", "async") if r % 2 == 0 else ("async", "sync")):
            results[mode].append(run_mode(engine, tokenizer, batch, mode, args.response_length, args.turns))
    same = all(torch.equal(a["responses"], s["responses"]) for a, s in zip(results["async"], results["sync"]))
    summary = {}
    for mode, runs in results.items():
        summary[mode] = {k: statistics.median(r[k] for r in runs)
                         for k in ("wall_s", "traj_per_s", "model_tok_per_s", "env_wait_s", "turns_mean")}
        summary[mode]["model_tokens"] = runs[0]["model_tokens"]
        summary[mode]["stops"] = runs[0]["stops"]
    ratio = {k: summary["async"][k] / summary["sync"][k] for k in ("traj_per_s", "model_tok_per_s")}
    print(f"{'mode':<6} {'wall s':>8} {'traj/s':>8} {'model tok/s':>12} {'env wait s':>11} {'turns':>6}")
    for mode in ("sync", "async"):
        s = summary[mode]
        print(f"{mode:<6} {s['wall_s']:8.2f} {s['traj_per_s']:8.2f} {s['model_tok_per_s']:12.1f} "
              f"{s['env_wait_s']:11.2f} {s['turns_mean']:6.2f}")
    print(f"async / sync: trajectories/s {ratio['traj_per_s']:.2f}x, model tokens/s {ratio['model_tok_per_s']:.2f}x; "
          f"same tokens in both modes: {same}")
    record = {"args": vars(args), "summary": summary, "async_over_sync": ratio, "same_tokens": same,
              "machine": machine()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(stamp(record), indent=2, default=str))
    print(f"load average {record['machine']['load_avg_1_5_15']}; wrote {args.out}")


if __name__ == "__main__":
    main()
