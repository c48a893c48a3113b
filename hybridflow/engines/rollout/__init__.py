"""Rollout: hybridflow's own generation engine and the interface external engines implement.

    from hybridflow.engines.rollout import NativeRolloutEngine, RolloutConfig, SamplingParams

`RolloutEngine` (interface.py) is what workers depend on; `NativeRolloutEngine`
(engine.py) implements it with a compact decoder (model.py), a preallocated KV cache
(kv_cache.py), continuous batching (scheduler.py), per-row sampling (sampling.py) and
a choice of GEMM path (gemm.py: torch's kernel, or fp32 panels for bf16 on CPUs without
native bf16).
"""

from hybridflow.engines.rollout.engine import NativeRolloutEngine, RolloutConfig
from hybridflow.engines.rollout.interface import RolloutEngine
from hybridflow.engines.rollout.sampling import SamplingParams
from hybridflow.engines.rollout.weights import shard_for_rank, tp_shard_dim

__all__ = [
    "NativeRolloutEngine",
    "RolloutConfig",
    "RolloutEngine",
    "SamplingParams",
    "shard_for_rank",
    "tp_shard_dim",
]
