"""Small policy networks for environment tasks (vector observations) and their learners.

- spaces.py: `ActionSpec` (discrete, multi-discrete, bounded box), Gymnasium-free;
- mlp.py: MLPs with orthogonal init, activations by name, the observation normaliser;
- distributions.py: categorical and tanh-squashed Gaussian heads (log-probs, entropy);
- actor_critic.py: `ActorCritic` (PPO); sac_model.py: `SACModel` (actor, twin Q, targets, alpha);
- ppo_learner.py / sac_learner.py: the update of one learner rank; data_parallel.py:
  gradient averaging over learner ranks.
"""

from __future__ import annotations

from hybridflow.lazy import lazy_exports

# Lazy: `hybridflow.envs` reads ActionSpec from here, and registering an environment in a
# user's script should not import torch.
_LAZY = {
    "ActionSpec": "spaces", "ActorCritic": "actor_critic", "NetworkSpec": "actor_critic",
    "PPOLearner": "ppo_learner", "PPOUpdateConfig": "ppo_learner", "SACLearner": "sac_learner",
    "SACModel": "sac_model", "SACUpdateConfig": "sac_learner",
}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)


__all__ = sorted(_LAZY)
