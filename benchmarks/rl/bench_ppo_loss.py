"""The one PPO clipped loss on environment minibatches: its masked path against its dense path.

    .venv/bin/python benchmarks/bench_ppo_loss.py [--rows 64,256] [--reps 2000]

algorithms/policy_loss.ppo_clip_loss takes a response mask ([B, T] language-model batches);
without one (environment steps: every row counts) it runs a dense path that skips the masking
and the per-side clip metrics. Both compute the same loss and gradient
(tests/algorithms/test_ppo_env_loss.py); this measures forward + backward of each, on one
torch thread, interleaved (A, B, A, B, ...) so that machine load hits both alike. Writes
benchmarks/rl/results/ppo_loss.json with the machine description.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # run by path: the root, for benchmarks.*

from benchmarks.controller.bench_controller import machine  # noqa: E402
from benchmarks.common.provenance import stamp  # noqa: E402

from hybridflow.algorithms import PolicyLossConfig  # noqa: E402
from hybridflow.algorithms.policy_loss import ppo_clip_loss  # noqa: E402

CONFIG = PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=math.inf)


def timed(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def case(rows: int, reps: int) -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    old, adv = torch.randn(rows, generator=g), torch.randn(rows, generator=g)
    new = (old + 0.1 * torch.randn(rows, generator=g)).requires_grad_()
    mask = torch.ones(rows, 1, dtype=torch.bool)

    def masked() -> None:
        loss, _ = ppo_clip_loss(old[:, None], new[:, None], adv[:, None], mask, config=CONFIG)
        loss.backward()

    def dense() -> None:
        loss, _ = ppo_clip_loss(old, new, adv, None, config=CONFIG)
        loss.backward()

    samples: dict[str, list[float]] = {"masked": [], "dense": []}
    for _ in range(10):  # rounds, interleaved
        samples["masked"] += timed(masked, reps // 10)
        samples["dense"] += timed(dense, reps // 10)
    med = {name: statistics.median(values) * 1e6 for name, values in samples.items()}
    return {"rows": rows, "masked_us": round(med["masked"], 1), "dense_us": round(med["dense"], 1),
            "dense_vs_masked": round(med["dense"] / med["masked"], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="64,256")
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--out", default=str(HERE / "results" / "ppo_loss.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = [case(int(r), args.reps) for r in args.rows.split(",")]
    print(f"{'rows':>6} {'masked us':>10} {'dense us':>10} {'dense/masked':>13}")
    for r in results:
        print(f"{r['rows']:>6} {r['masked_us']:>10} {r['dense_us']:>10} {r['dense_vs_masked']:>13}")
    key = {f"rows {r['rows']} dense/masked": r["dense_vs_masked"] for r in results}
    Path(args.out).write_text(json.dumps(stamp({"machine": machine(), "reps": args.reps, "results": results,
                                                "key_figures": key}), indent=1) + "\n")


if __name__ == "__main__":
    main()
