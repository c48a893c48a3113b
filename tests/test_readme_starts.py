"""The README's three five-line starts (issue 26) stay true: every `hybridflow` command
parses, the agent start's tool registers and answers in the tools environment, and the
environment start's dict is a valid config of an API that exists."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from hybridflow.cli import parse_args

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
START = README.split("## Start here", 1)[1].split("### What has run where", 1)[0]


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", START, flags=re.S)


def test_there_are_three_starts_and_a_table_of_what_ran_where():
    assert len(_blocks("bash")) == 1 and len(_blocks("python")) == 2
    table = README.split("### What has run where", 1)[1].split("## ", 1)[0]
    assert "| CPU" in table and "| GPU |" in table


def test_every_command_of_the_language_model_start_parses():
    (block,) = _blocks("bash")
    commands = [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]
    assert len(commands) == 5
    for command in commands:
        argv = shlex.split(command)
        assert argv[0] == "hybridflow"
        parse_args(argv[1:])  # argparse exits (SystemExit) on a wrong command or option


def test_the_agent_start_registers_a_tool_the_tools_environment_answers_with():
    from hybridflow.envs.agent.builtin import ToolEnv
    from hybridflow.envs.agent.tools import TOOLS

    agent, _ = _blocks("python")
    try:
        exec(compile(agent, "README.md", "exec"), {"__name__": "readme_tools"})
        env = ToolEnv(tools=["lookup"], tool_format="compact")
        assert env.step("@lookup[cat]").observation == [{"role": "user", "content": "chat"}]
    finally:
        TOOLS._items.pop("lookup", None)


def test_the_environment_start_is_a_valid_config_of_the_api_it_calls():
    from hybridflow.config.env_schema import env_config_from_dict
    from hybridflow import RLTrainer
    from hybridflow.trainer.env.part import EnvTrainResult

    _, env = _blocks("python")
    (literal,) = re.findall(r"RLTrainer\((\{.*\})\)", env)
    cfg = env_config_from_dict(eval(literal))  # the dict as written
    assert (cfg.algorithm.name, cfg.env.id, cfg.distributed.num_workers) == ("sac", "Pendulum-v1", 2)
    assert callable(RLTrainer.setup) and callable(RLTrainer.train)
    fields = EnvTrainResult.__dataclass_fields__
    assert "return_mean_window" in fields and "wall_s" in fields
    compile(env, "README.md", "exec")
