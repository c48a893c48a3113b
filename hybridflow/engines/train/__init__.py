"""Training engine: FSDP2 + tensor-parallel actor, critic, reference and reward models.

The multi-controller side of HybridFlow for training and scoring. Workers build one
engine per role inside an initialised torch.distributed process group; the engine does
not know how the processes were started (it never imports Ray).

    from hybridflow.engines.train import ActorEngine, TrainEngineConfig, init_distributed
"""

from __future__ import annotations

from hybridflow.lazy import lazy_exports

# name -> the module that defines it; imported on first use (hybridflow/lazy.py), so
# importing a torch-free module of this package (config classes) stays torch-free.
_EXPORTS = {
    "ActorEngine": "actor",
    "ActorLossConfig": "config",
    "CriticLossConfig": "config",
    "LoraConfig": "config",
    "ForwardBatchConfig": "config",
    "MicroBatchConfig": "config",
    "OptimConfig": "config",
    "TrainEngineConfig": "config",
    "CriticEngine": "critic",
    "build_device_mesh": "distributed",
    "full_tensor": "distributed",
    "init_distributed": "distributed",
    "TrainEngine": "engine",
    "RewardModelEngine": "reward",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "ActorEngine",
    "ActorLossConfig",
    "CriticEngine",
    "CriticLossConfig",
    "LoraConfig",
    "ForwardBatchConfig",
    "MicroBatchConfig",
    "OptimConfig",
    "RewardModelEngine",
    "TrainEngine",
    "TrainEngineConfig",
    "build_device_mesh",
    "full_tensor",
    "init_distributed",
]
