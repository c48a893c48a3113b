"""A reward function given from Python (RLTrainer's dict or a RunConfig) is recorded by its
import path, so the saved config.yaml loads it again (resume, eval); a lambda or a nested
function is a ConfigError before any run directory exists."""

from __future__ import annotations

import sys
import textwrap

import pytest

from hybridflow.config import ConfigError, load_config, save_config
from hybridflow.config.schema import RunConfig, load_run_config
from hybridflow.rewards import load_reward_fn
from hybridflow import RLTrainer
from hybridflow.config.schema import run_config_from_tree


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """An importable module `my_rewards` with a reward function."""
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent('''
        def exact(data_source, solution_str, ground_truth, extra_info=None):
            return float(solution_str.strip() == str(ground_truth))
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    import my_rewards

    yield my_rewards
    sys.modules.pop("my_rewards", None)


def test_a_function_from_a_dict_is_recorded_by_import_path(user_module, tmp_path):
    cfg = run_config_from_tree({"reward": {"custom_fn_path": user_module.exact}})
    assert (cfg.reward.custom_fn_path, cfg.reward.custom_fn_name) == ("my_rewards", "exact")
    saved = load_config(RunConfig, save_config(cfg, tmp_path / "config.yaml"))  # YAML, no RepresenterError
    fn = load_reward_fn(saved.reward.custom_fn_path, saved.reward.custom_fn_name)
    assert fn is user_module.exact and fn("arithmetic", " 7", 7) == 1.0


def test_a_function_assigned_to_a_config_is_recorded_when_the_run_opens(user_module, tmp_path):
    from hybridflow.trainer.run.setup import RunContext

    out = tmp_path / "runs"
    cfg = load_run_config(None, [f"trainer.output_dir={out}", "model.path=/nonexistent"])
    cfg.reward.custom_fn_path = user_module.exact
    with pytest.raises(ConfigError, match="model.path"):  # stops at the model check, after the conversion
        RunContext.open(cfg)
    assert not out.exists()


@pytest.mark.parametrize("fn", [lambda data_source, solution_str, ground_truth, extra_info=None: 1.0, None])
def test_a_lambda_or_nested_function_is_refused_before_the_run_dir(tmp_path, fn):
    if fn is None:
        def nested(data_source, solution_str, ground_truth, extra_info=None):
            return 1.0

        fn = nested
    with pytest.raises(ConfigError, match="reward.custom_fn_path: .*cannot be loaded by name.*module level"):
        RLTrainer({"reward": {"custom_fn_path": fn}, "trainer": {"output_dir": str(tmp_path)}})
    assert not any(tmp_path.iterdir())


def test_the_documented_register_scorer_example_scores_its_data_source():
    import re
    from pathlib import Path

    from hybridflow.rewards import SCORERS, default_compute_score

    doc = (Path(__file__).resolve().parents[2] / "docs" / "extending.md").read_text()
    section = doc.split("**Scorers by data source.**", 1)[1]
    (block,) = re.findall(r"```python\n(.*?)```", section.split("**The data row format**", 1)[0], flags=re.S)
    try:
        exec(compile(block, "extending.md", "exec"), {"__name__": "doc_example"})
        assert default_compute_score("my_task", " 5 ", "5") == 1.0
        assert default_compute_score("my_task", "6", "5") == 0.0
    finally:
        SCORERS.pop("my_task", None)
