"""docs/extending.md, "Add an agent environment" and "Add a reward template": the two
modules, saved as the page says, and its YAML block: the run config resolves both by
import path; the agent loop plays `countdown` on a tiny model (turn rewards, several
turns); the run's reward manager scores the trajectories with `says_please` in fresh
worker processes (spawn: they import my_templates again); unknown names are ConfigErrors
keyed by their setting."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
import yaml
from agent_helpers import prompt_batch, tokenizer_of

from hybridflow.config.schema import load_run_config
from hybridflow.engines.rollout import NativeRolloutEngine, RolloutConfig, SamplingParams
from hybridflow.envs.agent.loop import AgentLoop
from hybridflow.errors import ConfigError
from hybridflow.trainer.run.setup import build_reward_manager

DOC = Path(__file__).resolve().parents[3] / "docs" / "extending.md"


def _section(title: str) -> str:
    return DOC.read_text().split(f"## {title}", 1)[1].split("\n## ", 1)[0]


@pytest.fixture
def doc_config(tmp_path, monkeypatch):
    (env_module,) = re.findall(r"```python\n(.*?)```", _section("Add an agent environment"), flags=re.S)
    template_module, config = (re.findall(r"```(?:python|yaml)\n(.*?)```", _section("Add a reward template"),
                                          flags=re.S))
    (tmp_path / "my_agent_envs.py").write_text(env_module)
    (tmp_path / "my_templates.py").write_text(template_module)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield yaml.safe_load(config)
    for name in ("my_agent_envs", "my_templates"):
        sys.modules.pop(name, None)


def _overrides(tree: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in tree.items():
        if isinstance(value, dict) and key != "env_kwargs":
            out += _overrides(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}={yaml.safe_dump(value, default_flow_style=True).strip()}")
    return out


def test_documented_agent_env_and_template_run(doc_config, turn_model_dir):
    cfg = load_run_config(None, [*_overrides(doc_config), "reward.manager.mp_context=spawn",
                                 "reward.manager.num_workers=1"])
    tok = tokenizer_of(turn_model_dir)
    engine = NativeRolloutEngine.from_pretrained(turn_model_dir, RolloutConfig(dtype=torch.float32), tokenizer=tok)
    batch = prompt_batch(tok, ["3", "3"], [None, None], ground_truths=["1", "1"])
    out = AgentLoop(engine, tok, cfg.rollout.agent, 96, tok.pad_token_id).run(
        batch, SamplingParams(temperature=0.5, max_new_tokens=96, n=2, seed=0))
    assert max(out.non_tensor_batch["num_turns"]) >= 2, list(out.non_tensor_batch["agent_stop"])
    assert "env_error" not in set(out.non_tensor_batch["agent_stop"])
    with build_reward_manager(cfg, tok) as manager:
        scored = manager.score(out)
    assert scored.metrics["reward/errors"] == 0
    assert "template/my_templates:says_please" in scored.metrics and "template/numeric_match" in scored.metrics

    with pytest.raises(ConfigError, match="countdown") as err:
        load_run_config(None, ["rollout.agent.enable=true", "rollout.agent.default_env=countdwn"])
    assert err.value.key == "rollout.agent.default_env"
    with pytest.raises(ConfigError, match="registers no 'nothing'") as err:
        load_run_config(None, ["reward.templates=[{name: 'my_templates:nothing'}]"])
    assert err.value.key == "reward.templates[0].name"
