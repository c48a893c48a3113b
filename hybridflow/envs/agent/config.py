"""`rollout.agent`: multi-turn rollouts with environments (see docs/agents.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hybridflow.errors import ConfigError

MODES = ("async", "sync")


@dataclass
class AgentConfig:
    """enable: run rollouts through the agent loop (rows may still be single-turn).
    mode: "async" or "sync" environment interaction.
    max_turns: model turns per trajectory (the last one is not answered by the env).
    max_turn_tokens: tokens of one model turn (null: the whole response_length).
    max_obs_tokens: tokens of one observation; a longer one ends the trajectory.
    env_timeout_s: limit of each reset/step call; beyond it the trajectory ends with an error.
    error_score: score of a trajectory whose environment failed (replaces the scorer's).
    default_env / env_kwargs: environment of rows that name none in extra_info["env"].
    """

    enable: bool = False
    mode: str = "async"
    max_turns: int = 4
    max_turn_tokens: int | None = None
    max_obs_tokens: int = 256
    env_timeout_s: float = 30.0
    error_score: float = 0.0
    default_env: str | None = None
    env_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"must be one of {MODES}, got {self.mode!r}", "mode")
        for key in ("max_turns", "max_obs_tokens"):
            if getattr(self, key) < 1:
                raise ConfigError(f"must be >= 1, got {getattr(self, key)}", key)
        if self.max_turn_tokens is not None and self.max_turn_tokens < 1:
            raise ConfigError(f"must be >= 1 or null, got {self.max_turn_tokens}", "max_turn_tokens")
        if self.env_timeout_s <= 0:
            raise ConfigError(f"must be > 0, got {self.env_timeout_s}", "env_timeout_s")
        if self.default_env is not None:
            from hybridflow.envs.agent.base import resolve_agent_env

            resolve_agent_env(self.default_env, "default_env")
