"""Worker roles: one class per role, built from the engines, driven through worker groups.

    from hybridflow.workers import (ActorRolloutRefConfig, ActorRolloutRefWorker, CriticWorker,
                                    CriticWorkerConfig, PlacementSpec, RewardModelWorker,
                                    RewardModelWorkerConfig, build_role_groups)

    groups = build_role_groups({"actor": RoleSpec(ActorRolloutRefWorker, (actor_cfg,)),
                                "critic": RoleSpec(CriticWorker, (critic_cfg,))},
                               PlacementSpec.colocated([2]))
    for group in groups.values():
        group.init_model()
    gen = groups["actor"].generate_sequences(prompts)

- actor_rollout_ref.py: the hybrid engine role (generation, log-probs, reference, update).
- critic.py / reward_model.py: value model and reward model roles.
- config.py: the roles' typed configs; placement.py: roles onto resource pools.
- generation_weights.py: the actor's weights under HF names (LoRA merged) for resharding.
"""

from hybridflow.workers.actor_rollout_ref import ACTOR_MESH, ROLLOUT_MESH, ActorRolloutRefWorker
from hybridflow.workers.config import (
    ActorRolloutRefConfig,
    CriticWorkerConfig,
    RewardModelWorkerConfig,
    RolloutWorkerConfig,
)
from hybridflow.workers.critic import CRITIC_MESH, CriticWorker
from hybridflow.workers.placement import DEFAULT_POOL, PlacementSpec, build_role_groups, shutdown_role_groups
from hybridflow.workers.reward_model import REWARD_MESH, RewardModelWorker, scores_at_last_response_token

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
