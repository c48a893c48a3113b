"""Environments for language agents: multi-turn conversations and tool calls (docs/agents.md).

- base.py: `AgentEnv` (reset(row) -> messages; step(turn) / async astep -> `StepResult`),
  `register_agent_env`, `resolve_agent_env` (registered names or import paths);
- builtin.py: `tools` (calculator, Python sandbox) and `guess_number` environments;
- tools.py, toolcall.py, sandbox.py: tool schemas and functions (`register_tool`: a
  function as a tool), tool-call parsing
  (Hermes `<tool_call>` JSON, compact `@name[arg]`), the Python sandbox;
- guard.py: `EnvRunner` (timeouts, wrong types and exceptions become recorded failures);
- render.py: chat-template rendering of prompts and observations to tokens;
- loop.py: `AgentLoop`, the sync / async multi-turn rollout on the native engine;
- config.py: `AgentConfig` (`rollout.agent`).
"""

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
