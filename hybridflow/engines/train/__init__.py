"""Training engine: FSDP2 + tensor-parallel actor, critic, reference and reward models.

The multi-controller side of HybridFlow for training and scoring. Workers build one
engine per role inside an initialised torch.distributed process group; the engine does
not know how the processes were started (it never imports Ray).

    from hybridflow.engines.train import ActorEngine, TrainEngineConfig, init_distributed
"""

from hybridflow.engines.train.actor import ActorEngine
from hybridflow.engines.train.config import (
    ActorLossConfig,
    CriticLossConfig,
    LoraConfig,
    ForwardBatchConfig,
    MicroBatchConfig,
    OptimConfig,
    TrainEngineConfig,
)
from hybridflow.engines.train.critic import CriticEngine
from hybridflow.engines.train.distributed import build_device_mesh, full_tensor, init_distributed
from hybridflow.engines.train.engine import TrainEngine
from hybridflow.engines.train.reward import RewardModelEngine

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
