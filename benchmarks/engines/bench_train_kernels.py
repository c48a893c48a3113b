"""The training engine's kernel options on this machine, each against the code it replaces.

Run from the repository root (a few minutes on 2 cores, most of it compiling):

    .venv/bin/python benchmarks/bench_train_kernels.py
    .venv/bin/python benchmarks/bench_train_kernels.py --skip-compile     # the head only

Cases, each timed side by side in one run (alternating, best of --repeats, process CPU
time recorded beside wall time since the machine is shared):
- `head`: response log-probs + entropy of N tokens over a SmolLM2-135M-sized head
  (hidden 576, vocab 49152), forward and backward: lm_head then algorithms.logprob's
  chunked log-softmax (`fused_head: false`) vs vocab_head.head_log_probs (`fused_head:
  true`). Memory: bytes autograd keeps for backward (saved-tensor hooks), and the largest
  single tensor the step creates ([N, vocab] logits and their gradient vs one chunk).
- `compile`: ActorEngine.update_policy of a small Llama (hidden 256, 4 layers) with
  `compile_kernels` off and on (each decoder layer through torch.compile); the first
  compiled step (the compile itself) is reported apart.
Writes benchmarks/engines/results/train_kernels.json with the machine description.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*

from hybridflow.algorithms import entropy_from_logits, logprobs_from_logits  # noqa: E402
from hybridflow.engines.train.vocab_head import head_log_probs  # noqa: E402

from benchmarks.common.plain_machine import load_average, machine  # noqa: E402
from benchmarks.common.provenance import stamp  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "train_kernels.json"


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def best_of(fn: Callable[[], Any], repeats: int) -> dict[str, float]:
    fn()  # warm-up
    walls, cpus = [], []
    for _ in range(repeats):
        w, c = _clock()
        fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return {"wall_s": round(min(walls), 4), "cpu_s": round(min(cpus), 4)}


def saved_bytes(fn: Callable[[], torch.Tensor]) -> int:
    """Bytes of the distinct tensors autograd saves for backward while `fn` runs forward."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def head_case(tokens: int, dtype: torch.dtype, repeats: int, chunk: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    hidden, vocab = 576, 49152
    h = torch.randn(tokens, hidden, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(vocab, hidden, generator=g) * 0.05).to(dtype).requires_grad_()
    labels = torch.randint(0, vocab, (tokens,), generator=g)

    def unfused() -> torch.Tensor:
        logits = F.linear(h, w)
        return logprobs_from_logits(logits, labels, 1.0, chunk).sum() + entropy_from_logits(logits, chunk).sum()

    def fused() -> torch.Tensor:
        lp, ent = head_log_probs(h, w, labels, chunk=chunk, with_entropy=True)
        return lp.sum() + ent.sum()

    row: dict[str, Any] = {"case": "head", "tokens": tokens, "hidden": hidden, "vocab": vocab,
                           "dtype": str(dtype).replace("torch.", ""), "chunk": chunk}
    timings: dict[str, list] = {"unfused": [], "fused": []}
    for fn, name in ((unfused, "unfused"), (fused, "fused")):
        row[f"{name}_saved_for_backward_mib"] = round(saved_bytes(fn) / 2**20, 1)
    for _ in range(repeats):  # alternate, so load hits both alike
        for fn, name in ((unfused, "unfused"), (fused, "fused")):
            timings[name].append(best_of(lambda fn=fn: (fn().backward(), h.grad.zero_(), w.grad.zero_()), 1))
    for name, runs in timings.items():
        row[f"{name}_fwd_bwd_s"] = min(r["wall_s"] for r in runs)
        row[f"{name}_fwd_bwd_cpu_s"] = min(r["cpu_s"] for r in runs)
    row["largest_tensor_mib"] = {"unfused": round(tokens * vocab * torch.finfo(dtype).bits / 8 / 2**20, 1),
                                 "fused": round(min(chunk, tokens) * vocab * 4 / 2**20, 1)}
    row["speedup_cpu_time"] = round(row["unfused_fwd_bwd_cpu_s"] / row["fused_fwd_bwd_cpu_s"], 2)
    return row


def compile_case(repeats: int) -> dict[str, Any]:
    import torch.distributed as dist

    from hybridflow.engines.local_ranks import free_port
    from hybridflow.engines.models import save_tiny_model
    from hybridflow.engines.train import ActorEngine, MicroBatchConfig, OptimConfig, TrainEngineConfig

    from benchmarks.gpu.gpu_check import full_batch

    if not dist.is_initialized():
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)
    sizes = dict(hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=4096)
    n, prompt, response = 8, 32, 32
    row: dict[str, Any] = {"case": "compile", "model": sizes, "batch": [n, prompt, response]}
    with tempfile.TemporaryDirectory() as tmp:
        path = save_tiny_model(Path(tmp) / "m", "llama", seed=0, **sizes)
        batch = full_batch(n, prompt, response, sizes["vocab_size"], seed=1)
        engines = {}
        for name, compiled in (("eager", False), ("compiled", True)):
            mb = MicroBatchConfig(mini_batch_size=n, micro_batch_size_per_device=n,
                                  forward_micro_batch_size_per_device=n)
            engines[name] = ActorEngine(TrainEngineConfig(model_path=str(path), dtype="fp32", micro_batch=mb,
                                                          optim=OptimConfig(lr=1e-6), compile_kernels=compiled))
            start = time.perf_counter()
            engines[name].update_policy(batch)  # the compiled engine compiles here
            row[f"{name}_first_step_s"] = round(time.perf_counter() - start, 2)
        timings: dict[str, list] = {k: [] for k in engines}
        for _ in range(repeats):
            for name, engine in engines.items():
                timings[name].append(best_of(lambda engine=engine: engine.update_policy(batch), 1))
    for name, runs in timings.items():
        row[f"{name}_step_s"] = min(r["wall_s"] for r in runs)
        row[f"{name}_step_cpu_s"] = min(r["cpu_s"] for r in runs)
    row["speedup_cpu_time"] = round(row["eager_step_cpu_s"] / row["compiled_step_cpu_s"], 2)
    saved = row["eager_step_s"] - row["compiled_step_s"]
    row["break_even_steps"] = round(row["compiled_first_step_s"] / saved, 1) if saved > 0 else None
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--chunk", type=int, default=1024, help="logits_chunk_size")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-compile", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    load_before = load_average()
    rows = []
    for d in args.dtypes.split(","):
        rows.append(head_case(args.tokens, dtypes[d], args.repeats, args.chunk))
        r = rows[-1]
        print(f"head {r['dtype']:>8} N={r['tokens']}: unfused {r['unfused_fwd_bwd_cpu_s']:.3f} CPU s, "
              f"{r['unfused_saved_for_backward_mib']} MiB saved | fused {r['fused_fwd_bwd_cpu_s']:.3f} CPU s, "
              f"{r['fused_saved_for_backward_mib']} MiB saved | speedup {r['speedup_cpu_time']}x", flush=True)
    if not args.skip_compile:
        rows.append(compile_case(args.repeats))
        r = rows[-1]
        print(f"compile: eager {r['eager_step_cpu_s']:.3f} CPU s/step, compiled {r['compiled_step_cpu_s']:.3f} "
              f"(first step {r['compiled_first_step_s']} s) speedup {r['speedup_cpu_time']}x", flush=True)
    key = {f"{r['case']} {r.get('dtype', '')} CPU-time speedup".replace("  ", " "): r["speedup_cpu_time"] for r in rows}
    record = {"benchmark": "train kernels: fused head, compiled layers",
              "load_avg_before": load_before, "load_avg_after": load_average(), "machine": machine(),
              "rows": rows, "key_figures": key}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(stamp(record), indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
