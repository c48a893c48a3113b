"""docs/extending.md, "Add an environment algorithm": its module registers a row whose
program is the user's, and its RLTrainer block runs that program (in-process)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from hybridflow.config.algorithm import ALGORITHMS

DOC = Path(__file__).resolve().parents[3] / "docs" / "extending.md"


def test_the_documented_environment_algorithm_runs(tmp_path, monkeypatch):
    section = DOC.read_text().split("## Add an environment algorithm", 1)[1].split("\n## ", 1)[0]
    module, usage = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    (tmp_path / "my_env_algos.py").write_text(module)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)  # the run directory goes to ./runs, as for a user
    try:
        scope: dict = {}
        exec(usage, scope)  # noqa: S102 - the documented example, as a user runs it
        result = scope["result"]
        assert result.env_steps == 256 and (tmp_path / "runs").is_dir()
        program = ALGORITHMS["ppo_mc"].environment.program
        assert program.program.__name__ == "ppo_monte_carlo"
        assert (result.run_dir / "config.yaml").read_text().startswith("name: CartPole-v1-ppo_mc")
    finally:
        ALGORITHMS.pop("ppo_mc")
        sys.modules.pop("my_env_algos", None)
