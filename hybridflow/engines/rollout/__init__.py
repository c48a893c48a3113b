"""Rollout: generation backends behind one interface, chosen by name (`rollout.name`).

    from hybridflow.engines.rollout import RolloutConfig, SamplingParams, build_rollout_engine
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
