"""One GPU check: the training engine, the native rollout engine and packed attention on CUDA.

Prints a table and writes one JSON (machine, versions, one record per case). Each case
runs in its own try block: a failure is recorded with its error and the rest still run,
and the JSON is rewritten after every case, so a check cut short by its time limit still
reports what it measured.

Cases (models are built from their config with random weights: no weights travel):
- `train/*`: ActorEngine (FSDP2 at world size 1, bf16 compute with fp32 master weights)
  on a SmolLM2-135M-shaped and a ~1.2B Llama-3.2-1B-shaped model: plain, with gradient
  checkpointing, with CPU offload of parameters and optimizer state (timed with the
  onload/offload around the update, as the workers do). Step time, tokens/s, MFU against
  the bf16 matmul peak measured here, peak GPU memory.
- `rollout/*`: our engine vs transformers `generate`, tokens/s at batch 64 and 256
  (every row runs max_new tokens in both: eos ignored).
- `logprob_parity`: rollout_log_probs of our engine vs the training engine's
  compute_log_prob of the same sequences, both bf16 (max and mean abs difference).
- `packed`: the training engine's packed micro-batches vs padded ones (log-prob
  difference, time); on a GPU packing runs transformers' sdpa with its block-causal mask
  (engines/train/packed_attention.py routes only CPU calls per sequence).

On the lent H100 (no Ray, no vLLM there; nothing to download), from the repository root:

    device run, kind nvidia-h100-x1, timeout_s 540, command:
      PYTHONUNBUFFERED=1 PYTHONPATH=. python3 benchmarks/gpu/gpu_check.py --out $OUT/gpu_check.json

Here (a test runs this, so it cannot rot): `.venv/bin/python benchmarks/gpu/gpu_check.py --device cpu --tiny`
(under a minute; the tiny Llama of the test suite, small batches, no offload case).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

import transformers  # noqa: E402

from hybridflow.engines.models import make_tiny_config  # noqa: E402
from hybridflow.engines.rollout import NativeRolloutEngine, RolloutConfig, SamplingParams  # noqa: E402
from hybridflow.engines.train import ActorEngine, MicroBatchConfig, OptimConfig, TrainEngineConfig  # noqa: E402
from hybridflow.engines.train.flops import measure_matmul_flops, training_flops  # noqa: E402
from hybridflow.protocol import DataProto  # noqa: E402

from benchmarks.engines.bench_rollout import make_workload  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "gpu_check.json"

# Shapes of the real models (their config.json), random weights.
SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                         rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                         bos_token_id=1, eos_token_id=2, pad_token_id=2),
    "llama-1.2b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                       num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096,
                       rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                       bos_token_id=1, eos_token_id=2, pad_token_id=2),
}


# ----------------------------------------------------------------------------- set-up

def init_process_group(device: str) -> None:
    """A world-size-1 group (nccl+gloo on CUDA, gloo on CPU) for FSDP2 at world size 1."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device == "cuda":
        torch.cuda.set_device(0)
        dist.init_process_group(backend="cpu:gloo,cuda:nccl")
    else:
        dist.init_process_group(backend="gloo")


def save_random_model(root: Path, name: str, tiny: bool, device: str) -> Path:
    """A random-weight Llama of the named shape (or the test suite's tiny one), saved in bf16."""
    path = root / name
    if (path / "config.json").exists():
        return path
    config = make_tiny_config("llama") if tiny else transformers.LlamaConfig(**SHAPES[name])
    torch.manual_seed(0)
    with torch.device(device):  # initialising 1.2B parameters on the host takes tens of seconds
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)
    del model
    return path


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def memory_reset(device: str) -> None:
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_memory_gib(device: str) -> float | None:
    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else None


def full_batch(n: int, prompt: int, response: int, vocab: int, seed: int, ragged: bool = False) -> dict[str, torch.Tensor]:
    """An RL batch in the ARCHITECTURE.md layout: left-padded prompts, right-padded responses
    (every token valid unless `ragged`, which draws each length in [1/4, 1] of the width)."""
    g = torch.Generator().manual_seed(seed)
    if ragged:
        p_lens = torch.randint(max(1, prompt // 4), prompt + 1, (n,), generator=g)
        r_lens = torch.randint(max(1, response // 4), response + 1, (n,), generator=g)
    else:
        p_lens, r_lens = torch.full((n,), prompt), torch.full((n,), response)
    prompt_mask = (torch.arange(prompt) >= (prompt - p_lens)[:, None]).long()
    response_mask = (torch.arange(response) < r_lens[:, None]).long()
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    input_ids = torch.randint(3, vocab, (n, prompt + response), generator=g) * attention_mask
    return {
        "input_ids": input_ids, "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "responses": input_ids[:, prompt:], "response_mask": response_mask,
        "advantages": torch.randn(n, response, generator=g),
    }


def engine_config(path: Path, *, mini: int, micro: int, **kw) -> TrainEngineConfig:
    mb = MicroBatchConfig(mini_batch_size=mini, micro_batch_size_per_device=micro,
                          forward_micro_batch_size_per_device=micro)
    return TrainEngineConfig(model_path=str(path), dtype="bf16", micro_batch=mb,
                             optim=OptimConfig(lr=1e-6), **kw)


# ----------------------------------------------------------------------------- cases

def train_case(path: Path, variant: str, args, peak: float) -> dict[str, Any]:
    """Steps of update_policy (forward, backward, optimizer) on full-length sequences."""
    n, prompt, response, micro = args.train_batch
    kw = {"gradient_checkpointing": variant == "checkpointing"}
    if variant == "offload":
        kw.update(param_offload=True, optimizer_offload=True)
    memory_reset(args.device)
    engine = ActorEngine(engine_config(path, mini=n, micro=micro, **kw))
    vocab = transformers.AutoConfig.from_pretrained(path).vocab_size
    batch = full_batch(n, prompt, response, vocab, seed=1)
    batch["old_log_probs"] = engine.compute_log_prob(batch)[0].detach()
    times, metrics = [], {}
    for step in range(args.train_steps + 1):  # the first step warms up (allocator, kernels)
        sync(args.device)
        start = time.perf_counter()
        engine.onload()
        metrics = engine.update_policy(batch)
        if variant == "offload":
            engine.offload()
        sync(args.device)
        if step:
            times.append(time.perf_counter() - start)
    step_s = min(times)
    params, layers, hidden = engine.flops_config()
    flops = training_flops(params, layers, hidden, [prompt + response] * n)
    return {
        "step_s": round(step_s, 4), "tokens_per_s": round(n * (prompt + response) / step_s, 1),
        "mfu": round(flops / step_s / peak, 4), "tflop_s": round(flops / step_s / 1e12, 2),
        "matmul_params": params, "batch": [n, prompt, response, micro],
        "loss": round(float(metrics.get("actor/loss", float("nan"))), 5),
        "grad_norm": round(float(metrics.get("actor/grad_norm", float("nan"))), 5),
        "peak_gpu_gib": peak_memory_gib(args.device),
    }


def prompts_of(batch: int, vocab: int, lens: tuple[int, int], seed: int) -> DataProto:
    """Random left-padded prompts with lengths uniform in `lens` (bench_rollout's workload)."""
    return make_workload(batch, vocab, lens, 1, seed=seed)[0]


def native_engine(path: Path, device: str, slots: int) -> NativeRolloutEngine:
    return NativeRolloutEngine.from_pretrained(path, RolloutConfig(dtype=torch.bfloat16, device=device,
                                                                   max_num_seqs=slots))


def rollout_case(path: Path, batch: int, args) -> dict[str, Any]:
    """Tokens/s of our engine and of HF generate on the same prompts, max_new tokens per row."""
    max_new = args.max_new
    memory_reset(args.device)
    ours = native_engine(path, args.device, batch)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16,
                                                           attn_implementation="sdpa").to(args.device).eval()
    prompts = prompts_of(batch, hf.config.vocab_size, args.prompt_lens, seed=batch)
    params = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=max_new, ignore_eos=True, seed=0)
    gen = transformers.GenerationConfig(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_new,
                                        min_new_tokens=max_new, eos_token_id=None, pad_token_id=0)

    def run_ours() -> None:
        out = ours.generate(prompts, params)
        assert int(out.batch["response_mask"].sum()) == batch * max_new

    def run_hf() -> None:
        ids = prompts.batch["input_ids"].to(args.device)
        with torch.inference_mode():
            out = hf.generate(input_ids=ids, attention_mask=prompts.batch["attention_mask"].to(args.device),
                              generation_config=gen)
        assert out.shape[1] == ids.shape[1] + max_new

    timings = {}
    for name, fn in (("ours", run_ours), ("hf", run_hf)):
        fn()  # warm-up (kernel selection, allocator)
        timings[name] = best_time(fn, args.device, repeats=2)
    tokens = batch * max_new
    return {
        "batch": batch, "max_new": max_new, "ours_s": round(timings["ours"], 3), "hf_s": round(timings["hf"], 3),
        "ours_tok_s": round(tokens / timings["ours"], 1), "hf_tok_s": round(tokens / timings["hf"], 1),
        "speedup_vs_hf": round(timings["hf"] / timings["ours"], 2), "peak_gpu_gib": peak_memory_gib(args.device),
    }


def best_time(fn: Callable[[], None], device: str, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def logprob_parity_case(path: Path, args) -> dict[str, Any]:
    """The rollout engine's sampled log-probs vs the training engine's recomputation (bf16)."""
    rollout = native_engine(path, args.device, 16)
    vocab = transformers.AutoConfig.from_pretrained(path).vocab_size
    out = rollout.generate(prompts_of(16, vocab, args.prompt_lens, seed=7),
                           SamplingParams(temperature=1.0, max_new_tokens=args.max_new, ignore_eos=True, seed=3))
    del rollout
    batch = {k: out.batch[k] for k in ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")}
    train = ActorEngine(engine_config(path, mini=16, micro=8), trainable=False)
    recomputed, _ = train.compute_log_prob(batch)
    mask = batch["response_mask"].bool()
    diff = (recomputed.float().cpu() - out.batch["rollout_log_probs"].float())[mask].abs()
    return {"tokens": int(mask.sum()), "max_abs_diff": round(float(diff.max()), 5),
            "mean_abs_diff": round(float(diff.mean()), 6),
            "mean_log_prob": round(float(out.batch["rollout_log_probs"][mask].mean()), 4)}


def packed_case(path: Path, args) -> dict[str, Any]:
    """Packed vs padded forward of the training engine on ragged sequences: equal log-probs?"""
    n, prompt, response, micro = args.train_batch
    vocab = transformers.AutoConfig.from_pretrained(path).vocab_size
    batch = full_batch(n, prompt, response, vocab, seed=5, ragged=True)
    result: dict[str, Any] = {"varlen_in_torch": hasattr(torch.nn.attention, "varlen")}
    log_probs = {}
    for packed in (False, True):
        engine = ActorEngine(engine_config(path, mini=n, micro=micro, pack_sequences=packed), trainable=False)
        engine.compute_log_prob(batch)  # warm-up
        holder: dict[str, torch.Tensor] = {}

        def run(engine: ActorEngine = engine, holder: dict = holder) -> None:
            holder["lp"] = engine.compute_log_prob(batch)[0]

        result["packed_s" if packed else "padded_s"] = round(best_time(run, args.device, repeats=2), 4)
        log_probs[packed] = holder["lp"].float().cpu()
        del engine
    mask = batch["response_mask"].bool()
    result["max_abs_diff"] = round(float((log_probs[True] - log_probs[False])[mask].abs().max()), 5)
    return result


# ----------------------------------------------------------------------------- driver

def machine(device: str) -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(), "python": platform.python_version(), "cores": os.cpu_count(),
        "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    capability=f"{props.major}.{props.minor}")
    for module in ("peft", "safetensors", "ray", "vllm", "sglang"):
        try:
            info[module] = __import__(module).__version__
        except Exception:  # noqa: BLE001 - absent or broken: recorded as missing
            info[module] = None
    return info


def run_case(record: dict, name: str, fn: Callable[[], dict[str, Any]], deadline: float) -> None:
    """Run one case into record["cases"][name]; errors and skips are recorded, never raised."""
    if time.monotonic() > deadline:
        record["cases"][name] = {"ok": False, "skipped": "time budget spent"}
        return
    start = time.monotonic()
    try:
        result = {"ok": True, **fn()}
    except Exception as exc:  # noqa: BLE001 - one failing case must not hide the others
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:600],
                  "traceback": traceback.format_exc()[-2500:]}
    result["seconds"] = round(time.monotonic() - start, 1)
    record["cases"][name] = result
    print(f"  {name:<34} {summary(result)}", flush=True)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def summary(result: dict[str, Any]) -> str:
    if not result["ok"]:
        return "SKIPPED (" + result["skipped"] + ")" if "skipped" in result else "FAILED " + result["error"][:160]
    keys = ("step_s", "tokens_per_s", "mfu", "peak_gpu_gib", "ours_tok_s", "hf_tok_s", "speedup_vs_hf",
            "max_abs_diff", "mean_abs_diff", "packed_s", "padded_s", "tflop_s")
    return "  ".join(f"{k}={result[k]}" for k in keys if result.get(k) is not None) + f"  ({result['seconds']} s)"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--tiny", action="store_true", help="the tiny test model and small batches (CPU smoke run)")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--budget-s", type=float, default=420.0, help="cases not started by then are skipped")
    p.add_argument("--models", nargs="+", default=["smollm2-135m", "llama-1.2b"])
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is visible; use --device cpu --tiny here")
    # train batch: (sequences, prompt tokens, response tokens, micro-batch)
    args.train_batch = (4, 8, 8, 2) if args.tiny else (16, 256, 256, 8)
    args.train_steps = 1 if args.tiny else 3
    args.rollout_batches = (4, 8) if args.tiny else (64, 256)
    args.max_new = 8 if args.tiny else 128
    args.prompt_lens = (2, 6) if args.tiny else (32, 128)
    if args.tiny:
        args.models = ["tiny"]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    deadline = time.monotonic() + args.budget_s
    torch.manual_seed(0)
    init_process_group(args.device)
    settings = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(args).items() if k != "out"}
    record: dict[str, Any] = {"machine": machine(args.device), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                              "args": settings, "cases": {}}
    peak_size = 1024 if args.tiny else 8192
    peak = measure_matmul_flops(torch.bfloat16, size=peak_size, seconds=0.2 if args.tiny else 1.0)
    record["bf16_matmul_peak_tflop_s"] = round(peak / 1e12, 2)
    print(f"gpu_check on {record['machine'].get('gpu', 'cpu')}: torch {torch.__version__}, "
          f"bf16 matmul {peak / 1e12:.1f} TFLOP/s (measured, {peak_size}^2)", flush=True)
    variants = ["plain", "checkpointing"] + (["offload"] if args.device == "cuda" else [])

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(stamp(record), indent=1))

    with tempfile.TemporaryDirectory() as tmp:
        paths = {name: save_random_model(Path(tmp), name, args.tiny, args.device) for name in args.models}
        first = paths[args.models[0]]
        for name, path in paths.items():
            for variant in variants:
                run_case(record, f"train/{name}/{variant}", lambda: train_case(path, variant, args, peak), deadline)
                save()
        for batch in args.rollout_batches:
            run_case(record, f"rollout/{args.models[0]}/batch{batch}", lambda: rollout_case(first, batch, args),
                     deadline)
            save()
        run_case(record, f"logprob_parity/{args.models[0]}", lambda: logprob_parity_case(first, args), deadline)
        run_case(record, f"packed/{args.models[0]}", lambda: packed_case(first, args), deadline)
    record["all_ok"] = all(case["ok"] for case in record["cases"].values())
    save()
    print(f"{'all cases ran' if record['all_ok'] else 'SOME CASES FAILED'}; wrote {args.out}")
    return 0 if record["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
