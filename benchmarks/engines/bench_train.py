"""Training-engine throughput: forward+backward tokens/s and MFU of a ~100M Llama.

Run:  .venv/bin/python benchmarks/engines/bench_train.py [--layers 12] [--seq-len 256] [--iters 3]

Builds a Llama config locally (hidden 768, 12 layers, 12 heads, MLP 2048, vocab 32000:
134M parameters, 110M of them in matmuls), wraps it in the real `ActorEngine` (FSDP2
on a one-process gloo group, the mixed-precision policy of the chosen dtype) and times
the micro-batch step the engine runs in `update_policy` (forward, chunked log-probs,
PPO loss, backward), then a whole `update_policy` call including the AdamW step.

In the same run it measures the matmul ceiling of this machine: FLOP/s of a square
torch.matmul in that dtype, right before and right after every timed step (the
machine is shared, so its speed drifts; each step is compared with the ceiling
measured around it). Two MFUs are reported: from wall-clock time, and from process
CPU time (FLOPs per CPU-second over the ceiling's FLOPs per CPU-second), which is
insensitive to other processes taking the cores. MFU = achieved / ceiling, with
achieved FLOP/s from

    FLOPs per sequence of s tokens = 6 N s + 12 L d s^2     (fwd + bwd)

(N matmul parameters, L layers, d hidden size; see hybridflow/engines/train/flops.py).
The batch is one prompt token and a response filling the rest, so the lm_head runs on
every position and the 6 N term is exact. Prints a table and writes
benchmarks/engines/results/train.json with the machine description.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from hybridflow.algorithms import PolicyLossConfig, get_policy_loss
from hybridflow.engines.models import save_tiny_model
from hybridflow.engines.train import ActorEngine, ActorLossConfig, MicroBatchConfig, OptimConfig, TrainEngineConfig
from hybridflow.engines.train.flops import training_flops
from hybridflow.engines.train.forward import causal_lm_log_probs
import sys
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def _init_single_process_group() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)


def _batch(n: int, seq_len: int, vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, vocab, (n, seq_len), generator=g)
    ones = torch.ones(n, seq_len, dtype=torch.long)
    r = seq_len - 1
    return {
        "input_ids": input_ids,
        "attention_mask": ones,
        "position_ids": torch.arange(seq_len).expand(n, -1).clone(),
        "responses": input_ids[:, 1:],
        "response_mask": ones[:, 1:],
        "old_log_probs": torch.full((n, r), -10.0),
        "advantages": torch.randn(n, r, generator=g),
    }


def _timed(fn) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of fn()."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def _ceiling(dtype: torch.dtype, size: int, seconds: float) -> tuple[float, float]:
    """Matmul FLOPs per wall second and per CPU second (square `size` matmuls for ~`seconds`)."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    out = torch.empty(size, size, dtype=dtype)
    torch.matmul(a, b, out=out)
    iters = 0
    wall, cpu = time.perf_counter(), time.process_time()
    while time.perf_counter() - wall < seconds:
        torch.matmul(a, b, out=out)
        iters += 1
    flops = 2.0 * size**3 * iters
    return flops / (time.perf_counter() - wall), flops / (time.process_time() - cpu)


def _fwd_bwd(engine: ActorEngine, batch: dict[str, torch.Tensor]) -> None:
    """The engine's micro-batch step: forward, chunked log-probs, PPO loss, backward."""
    lp, _ = causal_lm_log_probs(engine.model, batch, temperature=1.0, chunk_size=1024,
                                pack_sequences=False, with_entropy=False)
    loss, _ = get_policy_loss("vanilla")(batch["old_log_probs"], lp, batch["advantages"],
                                         batch["response_mask"], config=PolicyLossConfig())
    loss.backward()
    engine.optimizer.zero_grad(set_to_none=True)


def _measure(engine: ActorEngine, batch: dict, dtype: torch.dtype, args: argparse.Namespace, flops: float) -> dict:
    """Best-of-`iters` MFU (wall and CPU time), each step between two ceiling measurements."""
    engine.model.train()
    _fwd_bwd(engine, batch)  # warm-up: allocations, kernel selection
    best: dict = {}
    for _ in range(args.iters):
        before = _ceiling(dtype, args.matmul_size, args.ceiling_seconds)
        wall, cpu = _timed(lambda: _fwd_bwd(engine, batch))
        after = _ceiling(dtype, args.matmul_size, args.ceiling_seconds)
        ceiling_wall = (before[0] + after[0]) / 2
        ceiling_cpu = (before[1] + after[1]) / 2
        row = {
            "seconds_fwd_bwd": wall,
            "achieved_gflops": flops / wall / 1e9,
            "ceiling_gflops": ceiling_wall / 1e9,
            "mfu": flops / wall / ceiling_wall,
            "mfu_cpu_time": (flops / cpu) / ceiling_cpu,
        }
        if not best or row["mfu_cpu_time"] > best["mfu_cpu_time"]:
            best = row
    return best


def run(dtype_name: str, model_dir: Path, args: argparse.Namespace) -> dict:
    dtype = DTYPES[dtype_name]
    config = TrainEngineConfig(
        model_path=str(model_dir), dtype=dtype_name,
        optim=OptimConfig(lr=1e-5),
        micro_batch=MicroBatchConfig(mini_batch_size=args.batch, micro_batch_size_per_device=args.batch),
    )
    engine = ActorEngine(config, ActorLossConfig())
    n_params, layers, hidden = engine.flops_config()
    batch = _batch(args.batch, args.seq_len, 32000)
    tokens = args.batch * args.seq_len
    flops = training_flops(n_params, layers, hidden, [args.seq_len] * args.batch)
    row = {"dtype": dtype_name, **_measure(engine, batch, dtype, args, flops)}
    row["tokens_per_s_fwd_bwd"] = tokens / row["seconds_fwd_bwd"]
    update_s, _ = _timed(lambda: engine.update_policy(batch))
    row["tokens_per_s_update_with_adamw"] = tokens / update_s
    return row


def key_figures(rows: list[dict]) -> dict[str, str]:
    """Per dtype: tokens/s, achieved and ceiling GFLOP/s (an MFU over 1 means the ceiling's
    square matmul is slower than the model's: no native kernel for that dtype)."""
    return {f"{r['dtype']} tok/s, GFLOP/s achieved/ceiling":
            f"{r['tokens_per_s_fwd_bwd']:.1f}, {r['achieved_gflops']:.1f}/{r['ceiling_gflops']:.1f}" for r in rows}


def machine() -> dict:
    cpu = ""
    if Path("/proc/cpuinfo").is_file():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "avx512_bf16": "avx512_bf16" in flags,
        "amx_bf16": "amx_bf16" in flags,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "load_average": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--iters", type=int, default=2)
    parser.add_argument("--matmul-size", type=int, default=2048)
    parser.add_argument("--ceiling-seconds", type=float, default=1.5)
    parser.add_argument("--dtypes", default="bf16,fp32")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "train.json"))
    args = parser.parse_args()
    _init_single_process_group()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_tiny_model(
            Path(tmp) / "llama100m", "llama", seed=0, vocab_size=32000, hidden_size=768,
            intermediate_size=2048, num_hidden_layers=args.layers, num_attention_heads=12,
            num_key_value_heads=12, max_position_embeddings=2048,
        )
        rows = [run(d, model_dir, args) for d in args.dtypes.split(",")]
        import transformers

        full = transformers.AutoModelForCausalLM.from_pretrained(model_dir, trust_remote_code=False)
        n_total = sum(p.numel() for p in full.parameters())
    header = (f"| {'dtype':5} | {'tok/s fwd+bwd':>13} | {'GFLOP/s':>7} | {'matmul ceiling GFLOP/s':>22} | "
              f"{'MFU (wall)':>10} | {'MFU (CPU time)':>14} | {'tok/s update+AdamW':>18} |")
    print(header)
    print("|" + "|".join("-" * len(c) for c in header.split("|")[1:-1]) + "|")
    for r in rows:
        print(f"| {r['dtype']:5} | {r['tokens_per_s_fwd_bwd']:13.1f} | {r['achieved_gflops']:7.1f} | "
              f"{r['ceiling_gflops']:22.1f} | {r['mfu']:10.1%} | {r['mfu_cpu_time']:14.1%} | "
              f"{r['tokens_per_s_update_with_adamw']:18.1f} |")
    result = {
        "benchmark": "train_fwd_bwd",
        "model": {"family": "llama", "layers": args.layers, "hidden": 768, "heads": 12, "intermediate": 2048,
                  "vocab": 32000, "parameters": n_total},
        "batch": {"sequences": args.batch, "seq_len": args.seq_len},
        "mfu_formula": "(6 N s + 12 L d s^2) per sequence / step time / matmul ceiling of the same dtype; "
                       "mfu_cpu_time uses process CPU seconds for both",
        "args": vars(args),
        "rows": rows,
        "machine": machine(),
        "key_figures": key_figures(rows),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(stamp(result), indent=2))
    print(f"wrote {out}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
