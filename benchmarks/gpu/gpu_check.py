"""One GPU check (issue 40): ceilings, decode, training MFU and a GRPO step vs TRL, in one run.

Prints a table and writes one JSON: the device description, one record per case and the
goals of issue 40's item 4 evaluated (`goals`: met / not met / not measured). Each case
runs in its own try block (a failure is recorded, the rest run); the JSON is rewritten
after every case, and a case that would end past --budget-s is skipped, so a run cut
short still reports what it measured. Models are built from their config, random weights.

Cases (the headline goals first; the order is in `main`):
- `ceilings`: copy bandwidth (bytes read + written / s of a 512 MiB bf16 device copy) and
  the bf16 matmul rate (8192^3, random data).
- `rollout/{shape}/batch{256,64}`: tokens/s (batch x 128 new tokens / generate's wall
  time, prefill included, eos ignored) of our engine with its device loop and CUDA graphs
  (`ours`), with the per-token host loop (`ours_host_loop`), and of transformers generate
  with its dynamic cache; `roofline_tok_s`: what the measured bandwidth allows if a step
  read only the bf16 weights and the KV cache (`decode_roofline_tok_s`).
- `train/{shape}/{plain,fast}`: ActorEngine.update_policy (FSDP2, bf16 compute, fp32 master
  weights), 16 x 512 tokens: step time, MFU against the measured matmul rate; "fast" adds
  fused_head and compile_kernels.
- `grpo/{ours,trl}`: one GRPO step of a Qwen2.5-0.5B-shaped model, 32 prompts x 8 samples,
  128 new tokens, phase by phase (gpu_grpo.py); TRL's GRPOTrainer if it imports, else
  transformers generate + one training step as its stand-in (the reason recorded).
- `logprob_parity`, `packed`: rollout vs training log-probs (bf16), packed vs padded.
- `rollout_hf_static/*`: transformers generate with its static cache, compiled (its best
  setting on a GPU; a minute of compiling per shape and batch: batch 256 right after our
  decode cases, batch 64 last, skipped if no time is left).
Shapes: smollm2-135m (SmolLM2-135M's config) and llama-1.2b (Llama-3.2-1B's).

THE DEVICE COMMAND (H200/H100; nothing installed there but TRL, carried as wheels). Once,
here, in the repository root (1.8 MiB of wheels: trl 1.16.0 with datasets, dill and
multiprocess, the only ones of its dependencies the machine's image lacks):

    echo /.whl/ >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19

then one `run` call, carry [".whl"], timeout_s 450 (the script starts no case that would end
after --budget-s 360 s; with the machine's start, about 8 of a session's 15 device minutes):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
    && export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
    && python3 benchmarks/gpu/gpu_check.py --out $OUT/gpu_check.json

(datasets 5.2 asks for pyarrow >= 24; if the image's is older and the import fails, the
TRL case records the error and times the stand-in.) Then copy $OUT/gpu_check.json to
benchmarks/results/gpu_check_h200.json and commit it.

Here (a test runs this, so it cannot rot): `.venv/bin/python benchmarks/gpu/gpu_check.py --device cpu --tiny`
(the tiny models of the test suite, small batches; no CUDA graphs, no compiling: HF's
static cache runs uncompiled and compile_kernels stays off).
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402
from benchmarks.engines.bench_rollout import make_workload  # noqa: E402
from benchmarks.gpu import gpu_grpo  # noqa: E402

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
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, trust_remote_code=False)
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
    """Steps of update_policy (forward, backward, optimizer) on full-length sequences.

    "plain": the engine's defaults; "fast": fused_head, and compile_kernels on a GPU (on a
    CPU compiling takes minutes, so the rehearsal leaves it off)."""
    n, prompt, response, micro = args.train_batch
    kw = {"fused_head": True, "compile_kernels": args.device == "cuda"} if variant == "fast" else {}
    memory_reset(args.device)
    engine = ActorEngine(engine_config(path, mini=n, micro=micro, **kw))
    vocab = transformers.AutoConfig.from_pretrained(path, trust_remote_code=False).vocab_size
    batch = full_batch(n, prompt, response, vocab, seed=1)
    batch["old_log_probs"] = engine.compute_log_prob(batch)[0].detach()
    times, metrics = [], {}
    for step in range(args.train_steps + 1):  # the first step warms up (allocator, kernels, compiling)
        sync(args.device)
        start = time.perf_counter()
        metrics = engine.update_policy(batch)
        sync(args.device)
        if step:
            times.append(time.perf_counter() - start)
    step_s = min(times)
    params, layers, hidden = engine.flops_config()
    flops = training_flops(params, layers, hidden, [prompt + response] * n)
    return {
        "step_s": round(step_s, 4), "tokens_per_s": round(n * (prompt + response) / step_s, 1),
        "mfu": figure(flops / step_s / peak), "tflop_s": figure(flops / step_s / 1e12),
        "matmul_params": params, "batch": [n, prompt, response, micro], "settings": kw,
        "loss": round(float(metrics.get("actor/loss", float("nan"))), 5),
        "grad_norm": round(float(metrics.get("actor/grad_norm", float("nan"))), 5),
        "peak_gpu_gib": peak_memory_gib(args.device),
    }


def prompts_of(batch: int, vocab: int, lens: tuple[int, int], seed: int) -> DataProto:
    """Random left-padded prompts with lengths uniform in `lens` (bench_rollout's workload)."""
    return make_workload(batch, vocab, lens, 1, seed=seed)[0]


def native_engine(path: Path, device: str, slots: int, **kw) -> NativeRolloutEngine:
    return NativeRolloutEngine.from_pretrained(path, RolloutConfig(dtype=torch.bfloat16, device=device,
                                                                   max_num_seqs=slots, **kw))


def hf_generate(path: Path, args, batch: int, static: bool) -> Callable[[DataProto], None]:
    """transformers generate on `path`: dynamic cache, or static cache compiled (its best setting
    on a GPU; on a CPU the rehearsal does not compile)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, trust_remote_code=False,
                                                              attn_implementation="sdpa").to(args.device).eval()
    extra = dict(cache_implementation="static", disable_compile=args.device != "cuda") if static else {}
    gen = transformers.GenerationConfig(do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                                        max_new_tokens=args.max_new, min_new_tokens=args.max_new, eos_token_id=None,
                                        pad_token_id=0, **extra)

    def run(prompts: DataProto) -> None:
        ids = prompts.batch["input_ids"].to(args.device)
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=prompts.batch["attention_mask"].to(args.device),
                                 generation_config=gen)
        assert out.shape[1] == ids.shape[1] + args.max_new

    return run


def decode_roofline_tok_s(path: Path, batch: int, args, bandwidth: float) -> float:
    """Tokens/s if a decode step only read, at the measured copy bandwidth, the bytes it must:
    the bf16 weights it multiplies by (layers and lm_head, not the embedding table) and each
    row's KV cache at the run's mean length (prompt mean + max_new / 2)."""
    config = transformers.AutoConfig.from_pretrained(path, trust_remote_code=False)
    h, inter, layers, vocab = config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.vocab_size
    head_dim = h // config.num_attention_heads
    kv = config.num_key_value_heads * head_dim
    layer_params = h * (h + 2 * kv) + h * h + 3 * h * inter
    weight_bytes = 2 * (layers * layer_params + vocab * h)
    mean_len = sum(args.prompt_lens) / 2 + args.max_new / 2
    kv_bytes = batch * layers * 2 * kv * mean_len * 2
    return batch * bandwidth / (weight_bytes + kv_bytes)


def rollout_case(path: Path, batch: int, args, ceilings: dict[str, float], hf_static: bool) -> dict[str, Any]:
    """Tokens/s on the same prompts, max_new tokens per row: our engine with its device loop
    (CUDA graphs on a GPU) and with the per-token host loop, and HF generate (dynamic cache,
    or with `hf_static` its static cache compiled)."""
    memory_reset(args.device)
    vocab = transformers.AutoConfig.from_pretrained(path, trust_remote_code=False).vocab_size
    prompts = prompts_of(batch, vocab, args.prompt_lens, seed=batch)
    params = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=args.max_new, ignore_eos=True, seed=0)
    graphs = args.device == "cuda"
    runners: dict[str, Callable[[], None]] = {}
    if hf_static:
        static = hf_generate(path, args, batch, static=True)
        runners["hf_static"] = lambda: static(prompts)
    else:
        engines = {"ours": native_engine(path, args.device, batch, decode_loop="device", cuda_graphs=graphs),
                   "ours_host_loop": native_engine(path, args.device, batch, decode_loop="host")}
        for name, engine in engines.items():
            runners[name] = lambda engine=engine: check_tokens(engine.generate(prompts, params), batch * args.max_new)
        dynamic = hf_generate(path, args, batch, static=False)
        runners["hf_dynamic"] = lambda: dynamic(prompts)
    result: dict[str, Any] = {"batch": batch, "max_new": args.max_new}
    tokens = batch * args.max_new
    for name, fn in runners.items():
        start = time.perf_counter()
        fn()  # warm-up (kernel choice, graph capture, compiling)
        result[f"{name}_first_call_s"] = round(time.perf_counter() - start, 2)
        seconds = best_time(fn, args.device, repeats=1 if args.tiny else 2)
        result[f"{name}_tok_s"] = round(tokens / seconds, 1)
    if not hf_static:
        result["ours_cuda_graphs"] = graphs
        result["roofline_tok_s"] = round(decode_roofline_tok_s(path, batch, args, ceilings["copy_bytes_per_s"]), 1)
        result["fraction_of_roofline"] = figure(result["ours_tok_s"] / result["roofline_tok_s"])
    result["peak_gpu_gib"] = peak_memory_gib(args.device)
    return result


def check_tokens(out: DataProto, expected: int) -> None:
    assert int(out.batch["response_mask"].sum()) == expected, "every row must run max_new tokens (eos ignored)"


def figure(value: float, digits: int = 3) -> float:
    """`value` to `digits` significant digits: a CPU's 0.03 TFLOP/s is not rounded to 0."""
    return float(f"{value:.{digits}g}")


def best_time(fn: Callable[[], None], device: str, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def ceilings_case(args) -> dict[str, Any]:
    """The device's measured ceilings: copy bandwidth (bytes read + written / s of a large
    device-to-device copy) and the bf16 matmul rate on random data."""
    numel = (1 << 28) if args.device == "cuda" else (1 << 22)  # 512 MiB (8 MiB here) of bf16 per buffer
    src = torch.randn(numel, device=args.device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    dst.copy_(src)
    gpu = args.device == "cuda"
    seconds = best_time(lambda: dst.copy_(src), args.device, repeats=20 if gpu else 3)
    size = 8192 if gpu else 256
    peak = measure_matmul_flops(torch.bfloat16, size=size, seconds=1.0 if gpu else 0.05)
    return {"copy_bytes_per_s": 2 * src.numel() * 2 / seconds, "copy_tb_s": figure(4 * src.numel() / seconds / 1e12),
            "bf16_matmul_flops": peak, "bf16_matmul_tflop_s": figure(peak / 1e12), "matmul_size": size,
            "copy_bytes": 4 * src.numel()}


def logprob_parity_case(path: Path, args) -> dict[str, Any]:
    """The rollout engine's sampled log-probs vs the training engine's recomputation (bf16)."""
    rollout = native_engine(path, args.device, 16)
    vocab = transformers.AutoConfig.from_pretrained(path, trust_remote_code=False).vocab_size
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
    vocab = transformers.AutoConfig.from_pretrained(path, trust_remote_code=False).vocab_size
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
    for module in ("peft", "safetensors", "ray", "vllm", "sglang", "trl", "datasets", "pyarrow"):
        try:
            info[module] = __import__(module).__version__
        except Exception:  # noqa: BLE001 - absent or broken: recorded as missing
            info[module] = None
    return info


def run_case(record: dict, name: str, fn: Callable[[], dict[str, Any]], deadline: float, cost_s: float = 0.0) -> None:
    """Run one case into record["cases"][name]; errors and skips are recorded, never raised.
    A case is skipped when fewer than its estimated `cost_s` seconds are left."""
    if time.monotonic() + cost_s > deadline:
        record["cases"][name] = {"ok": False, "skipped": "time budget spent"}
        print(f"  {name:<34} SKIPPED (time budget spent)", flush=True)
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
    keys = ("step_s", "tokens_per_s", "mfu", "peak_gpu_gib", "ours_tok_s", "ours_host_loop_tok_s", "hf_dynamic_tok_s",
            "hf_static_tok_s", "fraction_of_roofline", "max_abs_diff", "mean_abs_diff", "packed_s", "padded_s",
            "tflop_s", "copy_tb_s", "bf16_matmul_tflop_s", "step_total_s", "stand_in")
    return "  ".join(f"{k}={result[k]}" for k in keys if result.get(k) is not None) + f"  ({result['seconds']} s)"


def grpo_case(path: Path, args, work: Path, side: str) -> dict[str, Any]:
    """One GRPO step of the 0.5B shape: ours (its phases), or TRL's (its stand-in if TRL cannot load)."""
    memory_reset(args.device)
    if side == "ours":
        out = gpu_grpo.ours_step(path, args, lambda: sync(args.device))
        return {**out, "step_total_s": out["phases_s"]["step"], "peak_gpu_gib": peak_memory_gib(args.device)}
    try:
        import trl  # noqa: F401 - carried as a wheel on the GPU machine (see the module docstring)
    except Exception as exc:  # noqa: BLE001 - absent or its dependencies broken: the stand-in runs
        out = gpu_grpo.hf_stand_in_step(path, args, lambda: sync(args.device))
        return {**out, "step_total_s": out["phases_s"]["step"], "stand_in": True,
                "why_stand_in": f"TRL not importable: {type(exc).__name__}: {exc}"[:300]}
    out = gpu_grpo.trl_step(path, args, work)
    return {**out, "step_total_s": out["step_s"], "stand_in": False, "peak_gpu_gib": peak_memory_gib(args.device)}


# ----------------------------------------------------------------------------- goals (issue 40, item 4)

def _ok(case: dict | None, *keys: str) -> bool:
    return case is not None and case.get("ok", False) and all(case.get(k) is not None for k in keys)


def _goal(value: float | None, target: float, above: bool = True, note: str = "") -> dict[str, Any]:
    if value is None:
        return {"status": "not measured", "target": target, **({"note": note} if note else {})}
    met = value >= target if above else value <= target
    return {"status": "met" if met else "not met", "value": round(value, 4), "target": target,
            **({"note": note} if note else {})}


def evaluate_goals(cases: dict[str, dict], models: list[str], batches: tuple[int, ...]) -> dict[str, Any]:
    """Each goal of item 4: met / not met / not measured, with the measured value."""
    small, large = models[0], models[-1]
    big_batch = max(batches)
    ours_small = cases.get(f"rollout/{small}/batch{big_batch}")
    goals = {"smollm2_decode_tok_s_at_batch_256": _goal(
        ours_small["ours_tok_s"] if _ok(ours_small, "ours_tok_s") else None, 120000.0)}
    roofline = [c["fraction_of_roofline"] for b in batches
                if _ok(c := cases.get(f"rollout/{large}/batch{b}"), "fraction_of_roofline")]
    goals["llama_1b_decode_fraction_of_hbm_roofline"] = _goal(min(roofline) if roofline else None, 0.5,
                                                               note="the lower of batch 64 and 256")
    ratios = []
    for model in models:
        for b in batches:
            ours = cases.get(f"rollout/{model}/batch{b}")
            static = cases.get(f"rollout_hf_static/{model}/batch{b}")
            if not _ok(ours, "ours_tok_s", "hf_dynamic_tok_s"):
                continue
            best_hf = max([ours["hf_dynamic_tok_s"]] + ([static["hf_static_tok_s"]] if _ok(static, "hf_static_tok_s")
                                                        else []))
            ratios.append(ours["ours_tok_s"] / best_hf)
    goals["decode_over_best_hf_generate"] = _goal(min(ratios) if ratios else None, 2.0, note=(
        "lowest over the measured shapes and batches; best HF = the faster of dynamic cache and static cache "
        "compiled where the latter ran"))
    for model, name, target in ((large, "train_mfu_llama_1b", 0.45), (small, "train_mfu_smollm2", 0.15)):
        mfus = [c["mfu"] for v in ("plain", "fast") if _ok(c := cases.get(f"train/{model}/{v}"), "mfu")]
        goals[name] = _goal(max(mfus) if mfus else None, target, note="the better of plain and fast")
    ours, trl = cases.get("grpo/ours"), cases.get("grpo/trl")
    ratio = ours["step_total_s"] / trl["step_total_s"] if _ok(ours, "step_total_s") and _ok(trl, "step_total_s") \
        else None
    stand_in = bool(trl and trl.get("stand_in"))
    goals["grpo_step_over_trl"] = _goal(None if stand_in else ratio, 0.3, above=False, note=(
        f"TRL not run ({trl.get('why_stand_in')}); ours over the HF stand-in: {ratio and round(ratio, 3)}"
        if stand_in else ""))
    return goals


# ----------------------------------------------------------------------------- driver

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--tiny", action="store_true", help="the tiny test model and small batches (CPU smoke run)")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--budget-s", type=float, default=360.0, help="cases that would end after this are skipped")
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
    # GRPO step: prompts x samples, new tokens, micro-batch of the update
    args.grpo_prompts, args.grpo_n, args.grpo_max_new, args.grpo_micro = (2, 2, 8, 2) if args.tiny else (32, 8, 128, 32)
    if args.tiny:
        args.models = ["tiny"]
    return args


# Seconds each case may take on the H200 (start it only if that much is left); 0 on a CPU.
COSTS = {"rollout": 25.0, "train": 20.0, "grpo": 40.0, "hf_static": 60.0, "parity": 10.0}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    deadline = time.monotonic() + args.budget_s
    torch.manual_seed(0)
    init_process_group(args.device)
    settings = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(args).items() if k != "out"}
    record: dict[str, Any] = {"machine": machine(args.device),
                              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                              "args": settings, "cases": {}}
    cost = {k: (v if args.device == "cuda" else 0.0) for k, v in COSTS.items()}

    def save() -> None:
        record["goals"] = evaluate_goals(record["cases"], args.models, args.rollout_batches)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(stamp(record), indent=1))

    run_case(record, "ceilings", lambda: ceilings_case(args), deadline)
    ceilings = record["cases"]["ceilings"]
    if not ceilings["ok"]:
        save()
        return 1
    peak = ceilings["bf16_matmul_flops"]
    record["bf16_matmul_peak_tflop_s"], record["copy_tb_s"] = ceilings["bf16_matmul_tflop_s"], ceilings["copy_tb_s"]
    print(f"gpu_check on {record['machine'].get('gpu', 'cpu')}: torch {torch.__version__}, bf16 matmul "
          f"{peak / 1e12:.3g} TFLOP/s, copy {ceilings['copy_tb_s']} TB/s (measured)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        paths = {name: save_random_model(work, name, args.tiny, args.device) for name in args.models}
        grpo_path = gpu_grpo.save_grpo_model(work / "grpo_qwen05", args.tiny, args.device)
        schedule: list[tuple[str, Callable[[], dict[str, Any]], float]] = []

        def hf_static(batches: list[int]) -> None:  # compiling HF's static cache costs a minute a case
            for batch in batches:
                for name, path in paths.items():
                    schedule.append((f"rollout_hf_static/{name}/batch{batch}",
                                     lambda p=path, b=batch: rollout_case(p, b, args, ceilings, True),
                                     cost["hf_static"]))

        batches = sorted(args.rollout_batches, reverse=True)  # batch 256 first: the headline goals
        for batch in batches:
            for name, path in paths.items():
                schedule.append((f"rollout/{name}/batch{batch}",
                                 lambda p=path, b=batch: rollout_case(p, b, args, ceilings, False), cost["rollout"]))
        hf_static(batches[:1])
        for name, path in paths.items():
            for variant in ("plain", "fast"):
                schedule.append((f"train/{name}/{variant}", lambda p=path, v=variant: train_case(p, v, args, peak),
                                 cost["train"]))
        for side in ("ours", "trl"):
            schedule.append((f"grpo/{side}", lambda s=side: grpo_case(grpo_path, args, work, s), cost["grpo"]))
        first = paths[args.models[0]]
        schedule.append((f"logprob_parity/{args.models[0]}", lambda: logprob_parity_case(first, args), cost["parity"]))
        schedule.append((f"packed/{args.models[0]}", lambda: packed_case(first, args), cost["parity"]))
        hf_static(batches[1:])
        for name, fn, estimate in schedule:
            run_case(record, name, fn, deadline, estimate)
            save()
    record["all_ok"] = all(case["ok"] or "skipped" in case for case in record["cases"].values())
    save()
    print("goals: " + "; ".join(f"{k} {v['status']}" + (f" ({v['value']})" if "value" in v else "")
                                for k, v in record["goals"].items()))
    print(f"{'all cases ran or were skipped for time' if record['all_ok'] else 'SOME CASES FAILED'}; wrote {args.out}")
    return 0 if record["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
