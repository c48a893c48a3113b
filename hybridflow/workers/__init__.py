"""Worker roles: one class per role, built from the engines, driven through worker groups.

    from hybridflow.workers import (ActorRolloutRefConfig, ActorRolloutRefWorker, CriticWorker,
                                    CriticWorkerConfig, PlacementSpec, RewardModelWorker,
                                    RewardModelWorkerConfig, build_role_groups)
"""

from __future__ import annotations

from hybridflow.lazy import lazy_exports

# name -> the module that defines it; imported on first use (hybridflow/lazy.py), so
# importing a torch-free module of this package (config classes) stays torch-free.
_EXPORTS = {
    "ACTOR_MESH": "actor_rollout_ref",
    "ROLLOUT_MESH": "actor_rollout_ref",
    "ActorRolloutRefWorker": "actor_rollout_ref",
    "ActorRolloutRefConfig": "config",
    "CriticWorkerConfig": "config",
    "RewardModelWorkerConfig": "config",
    "RolloutWorkerConfig": "config",
    "CRITIC_MESH": "critic",
    "CriticWorker": "critic",
    "DEFAULT_POOL": "placement",
    "PlacementSpec": "placement",
    "build_role_groups": "placement",
    "shutdown_role_groups": "placement",
    "REWARD_MESH": "reward_model",
    "RewardModelWorker": "reward_model",
    "scores_at_last_response_token": "reward_model",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "ACTOR_MESH",
    "CRITIC_MESH",
    "DEFAULT_POOL",
    "REWARD_MESH",
    "ROLLOUT_MESH",
    "ActorRolloutRefConfig",
    "ActorRolloutRefWorker",
    "CriticWorker",
    "CriticWorkerConfig",
    "PlacementSpec",
    "RewardModelWorker",
    "RewardModelWorkerConfig",
    "RolloutWorkerConfig",
    "build_role_groups",
    "scores_at_last_response_token",
    "shutdown_role_groups",
]
