"""A user's tool is one function (issue 26): `@register_tool` makes it a tool the built-in
`tools` environment takes by name, or by import path in another process (a rollout
worker); its schema comes from the signature and docstring."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hybridflow
from hybridflow.envs.agent import register_tool
from hybridflow.envs.agent.builtin import ToolEnv
from hybridflow.envs.agent.tools import TOOLS
from hybridflow.errors import ConfigError

MODULE = '''
from hybridflow.envs.agent import register_tool

DICTIONARY = {"cat": "chat", "dog": "chien"}


@register_tool
def lookup(key: str, times: int = 1) -> str:
    """Look a word up in the English-French dictionary.

    Unknown words answer "not found".
    """
    return ",".join([DICTIONARY.get(key, "not found")] * times)
'''


@pytest.fixture
def user_tools(tmp_path, monkeypatch):
    (tmp_path / "my_tools.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import my_tools

    yield tmp_path
    sys.modules.pop("my_tools", None)
    TOOLS._items.pop("lookup", None)


def test_a_registered_function_is_a_tool_of_the_tools_environment_by_name(user_tools):
    env = ToolEnv(tools=["lookup", "calculator"], tool_format="hermes")
    (schema,) = [t["function"] for t in env.tools if t["function"]["name"] == "lookup"]
    assert schema["description"] == "Look a word up in the English-French dictionary."
    assert schema["parameters"] == {"type": "object", "required": ["key"], "properties": {
        "key": {"type": "string"}, "times": {"type": "integer"}}}
    call = '<tool_call>{"name": "lookup", "arguments": {"key": "cat", "times": 2}}</tool_call>'
    assert env.step(call).observation == [{"role": "tool", "content": "chat,chat"}]
    bad = '<tool_call>{"name": "lookup", "arguments": {"word": "cat"}}</tool_call>'
    assert env.step(bad).observation[0]["content"].startswith("error: lookup needs argument(s) ['key']")


def test_the_compact_form_fills_the_first_parameter(user_tools):
    env = ToolEnv(tools=["lookup"], tool_format="compact")
    assert env.step("@lookup[dog]").observation == [{"role": "user", "content": "chien"}]


def test_an_import_path_reaches_the_tool_in_a_fresh_process(user_tools):
    """What a rollout worker does: a new interpreter that never ran the user's script."""
    code = textwrap.dedent('''
        from hybridflow.envs.agent.builtin import ToolEnv
        env = ToolEnv(tools=["my_tools:lookup"], tool_format="compact")
        print(env.step("@lookup[cat]").observation[0]["content"])
    ''')
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": f"{user_tools}:{Path(hybridflow.__file__).resolve().parents[1]}",
                              "PATH": "/usr/bin:/bin"}, timeout=120)
    assert out.stdout.strip() == "chat"


def test_names_are_checked_and_override_replaces(user_tools):
    def lookup(key: str) -> str:
        return "other"

    with pytest.raises(ValueError, match="already registered.*override=True"):
        register_tool(lookup)
    register_tool(lookup, override=True)
    assert ToolEnv(tools=["lookup"], tool_format="compact").step("@lookup[cat]").observation[0]["content"] == "other"
    with pytest.raises(ValueError, match="is a built-in"):
        register_tool(name="calculator")(lookup)
    with pytest.raises(ConfigError, match=r"env_kwargs\.tools: unknown tool 'lookpu'; did you mean 'lookup'"):
        ToolEnv(tools=["lookpu"])


def test_a_function_the_model_cannot_call_is_refused_at_registration():
    def variadic(*args):
        return ""

    with pytest.raises(TypeError, match=r"\*args"):
        register_tool(variadic)
    assert "variadic" not in TOOLS
