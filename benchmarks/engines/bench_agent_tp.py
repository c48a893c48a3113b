"""What the agent loop's lockstep costs at generation tensor parallelism t_g = 2.

Run from the repository root:

    .venv/bin/python benchmarks/engines/bench_agent_tp.py                     # 32 trajectories, 4 turns, 2 rounds
    .venv/bin/python benchmarks/engines/bench_agent_tp.py --median-ms 20      # with log-normal env latency

Workload: `--trajectories` rows of the built-in `latency` environment (envs/agent/demo.py,
deterministic answers; `--median-ms` 0 = no latency), `--turns` model turns each, greedy,
on the built-in character model with 2 kv heads (`--model default`: 4 layers x 128;
`tiny`: 2 x 32). Each mode (sync, async) runs on one process (t_g = 1) and on two gloo
processes forming one t_g = 2 group (envs/agent/lockstep.py); the t_g = 2 tokens must
equal the t_g = 1 tokens (checked). Per run: loop wall time, decode steps, lockstep
exchanges and bytes, and the seconds each rank spent inside the lockstep broadcasts (rank
0: the collectives; rank 1: also waiting while rank 0 steps environments). Both t_g
settings run in the same invocation, alternating per round, median over rounds.

Prints a table and writes benchmarks/engines/results/agent_tp.json with the machine description.
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
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402
from benchmarks.engines.bench_agent_async import batch_of  # noqa: E402
from benchmarks.controller.bench_controller import machine  # noqa: E402

from hybridflow.data.tokenizer import load_tokenizer  # noqa: E402
from hybridflow.engines.rollout import NativeRolloutEngine, RolloutConfig, SamplingParams  # noqa: E402
from hybridflow.envs.agent import AgentConfig  # noqa: E402
from hybridflow.envs.agent.demo import TINY_SIZES, make_turn_model_dir  # noqa: E402
from hybridflow.envs.agent.loop import AgentLoop  # noqa: E402

MODELS = {"tiny": {**TINY_SIZES, "num_key_value_heads": 2},
          "default": dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                          num_key_value_heads=2)}


def run_modes(engine, tokenizer, args) -> dict[str, dict]:
    """Both agent modes once on `engine`: timings, counters and the responses."""
    env_kwargs = {"turns": args.turns, "median_s": args.median_ms / 1e3, "sigma": args.sigma}
    batch = batch_of(tokenizer, args.trajectories, env_kwargs)
    out = {}
    for mode in ("sync", "async"):
        config = AgentConfig(enable=True, mode=mode, max_turns=args.turns, env_timeout_s=60.0)
        loop = AgentLoop(engine, tokenizer, config, args.response_length, tokenizer.pad_token_id)
        if dist.is_initialized():
            dist.barrier()  # both ranks start the clock together (model loading takes different times)
        start = time.perf_counter()
        result = loop.run(batch, SamplingParams(temperature=0.0, max_new_tokens=args.response_length))
        stats = loop.stats
        out[mode] = {"wall_s": time.perf_counter() - start, "decode_steps": stats["engine_decode_steps"],
                     "prefill_calls": stats["engine_prefill_calls"],
                     "lockstep_exchanges": stats.get("lockstep_exchanges", 0.0),
                     "lockstep_bytes": stats.get("lockstep_bytes", 0.0), "lockstep_s": stats.get("lockstep_s", 0.0),
                     "model_tokens": int(result.batch["response_mask"].sum()), "responses": result.batch["responses"]}
    return out


def _tp_worker(rank: int, init_file: str, path: str, args, out_file: str) -> None:
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    tokenizer = load_tokenizer(path)
    engine = NativeRolloutEngine.from_pretrained(path, RolloutConfig(dtype=torch.float32),
                                                 process_group=dist.group.WORLD, tokenizer=tokenizer)
    torch.save(run_modes(engine, tokenizer, args), f"{out_file}.{rank}")
    dist.destroy_process_group()


def run_tp2(path: Path, args, work: Path, round_index: int) -> list[dict]:
    init = work / f"rdzv{round_index}"
    mp.spawn(_tp_worker, args=(str(init), str(path), args, str(work / f"tp{round_index}")), nprocs=2, join=True)
    return [torch.load(work / f"tp{round_index}.{r}", weights_only=False) for r in range(2)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trajectories", type=int, default=32)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--median-ms", type=float, default=0.0)
    ap.add_argument("--sigma", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--response-length", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", choices=tuple(MODELS), default="default")
    ap.add_argument("--out", default="benchmarks/engines/results/agent_tp.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp())
    path = make_turn_model_dir(work / "model", eos_boost=5.0, **MODELS[args.model])
    tokenizer = load_tokenizer(path)
    single_engine = NativeRolloutEngine.from_pretrained(path, RolloutConfig(dtype=torch.float32), tokenizer=tokenizer)
    single, ranks = [], [[], []]
    for r in range(args.rounds):
        order = ("tg1", "tg2") if r % 2 == 0 else ("tg2", "tg1")
        for which in order:
            if which == "tg1":
                single.append(run_modes(single_engine, tokenizer, args))
            else:
                for rank, result in enumerate(run_tp2(path, args, work, r)):
                    ranks[rank].append(result)
    same = all(torch.equal(s[m]["responses"], rk[i][m]["responses"])
               for i, s in enumerate(single) for rk in ranks for m in ("sync", "async"))
    keys = ("wall_s", "decode_steps", "prefill_calls", "lockstep_exchanges", "lockstep_bytes", "lockstep_s",
            "model_tokens")
    summary = {}
    for label, runs in (("t_g=1", single), ("t_g=2 rank 0", ranks[0]), ("t_g=2 rank 1", ranks[1])):
        for mode in ("sync", "async"):
            summary[f"{label} {mode}"] = {k: statistics.median(run[mode][k] for run in runs) for k in keys}
    print(f"{'run':<20} {'wall s':>7} {'decode':>7} {'exch':>6} {'exch/dec':>8} {'KiB':>7} {'in bcast s':>10} "
          f"{'share':>6}")
    for name, s in summary.items():
        per_decode = s["lockstep_exchanges"] / max(s["decode_steps"], 1)
        print(f"{name:<20} {s['wall_s']:7.2f} {s['decode_steps']:7.0f} {s['lockstep_exchanges']:6.0f} "
              f"{per_decode:8.2f} {s['lockstep_bytes'] / 1024:7.1f} {s['lockstep_s']:10.3f} "
              f"{s['lockstep_s'] / s['wall_s']:6.1%}")
    print(f"t_g=2 tokens equal t_g=1 tokens (greedy, both modes, both ranks): {same}")
    record = {"args": vars(args), "summary": summary, "same_tokens": same, "machine": machine()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(stamp(record), indent=2, default=str))
    print(f"load average {record['machine']['load_avg_1_5_15']}; wrote {args.out}")


if __name__ == "__main__":
    main()
