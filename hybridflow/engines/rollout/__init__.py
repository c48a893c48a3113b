"""Rollout: generation backends behind one interface, chosen by name (`rollout.name`).

    from hybridflow.engines.rollout import RolloutConfig, SamplingParams, build_rollout_engine

`RolloutEngine` (interface.py) is what workers and the HybridEngine depend on; backends
register with `@register_rollout_backend` (registry.py) and are built with
`build_rollout_engine(name, ...)`. Built in:
- "native", `NativeRolloutEngine` (engine.py): hybridflow's own engine, a compact decoder
  (model.py), a preallocated KV cache (kv_cache.py), continuous batching (scheduler.py),
  per-row sampling (sampling.py), tensor parallelism, and a choice of GEMM path (gemm.py);
- "hf", `HFRolloutEngine` (hf_backend.py): transformers `generate`, one rank, any family
  transformers knows; a reference and a fallback.
Both read prompts and write the output DataProto through batch_io.py.
"""

from hybridflow.engines.rollout.config import RolloutConfig
from hybridflow.engines.rollout.engine import NativeRolloutEngine
from hybridflow.engines.rollout.hf_backend import HFRolloutEngine
from hybridflow.engines.rollout.interface import RolloutEngine
from hybridflow.engines.rollout.registry import (
    build_rollout_engine,
    check_rollout_backend,
    register_rollout_backend,
    rollout_backend,
    rollout_backends,
)
from hybridflow.engines.rollout.sampling import SamplingParams
from hybridflow.engines.rollout.weights import shard_for_rank, tp_shard_dim

__all__ = [
    "HFRolloutEngine",
    "NativeRolloutEngine",
    "RolloutConfig",
    "RolloutEngine",
    "SamplingParams",
    "build_rollout_engine",
    "check_rollout_backend",
    "register_rollout_backend",
    "rollout_backend",
    "rollout_backends",
    "shard_for_rank",
    "tp_shard_dim",
]
