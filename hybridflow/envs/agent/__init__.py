"""Environments for language agents: multi-turn conversations and tool calls (docs/agents.md)."""

from __future__ import annotations

from hybridflow.lazy import lazy_exports

# name -> the module that defines it; imported on first use (hybridflow/lazy.py), so
# importing a torch-free module of this package (config classes) stays torch-free.
_EXPORTS = {
    "AgentEnv": "base",
    "SingleTurn": "base",
    "StepResult": "base",
    "register_agent_env": "base",
    "registered_agent_envs": "base",
    "resolve_agent_env": "base",
    "AgentConfig": "config",
    "Tool": "tools",
    "register_tool": "tools",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["AgentConfig", "AgentEnv", "SingleTurn", "StepResult", "register_agent_env", "registered_agent_envs",
           "resolve_agent_env", "Tool", "register_tool"]
