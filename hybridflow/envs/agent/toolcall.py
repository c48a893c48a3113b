"""Tool calls in model text: the Qwen/Hermes JSON form and a compact form for the character model.

Hermes (Qwen2.5, SmolLM2, ... chat templates rendered with `tools=`): each call is

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "123*456"}}
    </tool_call>
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

FORMATS = ("hermes", "compact")
# The role of a tool's answer: Hermes templates render "tool" messages; the character
# model's template knows only system/user/assistant, so its tool answers are user turns.
OBSERVATION_ROLE = {"hermes": "tool", "compact": "user"}

_HERMES = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
_COMPACT = re.compile(r"@([A-Za-z_]\w*)\[([^\]]*)(\]|$)")


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolCallError:
    """A call the parser could not read; `message` says what was wrong, for the model."""

    text: str
    message: str


def parse_tool_calls(text: str, fmt: str, first_param: dict[str, str] | None = None) -> list[ToolCall | ToolCallError]:
    """Every tool call in `text`, in order. `first_param` maps tool name -> the parameter a
    compact call's argument fills (unknown names get "input")."""
    if fmt == "hermes":
        return [call for body, end in _HERMES.findall(text) for call in _hermes_calls(body, closed=bool(end))]
    if fmt == "compact":
        first_param = first_param or {}
        out: list[ToolCall | ToolCallError] = []
        for name, arg, end in _COMPACT.findall(text):
            if not end:
                out.append(ToolCallError(f"@{name}[{arg}", "tool call not closed with ']'"))
            else:
                out.append(ToolCall(name, {first_param.get(name, "input"): arg}))
        return out
    raise ValueError(f"unknown tool-call format {fmt!r}; use one of {FORMATS}")


def _hermes_calls(body: str, closed: bool) -> list[ToolCall | ToolCallError]:
    """The calls in one <tool_call> body: a JSON object, or a JSON list of them (SmolLM2's
    function-calling form, `<tool_call>[{"name": ..., "arguments": ...}, ...]</tool_call>`)."""
    text = body.strip()
    if not closed:
        return [ToolCallError(text, "tool call not closed with </tool_call>")]
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        return [ToolCallError(text, f"tool call is not valid JSON ({err.msg} at character {err.pos})")]
    if isinstance(value, list) and value:
        return [_hermes_call(json.dumps(v), v) for v in value]
    return [_hermes_call(text, value)]


def _hermes_call(text: str, value: Any) -> ToolCall | ToolCallError:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return ToolCallError(text, 'tool call must be a JSON object with a string "name"')
    args = value.get("arguments", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return ToolCallError(text, '"arguments" is a string that is not a JSON object')
    if not isinstance(args, dict):
        return ToolCallError(text, '"arguments" must be a JSON object')
    return ToolCall(value["name"], args)
