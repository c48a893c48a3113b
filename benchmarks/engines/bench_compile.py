"""Does torch.compile pay for a small model's RL update on this CPU? (issue 28, goal 1)

Issue 28 lists torch.compile of the update and of the decode step as an option for the
tiny workload, to be judged by measuring compile time against run length. This times one
training step (forward over the batch, token log-probs, a PPO-style surrogate, backward,
gradient clipping, AdamW) of the tiny workload's model in eager mode and compiled
(`torch.compile(model)`, inductor, static shapes), and the first compiled step (the
compile itself). One decode step (batch rows, one new token, KV cache) is timed the same
way. Break-even = compile seconds / seconds saved per step: the number of steps a run must
have before compiling saves time.

Run (~2-3 min, most of it compiling):

    .venv/bin/python benchmarks/engines/bench_compile.py

The model is the tiny workload's (bench_vs_trl.py: the built-in task's Qwen2, 1.0M
parameters, random weights from seed 0); the batch is 64 samples of `--tokens` tokens
(bench_vs_trl's tiny runs average 9 prompt + 8 completion tokens). Static shapes favour
compile: a real run's lengths vary from step to step and either recompile or need
dynamic shapes. Prints a table; writes benchmarks/engines/results/compile.json with the machine
description.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
import transformers
import sys
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402

from benchmarks.common.plain_machine import load_average, machine

HERE = Path(__file__).resolve().parent


def tiny_model(work: Path) -> transformers.PreTrainedModel:
    """The tiny workload's model, as bench_vs_trl builds it."""
    from benchmarks.rl.bench_vs_trl import WORKLOADS, model_dir

    path = model_dir(WORKLOADS["tiny"], work)
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, trust_remote_code=False)


def train_step(model: torch.nn.Module, params: list, optimizer: torch.optim.Optimizer, ids: torch.Tensor) -> None:
    """Forward, token log-probs, a clipped-ratio surrogate at ratio 1, backward, clip, AdamW."""
    logits = model(input_ids=ids).logits[:, :-1]
    log_probs = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    loss = -(torch.exp(log_probs - log_probs.detach())).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def decode_step(model: torch.nn.Module, ids: torch.Tensor) -> None:
    """Prefill all but the last token, then one decode step with the cache (no grad)."""
    with torch.no_grad():
        out = model(input_ids=ids[:, :-1], use_cache=True)
        model(input_ids=ids[:, -1:], past_key_values=out.past_key_values, use_cache=True)


def timed(fn, iters: int) -> float:
    """Median seconds of `iters` calls, after two warm-up calls."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def measure(name: str, make_fn, iters: int) -> dict:
    """Eager, first compiled call (compile included), and compiled steady-state seconds."""
    eager = timed(make_fn(compiled=False), iters)
    fn = make_fn(compiled=True)
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    compiled = timed(fn, iters)
    saved = eager - compiled
    return {"case": name, "eager_s": eager, "compiled_s": compiled, "first_compiled_call_s": first,
            "speedup": eager / compiled, "break_even_steps": first / saved if saved > 0 else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=17, help="tokens per sample (prompt + completion)")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", default=str(HERE / "results" / "compile.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    load_before = load_average()
    with tempfile.TemporaryDirectory() as work:
        base = tiny_model(Path(work))
    vocab = base.config.vocab_size
    ids = torch.randint(3, vocab, (args.samples, args.tokens))

    def make_train(compiled: bool):
        model = transformers.AutoModelForCausalLM.from_config(base.config, trust_remote_code=False)
        model.load_state_dict(base.state_dict())
        params = list(model.parameters())
        optimizer = torch.optim.AdamW(params, lr=1e-4, foreach=True)
        run = torch.compile(model, dynamic=False) if compiled else model
        return lambda: train_step(run, params, optimizer, ids)

    def make_decode(compiled: bool):
        model = base.eval()
        run = torch.compile(model, dynamic=False) if compiled else model
        return lambda: decode_step(run, ids)

    rows = [measure("update (fwd+bwd+AdamW)", make_train, args.iters),
            measure("prefill + 1 decode step", make_decode, args.iters)]
    print("| case | eager s | compiled s | speedup | first compiled call s | break-even steps |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        even = "never" if r["break_even_steps"] is None else f"{r['break_even_steps']:.0f}"
        print(f"| {r['case']} | {r['eager_s']:.4f} | {r['compiled_s']:.4f} | {r['speedup']:.2f}x | "
              f"{r['first_compiled_call_s']:.1f} | {even} |")
    record = {"benchmark": "bench_compile", "args": vars(args), "results": rows,
              "load_avg_before": load_before, "load_avg_after": load_average(), "machine": machine()}
    Path(args.out).write_text(json.dumps(stamp(record), indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
