"""docs/extending.md, "Add an environment": its module, saved as my_envs.py, registers the
environment; its RLTrainer block trains it on two Ray env runners (return rises); the
import path form and the case-insensitive name resolve to the same class."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from hybridflow.config import ConfigError
from hybridflow.envs import resolve_env
from hybridflow.trainer.run.run_dir import read_metrics

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def doc_blocks() -> list[str]:
    section = DOC.read_text().split("## Add an environment", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 2, "the environment section of docs/extending.md has a module and a usage example"
    return blocks


@pytest.fixture
def my_envs(tmp_path, monkeypatch):
    module, usage = doc_blocks()
    (tmp_path / "my_envs.py").write_text(module)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)  # the run directory goes to ./runs, as for a user
    yield usage
    sys.modules.pop("my_envs", None)


def test_the_documented_environment_trains_on_two_env_runners(ray_local, my_envs, tmp_path):
    # Ray started before tmp_path was on sys.path: the runners cannot import my_envs, so
    # this also checks that a user's class travels to them by value.
    scope: dict = {}
    exec(compile(my_envs, "docs/extending.md", "exec"), scope)  # noqa: S102 - the doc's own example
    result = scope["result"]
    assert result.env_steps == 2000 and result.run_dir.parent == Path("runs") and (tmp_path / result.run_dir).is_dir()
    windows = [r["episode/return_mean_window"] for r in read_metrics(result.run_dir / "metrics.jsonl")
               if r["phase"] == "rl"]
    # Random play averages about -36 over 20 steps (start_range 3); walking straight to 0
    # scores about -5. The first record comes after 1000 steps.
    assert len(windows) == 2 and windows[-1] > -15, windows


def test_the_import_path_and_any_case_of_the_name_find_the_class(my_envs):
    import my_envs as module

    by_path = resolve_env("my_envs:GoToZero", {"start_range": 1.0})
    assert by_path.factory is module.GoToZero and by_path.make().start_range == 1.0
    assert resolve_env("gotozero").factory is module.GoToZero
    with pytest.raises(ConfigError, match="did you mean 'GoToZero'"):
        resolve_env("GoToZer")
