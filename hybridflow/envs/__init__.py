"""Environments for RL on vector observations: Gymnasium adapters, a registry, vectorisation.

    from hybridflow.envs import register_env, resolve_env

    @register_env
    class CustomEnv(gymnasium.Env): ...          # then config `env: CustomEnv`
"""

from __future__ import annotations

from hybridflow.lazy import lazy_exports
from hybridflow.envs.registry import EnvSource, register_env, registered_envs, resolve_env

_LAZY = {"Collector": "collector", "CollectorSpec": "collector", "VecEnv": "vector", "RewardScaler": "vector",
         "action_spec": "spaces", "obs_dim": "spaces"}

__all__ = sorted(["EnvSource", "register_env", "registered_envs", "resolve_env", *_LAZY])
__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
