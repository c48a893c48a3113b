"""Tensor-parallel generation (t_g = 2, two gloo processes) equals single-process generation.

Each rank builds the engine on the world group twice: once cutting its shard from full
tensors, once from shards cut by the caller (`sharded=True`, what resharding will do).
Greedy and seeded-sampling outputs must equal the single-process engine's: tokens exactly,
log-probs within 1e-5 (fp32; only the summation order of the all-reduce differs). The
first model also runs the device decode loop (device_loop.py), tokens agreed inside each step.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from rollout_helpers import left_padded, save_model

from hybridflow.engines.models import load_hf_config
from hybridflow.engines.rollout import NativeRolloutEngine, RolloutConfig, SamplingParams, shard_for_rank
from hybridflow.engines.rollout.weights import iter_safetensors

FP32 = RolloutConfig(dtype=torch.float32, max_num_seqs=3)
DEVICE_LOOP = RolloutConfig(dtype=torch.float32, max_num_seqs=3, decode_loop="device", readback_every=3)
CASES = {
    "qwen2": ("qwen2", {}, {}),
    "qwen3": ("qwen3", {}, {}),
    "llama_tied_biases": ("llama", {"attention_bias": True, "mlp_bias": True}, {"tie_word_embeddings": True}),
}
PARAMS = {
    "greedy": SamplingParams(temperature=0.0, max_new_tokens=10, ignore_eos=True),
    "sampled": SamplingParams(temperature=0.9, top_p=0.9, top_k=50, max_new_tokens=10, n=2, seed=3, ignore_eos=True),
}


def _batch():
    return left_padded([4, 9, 1, 6], vocab=256, seed=12)


def _generate_all(make_engine) -> dict:
    out = {}
    for kind, params in PARAMS.items():
        result = make_engine().generate(_batch(), params)
        out[kind] = (result.batch["responses"], result.batch["rollout_log_probs"])
    return out


def _tp_worker(rank: int, world: int, init_file: str, paths: dict, out_prefix: str) -> None:
    torch.set_num_threads(1)  # two processes share the machine's cores
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    group = dist.group.WORLD
    results = {}
    for name, path in paths.items():
        results[name, "full"] = _generate_all(
            lambda: NativeRolloutEngine.from_pretrained(path, FP32, process_group=group))

        def from_shards():
            engine = NativeRolloutEngine(load_hf_config(path), FP32, process_group=group)
            shards = ((n, shard_for_rank(t, n, rank, world)) for n, t in iter_safetensors(path))
            engine.load_weights(shards, sharded=True)
            return engine

        results[name, "sharded"] = _generate_all(from_shards)
        if name == next(iter(paths)):
            results[name, "device_loop"] = _generate_all(
                lambda: NativeRolloutEngine.from_pretrained(path, DEVICE_LOOP, process_group=group))
    torch.save(results, f"{out_prefix}.{rank}")
    dist.destroy_process_group()


def test_tp2_generation_equals_single_process(tmp_path):
    paths = {}
    for name, (family, overrides, sizes) in CASES.items():
        paths[name] = save_model(tmp_path / name, family, seed=13, logit_scale=4.0, config_overrides=overrides, **sizes)
    mp.spawn(_tp_worker, args=(2, str(tmp_path / "rdzv"), paths, str(tmp_path / "out")), nprocs=2, join=True)
    per_rank = [torch.load(tmp_path / f"out.{r}") for r in range(2)]
    for name, path in paths.items():
        single = _generate_all(lambda: NativeRolloutEngine.from_pretrained(path, FP32))
        for rank_results in per_rank:
            for how in ("full", "sharded", "device_loop"):
                for kind, (tokens, log_probs) in rank_results.get((name, how), {}).items():
                    ref_tokens, ref_lp = single[kind]
                    assert torch.equal(tokens, ref_tokens), (name, how, kind)
                    assert torch.allclose(log_probs, ref_lp, atol=1e-5), (name, how, kind)
