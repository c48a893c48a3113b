"""The environment interface for language agents, and its registry.

    from hybridflow.envs.agent import AgentEnv, StepResult, register_agent_env
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hybridflow.errors import ConfigError
from hybridflow.registry import Registry

Message = dict[str, Any]  # {"role": ..., "content": ...}, plus "tool_calls" etc. where a template reads them


@dataclass
class StepResult:
    """What an environment answers to one model turn.

    observation: messages appended to the conversation (empty when done).
    reward: this turn's reward, placed on the last token of the turn it answers.
    done: the episode ended (the model's turn was its final answer, or the game is over).
    info: anything to record (counts of tool calls, errors a tool reported, ...).
    """

    observation: list[Message] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class AgentEnv:
    """Base class: override `reset` and `step` (and `astep` for I/O-bound environments).

    `tools` lists the tool schemas (OpenAI/HF function format) the environment offers; the
    prompt is rendered with them (`apply_chat_template(tools=...)`).
    """

    tools: list[dict[str, Any]] = []

    def reset(self, row: dict[str, Any]) -> list[Message]:
        raise NotImplementedError(f"{type(self).__name__} must implement reset(row) -> list of messages")

    def step(self, turn: str) -> StepResult:
        raise NotImplementedError(f"{type(self).__name__} must implement step(turn) -> StepResult")

    async def astep(self, turn: str) -> StepResult:
        return await asyncio.to_thread(self.step, turn)

    def close(self) -> None:
        """Release what the instance holds (processes, files); called once per trajectory."""


class SingleTurn(AgentEnv):
    """The environment of a row that names none: its prompt, and done after one model turn."""

    def reset(self, row: dict[str, Any]) -> list[Message]:
        prompt = row["raw_prompt"]
        return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)

    def step(self, turn: str) -> StepResult:
        return StepResult(done=True)


EnvFactory = Callable[..., AgentEnv]
_REGISTRY: Registry[EnvFactory] = Registry("agent environment")


def register_agent_env(name: str, *, override: bool = False) -> Callable[[EnvFactory], EnvFactory]:
    """Register an AgentEnv class (or factory) under `name`: ``@register_agent_env("calculator")``
    (another definition under a taken name needs override=True)."""
    return _REGISTRY.register(name, override=override)


def registered_agent_envs() -> list[str]:
    return _REGISTRY.names()


def resolve_agent_env(name: str, key: str = "agent.env") -> EnvFactory:
    """A registered name or an import path ("pkg.mod:Class" or "pkg.mod.Class") -> the factory."""
    _load_builtins()
    return _REGISTRY.resolve(name, key, "give a registered name or an import path 'package.module:Class'")


def _load_builtins() -> None:
    importlib.import_module("hybridflow.envs.agent.builtin")
    importlib.import_module("hybridflow.envs.agent.demo")
