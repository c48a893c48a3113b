"""Environments for RL on vector observations: Gymnasium adapters, a registry, vectorisation.

    from hybridflow.envs import register_env, resolve_env

    @register_env
    class CustomEnv(gymnasium.Env): ...          # then config `env: CustomEnv`

- registry.py: `register_env`, `resolve_env` (registered names, import paths, Gymnasium ids);
- spaces.py: Gymnasium spaces -> `ActionSpec` and flat observations;
- vector.py: `VecEnv` (N copies, same-step reset, episode statistics), `RewardScaler`;
- collector.py: `Collector` (steps a VecEnv with a policy; PPO segments, SAC transitions).

Heavy modules (torch, gymnasium) load on first use, so registering an environment is cheap.
"""

from __future__ import annotations

from hybridflow.lazy import lazy_exports
from hybridflow.envs.registry import EnvSource, register_env, registered_envs, resolve_env

_LAZY = {"Collector": "collector", "CollectorSpec": "collector", "VecEnv": "vector", "RewardScaler": "vector",
         "action_spec": "spaces", "obs_dim": "spaces"}

__all__ = sorted(["EnvSource", "register_env", "registered_envs", "resolve_env", *_LAZY])
__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
