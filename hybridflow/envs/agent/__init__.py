"""Environments for language agents: multi-turn conversations and tool calls (docs/agents.md).

- base.py: `AgentEnv` (reset(row) -> messages; step(turn) / async astep -> `StepResult`),
  `register_agent_env`, `resolve_agent_env` (registered names or import paths);
- builtin.py: `tools` (calculator, Python sandbox) and `guess_number` environments;
- tools.py, toolcall.py, sandbox.py: tool schemas and functions, tool-call parsing
  (Hermes `<tool_call>` JSON, compact `@name[arg]`), the Python sandbox;
- guard.py: `EnvRunner` (timeouts, wrong types and exceptions become recorded failures);
- render.py: chat-template rendering of prompts and observations to tokens;
- loop.py: `AgentLoop`, the sync / async multi-turn rollout on the native engine;
- config.py: `AgentConfig` (`rollout.agent`).
"""

from hybridflow.envs.agent.base import (
    AgentEnv,
    SingleTurn,
    StepResult,
    register_agent_env,
    registered_agent_envs,
    resolve_agent_env,
)
from hybridflow.envs.agent.config import AgentConfig

__all__ = ["AgentConfig", "AgentEnv", "SingleTurn", "StepResult", "register_agent_env", "registered_agent_envs",
           "resolve_agent_env"]
