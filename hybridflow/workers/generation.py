"""What both generating roles share: the rollout engine's config and per-call sampling seeds.

The hybrid actor (actor_rollout_ref.py) and the separate rollout pool (rollout.py) must
sample alike: the same engine settings and the same seed for the same call, so that a
run whose rollout pool is never ahead of the trainer (async max_staleness=0) generates
exactly what the synchronous run generates.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from hybridflow.engines.precision import resolve_dtype
from hybridflow.engines.rollout import RolloutConfig, SamplingParams
from hybridflow.workers.config import RolloutWorkerConfig


def rollout_engine_config(r: RolloutWorkerConfig, device: torch.device, trust_remote_code: bool) -> RolloutConfig:
    """The rollout engine's settings from the `rollout` section, on `device`."""
    return RolloutConfig(trust_remote_code=trust_remote_code,
        dtype=resolve_dtype(r.dtype, device.type), device=str(device), max_num_seqs=r.max_num_seqs,
        max_model_len=r.max_model_len, keep_kv_cache=False, log_prob_mode=r.log_prob_mode,
        prefill_token_budget=r.prefill_token_budget, seed=r.seed, matmul=r.matmul, decode_loop=r.decode_loop,
        readback_every=r.readback_every, compile_decode=r.compile_decode, cuda_graphs=r.cuda_graphs,
    )


def call_sampling_params(r: RolloutWorkerConfig, meta: dict, calls: int, dp_rank: int) -> SamplingParams:
    """Sampling settings of one generation call: meta_info over the rollout defaults, seeded.

    Each micro-DP group must draw its own random numbers: the engine seeds a sample by
    (seed, row, sample index), and row 0 of every group would otherwise share a stream.
    Without a seed in meta_info, the call number `calls` makes every call draw afresh.
    """
    params = SamplingParams.from_meta_info(meta, **r.sampling_defaults())
    base = [params.seed] if params.seed is not None else [r.seed, 1 << 31, calls]
    return dataclasses.replace(params, seed=derive_seed(base + [dp_rank]))


def counts_as_sampled_call(params: SamplingParams, meta: dict) -> bool:
    """Whether a call consumes the seed counter: only calls whose seed came from it, so a
    greedy or explicitly seeded evaluation never shifts the training rollouts' seeds."""
    return not params.greedy and meta.get("seed") is None


def derive_seed(entropy: list[int]) -> int:
    state = np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint32)
    return int(state[0]) & 0x7FFFFFFF


def tokenizer_if_present(model_path: str, trust_remote_code: bool):
    """The model directory's tokenizer (stop strings need one to decode), or None."""
    if not (Path(model_path) / "tokenizer_config.json").is_file():
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path, local_files_only=True, trust_remote_code=trust_remote_code)
