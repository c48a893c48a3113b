"""Generation throughput: our rollout engine vs transformers `model.generate`, side by side.

Run from the repository root:

    .venv/bin/python benchmarks/bench_rollout.py                       # full table, bf16 and fp32
    .venv/bin/python benchmarks/bench_rollout.py --models tiny --batches 16
    .venv/bin/python benchmarks/bench_rollout.py --dtypes bf16          # only the bf16 rows

Workload (identical for both engines, per model x batch x dtype): random left-padded
prompts of mixed lengths (uniform in --prompt-lens), sampling at temperature 1, top-p 1,
no top-k, eos ignored; each request gets its own response budget drawn uniformly from
[R/8, R] (R = --max-new for the model). Both models are random-weight Llamas saved locally:
`tiny` (the test config: hidden 64, 2 layers, vocab 256) and `100m` (hidden 768, 12
layers, 12 heads / 4 kv heads, intermediate 2048, vocab 32000, tied embeddings: ~100M).

Method: transformers cannot stop one row of a batch at its own budget, so `generate` runs
the whole batch to R new tokens and we count only the useful tokens (the sum of the
per-request budgets) for both engines; `hf raw tok/s` also shows HF's rate over all the
tokens it computed. `work ratio` = token positions HF pushes through the model (padded
prompts + batch x R) over ours (prompt tokens + decode rows): when both are GEMM-bound,
the speedup cannot exceed it by much. Our engine gets the per-request budgets and stops each row there
(continuous batching: finished rows leave the batch). Each engine is warmed up on a small
batch first; then runs alternate (ours, hf) --repeats times and the best time of each is
kept, so machine load hits both alike. Both use --threads torch threads (default 1).
Writes benchmarks/results/rollout.json with the machine description.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import transformers

from hybridflow.engines.models import save_tiny_model
from hybridflow.engines.rollout import NativeRolloutEngine, RolloutConfig, SamplingParams
from hybridflow.protocol import DataProto

RESULTS = Path(__file__).resolve().parent / "results" / "rollout.json"
MODELS: dict[str, dict[str, Any]] = {
    "tiny": {"sizes": {}, "max_new": 128},
    "100m": {
        "sizes": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                      num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=2048,
                      tie_word_embeddings=True),
        "max_new": 64,
    },
}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def make_workload(batch: int, vocab: int, prompt_lens: tuple[int, int], max_new: int, seed: int = 0):
    """Left-padded prompts and per-request response budgets, reproducible from `seed`."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(prompt_lens[0], prompt_lens[1] + 1, (batch,), generator=gen).tolist()
    width = max(lengths)
    ids = torch.zeros(batch, width, dtype=torch.long)
    mask = torch.zeros(batch, width, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, width - n :] = torch.randint(3, vocab, (n,), generator=gen)
        mask[i, width - n :] = 1
    budgets = torch.randint(max(1, max_new // 8), max_new + 1, (batch,), generator=gen).tolist()
    return DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask}), budgets


def run_ours(engine: NativeRolloutEngine, prompts: DataProto, budgets: list[int]) -> float:
    params = [SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=b, ignore_eos=True, seed=i)
              for i, b in enumerate(budgets)]
    start = time.perf_counter()
    out = engine.generate(prompts, params)
    elapsed = time.perf_counter() - start
    assert int(out.batch["response_mask"].sum()) == sum(budgets)
    return elapsed


def run_hf(model, prompts: DataProto, max_new: int) -> float:
    config = transformers.GenerationConfig(
        do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_new,
        eos_token_id=None, pad_token_id=0,
    )
    ids = prompts.batch["input_ids"]
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=prompts.batch["attention_mask"], generation_config=config)
    elapsed = time.perf_counter() - start
    assert out.shape[1] == ids.shape[1] + max_new, "HF stopped early; the comparison assumes it runs to max_new"
    return elapsed


def bench_case(path: Path, name: str, batch: int, dtype_name: str, args) -> dict[str, Any]:
    dtype = DTYPES[dtype_name]
    max_new = args.max_new or MODELS[name]["max_new"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    engine = NativeRolloutEngine.from_pretrained(path, RolloutConfig(dtype=dtype, max_num_seqs=batch))
    prompts, budgets = make_workload(batch, hf.config.vocab_size, args.prompt_lens, max_new)
    warm_prompts, warm_budgets = make_workload(2, hf.config.vocab_size, args.prompt_lens, 4, seed=1)
    run_ours(engine, warm_prompts, warm_budgets)
    run_hf(hf, warm_prompts, 4)
    ours, theirs = [], []
    for _ in range(args.repeats):
        ours.append(run_ours(engine, prompts, budgets))
        theirs.append(run_hf(hf, prompts, max_new))
    useful = sum(budgets)
    t_ours, t_hf = min(ours), min(theirs)
    stats = engine.last_stats
    # token positions pushed through the model: HF pads prompts and runs every row to R
    hf_work = prompts.batch["input_ids"].numel() + batch * max_new
    ours_work = stats.prefill_tokens_computed + stats.decode_row_steps
    return {
        "model": name, "batch": batch, "dtype": dtype_name, "max_new": max_new,
        "useful_tokens": useful, "hf_computed_tokens": batch * max_new,
        "prompt_tokens": int(prompts.batch["attention_mask"].sum()),
        "ours_s": round(t_ours, 3), "hf_s": round(t_hf, 3),
        "ours_tok_s": round(useful / t_ours, 1), "hf_tok_s": round(useful / t_hf, 1),
        "hf_raw_tok_s": round(batch * max_new / t_hf, 1),
        "speedup": round(t_hf / t_ours, 2),
        "ours_runs_s": [round(t, 3) for t in ours], "hf_runs_s": [round(t, 3) for t in theirs],
        "work_ratio_hf_over_ours": round(hf_work / ours_work, 2),
    }


def method_text() -> str:
    """The Workload and Method paragraphs of this docstring, for the JSON record."""
    paragraphs = [p for p in __doc__.split("\n\n") if p.startswith(("Workload", "Method"))]
    return " ".join(p.replace("\n", " ") for p in paragraphs)


def machine() -> dict[str, Any]:
    cpu, flags = platform.processor(), []
    try:
        with open("/proc/cpuinfo") as info:
            lines = info.read().splitlines()
        cpu = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
        flags = next(line.split(":", 1)[1].split() for line in lines if line.startswith("flags"))
    except (OSError, StopIteration):
        pass
    return {
        "platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count(),
        "avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags,
        "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "load_avg_1_5_15": [round(x, 2) for x in os.getloadavg()],
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    head = f"{'model':>6} {'batch':>5} {'dtype':>5} {'tokens':>7} {'ours s':>8} {'ours tok/s':>10} " \
           f"{'hf s':>8} {'hf tok/s':>9} {'hf raw tok/s':>12} {'speedup':>7} {'work ratio':>10}"
    print(head)
    for r in rows:
        print(f"{r['model']:>6} {r['batch']:>5} {r['dtype']:>5} {r['useful_tokens']:>7} {r['ours_s']:>8} "
              f"{r['ours_tok_s']:>10} {r['hf_s']:>8} {r['hf_tok_s']:>9} {r['hf_raw_tok_s']:>12} {r['speedup']:>6}x "
              f"{r['work_ratio_hf_over_ours']:>9}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny,100m")
    parser.add_argument("--batches", default="16,64")
    parser.add_argument("--dtypes", default="bf16,fp32")
    parser.add_argument("--prompt-lens", default="16,64", help="min,max prompt length")
    parser.add_argument("--max-new", type=int, default=0, help="R; 0: per-model default (tiny 128, 100m 64)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for both engines (default 1: on a shared, loaded 2-core machine "
                             "a second OpenMP thread mostly waits to be scheduled)")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.prompt_lens = tuple(int(x) for x in args.prompt_lens.split(","))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            path = save_tiny_model(Path(tmp) / name, "llama", seed=0, **MODELS[name]["sizes"])
            for dtype_name in args.dtypes.split(","):
                for batch in (int(b) for b in args.batches.split(",")):
                    rows.append(bench_case(path, name, batch, dtype_name, args))
                    print_table(rows[-1:])
    print()
    print_table(rows)
    result = {
        "benchmark": "rollout generation throughput vs transformers generate",
        "method": method_text(),
        "target": "ours >= 2x hf tok/s at batch >= 32 (bf16)",
        "prompt_lens": list(args.prompt_lens), "repeats": args.repeats,
        "machine": machine(), "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
