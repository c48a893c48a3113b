"""Pipeline-parallel vs data-parallel training throughput on the same ranks.

Run:  PYTHONPATH=. .venv/bin/python benchmarks/engines/bench_pipeline.py [--ranks 2] [--layers 8] [--rounds 2]

One global batch, one micro-batch size, the real `ActorEngine.update_policy` (forward,
chunked log-probs, PPO loss, backward, AdamW) on `--ranks` gloo CPU processes laid out
either as dp = ranks (FSDP2) or as pp = ranks (1F1B, one stage per rank). Layouts are
run alternately for `--rounds` rounds (the machine is shared: alternating spreads its
drift over both), each round timing `--iters` updates after one warm-up update. Reported:
median update seconds and tokens/s of the whole group (valid tokens / wall time), the
pp/dp ratio, the load average before and after. Writes benchmarks/engines/results/pipeline.json
with the machine description.

What to expect on CPU: with 1 thread per rank a pipeline of p stages keeps each rank
busy (M / (M + p - 1)) of the time for M micro-batches (the 1F1B bubble), and sends one
activation per micro-batch; dp instead all-gathers and reduce-scatters every layer's
weights each micro-batch. Which wins depends on the model and batch; that is what this
measures.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402

from benchmarks.controller.bench_controller import machine  # noqa: E402

from hybridflow.engines.local_ranks import run_ranks  # noqa: E402


def _batch(n: int, prompt: int, response: int, vocab: int):
    import torch

    g = torch.Generator().manual_seed(0)
    s = prompt + response
    input_ids = torch.randint(3, vocab, (n, s), generator=g)
    mask = torch.ones(n, s, dtype=torch.long)
    return {
        "input_ids": input_ids, "attention_mask": mask, "position_ids": torch.arange(s).expand(n, s).clone(),
        "responses": input_ids[:, prompt:], "response_mask": torch.ones(n, response, dtype=torch.long),
        "advantages": torch.randn(n, response, generator=g), "old_log_probs": torch.full((n, response), -8.0),
    }


def _time_updates(rank: int, world: int, path: str, layout: str, args: dict) -> dict:
    from hybridflow.engines.train import ActorEngine, MicroBatchConfig, OptimConfig, TrainEngineConfig

    pp = world if layout == "pp" else 1
    dp = world // pp
    config = TrainEngineConfig(
        model_path=path, dtype="fp32", pp_size=pp,
        optim=OptimConfig(lr=1e-5),
        micro_batch=MicroBatchConfig(mini_batch_size=args["batch"], micro_batch_size_per_device=args["micro"]),
    )
    engine = ActorEngine(config)
    batch = _batch(args["batch"], args["prompt"], args["response"], args["vocab"])
    local = {k: v.chunk(dp)[engine.dp_rank] for k, v in batch.items()}
    engine.update_policy(local)  # warm-up
    seconds = []
    for _ in range(args["iters"]):
        start = time.perf_counter()
        engine.update_policy(local)
        seconds.append(time.perf_counter() - start)
    return {"seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16, help="sequences per update (one mini-batch)")
    parser.add_argument("--micro", type=int, default=2, help="sequences per micro-batch")
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--response", type=int, default=96)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "pipeline.json"))
    args = parser.parse_args()
    from hybridflow.engines.models import save_tiny_model

    vocab = 4096
    opts = {"batch": args.batch, "micro": args.micro, "prompt": args.prompt, "response": args.response,
            "vocab": vocab, "iters": args.iters}
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {"dp": [], "pp": []}
    with tempfile.TemporaryDirectory() as tmp:
        path = str(save_tiny_model(Path(tmp) / "m", "llama", num_hidden_layers=args.layers, hidden_size=args.hidden,
                                   intermediate_size=4 * args.hidden, num_attention_heads=8, num_key_value_heads=4,
                                   vocab_size=vocab))
        for _ in range(args.rounds):
            for layout in ("dp", "pp"):
                per_rank = run_ranks(_time_updates, args.ranks, path, layout, opts, timeout=1200)
                # A step ends when its slowest rank does.
                times[layout] += [max(r["seconds"][i] for r in per_rank) for i in range(args.iters)]
    tokens = args.batch * (args.prompt + args.response)
    rows = {}
    for layout, secs in times.items():
        med = statistics.median(secs)
        rows[layout] = {"median_update_s": round(med, 3), "tokens_per_s": round(tokens / med, 1),
                        "samples_s": [round(s, 3) for s in secs]}
    ratio = rows["pp"]["tokens_per_s"] / rows["dp"]["tokens_per_s"]
    result = {"config": vars(args), "tokens_per_update": tokens, "layouts": rows, "pp_over_dp_tokens_per_s": round(ratio, 3),
              "load_avg_before": [round(x, 2) for x in load_before], "machine": machine()}
    print(f"{args.ranks} ranks, llama {args.layers} layers x hidden {args.hidden}, {args.batch} sequences x "
          f"{args.prompt + args.response} tokens per update, micro-batch {args.micro}")
    print(f"{'layout':<8}{'median update s':>18}{'tokens/s':>12}")
    for layout, row in rows.items():
        print(f"{layout + ' ' + str(args.ranks):<8}{row['median_update_s']:>18}{row['tokens_per_s']:>12}")
    print(f"pp / dp tokens/s = {ratio:.2f}; load average before {load_before}, after {os.getloadavg()}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(stamp(result), indent=2))


if __name__ == "__main__":
    main()
