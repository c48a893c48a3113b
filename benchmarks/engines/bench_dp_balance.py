"""Sequence-length balancing across dp ranks (trainer.balance_batch): token spread and step time.

Run from the repository root:

    .venv/bin/python benchmarks/engines/bench_dp_balance.py               # spread table + per-rank timing
    .venv/bin/python benchmarks/engines/bench_dp_balance.py --no-timing   # spread table only

1. Token spread, no processes: a GRPO-like batch (prompts x n samples; a prompt's samples
   are adjacent and similar in length, response lengths log-normal across prompts), split
   into dp contiguous chunks as dispatch does. For each order: `none` (as generated),
   `kk` (Karmarkar-Karp over the whole batch: the best total balance, but it moves
   samples between mini-batches) and `slot` (`dp_balanced_order`: rows swap ranks only at
   the same offset, so every mini-batch keeps its samples), the table shows max/min of
   the ranks' tokens over the whole batch and for the worst mini-batch (one optimizer
   step: ranks wait for each other at every step).
2. What a synchronous step waits for: each rank's chunk of one drawn batch (--timing-seed)
   goes through the training engine's old-log-prob forward (tiny Llama, sequence packing
   and a token budget, so compute follows tokens), one chunk at a time in this process,
   fastest of --repeats; the step costs the slowest rank. Measured chunk by chunk rather
   than on live ranks because on a shared 2-core machine the ranks do not run in parallel
   (the rank that would wait frees its core for the other), which hides the effect.

Prints the tables and writes benchmarks/engines/results/dp_balance.json with the machine description.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402
from benchmarks.controller.bench_controller import machine
from hybridflow.engines.train.batching import dp_balanced_order
from hybridflow.protocol import DataProto, balanced_partition

RESULTS = Path(__file__).resolve().parent / "results" / "dp_balance.json"


def grpo_lengths(prompts: int, n: int, seed: int, max_response: int) -> tuple[list[int], list[int]]:
    """(prompt lengths, response lengths) per sample, samples of a prompt adjacent."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(32, 256, prompts)
    typical = rng.lognormal(mean=np.log(300), sigma=0.8, size=prompts)  # how long a prompt makes answers
    responses = np.clip(typical[:, None] * rng.lognormal(0.0, 0.25, (prompts, n)), 8, max_response).astype(int)
    return np.repeat(prompt, n).tolist(), responses.reshape(-1).tolist()


def _orders(lengths: list[int], dp: int) -> dict[str, list[int]]:
    mask = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for i, length in enumerate(lengths):
        mask[i, :length] = 1
    kk = [i for part in balanced_partition(lengths, dp, equal_size=True) for i in sorted(part)]
    return {"none": list(range(len(lengths))), "kk": kk, "slot": dp_balanced_order(mask, dp).tolist()}


def _ratio(values: list[int]) -> float:
    return max(values) / min(values)


def spread_rows(lengths: list[int], dp: int, mini_batch: int) -> list[dict[str, Any]]:
    """Max/min rank tokens over the batch and over the worst mini-batch, per order."""
    chunk, per_rank = len(lengths) // dp, mini_batch // dp
    rows = []
    for name, order in _orders(lengths, dp).items():
        ranks = [[lengths[i] for i in order[r * chunk:(r + 1) * chunk]] for r in range(dp)]
        steps = [[sum(rank[s:s + per_rank]) for rank in ranks] for s in range(0, chunk, per_rank)]
        rows.append({"dp": dp, "order": name, "batch_max_over_min": _ratio([sum(rank) for rank in ranks]),
                     "worst_step_max_over_min": max(_ratio(step) for step in steps),
                     "mean_step_max_over_min": statistics.mean(_ratio(step) for step in steps)})
    return rows


# ----------------------------------------------------------------------------- 2-rank timing

def _timing_batch(prompts: int, n: int, vocab: int, max_response: int, seed: int) -> DataProto:
    prompt_lens, response_lens = grpo_lengths(prompts, n, seed=seed, max_response=max_response)
    prompt_lens = [min(p // 8, 32) for p in prompt_lens]  # short prompts: the responses dominate
    width_p, width_r, rows = max(prompt_lens), max(response_lens), len(prompt_lens)
    g = torch.Generator().manual_seed(0)
    prompt_mask = (torch.arange(width_p) >= width_p - torch.tensor(prompt_lens)[:, None]).long()
    response_mask = (torch.arange(width_r) < torch.tensor(response_lens)[:, None]).long()
    mask = torch.cat([prompt_mask, response_mask], dim=1)
    ids = torch.randint(3, vocab, (rows, width_p + width_r), generator=g) * mask
    return DataProto.from_dict(tensors={
        "input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        "responses": ids[:, width_p:], "response_mask": response_mask.float(),
        "advantages": torch.randn(rows, width_r, generator=g) * response_mask}, meta_info={"temperature": 1.0})


def _rank_seconds(engine: Any, chunk: DataProto, repeats: int) -> float:
    """Fastest of `repeats` forward passes (old log-probs) over one rank's chunk: the
    minimum filters out the other processes of a shared machine."""
    tensors = {key: chunk.batch[key] for key in ("input_ids", "attention_mask", "position_ids", "responses")}
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        engine.compute_log_prob(tensors)
        times.append(time.perf_counter() - start)
    return min(times)


def time_rank_chunks(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per dp size and order: each rank's forward time over its chunk, measured one chunk at a
    time in this process, and their max: what a synchronous step waits for on dedicated cores."""
    import torch.distributed as dist

    from hybridflow.engines.models import save_tiny_model
    from hybridflow.engines.train import ActorEngine, ActorLossConfig, MicroBatchConfig, TrainEngineConfig

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    model_dir = save_tiny_model(Path(tempfile.mkdtemp()) / "model", "llama", hidden_size=128, intermediate_size=256,
                                num_hidden_layers=4, max_position_embeddings=2048)
    batch = _timing_batch(args.timing_prompts, args.n, 256, args.timing_max_response, args.timing_seed)
    config = TrainEngineConfig(model_path=str(model_dir), dtype="fp32", pack_sequences=True,
                               micro_batch=MicroBatchConfig(mini_batch_size=len(batch), use_dynamic_bsz=True,
                                                            forward_max_tokens_per_device=2048))
    engine = ActorEngine(config, ActorLossConfig())
    tokens = batch.batch["attention_mask"].sum(-1).tolist()
    rows = []
    for dp in (2, 4):
        for name, order in _orders(tokens, dp).items():
            chunks = batch[np.array(order)].chunk(dp)
            seconds = [_rank_seconds(engine, chunk, args.repeats) for chunk in chunks]
            rows.append({"dp": dp, "order": name, "rank_tokens": [int(c.batch["attention_mask"].sum()) for c in chunks],
                         "rank_seconds": seconds, "step_seconds": max(seconds), "sum_seconds": sum(seconds)})
    dist.destroy_process_group()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--mini-batch", type=int, default=256)
    parser.add_argument("--max-response", type=int, default=4096)
    parser.add_argument("--timing-prompts", type=int, default=8)
    parser.add_argument("--timing-max-response", type=int, default=256)
    # Seed 0 draws a batch whose halves differ 1.31x in tokens; over seeds 0-11 the 2-rank
    # imbalance of 8 prompts x 8 ranges 1.02x-1.45x (median ~1.15x): an unlucky, not rare, draw.
    parser.add_argument("--timing-seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-timing", action="store_true")
    args = parser.parse_args()

    prompt_lens, response_lens = grpo_lengths(args.prompts, args.n, seed=0, max_response=args.max_response)
    lengths = [p + r for p, r in zip(prompt_lens, response_lens)]
    rows = [row for dp in (2, 4, 8) for row in spread_rows(lengths, dp, args.mini_batch)]
    print(f"{len(lengths)} sequences ({args.prompts} prompts x {args.n}), mini-batch {args.mini_batch}: "
          "max/min of rank tokens")
    print(f"{'dp':>3} {'order':>5} {'batch':>7} {'worst step':>11} {'mean step':>10}")
    for row in rows:
        print(f"{row['dp']:>3} {row['order']:>5} {row['batch_max_over_min']:>7.3f} "
              f"{row['worst_step_max_over_min']:>11.3f} {row['mean_step_max_over_min']:>10.3f}")
    result: dict[str, Any] = {"spread": rows, "args": vars(args), "machine": machine()}
    if not args.no_timing:
        timing = time_rank_chunks(args)
        result["rank_forward_timing"] = timing
        print(f"\nforward (old log-probs) per rank chunk, {args.timing_prompts} prompts x {args.n}, packed: "
              "max over ranks = the synchronous step")
        print(f"{'dp':>3} {'order':>5} {'rank tokens':>26} {'step s':>7} {'sum s':>6}")
        for row in timing:
            print(f"{row['dp']:>3} {row['order']:>5} {str(row['rank_tokens']):>26} "
                  f"{row['step_seconds']:>7.3f} {row['sum_seconds']:>6.3f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(stamp(result), indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
