"""The environment interface for language agents, and its registry.

    from hybridflow.envs.agent import AgentEnv, StepResult, register_agent_env

    @register_agent_env("echo")
    class Echo(AgentEnv):
        def reset(self, row):                       # row: the data row (prompt, ground_truth, extra_info, ...)
            return [{"role": "user", "content": row["raw_prompt"]}]
        def step(self, turn):                       # turn: the model's text of this turn
            return StepResult([{"role": "user", "content": turn.upper()}], reward=0.0, done=len(turn) > 3)

One instance per trajectory: `reset` gives the first messages (the conversation the model
continues), then `step` answers each model turn with observation message(s), a turn
reward, whether the episode is done, and an info dict. Environments that wait on I/O
override `astep` (a coroutine); the default `astep` runs `step` in a worker thread.
Data rows name their environment in `extra_info["env"]` (a registered name or an import
path "package.module:Class") with keyword arguments in `extra_info["env_kwargs"]`; rows
without one are single-turn. What the loop does when an environment misbehaves (raises,
hangs, returns the wrong type) is in guard.py.
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
