"""Rollout: generation backends behind one interface, chosen by name (`rollout.name`).

    from hybridflow.engines.rollout import RolloutConfig, SamplingParams, build_rollout_engine

`RolloutEngine` (interface.py) is what workers and the HybridEngine depend on; backends
register with `@register_rollout_backend` (registry.py) and are built with
`build_rollout_engine(name, ...)`. Built in:
- "native", `NativeRolloutEngine` (engine.py): hybridflow's own engine, a compact decoder
  (model.py), a preallocated KV cache (kv_cache.py), continuous batching (scheduler.py),
  per-row sampling (sampling.py), tensor parallelism, and a choice of GEMM path (gemm.py);
- "hf", `HFRolloutEngine` (hf_backend.py): transformers `generate`, one rank, any family
  transformers knows; a reference and a fallback;
- "vllm", `VLLMRolloutEngine` (vllm_backend.py) and "sglang", `SGLangRolloutEngine`
  (sglang_backend.py): adapters of the external engines (GPU only, packages installed
  separately; external.py, external_engine.py, external_io.py; docs/rollout_backends.md).
All read prompts and write the output DataProto through batch_io.py.
"""

from __future__ import annotations

from hybridflow.lazy import lazy_exports

# name -> the module that defines it; imported on first use (hybridflow/lazy.py), so
# importing a torch-free module of this package (config classes) stays torch-free.
_EXPORTS = {
    "RolloutConfig": "config",
    "NativeRolloutEngine": "engine",
    "HFRolloutEngine": "hf_backend",
    "VLLMRolloutEngine": "vllm_backend",
    "SGLangRolloutEngine": "sglang_backend",
    "RolloutEngine": "interface",
    "build_rollout_engine": "registry",
    "check_rollout_backend": "registry",
    "register_rollout_backend": "registry",
    "rollout_backend": "registry",
    "rollout_backends": "registry",
    "SamplingParams": "sampling",
    "shard_for_rank": "weights",
    "tp_shard_dim": "weights",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "HFRolloutEngine",
    "NativeRolloutEngine",
    "RolloutConfig",
    "RolloutEngine",
    "SGLangRolloutEngine",
    "SamplingParams",
    "VLLMRolloutEngine",
    "build_rollout_engine",
    "check_rollout_backend",
    "register_rollout_backend",
    "rollout_backend",
    "rollout_backends",
    "shard_for_rank",
    "tp_shard_dim",
]
