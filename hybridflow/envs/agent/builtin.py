"""Built-in agent environments: tool use (calculator, Python sandbox) and a guessing game.

Data rows choose them with `extra_info = {"env": "tools", "env_kwargs": {"tools": ["calculator"]}}`
(or `"env": "guess_number"`); `agent.default_env` in the config applies one to every row
that names none.
"""

from __future__ import annotations

import random
import re
from typing import Any

from hybridflow.envs.agent.base import AgentEnv, Message, StepResult, register_agent_env
from hybridflow.envs.agent.sandbox import SandboxLimits
from hybridflow.envs.agent.toolcall import OBSERVATION_ROLE, ToolCall, parse_tool_calls
from hybridflow.envs.agent.tools import Tool, resolve_tools


def prompt_messages(row: dict[str, Any]) -> list[Message]:
    prompt = row["raw_prompt"]
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]


@register_agent_env("tools")
class ToolEnv(AgentEnv):
    """Answers tool calls until the model answers without one."""

    def __init__(self, tools: list[str] = ("calculator",), tool_format: str = "hermes", max_calls_per_turn: int = 4,
                 python_time_s: float = 5.0, python_memory_mb: int = 1024) -> None:
        limits = SandboxLimits(time_s=python_time_s, memory_bytes=python_memory_mb << 20)
        self._tools: dict[str, Tool] = resolve_tools(list(tools), limits)
        # Schemas go into the prompt (chat template, or a system message) for the Hermes
        # form; the compact form is the character model's own, learned from data, not shown.
        self.tools = [t.schema for t in self._tools.values()] if tool_format == "hermes" else []
        self.format = tool_format
        self.max_calls = max_calls_per_turn

    def reset(self, row: dict[str, Any]) -> list[Message]:
        return prompt_messages(row)

    def step(self, turn: str) -> StepResult:
        first = {name: tool.first_param for name, tool in self._tools.items()}
        calls = parse_tool_calls(turn, self.format, first)
        if not calls:
            return StepResult(done=True, info={"tool_calls": 0, "tool_errors": 0, "tool_malformed": 0})
        malformed = sum(not isinstance(c, ToolCall) for c in calls)
        answers, errors = [], 0
        for call in calls[: self.max_calls]:
            text = self._answer(call)
            errors += text.startswith("error:")
            answers.append(text)
        if len(calls) > self.max_calls:
            answers.append(f"error: at most {self.max_calls} tool calls per turn; the rest were ignored")
        role = OBSERVATION_ROLE[self.format]
        if self.format == "compact":  # one short user turn: answers separated by ";"
            observation = [{"role": role, "content": ";".join(answers)}]
        else:
            observation = [{"role": role, "content": a} for a in answers]
        return StepResult(observation, info={"tool_calls": len(calls), "tool_errors": errors,
                                             "tool_malformed": malformed})

    def _answer(self, call) -> str:
        if not isinstance(call, ToolCall):
            return f"error: {call.message}"
        tool = self._tools.get(call.name)
        if tool is None:
            return f"error: unknown tool {call.name!r}; available: {sorted(self._tools)}"
        return tool.call(call.arguments)


_INT = re.compile(r"-?\d+")


@register_agent_env("guess_number")
class GuessNumberEnv(AgentEnv):
    """Guess a secret integer with higher/lower feedback."""

    def __init__(self, low: int = 1, high: int = 100, seed: int | None = None) -> None:
        if low > high:
            raise ValueError(f"guess_number: low={low} > high={high}")
        self.low, self.high, self.seed = low, high, seed
        self.target = low

    def reset(self, row: dict[str, Any]) -> list[Message]:
        truth = row.get("ground_truth")
        if truth is not None and _INT.fullmatch(str(truth).strip()):
            self.target = int(str(truth).strip())
        else:
            self.target = random.Random(self.seed).randint(self.low, self.high)
        return [{"role": "user", "content": f"Guess my number between {self.low} and {self.high}. "
                 "Answer with one number; I will say higher or lower."}]

    def step(self, turn: str) -> StepResult:
        numbers = _INT.findall(turn)
        if not numbers:
            return StepResult([{"role": "user", "content": "Answer with a number."}])
        guess = int(numbers[-1])
        if guess == self.target:
            return StepResult(reward=1.0, done=True, info={"guess": guess})
        hint = "higher" if guess < self.target else "lower"
        return StepResult([{"role": "user", "content": hint}], info={"guess": guess})
