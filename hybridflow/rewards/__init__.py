"""The rewards layer: rule-based scorers, the data_source registry, user reward functions
loaded from files, and the RewardManager that scores batches in worker processes.

    from hybridflow.rewards import RewardManager, RewardConfig, default_compute_score, load_reward_fn

`RewardManager`/`RewardConfig`/`RewardOutput` are imported lazily: reward worker
processes import this package and must not pay for torch.
"""

from __future__ import annotations

from hybridflow.lazy import lazy_exports
from hybridflow.rewards.registry import (
    SCORERS,
    DispatchScore,
    FileRewardFn,
    default_compute_score,
    load_reward_fn,
    register_scorer,
)

_LAZY = {"RewardManager": "manager", "RewardConfig": "config", "RewardOutput": "manager", "ScoringPool": "pool"}

__all__ = [
    "SCORERS",
    "DispatchScore",
    "FileRewardFn",
    "RewardConfig",
    "RewardManager",
    "RewardOutput",
    "ScoringPool",
    "default_compute_score",
    "load_reward_fn",
    "register_scorer",
]
__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
